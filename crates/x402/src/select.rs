//! Requirement selection: which of an upstream's payment options, if any, the router pays.
//!
//! Rules (DESIGN §6), all of which an option must pass:
//! scheme `exact` (transfer method `eip3009`, the default, or `permit2`) or `upto` (Permit2
//! only, with a non-zero `extra.facilitatorAddress`); Permit2 only in x402 v2;
//! network configured (has an RPC URL); asset configured for that network;
//! for EIP-3009, `extra.name` and `extra.version` present (the token's EIP-712 domain; Permit2
//! has its own); `payTo` not the zero address;
//! amount > 0; `maxTimeoutSeconds` > 0; amount ≤ the agent's `max_amount`; amount ≤ the
//! agent's limit (per-call cap and/or what remains of its budget), when given. For `upto` the
//! amount is the signed maximum: it is what is checked and reserved.
//! Among the passing options the cheapest wins; ties go to the earliest in `accepts`.
//!
//! Fail closed: with no passing option the answer is a [`Rejection`] that says, per option,
//! why it was refused — never a fallback to `accepts[0]`.

use std::collections::{BTreeMap, BTreeSet};

use alloy::primitives::Address;

use crate::money::{Amount, Rate};

use super::network::Network;
pub use super::rejection::{OptionRejection, RejectReason, Rejection};
use super::wire::{PaymentRequired, Requirement};

/// The fixed-price scheme.
pub const EXACT: &str = "exact";
/// The metered scheme (Permit2 only): the amount is a maximum.
pub const UPTO: &str = super::permit2::UPTO;

/// What the router is configured to pay with: networks that have an RPC URL, the
/// `(network, token)` pairs of `X402_ASSETS`, and each token's decimals.
///
/// Amounts (prices, `max_amount`, caps, budgets) are compared as atomic units only between
/// assets of the same decimals: an asset whose decimals are unknown, or differ from the
/// router's unit (the decimals every configured asset shares, see
/// `config::PaymentConfig::check_one_unit`), is never paid. With a budget currency
/// ([`Supported::with_budget`]) every asset of known decimals and value is paid, its prices
/// counted in budget units ([`Supported::rate`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Supported {
    networks: BTreeSet<Network>,
    assets: BTreeSet<(Network, Address)>,
    decimals: BTreeMap<(Network, Address), u8>,
    permit2_only: BTreeSet<(Network, Address)>,
    /// The budget currency's decimals, when one is configured (`BUDGET_CURRENCY`).
    budget_decimals: Option<u8>,
    /// With a budget currency: what one whole token of each asset is worth in it.
    values: BTreeMap<(Network, Address), Rate>,
}

impl Supported {
    /// Builds the set. An asset on a network without an RPC URL is kept but never allowed
    /// ([`Self::allows_asset`] checks both), so settlement can always be verified.
    pub fn new(
        networks: impl IntoIterator<Item = Network>,
        assets: impl IntoIterator<Item = (Network, Address)>,
    ) -> Self {
        Self {
            networks: networks.into_iter().collect(),
            assets: assets.into_iter().collect(),
            decimals: BTreeMap::new(),
            permit2_only: BTreeSet::new(),
            budget_decimals: None,
            values: BTreeMap::new(),
        }
    }

    /// Counts budgets in a budget currency of `decimals`, each asset's whole token worth
    /// `values` of it: assets of different decimals then share one budget. An asset without
    /// a value (or without known decimals) is never paid.
    #[must_use]
    pub fn with_budget(mut self, decimals: u8, values: impl IntoIterator<Item = ((Network, Address), Rate)>) -> Self {
        self.budget_decimals = Some(decimals);
        self.values.extend(values);
        self
    }

    /// The budget currency's decimals, when one is configured.
    pub fn budget_decimals(&self) -> Option<u8> {
        self.budget_decimals
    }

    /// How many budget units one atomic unit of `asset` counts: with a budget currency, its
    /// value over its decimals; without one, one for an asset in the router's unit. `None`:
    /// the asset is never paid (no value, unknown decimals, or outside the one unit).
    pub fn rate(&self, network: Network, asset: Address) -> Option<Rate> {
        let decimals = self.decimals(network, asset)?;
        match self.budget_decimals {
            Some(budget) => Rate::of_asset(*self.values.get(&(network, asset))?, decimals, budget).ok(),
            None => (self.unit() == Some(decimals)).then_some(Rate::ONE),
        }
    }

    /// What `amount` of `asset` counts against budgets, caps and `max_amount` (rounded up);
    /// `None`: never paid ([`Self::rate`]), or too large.
    pub fn charge(&self, network: Network, asset: Address, amount: Amount) -> Option<Amount> {
        self.rate(network, asset)?.charge(amount)
    }

    /// Records the assets without EIP-3009 (`X402_ASSETS` `+permit2`): paid only via
    /// Permit2, and their `authorizationState` is never asked.
    #[must_use]
    pub fn with_permit2_only(mut self, assets: impl IntoIterator<Item = (Network, Address)>) -> Self {
        self.permit2_only.extend(assets);
        self
    }

    /// True when `asset` on `network` has no EIP-3009 (paid only via Permit2).
    pub fn is_permit2_only(&self, network: Network, asset: Address) -> bool {
        self.permit2_only.contains(&(network, asset))
    }

    /// Records the decimals of assets (configured, built in, or read from the token).
    #[must_use]
    pub fn with_decimals(mut self, decimals: impl IntoIterator<Item = ((Network, Address), u8)>) -> Self {
        self.decimals.extend(decimals);
        self
    }

    /// The decimals of `asset` on `network`, if known.
    pub fn decimals(&self, network: Network, asset: Address) -> Option<u8> {
        self.decimals.get(&(network, asset)).copied()
    }

    /// The router's unit: the decimals shared by every asset whose decimals are known
    /// (`None` when none is known, or when they disagree: then nothing is paid).
    pub fn unit(&self) -> Option<u8> {
        let mut it = self.decimals.values().copied();
        let first = it.next()?;
        it.all(|d| d == first).then_some(first)
    }

    /// The configured `(network, asset)` pairs that can be paid (network with an RPC URL).
    pub fn payable_assets(&self) -> impl Iterator<Item = (Network, Address)> + '_ {
        self.assets.iter().copied().filter(|(n, _)| self.has_network(*n))
    }

    /// True when the router can pay on, and verify settlement on, `network`.
    pub fn has_network(&self, network: Network) -> bool {
        self.networks.contains(&network)
    }

    /// True when `asset` is configured for `network` and `network` has an RPC URL.
    pub fn allows_asset(&self, network: Network, asset: Address) -> bool {
        self.has_network(network) && self.assets.contains(&(network, asset))
    }
}

/// The first rule `requirement` breaks, or `None` when it is payable.
pub fn check(
    requirement: &Requirement,
    supported: &Supported,
    max_amount: Amount,
    agent_limit: Option<Amount>,
) -> Option<RejectReason> {
    use super::permit2::{EIP3009_METHOD, PERMIT2_METHOD};
    let network = requirement.network();
    let amount = requirement.amount();
    let scheme = requirement.scheme();
    let method = requirement.asset_transfer_method();
    // `Some(true)`: Permit2; `Some(false)`: EIP-3009; `None`: a method we do not pay with.
    let permit2 = match (scheme, method) {
        (EXACT, None) => Some(false),
        (EXACT, Some(m)) if m == EIP3009_METHOD => Some(false),
        (EXACT | UPTO, Some(m)) if m == PERMIT2_METHOD => Some(true),
        (UPTO, None) => Some(true),
        _ => None,
    };
    let has_domain = requirement.extra_name().is_some_and(|s| !s.is_empty())
        && requirement.extra_version().is_some_and(|s| !s.is_empty());
    let reason = if scheme != EXACT && scheme != UPTO {
        RejectReason::UnsupportedScheme(scheme.to_owned())
    } else if permit2.is_none() {
        RejectReason::UnsupportedTransferMethod {
            scheme: scheme.to_owned(),
            method: super::wire::primitives::truncate(method.unwrap_or(""), 64),
        }
    } else if permit2 == Some(true) && requirement.version() != super::wire::X402Version::V2 {
        RejectReason::Permit2RequiresV2
    } else if scheme == UPTO && requirement.facilitator_address().is_none_or(|a| a.is_zero()) {
        RejectReason::MissingFacilitator
    } else if !supported.has_network(network) {
        RejectReason::UnsupportedNetwork(requirement.network_raw().to_owned())
    } else if !supported.allows_asset(network, requirement.asset()) {
        RejectReason::UnsupportedAsset { network, asset: requirement.asset() }
    } else if supported.rate(network, requirement.asset()).is_none() {
        RejectReason::UnknownUnit { network, asset: requirement.asset() }
    } else if permit2 == Some(false) && supported.is_permit2_only(network, requirement.asset()) {
        RejectReason::NoEip3009 { network, asset: requirement.asset() }
    } else if permit2 == Some(false) && !has_domain {
        RejectReason::MissingEip712Domain
    } else if requirement.pay_to() == Address::ZERO {
        RejectReason::ZeroPayTo
    } else if amount.is_zero() {
        RejectReason::ZeroAmount
    } else if requirement.max_timeout_seconds() == 0 {
        RejectReason::ZeroTimeout
    } else {
        return over_limits(supported.charge(network, requirement.asset(), amount), max_amount, agent_limit);
    };
    Some(reason)
}

/// Whether a price that counts `charge` (budget units; `None`: too large to count) is over
/// `max_amount` or the agent's limit.
fn over_limits(charge: Option<Amount>, max_amount: Amount, agent_limit: Option<Amount>) -> Option<RejectReason> {
    let Some(amount) = charge else {
        return Some(RejectReason::OverMaxAmount {
            amount: Amount::from_u256(alloy::primitives::U256::MAX),
            max_amount,
        });
    };
    if amount > max_amount {
        return Some(RejectReason::OverMaxAmount { amount, max_amount });
    }
    agent_limit.filter(|&limit| amount > limit).map(|limit| RejectReason::OverAgentLimit { amount, limit })
}

/// Picks the cheapest payable option of `accepts` (ties: earliest), or says why there is none.
///
/// `max_amount` is the agent's ceiling for this call; `agent_limit` its own limit if any
/// (per-call cap, or what remains of its daily budget — pass the smaller).
///
/// # Errors
/// [`Rejection`] listing every option and the rule it broke.
pub fn select<'a>(
    accepts: &'a [Requirement],
    supported: &Supported,
    max_amount: Amount,
    agent_limit: Option<Amount>,
) -> Result<&'a Requirement, Rejection> {
    let mut best: Option<&Requirement> = None;
    let mut options = Vec::new();
    for requirement in accepts {
        match check(requirement, supported, max_amount, agent_limit) {
            Some(reason) => options.push(OptionRejection { index: requirement.index(), reason }),
            None => {
                // Every payable option has a rate (see `check`): compared by what each counts.
                let cost = |r: &Requirement| supported.charge(r.network(), r.asset(), r.amount());
                let cheaper = best.is_none_or(|b| (cost(requirement), requirement.index()) < (cost(b), b.index()));
                if cheaper {
                    best = Some(requirement);
                }
            }
        }
    }
    best.ok_or(Rejection { options })
}

impl PaymentRequired {
    /// [`select`] over this 402's options; a [`Rejection`] also lists the entries that did not
    /// parse, so the agent sees every option the upstream offered.
    ///
    /// # Errors
    /// [`Rejection`] when no option is payable.
    pub fn select(
        &self,
        supported: &Supported,
        max_amount: Amount,
        agent_limit: Option<Amount>,
    ) -> Result<&Requirement, Rejection> {
        select(&self.accepts, supported, max_amount, agent_limit).map_err(|mut rejection| {
            rejection.options.extend(self.skipped.iter().map(|s| OptionRejection {
                index: s.index,
                reason: if s.error.is_unsupported() {
                    RejectReason::Unsupported(s.error.to_string())
                } else {
                    RejectReason::Unreadable(s.error.to_string())
                },
            }));
            rejection.options.sort_by_key(|o| o.index);
            rejection
        })
    }
}

#[cfg(test)]
mod tests {
    use alloy::primitives::{U256, address};
    use serde_json::{Value, json};

    use super::*;
    use crate::wire::{X402Version, parse_payment_required};

    const USDC_SEPOLIA: Address = address!("0x036CbD53842c5426634e7929541eC2318f3dCF7e");
    const USDC_BASE: Address = address!("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913");
    const PAY_TO: &str = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";

    fn supported() -> Supported {
        Supported::new(
            [Network::BASE_SEPOLIA, Network::BASE],
            [(Network::BASE_SEPOLIA, USDC_SEPOLIA), (Network::BASE, USDC_BASE)],
        )
        .with_decimals([((Network::BASE_SEPOLIA, USDC_SEPOLIA), 6), ((Network::BASE, USDC_BASE), 6)])
    }

    #[test]
    fn amounts_of_assets_in_other_units_are_never_compared() {
        // 9000 atomic units of a 2-decimal token (90 tokens) look cheaper than 10000 of USDC
        // (0.01) when compared raw: an asset outside the router's unit is never payable.
        let mixed = supported().with_decimals([((Network::BASE, USDC_BASE), 2)]);
        assert_eq!(mixed.unit(), None);
        let accepts =
            parse(vec![entry("eip155:8453", USDC_BASE, "9000"), entry("eip155:84532", USDC_SEPOLIA, "10000")]);
        let rejection = select(&accepts, &mixed, amount(50_000), None).unwrap_err();
        assert!(rejection.options.iter().all(|o| matches!(o.reason, RejectReason::UnknownUnit { .. })), "{rejection}");
        // Unknown decimals: never paid either.
        let unknown = Supported::new([Network::BASE_SEPOLIA], [(Network::BASE_SEPOLIA, USDC_SEPOLIA)]);
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, "10000")]);
        assert!(select(&accepts, &unknown, amount(50_000), None).is_err());
        // One unit: payable.
        assert_eq!(select(&accepts, &supported(), amount(50_000), None).unwrap().amount(), amount(10_000));
    }

    #[test]
    fn with_a_budget_currency_assets_of_other_decimals_compare_by_what_they_count() {
        let (base, sepolia) = ((Network::BASE, USDC_BASE), (Network::BASE_SEPOLIA, USDC_SEPOLIA));
        let one = Rate::ONE;
        // USDC_BASE stands for an 18-decimal stablecoin here.
        let mixed = supported().with_decimals([(base, 18)]).with_budget(6, [(base, one), (sepolia, one)]);
        // 0.009 of the 18-decimal token is cheaper than 0.01 USDC, although its atomic amount is larger.
        let accepts = parse(vec![
            entry("eip155:84532", USDC_SEPOLIA, "10000"),
            entry("eip155:8453", USDC_BASE, "9000000000000000"),
        ]);
        assert_eq!(select(&accepts, &mixed, amount(50_000), None).unwrap().index(), 1);
        // max_amount and the agent's limit are budget units: 9000 counts, not 9·10^15.
        assert!(select(&accepts[1..], &mixed, amount(9_000), Some(amount(9_000))).is_ok());
        let over = select(&accepts[1..], &mixed, amount(50_000), Some(amount(8_999))).unwrap_err();
        assert!(over.is_over_budget(), "{over}");
        // One wei counts one budget unit (rounded against the spender).
        let tiny = parse(vec![entry("eip155:8453", USDC_BASE, "1")]);
        assert!(select(&tiny, &mixed, amount(0), None).is_err());
        assert!(select(&tiny, &mixed, amount(1), None).is_ok());
        // An asset without a value is never paid.
        let no_value = supported().with_decimals([(base, 18)]).with_budget(6, [(sepolia, one)]);
        let rejection = select(&accepts[1..], &no_value, amount(u64::MAX), None).unwrap_err();
        assert!(matches!(rejection.options[0].reason, RejectReason::UnknownUnit { .. }), "{rejection}");
    }

    fn entry(network: &str, asset: Address, amount: &str) -> Value {
        json!({"scheme": "exact", "network": network, "amount": amount, "asset": asset.to_string(),
               "payTo": PAY_TO, "maxTimeoutSeconds": 60,
               "extra": {"name": "USD Coin", "version": "2"}})
    }

    fn parse(entries: Vec<Value>) -> Vec<Requirement> {
        entries.iter().enumerate().map(|(i, e)| Requirement::from_json(X402Version::V2, i, e).unwrap()).collect()
    }

    fn amount(n: u64) -> Amount {
        Amount::from(n)
    }

    #[test]
    fn picks_the_cheapest_acceptable_option() {
        let accepts = parse(vec![
            entry("eip155:84532", USDC_SEPOLIA, "300"),
            entry("eip155:8453", USDC_BASE, "100"),
            entry("eip155:84532", USDC_SEPOLIA, "200"),
        ]);
        let chosen = select(&accepts, &supported(), amount(1000), None).unwrap();
        assert_eq!(chosen.index(), 1);
        assert_eq!(chosen.amount(), amount(100));
    }

    #[test]
    fn ties_go_to_the_earliest_option() {
        let accepts = parse(vec![
            entry("eip155:1", USDC_BASE, "5"), // unsupported network, cheapest
            entry("eip155:8453", USDC_BASE, "100"),
            entry("eip155:84532", USDC_SEPOLIA, "100"),
        ]);
        assert_eq!(select(&accepts, &supported(), amount(100), None).unwrap().index(), 1);
    }

    #[test]
    fn cheaper_but_unacceptable_options_are_skipped() {
        let accepts = parse(vec![
            entry("eip155:84532", USDC_BASE, "1"), // asset of another network
            entry("eip155:84532", USDC_SEPOLIA, "900"),
        ]);
        assert_eq!(select(&accepts, &supported(), amount(1000), None).unwrap().index(), 1);
    }

    #[test]
    fn fails_closed_and_says_why_for_every_option() {
        let mut no_domain = entry("eip155:84532", USDC_SEPOLIA, "10");
        no_domain["extra"] = json!({"name": "USD Coin"});
        let mut empty_domain = entry("eip155:84532", USDC_SEPOLIA, "10");
        empty_domain["extra"] = json!({"name": "", "version": "2"});
        let mut no_extra = entry("eip155:84532", USDC_SEPOLIA, "10");
        no_extra.as_object_mut().unwrap().remove("extra");
        let mut upto = entry("eip155:84532", USDC_SEPOLIA, "10");
        upto["scheme"] = json!("streaming");
        let mut zero_timeout = entry("eip155:84532", USDC_SEPOLIA, "10");
        zero_timeout["maxTimeoutSeconds"] = json!(0);
        let mut zero_pay_to = entry("eip155:84532", USDC_SEPOLIA, "10");
        zero_pay_to["payTo"] = json!(Address::ZERO.to_string());
        let accepts = parse(vec![
            upto,
            entry("eip155:137", USDC_SEPOLIA, "10"),
            entry("eip155:84532", USDC_BASE, "10"),
            no_domain,
            empty_domain,
            no_extra,
            zero_pay_to,
            entry("eip155:84532", USDC_SEPOLIA, "0"),
            zero_timeout,
            entry("eip155:84532", USDC_SEPOLIA, "5000"),
        ]);
        let rejection = select(&accepts, &supported(), amount(1000), None).unwrap_err();
        let reasons: Vec<_> = rejection.options.iter().map(|o| o.reason.clone()).collect();
        assert_eq!(
            reasons,
            vec![
                RejectReason::UnsupportedScheme("streaming".into()),
                RejectReason::UnsupportedNetwork("eip155:137".into()),
                RejectReason::UnsupportedAsset { network: Network::BASE_SEPOLIA, asset: USDC_BASE },
                RejectReason::MissingEip712Domain,
                RejectReason::MissingEip712Domain,
                RejectReason::MissingEip712Domain,
                RejectReason::ZeroPayTo,
                RejectReason::ZeroAmount,
                RejectReason::ZeroTimeout,
                RejectReason::OverMaxAmount { amount: amount(5000), max_amount: amount(1000) },
            ]
        );
        assert_eq!(rejection.options.iter().map(|o| o.index).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
        assert!(rejection.is_over_budget());
        assert_eq!(rejection.cheapest_over_budget(), Some(amount(5000)));
        let message = rejection.to_string();
        assert!(message.starts_with("no acceptable payment option: option #0: scheme \"streaming\""), "{message}");
        assert!(message.contains("option #9: amount 5000 exceeds max_amount 1000"), "{message}");
    }

    #[test]
    fn permit2_exact_and_upto_are_selected_only_when_well_formed() {
        const FACILITATOR: &str = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266";
        let with = |scheme: &str, extra: Value, amount: &str| {
            let mut e = entry("eip155:84532", USDC_SEPOLIA, amount);
            e["scheme"] = json!(scheme);
            e["extra"] = extra;
            e
        };
        let accepts = parse(vec![
            with("exact", json!({"assetTransferMethod": "permit2"}), "10"),
            with("upto", json!({"assetTransferMethod": "permit2", "facilitatorAddress": FACILITATOR}), "20"),
            with("upto", json!({"assetTransferMethod": "permit2"}), "1"),
            with("upto", json!({"facilitatorAddress": Address::ZERO.to_string()}), "1"),
            with("upto", json!({"assetTransferMethod": "eip3009", "facilitatorAddress": FACILITATOR}), "1"),
            with("exact", json!({"name": "USD Coin", "version": "2", "assetTransferMethod": "erc7710"}), "1"),
            with("upto", json!({"assetTransferMethod": "permit2", "facilitatorAddress": FACILITATOR}), "5000"),
        ]);
        // Permit2 needs no token domain; the cheapest acceptable option wins.
        assert_eq!(select(&accepts, &supported(), amount(1000), None).unwrap().index(), 0);
        assert_eq!(select(&accepts[1..], &supported(), amount(1000), None).unwrap().index(), 1);
        let rejection = select(&accepts[2..], &supported(), amount(1000), None).unwrap_err();
        let reasons: Vec<_> = rejection.options.iter().map(|o| o.reason.clone()).collect();
        assert_eq!(
            reasons,
            vec![
                RejectReason::MissingFacilitator,
                RejectReason::MissingFacilitator,
                RejectReason::UnsupportedTransferMethod { scheme: "upto".into(), method: "eip3009".into() },
                RejectReason::UnsupportedTransferMethod { scheme: "exact".into(), method: "erc7710".into() },
                // The maximum of an upto option is its price for the limits.
                RejectReason::OverMaxAmount { amount: amount(5000), max_amount: amount(1000) },
            ]
        );
        assert!(rejection.to_string().contains("assetTransferMethod \"erc7710\" is not supported"), "{rejection}");
        // Permit2 in a v1 message is refused.
        let v1 = Requirement::from_json(
            X402Version::V1,
            0,
            &json!({"scheme": "upto", "network": "base-sepolia", "maxAmountRequired": "10",
                    "asset": USDC_SEPOLIA.to_string(), "payTo": PAY_TO, "maxTimeoutSeconds": 60,
                    "extra": {"facilitatorAddress": FACILITATOR}}),
        )
        .unwrap();
        let rejection = select(std::slice::from_ref(&v1), &supported(), amount(1000), None).unwrap_err();
        assert_eq!(rejection.options[0].reason, RejectReason::Permit2RequiresV2);
    }

    #[test]
    fn a_token_without_eip3009_is_paid_only_via_permit2() {
        let only = supported().with_permit2_only([(Network::BASE_SEPOLIA, USDC_SEPOLIA)]);
        let mut permit2 = entry("eip155:84532", USDC_SEPOLIA, "20");
        permit2["extra"] = json!({"assetTransferMethod": "permit2"});
        let mut named = entry("eip155:84532", USDC_SEPOLIA, "10");
        named["extra"]["assetTransferMethod"] = json!("eip3009");
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, "1"), named, permit2]);
        // The cheaper EIP-3009 options are refused; the Permit2 one is chosen.
        assert_eq!(select(&accepts, &only, amount(1000), None).unwrap().index(), 2);
        let rejection = select(&accepts[..2], &only, amount(1000), None).unwrap_err();
        let no = RejectReason::NoEip3009 { network: Network::BASE_SEPOLIA, asset: USDC_SEPOLIA };
        assert!(rejection.options.iter().all(|o| o.reason == no), "{rejection}");
        assert!(rejection.to_string().contains("configured without EIP-3009"), "{rejection}");
        // Unmarked, the same token is paid with EIP-3009.
        assert_eq!(select(&accepts, &supported(), amount(1000), None).unwrap().index(), 0);
    }

    #[test]
    fn max_amount_and_agent_limit_are_inclusive_ceilings() {
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, "50000")]);
        assert!(select(&accepts, &supported(), amount(50_000), None).is_ok());
        assert!(select(&accepts, &supported(), amount(50_000), Some(amount(50_000))).is_ok());
        let over_max = select(&accepts, &supported(), amount(49_999), None).unwrap_err();
        assert_eq!(
            over_max.options[0].reason,
            RejectReason::OverMaxAmount { amount: amount(50_000), max_amount: amount(49_999) }
        );
        let over_limit = select(&accepts, &supported(), amount(100_000), Some(amount(10))).unwrap_err();
        assert_eq!(
            over_limit.options[0].reason,
            RejectReason::OverAgentLimit { amount: amount(50_000), limit: amount(10) }
        );
        assert!(over_limit.to_string().contains("spending limit 10"));
    }

    #[test]
    fn huge_amounts_compare_without_overflow() {
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, &U256::MAX.to_string())]);
        assert!(select(&accepts, &supported(), Amount::from_u256(U256::MAX - U256::from(1u8)), None).is_err());
        assert!(select(&accepts, &supported(), Amount::from_u256(U256::MAX), None).is_ok());
    }

    #[test]
    fn an_asset_on_a_network_without_rpc_url_is_never_paid() {
        let only_assets = Supported::new([], [(Network::BASE_SEPOLIA, USDC_SEPOLIA)])
            .with_decimals([((Network::BASE_SEPOLIA, USDC_SEPOLIA), 6)]);
        assert!(!only_assets.allows_asset(Network::BASE_SEPOLIA, USDC_SEPOLIA));
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, "1")]);
        let rejection = select(&accepts, &only_assets, amount(10), None).unwrap_err();
        assert_eq!(rejection.options[0].reason, RejectReason::UnsupportedNetwork("eip155:84532".into()));
    }

    #[test]
    fn nothing_configured_or_nothing_offered_is_a_rejection() {
        let accepts = parse(vec![entry("eip155:84532", USDC_SEPOLIA, "1")]);
        assert!(select(&accepts, &Supported::default(), amount(10), None).is_err());
        let none = select(&[], &supported(), amount(10), None).unwrap_err();
        assert!(none.options.is_empty());
        assert!(!none.is_over_budget());
        assert_eq!(none.to_string(), "no acceptable payment option: the upstream offered none");
    }

    #[test]
    fn v1_names_select_like_caip2() {
        let body = json!({"x402Version": 1, "accepts": [{
            "scheme": "exact", "network": "base-sepolia", "maxAmountRequired": "10000",
            "asset": USDC_SEPOLIA.to_string(), "payTo": PAY_TO, "maxTimeoutSeconds": 60,
            "extra": {"name": "USDC", "version": "2"}}]});
        let pr = parse_payment_required(
            reqwest::StatusCode::PAYMENT_REQUIRED,
            &reqwest::header::HeaderMap::new(),
            body.to_string().as_bytes(),
        )
        .unwrap();
        let chosen = pr.select(&supported(), amount(10_000), None).unwrap();
        assert_eq!(chosen.network_raw(), "base-sepolia");
    }

    #[test]
    fn payment_required_select_reports_skipped_entries_too() {
        let message = json!({"x402Version": 2, "accepts": [
            entry("eip155:84532", USDC_SEPOLIA, "-1"),
            {"scheme": "exact", "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "amount": "1",
             "asset": "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", "payTo": "x", "maxTimeoutSeconds": 60},
            entry("eip155:84532", USDC_SEPOLIA, "99999"),
        ]});
        let mut headers = reqwest::header::HeaderMap::new();
        let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, message.to_string());
        headers.insert("payment-required", encoded.parse().unwrap());
        let pr = parse_payment_required(reqwest::StatusCode::PAYMENT_REQUIRED, &headers, b"").unwrap();
        let rejection = pr.select(&supported(), amount(10), None).unwrap_err();
        assert_eq!(rejection.options.iter().map(|o| o.index).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert!(matches!(rejection.options[0].reason, RejectReason::Unreadable(_)));
        assert!(matches!(rejection.options[1].reason, RejectReason::Unsupported(_)));
        assert!(rejection.options[2].reason.is_over_budget());
        let text = rejection.to_string();
        assert!(text.contains("option #1: network \"solana:"), "{text}");
    }
}
