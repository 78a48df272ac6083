//! A 402's `batch-settlement` options, read from the entries as sent, and the record a payment
//! of one leaves in the ledger ([`SignedBatch`]).

use alloy::primitives::{Address, B256, U256};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

use crate::money::Amount;
use crate::x402::batch::{self, SignedDeposit, SignedVoucher};
use crate::x402::{Network, PaymentRequired, X402Version};

/// One `batch-settlement` option of a 402 (v2, EVM, EIP-3009 deposits).
#[derive(Debug, Clone)]
pub(crate) struct BatchTerms {
    pub version: X402Version,
    pub network: Network,
    pub asset: Address,
    pub pay_to: Address,
    /// The price of one request: what each voucher adds to the ceiling.
    pub amount: Amount,
    pub receiver_authorizer: Address,
    pub withdraw_delay: u64,
    pub token_name: String,
    pub token_version: String,
    /// The server's announced minimum deposit, if it reads.
    pub min_deposit: Option<Amount>,
    pub max_timeout_secs: u64,
}

impl BatchTerms {
    /// Reads one `accepts` entry; `None` when it is not a usable batch-settlement option.
    pub fn from_json(version: X402Version, e: &Value) -> Option<Self> {
        if version != X402Version::V2 || e.get("scheme")?.as_str()? != batch::SCHEME {
            return None;
        }
        let s = |k: &str| e.get(k).and_then(Value::as_str);
        let extra = e.get("extra")?;
        let x = |k: &str| extra.get(k).and_then(Value::as_str);
        let method = x("assetTransferMethod").unwrap_or("eip3009");
        if method != "eip3009" {
            return None;
        }
        let receiver_authorizer: Address = x("receiverAuthorizer")?.parse().ok()?;
        if receiver_authorizer.is_zero() {
            return None;
        }
        let withdraw_delay = match extra.get("withdrawDelay") {
            None => batch::MIN_WITHDRAW_DELAY,
            Some(v) => v.as_u64()?,
        };
        Some(Self {
            version,
            network: Network::parse_caip2(s("network")?).ok()?,
            asset: s("asset")?.parse().ok()?,
            pay_to: s("payTo")?.parse().ok()?,
            amount: Amount::parse(s("amount")?).ok()?,
            receiver_authorizer,
            withdraw_delay,
            token_name: x("name")?.to_owned(),
            token_version: x("version")?.to_owned(),
            min_deposit: x("minDeposit").and_then(|m| Amount::parse(m).ok()),
            max_timeout_secs: e.get("maxTimeoutSeconds").and_then(Value::as_u64).unwrap_or(300),
        })
    }
}

/// The 402's batch-settlement options, with each entry as sent.
pub(super) fn offered(required: &PaymentRequired) -> Vec<(BatchTerms, &Value)> {
    required.raw_accepts.iter().filter_map(|e| Some((BatchTerms::from_json(required.version, e)?, e))).collect()
}

/// What a batch-settlement payment signed: the ledger's `signed_authorization`. It names its
/// scheme (the registry tells its rows by it) and carries the voucher, and the deposit when
/// this request opened or topped up the channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SignedBatch {
    pub scheme: String,
    pub network: String,
    pub asset: String,
    pub pay_to: String,
    pub payer: String,
    /// The price: what this voucher adds to the channel's ceiling.
    pub amount: Amount,
    pub lane: Uuid,
    pub channel_id: B256,
    pub channel_config: Value,
    pub voucher: SignedVoucher,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub deposit: Option<SignedDeposit>,
}

impl SignedBatch {
    /// The voucher's ceiling.
    pub fn ceiling(&self) -> U256 {
        self.voucher.max_claimable
    }

    /// Whether a stored authorization is a batch-settlement record.
    pub fn is_one(stored: &Value) -> bool {
        stored.get("scheme").and_then(Value::as_str) == Some(batch::SCHEME)
    }
}
