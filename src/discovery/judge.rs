//! Whether the calling agent may pay an advertised option, and why not: the same rules `/route`
//! applies before it signs (host and `payTo` allowlists, the per-call cap and the budgets'
//! headroom, the networks, assets and schemes the router pays with), read now. Informational:
//! a payment always goes through `/route`, which asks the upstream's live 402 and decides
//! again under the agent's lock.

use serde_json::{Map, Value};
use url::Url;

use super::parse::amount_field;
use crate::chains::solana::Solana;
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::{Limits, Spend, limits};
use crate::x402::select::check;
use crate::x402::svm::SvmTerms;
use crate::x402::{RejectReason, Requirement, Supported, X402Version};

/// An option as advertised, and whether this agent may pay it now.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct OptionView {
    /// As advertised (e.g. `exact`).
    pub scheme: Option<String>,
    /// As advertised (CAIP-2, or an x402 v1 name).
    pub network: Option<String>,
    pub asset: Option<String>,
    /// The advertised price in the asset's atomic units (v1 `maxAmountRequired`): informational,
    /// `/route` pays what the live 402 asks.
    #[schema(schema_with = amount_doc)]
    pub amount: Amount,
    pub pay_to: Option<String>,
    pub max_timeout_seconds: Option<u64>,
    /// `extra.assetTransferMethod` when advertised (`permit2`, `eip3009`).
    pub asset_transfer_method: Option<String>,
    /// Whether this agent may pay it now (its limits, allowlists, and what the router pays with).
    pub payable: bool,
    /// Why not: the code `/route` would answer with (`payment_over_budget`, `payment_not_allowed`,
    /// `payment_unsupported`, `payment_over_max_amount` for `max_price`, `upstream_not_allowed`).
    pub code: Option<Code>,
    pub why_not: Option<String>,
}

fn amount_doc() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
    crate::schema_doc::amount(
        "The advertised price (atomic units): informational; `/route` pays what the live 402 asks.",
    )
}

/// What one agent may pay now.
pub struct Judge<'a> {
    pub spend: Option<&'a Spend>,
    pub supported: &'a Supported,
    pub solana: Option<&'a Solana>,
    /// `max_price` of the query: options above it are not payable (as `max_amount` of a call).
    pub max_price: Option<Amount>,
}

type Refusal = (Code, String);

impl Judge<'_> {
    /// The option at `raw` of a resource at `url`, judged.
    pub fn option(&self, url: &Url, version: X402Version, index: usize, raw: &Map<String, Value>) -> OptionView {
        let s = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_owned);
        let amount = raw.get(amount_field(version)).and_then(Value::as_str).and_then(|a| Amount::parse(a).ok());
        let refusal = self.refusal(url, version, index, raw);
        OptionView {
            scheme: s("scheme"),
            network: s("network"),
            asset: s("asset"),
            amount: amount.unwrap_or(Amount::ZERO),
            pay_to: s("payTo"),
            max_timeout_seconds: raw.get("maxTimeoutSeconds").and_then(Value::as_u64),
            asset_transfer_method: raw
                .get("extra")
                .and_then(|e| e.get("assetTransferMethod"))
                .and_then(|m| m.as_str().filter(|m| m.len() <= 32).map(str::to_owned)),
            payable: refusal.is_none(),
            code: refusal.as_ref().map(|r| r.0),
            why_not: refusal.map(|r| r.1),
        }
    }

    fn refusal(&self, url: &Url, version: X402Version, index: usize, raw: &Map<String, Value>) -> Option<Refusal> {
        let limits = match self.spend.map(Spend::limits).transpose() {
            Ok(limits) => limits,
            Err(_) => return Some((Code::PaymentOverBudget, "the agent's limits cannot be read".into())),
        };
        if let Some(why) = self.host_refused(url) {
            return Some((Code::UpstreamNotAllowed, why));
        }
        if let Some(pay_to) = raw.get("payTo").and_then(Value::as_str)
            && let Some(list) = self.spend.and_then(|s| s.allowed_pay_to.as_deref())
            && !list.iter().any(|a| limits::pay_to_matches(a, pay_to))
        {
            return Some((Code::PaymentNotAllowed, format!("its payTo {pay_to} is not on the agent's allowlist")));
        }
        let entry = Value::Object(raw.clone());
        match Requirement::from_json(version, index, &entry) {
            Ok(requirement) => self.evm(&requirement, limits),
            Err(evm) => match SvmTerms::from_json(version, &entry) {
                Ok(terms) => self.svm(&terms, limits),
                Err(_) => Some((Code::PaymentUnsupported, format!("the router does not pay it: {evm}"))),
            },
        }
    }

    /// The host allowlist, as `/route` applies it before a call.
    fn host_refused(&self, url: &Url) -> Option<String> {
        let allowed = self.spend?.allowed_hosts.as_deref()?;
        let host = url.host_str()?.to_ascii_lowercase();
        let port = url.port();
        (!allowed.iter().any(|p| limits::host_matches(p, &host, port)))
            .then(|| format!("the host {host} is not on the agent's allowlist"))
    }

    fn evm(&self, requirement: &Requirement, limits: Option<Limits>) -> Option<Refusal> {
        let ceiling = self.max_price.unwrap_or(Amount::from_u256(alloy::primitives::U256::MAX));
        let reason = check(requirement, self.supported, ceiling, limits.and_then(|l| l.headroom()))?;
        let code = match reason {
            RejectReason::OverMaxAmount { .. } => Code::PaymentOverMaxAmount,
            RejectReason::OverAgentLimit { .. } => Code::PaymentOverBudget,
            _ => Code::PaymentUnsupported,
        };
        let why = match (&reason, self.max_price) {
            (RejectReason::OverMaxAmount { amount, .. }, Some(max)) => {
                format!("its price {amount} is over max_price {max}")
            }
            _ => reason.to_string(),
        };
        Some((code, why))
    }

    /// The rules of the Solana walk (`relay/pay/svm`): a configured mint in the router's unit,
    /// a fee payer that is not the router's wallet, a non-zero price within the limits.
    fn svm(&self, terms: &SvmTerms, limits: Option<Limits>) -> Option<Refusal> {
        let unsupported = |why: String| Some((Code::PaymentUnsupported, why));
        let Some(solana) = self.solana else {
            return unsupported("the router pays on no Solana network".into());
        };
        let (network, mint) = (terms.network(), terms.mint());
        let decimals = solana.config.decimals(network, &mint);
        let amount = Amount::from(terms.amount());
        if decimals.is_none() {
            return unsupported(format!("{mint} on {network} is not configured for payments"));
        }
        if decimals != Some(solana.config.unit) || self.supported.unit().is_some_and(|u| u != solana.config.unit) {
            return unsupported(format!("{mint} on {network} is not in the router's unit"));
        }
        if terms.fee_payer() == solana.config.signer.address() {
            return unsupported("its feePayer is the router's own wallet (it would pay the fees)".into());
        }
        if amount.is_zero() {
            return unsupported("its amount is zero".into());
        }
        if let Some(max) = self.max_price.filter(|m| amount > *m) {
            return Some((Code::PaymentOverMaxAmount, format!("its price {amount} is over max_price {max}")));
        }
        let headroom = limits.and_then(|l| l.headroom()).filter(|h| amount > *h)?;
        Some((Code::PaymentOverBudget, format!("its price {amount} exceeds the agent's limits ({headroom} left)")))
    }
}
