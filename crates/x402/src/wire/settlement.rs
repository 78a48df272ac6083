//! What an upstream says after a paid attempt: the settlement claim and refusal reasons.

use alloy::primitives::{Address, B256};
use reqwest::header::HeaderMap;
use serde::Serialize;
use serde_json::{Map, Value};

use super::primitives::{header_json, parse_address, parse_b256, reason_field, truncate};
use super::*;
use crate::network::Network;

/// What an upstream said about settling a payment (`PAYMENT-RESPONSE` / `X-PAYMENT-RESPONSE`).
///
/// A claim only: the router confirms on-chain before calling anything settled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SettlementResponse {
    /// `success`; a missing or non-boolean value counts as `false`.
    pub success: bool,
    /// `transaction` as sent, if a non-empty string.
    pub transaction: Option<String>,
    /// `transaction` as an EVM transaction hash, when it is one.
    pub tx_hash: Option<B256>,
    /// `network` as sent (v1 name or CAIP-2).
    pub network: Option<String>,
    /// `payer`, when it is an EVM address.
    pub payer: Option<Address>,
    /// `errorReason` as sent (bounded).
    pub error_reason: Option<String>,
    /// `amount` (upto: what the upstream says it charged), when a canonical decimal string.
    /// A claim only: the ledger records what the chain shows moved.
    pub amount: Option<crate::money::Amount>,
}

/// `errorReason` of a settlement that the facilitator broadcast but did not see mined in time
/// (the upstream answers 402 with this in `PAYMENT-RESPONSE`): the money may still move.
pub const SETTLEMENT_PENDING: &str = "settlement_pending";
/// The reason (`PAYMENT-REQUIRED.error` of a 412) of an upstream whose facilitator takes payment
/// only from a wallet that approved Uniswap Permit2 for the token.
pub const PERMIT2_ALLOWANCE_REQUIRED: &str = "permit2_allowance_required";

impl SettlementResponse {
    /// True for an unsuccessful claim whose reason is [`SETTLEMENT_PENDING`].
    pub fn is_pending(&self) -> bool {
        !self.success && self.error_reason.as_deref() == Some(SETTLEMENT_PENDING)
    }

    /// The network, parsed, when it is one we know.
    pub fn parsed_network(&self) -> Option<Network> {
        Network::parse(self.network.as_deref()?).ok()
    }
}

/// Reads the settlement header of a paid answer: `PAYMENT-RESPONSE` (v2), else
/// `X-PAYMENT-RESPONSE` (v1). `Ok(None)` when neither is present. Tolerant of missing fields.
///
/// # Errors
/// [`WireError`] when the header is present but oversized, duplicated, not base64, not JSON,
/// or not a JSON object.
pub fn parse_settlement(headers: &HeaderMap) -> Result<Option<SettlementResponse>, WireError> {
    let message = match header_json(headers, PAYMENT_RESPONSE_HEADER)? {
        Some(m) => m,
        None => match header_json(headers, X_PAYMENT_RESPONSE_HEADER)? {
            Some(m) => m,
            None => return Ok(None),
        },
    };
    let obj = message.as_object().ok_or(WireError::Malformed("settlement response is not a JSON object"))?;
    let transaction =
        obj.get("transaction").and_then(Value::as_str).filter(|t| !t.is_empty()).map(|t| truncate(t, MAX_REASON_BYTES));
    let tx_hash = transaction.as_deref().and_then(parse_b256);
    Ok(Some(SettlementResponse {
        success: obj.get("success").and_then(Value::as_bool).unwrap_or(false),
        tx_hash,
        transaction,
        network: reason_field(obj, "network"),
        payer: obj.get("payer").and_then(Value::as_str).and_then(parse_address),
        error_reason: reason_field(obj, "errorReason"),
        amount: obj.get("amount").and_then(Value::as_str).and_then(|a| crate::money::Amount::parse(a).ok()),
    }))
}

/// Reasons an upstream (or its facilitator) gave for refusing or failing a payment, passed
/// through unchanged (bounded to [`MAX_REASON_BYTES`]) so agents and operators see them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusalReasons {
    /// `error` (v2 `PAYMENT-REQUIRED.error`, v1 body `error`), e.g.
    /// `invalid_exact_evm_nonce_already_used`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `invalidReason` (facilitator `/verify`), when the upstream forwards it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<String>,
    /// `errorReason` (facilitator `/settle`, or the settlement header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
}

impl RefusalReasons {
    /// True when any of the reasons is exactly `reason`.
    pub fn names(&self, reason: &str) -> bool {
        [&self.error, &self.invalid_reason, &self.error_reason].iter().any(|r| r.as_deref() == Some(reason))
    }

    /// True when the upstream gave no reason at all.
    pub fn is_empty(&self) -> bool {
        self.error.is_none() && self.invalid_reason.is_none() && self.error_reason.is_none()
    }

    fn fill_from(&mut self, obj: &Map<String, Value>) {
        if self.error.is_none() {
            self.error = reason_field(obj, "error");
        }
        if self.invalid_reason.is_none() {
            self.invalid_reason = reason_field(obj, "invalidReason");
        }
        if self.error_reason.is_none() {
            self.error_reason = reason_field(obj, "errorReason");
        }
    }
}

/// Collects the reasons of a refused or failed paid attempt from, in order of precedence:
/// a new `PAYMENT-REQUIRED` header (v2), the settlement header (`errorReason`), and a JSON body
/// (v1 `error`, or `invalidReason`/`errorReason` that some servers forward). Never fails:
/// unreadable sources are ignored.
pub fn refusal_reasons(headers: &HeaderMap, body: &[u8]) -> RefusalReasons {
    let mut reasons = RefusalReasons::default();
    for header in [PAYMENT_REQUIRED_HEADER, PAYMENT_RESPONSE_HEADER, X_PAYMENT_RESPONSE_HEADER] {
        if let Ok(Some(Value::Object(obj))) = header_json(headers, header) {
            reasons.fill_from(&obj);
        }
    }
    if body.len() <= MAX_BODY_BYTES {
        let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
        if let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) {
            reasons.fill_from(&obj);
        }
    }
    reasons
}
