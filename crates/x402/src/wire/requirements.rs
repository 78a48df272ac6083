//! Reading a `402 Payment Required`: the payment options an upstream offers.

use alloy::primitives::Address;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value};

use super::primitives::{header_json, parse_address, reason_field, str_field, truncate};
use super::*;
use crate::money::Amount;
use crate::network::Network;

/// One payment option offered by the upstream, typed, plus its JSON verbatim.
///
/// Built only by parsing ([`Requirement::from_json`]), so the typed fields and [`Self::raw`]
/// always agree: what is selected, signed and sent is the same option.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    version: X402Version,
    index: usize,
    scheme: String,
    network: Network,
    network_raw: String,
    amount: Amount,
    asset: Address,
    pay_to: Address,
    max_timeout_seconds: u64,
    extra: Option<Map<String, Value>>,
    raw: Map<String, Value>,
}

impl Requirement {
    /// Parses one `accepts` entry of a message of `version`; `index` is its position.
    ///
    /// Also the way to rebuild a requirement from a stored `accepted` object (e.g. to re-sign
    /// after a takeover).
    ///
    /// # Errors
    /// [`EntryError`]; see [`EntryError::is_unsupported`] for the two classes.
    pub fn from_json(version: X402Version, index: usize, entry: &Value) -> Result<Self, EntryError> {
        let obj = entry.as_object().ok_or(EntryError::NotObject)?;
        let scheme = str_field(obj, "scheme")?;
        Self::from_object(version, index, obj, scheme).map_err(|e| {
            if scheme != "exact" && !e.is_unsupported() {
                EntryError::UnsupportedScheme(truncate(scheme, 64))
            } else {
                e
            }
        })
    }

    fn from_object(
        version: X402Version,
        index: usize,
        obj: &Map<String, Value>,
        scheme: &str,
    ) -> Result<Self, EntryError> {
        let network_raw = str_field(obj, "network")?;
        let network = Network::parse(network_raw)?;
        let amount_field = version.amount_field();
        let amount = Amount::parse(str_field(obj, amount_field)?).map_err(|_| EntryError::BadAmount(amount_field))?;
        let asset = parse_address(str_field(obj, "asset")?).ok_or(EntryError::BadAddress("asset"))?;
        let pay_to = parse_address(str_field(obj, "payTo")?).ok_or(EntryError::BadAddress("payTo"))?;
        let max_timeout_seconds = obj.get("maxTimeoutSeconds").and_then(Value::as_u64).ok_or(EntryError::BadTimeout)?;
        let extra = match obj.get("extra") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map.clone()),
            Some(_) => return Err(EntryError::BadExtra),
        };
        Ok(Self {
            version,
            index,
            scheme: scheme.to_owned(),
            network,
            network_raw: network_raw.to_owned(),
            amount,
            asset,
            pay_to,
            max_timeout_seconds,
            extra,
            raw: obj.clone(),
        })
    }

    /// Position in the upstream's `accepts` array.
    pub fn index(&self) -> usize {
        self.index
    }
    /// Payment scheme, e.g. `exact`.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }
    /// The network, parsed.
    pub fn network(&self) -> Network {
        self.network
    }
    /// The network string exactly as the upstream sent it (a v1 payment must echo it).
    pub fn network_raw(&self) -> &str {
        &self.network_raw
    }
    /// Amount in the asset's atomic units (v1 `maxAmountRequired`, v2 `amount`).
    pub fn amount(&self) -> Amount {
        self.amount
    }
    /// Token contract; also the EIP-712 verifying contract.
    pub fn asset(&self) -> Address {
        self.asset
    }
    /// Recipient.
    pub fn pay_to(&self) -> Address {
        self.pay_to
    }
    /// Longest validity the upstream allows; `validBefore = now + this`.
    pub fn max_timeout_seconds(&self) -> u64 {
        self.max_timeout_seconds
    }
    /// The `extra` object, if any.
    pub fn extra(&self) -> Option<&Map<String, Value>> {
        self.extra.as_ref()
    }
    /// `extra.name`: the token's EIP-712 domain name (e.g. `USD Coin`).
    pub fn extra_name(&self) -> Option<&str> {
        self.extra_str("name")
    }
    /// `extra.version`: the token's EIP-712 domain version (e.g. `2`).
    pub fn extra_version(&self) -> Option<&str> {
        self.extra_str("version")
    }
    /// The entry as the upstream sent it.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }
    /// The entry as the upstream sent it, as a JSON value (v2 `accepted`).
    pub fn raw_json(&self) -> Value {
        Value::Object(self.raw.clone())
    }

    /// The protocol version of the message this entry came from.
    pub fn version(&self) -> X402Version {
        self.version
    }
    /// `extra.assetTransferMethod` (`eip3009` when absent; `permit2` for Permit2 payments).
    pub fn asset_transfer_method(&self) -> Option<&str> {
        self.extra_str("assetTransferMethod")
    }
    /// `extra.facilitatorAddress` (`upto`: the facilitator allowed to settle), when it is an
    /// EVM address.
    pub fn facilitator_address(&self) -> Option<Address> {
        parse_address(self.extra_str("facilitatorAddress")?)
    }

    fn extra_str(&self, key: &str) -> Option<&str> {
        self.extra.as_ref()?.get(key)?.as_str()
    }
}

/// A parsed `402 Payment Required`.
#[derive(Debug, Clone, PartialEq)]
pub struct PaymentRequired {
    /// Protocol version; the payment must use the same.
    pub version: X402Version,
    /// Entries that parsed, in the upstream's order (see [`Requirement::index`]).
    pub accepts: Vec<Requirement>,
    /// Entries that did not parse, and why.
    pub skipped: Vec<SkippedRequirement>,
    /// Every `accepts` entry verbatim, including skipped ones (for the router's own 402 body).
    pub raw_accepts: Vec<Value>,
    /// v2 `resource` object (copied into the payment). v1 carries it per entry instead.
    pub resource: Option<Value>,
    /// `error`: why the upstream asked (e.g. `Payment required`, or a refusal reason).
    pub error: Option<String>,
    /// v2 `extensions` object, if any.
    pub extensions: Option<Value>,
}

impl PaymentRequired {
    /// True when the upstream advertises the `payment-identifier` extension.
    pub fn advertises_payment_identifier(&self) -> bool {
        self.payment_identifier_declaration().is_some()
    }

    /// True when the upstream says a payment identifier is required (`info.required: true`).
    pub fn requires_payment_identifier(&self) -> bool {
        self.payment_identifier_declaration()
            .and_then(|decl| decl.get("info")?.get("required")?.as_bool())
            .unwrap_or(false)
    }

    fn payment_identifier_declaration(&self) -> Option<&Map<String, Value>> {
        let decl = self.extensions.as_ref()?.get(PAYMENT_IDENTIFIER)?.as_object()?;
        match decl.get("info") {
            None | Some(Value::Object(_)) => Some(decl),
            Some(_) => None,
        }
    }
}

/// Parses an upstream's 402 into its payment requirements.
///
/// v2 when a `PAYMENT-REQUIRED` header is present (it must then decode, and say version 2);
/// otherwise the body must be an x402 JSON message (`x402Version` 1, or 2 from servers that
/// put v2 in the body).
///
/// # Errors
/// [`WireError`]: not a 402, no x402 content, undecodable or oversized input, wrong version,
/// no or too many `accepts`, or only malformed entries.
pub fn parse_payment_required(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<PaymentRequired, WireError> {
    if status != StatusCode::PAYMENT_REQUIRED {
        return Err(WireError::NotPaymentRequired(status.as_u16()));
    }
    if let Some(message) = header_json(headers, PAYMENT_REQUIRED_HEADER)? {
        return parse_message(&message, Some(X402Version::V2));
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(WireError::BodyTooLarge { len: body.len(), limit: MAX_BODY_BYTES });
    }
    let body = body.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(body);
    let Ok(message) = serde_json::from_slice::<Value>(body) else {
        return Err(WireError::NoRequirements);
    };
    if message.get("x402Version").is_none() {
        return Err(WireError::NoRequirements);
    }
    parse_message(&message, None)
}

fn parse_message(message: &Value, expect: Option<X402Version>) -> Result<PaymentRequired, WireError> {
    let obj = message.as_object().ok_or(WireError::Malformed("message is not a JSON object"))?;
    let version = match obj.get("x402Version") {
        Some(v) => v
            .as_u64()
            .and_then(X402Version::from_number)
            .ok_or_else(|| WireError::UnsupportedVersion(truncate(&v.to_string(), 32)))?,
        None => return Err(WireError::UnsupportedVersion("missing".to_owned())),
    };
    if expect.is_some_and(|e| e != version) {
        return Err(WireError::UnsupportedVersion(format!("{} in the PAYMENT-REQUIRED header", version.number())));
    }
    let entries = obj
        .get("accepts")
        .ok_or(WireError::Malformed("accepts is missing"))?
        .as_array()
        .ok_or(WireError::Malformed("accepts is not an array"))?;
    if entries.is_empty() {
        return Err(WireError::EmptyAccepts);
    }
    if entries.len() > MAX_ACCEPTS {
        return Err(WireError::TooManyRequirements(entries.len()));
    }

    let field = version.amount_field();
    if let Some(index) = entries.iter().position(|e| e.get(field).is_some_and(Value::is_number)) {
        return Err(WireError::InexactAmount { index, field });
    }
    let mut accepts = Vec::new();
    let mut skipped = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        match Requirement::from_json(version, index, entry) {
            Ok(requirement) => accepts.push(requirement),
            Err(error) => skipped.push(SkippedRequirement { index, error }),
        }
    }
    if accepts.is_empty() && skipped.iter().all(|s| !s.error.is_unsupported()) {
        let reasons = skipped.iter().map(|s| format!("#{}: {}", s.index, s.error)).collect::<Vec<_>>().join("; ");
        return Err(WireError::NoValidRequirement(reasons));
    }

    let resource = match version {
        X402Version::V2 => obj.get("resource").filter(|v| !v.is_null()).cloned(),
        X402Version::V1 => None,
    };
    Ok(PaymentRequired {
        version,
        accepts,
        skipped,
        raw_accepts: entries.clone(),
        resource,
        error: reason_field(obj, "error"),
        extensions: obj.get("extensions").filter(|v| v.is_object()).cloned(),
    })
}
