//! The x402 wire format, both protocol versions: reading a `402 Payment Required`, building the
//! payment header of the paid retry, reading the settlement header and the reasons of a refusal.
//!
//! | | v2 | v1 |
//! |---|---|---|
//! | requirements (402) | `PAYMENT-REQUIRED` header, base64 JSON | JSON body |
//! | payment (retry) | `PAYMENT-SIGNATURE` | `X-PAYMENT` |
//! | settlement | `PAYMENT-RESPONSE` | `X-PAYMENT-RESPONSE` |
//!
//! Everything read here comes from an untrusted upstream. Invariants:
//! - Parsing never panics; every failure is a [`WireError`] (whole message) or an
//!   [`EntryError`] (one `accepts` entry). Inputs are bounded: header ≤ [`MAX_HEADER_BYTES`],
//!   v1 body ≤ [`MAX_BODY_BYTES`], ≤ [`MAX_ACCEPTS`] entries, reason strings ≤
//!   [`MAX_REASON_BYTES`]; serde_json bounds nesting depth.
//! - Amounts are `U256` parsed from canonical decimal strings (no sign, no leading zeros, no
//!   exponent, ≤ 2^256−1); addresses must be `0x` + 40 hex digits, with a valid EIP-55
//!   checksum when mixed-case. Nothing is ever a float.
//! - Entry policy: an entry that fails to parse is *skipped* (kept out of selection, listed in
//!   [`PaymentRequired::skipped`]) as long as the message itself is well-formed. Skipped entries
//!   are classed as *unsupported* (a non-EVM network or a scheme other than `exact` that we do
//!   not know how to read) or *malformed*. A 402 whose entries are all malformed is an error
//!   ([`WireError::NoValidRequirement`]): the upstream is broken. A 402 with only unsupported
//!   entries parses, with empty [`PaymentRequired::accepts`]: the upstream is fine, we just
//!   cannot pay it (selection then explains why).
//! - Each [`Requirement`] keeps its JSON object verbatim ([`Requirement::raw`]); a v2 payment
//!   copies it as `accepted`, and a v1 payment echoes the original network string.
//!   "Verbatim" means the same JSON value (serde_json may reorder keys; numbers beyond u64 go
//!   through f64 exactly as in the official JavaScript clients).

use alloy::primitives::{Address, B256, U256};
use base64::Engine as _;
use base64::alphabet;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde::{Serialize, Serializer};
use serde_json::{Map, Value, json};

use super::network::{Network, NetworkError};
use super::sign::SignedAuthorization;

/// v2: requirements sent by the upstream with its 402.
pub const PAYMENT_REQUIRED_HEADER: &str = "payment-required";
/// v2: the payment sent with the retry.
pub const PAYMENT_SIGNATURE_HEADER: &str = "payment-signature";
/// v2: the settlement result sent by the upstream with its answer.
pub const PAYMENT_RESPONSE_HEADER: &str = "payment-response";
/// v1: the payment sent with the retry.
pub const X_PAYMENT_HEADER: &str = "x-payment";
/// v1: the settlement result sent by the upstream with its answer.
pub const X_PAYMENT_RESPONSE_HEADER: &str = "x-payment-response";
/// Every x402 header, lowercase: an agent must not be able to inject any of them upstream.
pub const PAYMENT_HEADERS: [&str; 5] = [
    PAYMENT_REQUIRED_HEADER,
    PAYMENT_SIGNATURE_HEADER,
    PAYMENT_RESPONSE_HEADER,
    X_PAYMENT_HEADER,
    X_PAYMENT_RESPONSE_HEADER,
];

/// Largest x402 header value read (base64 text, before decoding).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest v1 402 body read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most `accepts` entries read; a longer list is refused as hostile.
pub const MAX_ACCEPTS: usize = 64;
/// Longest reason string (in UTF-8 bytes) kept from an upstream (`error`, `invalidReason`,
/// `errorReason`); longer ones are cut at a character boundary.
pub const MAX_REASON_BYTES: usize = 512;
/// Longest decimal amount: 2^256 − 1 has 78 digits.
const MAX_DECIMAL_DIGITS: usize = 78;

/// Name of the `payment-identifier` extension (x402 v2 extensions).
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";
const PAYMENT_ID_MIN_LEN: usize = 16;
const PAYMENT_ID_MAX_LEN: usize = 128;

/// Standard alphabet, padding optional (the official clients pad; be lenient on receipt).
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// URL-safe alphabet, padding optional: tolerated when `-` or `_` show up.
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// x402 protocol version of an exchange. The payment must use the version of the 402.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum X402Version {
    /// Legacy: requirements in the body, `X-PAYMENT`, v1 network names.
    V1,
    /// Current: base64 JSON headers, CAIP-2 networks.
    V2,
}

impl X402Version {
    /// The `x402Version` number on the wire.
    pub fn number(self) -> u8 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }

    /// The version with this `x402Version` number.
    pub fn from_number(n: u64) -> Option<Self> {
        match n {
            1 => Some(Self::V1),
            2 => Some(Self::V2),
            _ => None,
        }
    }

    /// Name of the request header that carries the payment (lowercase).
    pub fn payment_header(self) -> &'static str {
        match self {
            Self::V1 => X_PAYMENT_HEADER,
            Self::V2 => PAYMENT_SIGNATURE_HEADER,
        }
    }

    /// Name of the response header that carries the settlement (lowercase).
    pub fn settlement_header(self) -> &'static str {
        match self {
            Self::V1 => X_PAYMENT_RESPONSE_HEADER,
            Self::V2 => PAYMENT_RESPONSE_HEADER,
        }
    }

    /// JSON field of a requirement that holds the amount.
    fn amount_field(self) -> &'static str {
        match self {
            Self::V1 => "maxAmountRequired",
            Self::V2 => "amount",
        }
    }
}

impl Serialize for X402Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.number())
    }
}

/// Why an x402 message could not be read or written. Messages never quote the input at length.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Asked to parse requirements from a response that is not a 402.
    #[error("expected HTTP 402, got {0}")]
    NotPaymentRequired(u16),
    /// A 402 without x402 requirements (no `PAYMENT-REQUIRED`, body not an x402 message).
    #[error("402 response carries no x402 payment requirements")]
    NoRequirements,
    /// Header value over [`MAX_HEADER_BYTES`].
    #[error("{header} header is too large ({len} bytes, limit {limit})")]
    HeaderTooLarge {
        /// Header name.
        header: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The same x402 header twice, which could carry two different messages.
    #[error("{0} header appears more than once")]
    DuplicateHeader(&'static str),
    /// Header value is not base64.
    #[error("{0} header is not valid base64")]
    BadBase64(&'static str),
    /// Not valid JSON.
    #[error("{what} is not valid JSON: {source}")]
    BadJson {
        /// What was being read.
        what: &'static str,
        /// serde_json's reason (position only, no content).
        #[source]
        source: serde_json::Error,
    },
    /// v1 402 body over [`MAX_BODY_BYTES`].
    #[error("402 body is too large ({len} bytes, limit {limit})")]
    BodyTooLarge {
        /// Body length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// `x402Version` missing or not 1/2 (or 1 inside the v2 header).
    #[error("unsupported x402Version {0}")]
    UnsupportedVersion(String),
    /// Structurally wrong message (e.g. `accepts` not an array).
    #[error("malformed x402 message: {0}")]
    Malformed(&'static str),
    /// `accepts` is an empty array.
    #[error("402 offers no payment options (empty accepts)")]
    EmptyAccepts,
    /// `accepts` longer than [`MAX_ACCEPTS`].
    #[error("402 offers {0} payment options, more than the {MAX_ACCEPTS} accepted")]
    TooManyRequirements(usize),
    /// Every entry of `accepts` is malformed.
    #[error("no payment option in the 402 is well-formed: {0}")]
    NoValidRequirement(String),
    /// The signed authorization does not match the requirement it is sent for.
    #[error("signed authorization does not match the selected requirement: {0}")]
    AuthorizationMismatch(&'static str),
    /// A payment-identifier id outside 16–128 chars of `[A-Za-z0-9_-]`.
    #[error("payment identifier must be 16-128 characters of [A-Za-z0-9_-]")]
    InvalidPaymentId,
    /// Could not turn an outgoing payload into a header value.
    #[error("could not encode the payment header: {0}")]
    Encode(String),
}

/// Why one `accepts` entry was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Entry is not a JSON object.
    #[error("entry is not a JSON object")]
    NotObject,
    /// A required string field is missing or not a string.
    #[error("missing or non-string field `{0}`")]
    MissingField(&'static str),
    /// Amount is not a canonical decimal integer in U256 range.
    #[error("`{0}` is not a decimal integer between 0 and 2^256-1")]
    BadAmount(&'static str),
    /// Not an EVM address (or a mixed-case address with a wrong checksum).
    #[error("`{0}` is not an EVM address")]
    BadAddress(&'static str),
    /// `maxTimeoutSeconds` missing or not a non-negative integer.
    #[error("`maxTimeoutSeconds` is missing or not a non-negative integer")]
    BadTimeout,
    /// `extra` present but not an object.
    #[error("`extra` is not a JSON object")]
    BadExtra,
    /// Network not usable (non-EVM, unknown name, malformed id).
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A scheme other than `exact` whose fields we cannot read.
    #[error("unsupported scheme {0:?}")]
    UnsupportedScheme(String),
}

impl EntryError {
    /// True for an entry that is well-formed as far as we can tell but names a network or
    /// scheme this router does not pay with; false for a malformed entry.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Self::Network(e) => e.is_unsupported_family(),
            Self::UnsupportedScheme(_) => true,
            _ => false,
        }
    }
}

/// An `accepts` entry that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRequirement {
    /// Position in the upstream's `accepts` array.
    pub index: usize,
    /// Why it was skipped.
    pub error: EntryError,
}

/// One payment option offered by the upstream, typed, plus its JSON verbatim.
///
/// Built only by parsing ([`Requirement::from_json`]), so the typed fields and [`Self::raw`]
/// always agree: what is selected, signed and sent is the same option.
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    index: usize,
    scheme: String,
    network: Network,
    network_raw: String,
    amount: U256,
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
        let amount = parse_decimal_u256(str_field(obj, amount_field)?).ok_or(EntryError::BadAmount(amount_field))?;
        let asset = parse_address(str_field(obj, "asset")?).ok_or(EntryError::BadAddress("asset"))?;
        let pay_to = parse_address(str_field(obj, "payTo")?).ok_or(EntryError::BadAddress("payTo"))?;
        let max_timeout_seconds = obj.get("maxTimeoutSeconds").and_then(Value::as_u64).ok_or(EntryError::BadTimeout)?;
        let extra = match obj.get("extra") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(map.clone()),
            Some(_) => return Err(EntryError::BadExtra),
        };
        Ok(Self {
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
    pub fn amount(&self) -> U256 {
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

/// The JSON payment payload for `requirement`, ready to be stored in the payments ledger and
/// sent (again, verbatim) with [`encode_payment_header`].
///
/// - v2: `{x402Version: 2, payload: {authorization, signature}, accepted: <the entry verbatim>,
///   resource: <the 402's resource, if any>, extensions: <if given and non-empty>}`.
/// - v1: `{x402Version: 1, scheme, network: <the original v1 name>, payload: {signature,
///   authorization}}`; `resource` and `extensions` do not exist in v1 and are ignored.
///
/// # Errors
/// [`WireError::AuthorizationMismatch`] when `signed` is not an authorization for exactly
/// this requirement (network, asset, recipient, amount): a guard that the option signed is the
/// option sent.
pub fn payment_payload(
    version: X402Version,
    requirement: &Requirement,
    resource: Option<&Value>,
    signed: &SignedAuthorization,
    extensions: Option<&Value>,
) -> Result<Value, WireError> {
    check_matches(requirement, signed)?;
    let payload = signed.payload_json();
    let message = match version {
        X402Version::V2 => {
            let mut message = Map::new();
            message.insert("x402Version".to_owned(), json!(2));
            message.insert("payload".to_owned(), payload);
            if let Some(resource) = resource.filter(|r| !r.is_null()) {
                message.insert("resource".to_owned(), resource.clone());
            }
            message.insert("accepted".to_owned(), requirement.raw_json());
            if let Some(ext) = extensions.filter(|e| e.as_object().is_some_and(|m| !m.is_empty())) {
                message.insert("extensions".to_owned(), ext.clone());
            }
            Value::Object(message)
        }
        X402Version::V1 => json!({
            "x402Version": 1,
            "scheme": requirement.scheme(),
            "network": requirement.network_raw(),
            "payload": payload,
        }),
    };
    Ok(message)
}

fn check_matches(requirement: &Requirement, signed: &SignedAuthorization) -> Result<(), WireError> {
    let auth = signed.authorization();
    if signed.network() != requirement.network() {
        return Err(WireError::AuthorizationMismatch("network"));
    }
    if signed.asset() != requirement.asset() {
        return Err(WireError::AuthorizationMismatch("asset"));
    }
    if auth.to != requirement.pay_to() {
        return Err(WireError::AuthorizationMismatch("payTo"));
    }
    if auth.value != requirement.amount() {
        return Err(WireError::AuthorizationMismatch("amount"));
    }
    Ok(())
}

/// Encodes a payment payload (from [`payment_payload`]) as the header of its version:
/// `(PAYMENT-SIGNATURE | X-PAYMENT, standard padded base64 of the JSON)`.
///
/// # Errors
/// [`WireError::Encode`] if the payload is over [`MAX_HEADER_BYTES`] once encoded or cannot
/// be serialized.
pub fn encode_payment_header(version: X402Version, payload: &Value) -> Result<(&'static str, HeaderValue), WireError> {
    let bytes = serde_json::to_vec(payload).map_err(|e| WireError::Encode(e.to_string()))?;
    let encoded = STANDARD.encode(bytes);
    if encoded.len() > MAX_HEADER_BYTES {
        return Err(WireError::Encode(format!("header would be {} bytes, limit {MAX_HEADER_BYTES}", encoded.len())));
    }
    let value = HeaderValue::from_str(&encoded).map_err(|e| WireError::Encode(e.to_string()))?;
    Ok((version.payment_header(), value))
}

/// Decodes a payment header value (either version) back to its JSON; the inverse of
/// [`encode_payment_header`], for audits and tests.
///
/// # Errors
/// [`WireError`] for oversized, non-base64 or non-JSON input.
pub fn decode_payment_header(value: &HeaderValue) -> Result<Value, WireError> {
    decode_json_header(PAYMENT_SIGNATURE_HEADER, value)
}

/// The `extensions` object to send with a v2 payment, given the 402's `extensions` and the id
/// the caller derived for this payment ([`crate::x402::nonce::payment_identifier_id`]).
///
/// As the v2 spec and the official clients do, every extension the upstream declared is
/// echoed (the client "must include at least the info received"); when `payment-identifier`
/// is declared, `id` is added to its `info` (an `id` already there is left untouched: the
/// spec forbids overwriting server info). Returns `None` when the upstream declared no
/// extensions, so nothing is sent.
///
/// # Errors
/// [`WireError::InvalidPaymentId`] when `id` breaks the extension's 16–128 `[A-Za-z0-9_-]` rule
/// and the upstream declared `payment-identifier`.
pub fn payment_extensions(declared: Option<&Value>, id: &str) -> Result<Option<Value>, WireError> {
    let Some(declared) = declared.and_then(Value::as_object).filter(|m| !m.is_empty()) else {
        return Ok(None);
    };
    let mut echoed = declared.clone();
    if let Some(Value::Object(decl)) = echoed.get_mut(PAYMENT_IDENTIFIER) {
        let info = decl.entry("info").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(info) = info {
            if !is_valid_payment_id(id) {
                return Err(WireError::InvalidPaymentId);
            }
            info.entry("id").or_insert_with(|| Value::String(id.to_owned()));
        }
    }
    Ok(Some(Value::Object(echoed)))
}

fn is_valid_payment_id(id: &str) -> bool {
    (PAYMENT_ID_MIN_LEN..=PAYMENT_ID_MAX_LEN).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

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
}

impl SettlementResponse {
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

/// Reads one x402 header as base64 JSON. `Ok(None)` when absent.
fn header_json(headers: &HeaderMap, name: &'static str) -> Result<Option<Value>, WireError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(WireError::DuplicateHeader(name));
    }
    decode_json_header(name, value).map(Some)
}

fn decode_json_header(name: &'static str, value: &HeaderValue) -> Result<Value, WireError> {
    let raw = value.as_bytes();
    if raw.len() > MAX_HEADER_BYTES {
        return Err(WireError::HeaderTooLarge { header: name, len: raw.len(), limit: MAX_HEADER_BYTES });
    }
    let compact: Vec<u8> = raw.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    let engine = if compact.iter().any(|&b| b == b'-' || b == b'_') { &URL_SAFE_LENIENT } else { &STANDARD_LENIENT };
    let json = engine.decode(&compact).map_err(|_| WireError::BadBase64(name))?;
    serde_json::from_slice(&json).map_err(|source| WireError::BadJson { what: name, source })
}

fn str_field<'a>(obj: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, EntryError> {
    obj.get(field).and_then(Value::as_str).ok_or(EntryError::MissingField(field))
}

/// A string field of an upstream message, bounded; `None` if absent, empty or not a string.
fn reason_field(obj: &Map<String, Value>, field: &str) -> Option<String> {
    obj.get(field).and_then(Value::as_str).filter(|s| !s.is_empty()).map(|s| truncate(s, MAX_REASON_BYTES))
}

/// Parses a canonical decimal integer (`0` or `[1-9][0-9]*`, at most 2^256−1).
pub(crate) fn parse_decimal_u256(s: &str) -> Option<U256> {
    let canonical = !s.is_empty()
        && s.len() <= MAX_DECIMAL_DIGITS
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    if !canonical {
        return None;
    }
    U256::from_str_radix(s, 10).ok()
}

/// Parses `0x` + 40 hex digits; a mixed-case address must carry a valid EIP-55 checksum.
pub(crate) fn parse_address(s: &str) -> Option<Address> {
    let hex = s.strip_prefix("0x")?;
    if hex.len() != 40 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let has_upper = hex.bytes().any(|b| b.is_ascii_uppercase());
    let has_lower = hex.bytes().any(|b| b.is_ascii_lowercase());
    if has_upper && has_lower { Address::parse_checksummed(s, None).ok() } else { s.parse().ok() }
}

/// Parses `0x` + 64 hex digits.
fn parse_b256(s: &str) -> Option<B256> {
    let hex = s.strip_prefix("0x")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    s.parse().ok()
}

/// Cuts `s` to at most `max` bytes at a character boundary.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use alloy::primitives::address;
    use alloy::signers::local::PrivateKeySigner;

    use super::*;
    use crate::x402::sign::sign_authorization;

    /// PROTOCOL.md §3, the decoded `PAYMENT-REQUIRED` of `GET /v2/weather`.
    const V2_REQUIRED: &str = r#"{"x402Version":2,"error":"Payment required",
 "resource":{"url":"http://127.0.0.1:4021/v2/weather","description":"Weather report (x402 v2)","mimeType":"application/json"},
 "accepts":[{"scheme":"exact","network":"eip155:84532","amount":"10000",
   "asset":"0x5FbDB2315678afecb367f032d93F642f64180aa3","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
   "maxTimeoutSeconds":300,"extra":{"name":"USD Coin","version":"2"}}]}"#;

    /// PROTOCOL.md §4, the 402 body of `GET /v1/weather`.
    const V1_BODY: &str = r#"{"x402Version":1,"error":"X-PAYMENT header is required",
 "accepts":[{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000",
   "resource":"http://127.0.0.1:4021/v1/weather","description":"Weather report (x402 v1)","mimeType":"application/json",
   "payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,
   "asset":"0x5FbDB2315678afecb367f032d93F642f64180aa3",
   "outputSchema":{"input":{"type":"http","method":"GET","discoverable":true}},
   "extra":{"name":"USD Coin","version":"2"}}]}"#;

    /// PROTOCOL.md §3 and §4, settlement headers exactly as captured.
    const V2_SETTLEMENT: &str = "eyJzdWNjZXNzIjp0cnVlLCJwYXllciI6IjB4NzA5OTc5NzBDNTE4MTJkYzNBMDEwQzdkMDFiNTBlMGQxN2RjNzlDOCIsInRyYW5zYWN0aW9uIjoiMHhlNjg2ZGU5MTQzNjc0ZGJlYTlkYmM5OTcwMTdmZWM2NGYzZDdkZTA3NjdmNGM2YjM3Y2EzZjIzMTcwZWQ5NTE1IiwibmV0d29yayI6ImVpcDE1NTo4NDUzMiJ9";
    const V1_SETTLEMENT: &str = "eyJzdWNjZXNzIjp0cnVlLCJ0cmFuc2FjdGlvbiI6IjB4N2EwYTg4OWNiYWNkZGQxOWYxNzQ2ODc1MjMxMzhmZWU1NDI5MDMwNjlmM2I0MDI2OTZkZWNlODNjNDYwMTEzMyIsIm5ldHdvcmsiOiJiYXNlLXNlcG9saWEiLCJwYXllciI6IjB4NzA5OTc5NzBDNTE4MTJkYzNBMDEwQzdkMDFiNTBlMGQxN2RjNzlDOCJ9";

    /// anvil #1, a public test key.
    const PAYER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

    fn b64(s: &str) -> String {
        STANDARD.encode(s.as_bytes())
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    fn v2_402(message: &str) -> Result<PaymentRequired, WireError> {
        parse_payment_required(StatusCode::PAYMENT_REQUIRED, &headers(&[("PAYMENT-REQUIRED", &b64(message))]), b"{}")
    }

    fn v1_402(body: &str) -> Result<PaymentRequired, WireError> {
        parse_payment_required(StatusCode::PAYMENT_REQUIRED, &HeaderMap::new(), body.as_bytes())
    }

    fn v2_with_entries(entries: Value) -> Result<PaymentRequired, WireError> {
        v2_402(&json!({"x402Version": 2, "resource": {"url": "http://x/"}, "accepts": entries}).to_string())
    }

    fn v2_entry(amount: &str) -> Value {
        json!({"scheme": "exact", "network": "eip155:84532", "amount": amount,
               "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
               "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
               "maxTimeoutSeconds": 300, "extra": {"name": "USD Coin", "version": "2"}})
    }

    fn signer() -> PrivateKeySigner {
        PAYER_KEY.parse().unwrap()
    }

    #[test]
    fn parses_the_captured_v2_402() {
        let pr = v2_402(V2_REQUIRED).unwrap();
        assert_eq!(pr.version, X402Version::V2);
        assert_eq!(pr.error.as_deref(), Some("Payment required"));
        assert_eq!(pr.resource.as_ref().unwrap()["url"], "http://127.0.0.1:4021/v2/weather");
        assert!(pr.skipped.is_empty());
        assert_eq!(pr.accepts.len(), 1);
        let r = &pr.accepts[0];
        assert_eq!(r.index(), 0);
        assert_eq!(r.scheme(), "exact");
        assert_eq!(r.network(), Network::BASE_SEPOLIA);
        assert_eq!(r.network_raw(), "eip155:84532");
        assert_eq!(r.amount(), U256::from(10_000u64));
        assert_eq!(r.asset(), address!("0x5FbDB2315678afecb367f032d93F642f64180aa3"));
        assert_eq!(r.pay_to(), address!("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"));
        assert_eq!(r.max_timeout_seconds(), 300);
        assert_eq!(r.extra_name(), Some("USD Coin"));
        assert_eq!(r.extra_version(), Some("2"));
        let original: Value = serde_json::from_str(V2_REQUIRED).unwrap();
        assert_eq!(r.raw_json(), original["accepts"][0]);
        assert_eq!(pr.raw_accepts, original["accepts"].as_array().unwrap().clone());
    }

    #[test]
    fn parses_the_captured_v1_402() {
        let pr = v1_402(V1_BODY).unwrap();
        assert_eq!(pr.version, X402Version::V1);
        assert_eq!(pr.error.as_deref(), Some("X-PAYMENT header is required"));
        assert_eq!(pr.resource, None);
        let r = &pr.accepts[0];
        assert_eq!(r.network(), Network::BASE_SEPOLIA);
        assert_eq!(r.network_raw(), "base-sepolia");
        assert_eq!(r.amount(), U256::from(10_000u64));
        assert_eq!(r.max_timeout_seconds(), 60);
        assert_eq!(r.raw()["outputSchema"]["input"]["method"], "GET");
    }

    #[test]
    fn base64_is_read_leniently() {
        let encoded = b64(V2_REQUIRED);
        let unpadded = encoded.trim_end_matches('=').to_owned();
        let mut spaced = String::new();
        for (i, c) in encoded.chars().enumerate() {
            if i > 0 && i % 76 == 0 {
                spaced.push(' ');
            }
            spaced.push(c);
        }
        let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(V2_REQUIRED);
        for value in [unpadded, spaced, format!("  {encoded}  "), url_safe] {
            let pr =
                parse_payment_required(StatusCode::PAYMENT_REQUIRED, &headers(&[("payment-required", &value)]), b"")
                    .unwrap();
            assert_eq!(pr.accepts.len(), 1);
        }
    }

    #[test]
    fn only_a_402_is_read() {
        let err = parse_payment_required(StatusCode::OK, &HeaderMap::new(), V1_BODY.as_bytes());
        assert!(matches!(err, Err(WireError::NotPaymentRequired(200))));
    }

    #[test]
    fn a_402_without_x402_content_is_an_error() {
        for body in ["", "<html>pay up</html>", "{}", "[]", r#"{"error":"no"}"#] {
            assert!(matches!(v1_402(body), Err(WireError::NoRequirements)), "{body:?}");
        }
    }

    #[test]
    fn hostile_headers_are_typed_errors() {
        let too_big = "A".repeat(MAX_HEADER_BYTES + 1);
        type Expect = fn(&WireError) -> bool;
        let cases: Vec<(String, Expect)> = vec![
            ("!!!not base64!!!".to_owned(), |e| matches!(e, WireError::BadBase64(_))),
            (b64("not json"), |e| matches!(e, WireError::BadJson { .. })),
            (b64("[1,2]"), |e| matches!(e, WireError::Malformed(_))),
            (b64(r#"{"x402Version":2}"#), |e| matches!(e, WireError::Malformed(_))),
            (b64(r#"{"x402Version":2,"accepts":{}}"#), |e| matches!(e, WireError::Malformed(_))),
            (b64(r#"{"x402Version":2,"accepts":[]}"#), |e| matches!(e, WireError::EmptyAccepts)),
            (b64(r#"{"x402Version":3,"accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
            (b64(r#"{"x402Version":"2","accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
            (b64(r#"{"accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
            (b64(V1_BODY), |e| matches!(e, WireError::UnsupportedVersion(_))),
            (too_big, |e| matches!(e, WireError::HeaderTooLarge { .. })),
        ];
        for (value, expected) in cases {
            let err = parse_payment_required(
                StatusCode::PAYMENT_REQUIRED,
                &headers(&[("payment-required", &value)]),
                V1_BODY.as_bytes(),
            )
            .unwrap_err();
            assert!(expected(&err), "{err:?}");
        }
    }

    #[test]
    fn non_ascii_and_duplicate_headers_are_errors() {
        let mut map = HeaderMap::new();
        map.insert("payment-required", HeaderValue::from_bytes(b"eyJ\xff\xfe").unwrap());
        assert!(matches!(
            parse_payment_required(StatusCode::PAYMENT_REQUIRED, &map, b""),
            Err(WireError::BadBase64(_))
        ));
        let value = b64(V2_REQUIRED);
        let map = headers(&[("payment-required", &value), ("payment-required", &value)]);
        assert!(matches!(
            parse_payment_required(StatusCode::PAYMENT_REQUIRED, &map, b""),
            Err(WireError::DuplicateHeader(_))
        ));
    }

    #[test]
    fn deeply_nested_json_does_not_overflow_the_stack() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(v2_402(&deep).is_err());
        let body = format!(r#"{{"x402Version":1,"accepts":{}{}}}"#, "[".repeat(50_000), "]".repeat(50_000));
        assert!(v1_402(&body).is_err());
    }

    #[test]
    fn oversized_bodies_and_lists_are_refused() {
        let big = format!(r#"{{"x402Version":1,"pad":"{}","accepts":[]}}"#, "x".repeat(MAX_BODY_BYTES));
        assert!(matches!(v1_402(&big), Err(WireError::BodyTooLarge { .. })));
        let many = Value::Array(vec![v2_entry("1"); MAX_ACCEPTS + 1]);
        assert!(matches!(v2_with_entries(many), Err(WireError::TooManyRequirements(65))));
        let max = Value::Array(vec![v2_entry("1"); MAX_ACCEPTS]);
        assert_eq!(v2_with_entries(max).unwrap().accepts.len(), MAX_ACCEPTS);
    }

    #[test]
    fn amounts_must_be_canonical_decimal_u256() {
        let max = U256::MAX.to_string();
        assert_eq!(v2_with_entries(json!([v2_entry(&max)])).unwrap().accepts[0].amount(), U256::MAX);
        assert!(v2_with_entries(json!([v2_entry("0")])).unwrap().accepts[0].amount().is_zero());
        let over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        for bad in ["-1", "+1", "1.5", "1e6", " 1", "1 ", "01", "0x10", "", "١٢", over, &"9".repeat(79)] {
            let err = v2_with_entries(json!([v2_entry(bad)])).unwrap_err();
            assert!(matches!(&err, WireError::NoValidRequirement(m) if m.contains("amount")), "{bad:?}: {err}");
        }
        let mut numeric = v2_entry("1");
        numeric["amount"] = json!(10000);
        assert!(v2_with_entries(json!([numeric])).is_err());
    }

    #[test]
    fn malformed_fields_are_reported_per_entry() {
        let mutate = |field: &str, value: Value| {
            let mut e = v2_entry("10");
            e[field] = value;
            e
        };
        let remove = |field: &str| {
            let mut e = v2_entry("10");
            e.as_object_mut().unwrap().remove(field);
            e
        };
        let bad = [
            mutate("asset", json!("0x5FbDB2315678afecb367f032d93F642f64180aa")),
            mutate("asset", json!("5FbDB2315678afecb367f032d93F642f64180aa3")),
            mutate("asset", json!("0x5fbDB2315678afecb367f032d93F642f64180aa3")), // bad checksum
            mutate("payTo", json!("0xZZbDB2315678afecb367f032d93F642f64180aa3")),
            mutate("payTo", json!(12)),
            mutate("maxTimeoutSeconds", json!(-1)),
            mutate("maxTimeoutSeconds", json!(1.5)),
            mutate("maxTimeoutSeconds", json!("300")),
            mutate("extra", json!("USD Coin")),
            mutate("network", json!("eip155:0")),
            mutate("network", json!("")),
            remove("payTo"),
            remove("network"),
            remove("scheme"),
            json!("not an object"),
            json!(null),
        ];
        for entry in bad {
            let err = v2_with_entries(json!([entry.clone()])).unwrap_err();
            assert!(matches!(err, WireError::NoValidRequirement(_)), "{entry}: {err}");
        }
        // All-lowercase and all-uppercase addresses carry no checksum and are fine.
        let lower = mutate("asset", json!("0x5fbdb2315678afecb367f032d93f642f64180aa3"));
        assert!(v2_with_entries(json!([lower])).is_ok());
    }

    #[test]
    fn unparseable_entries_are_skipped_when_others_parse() {
        let pr = v2_with_entries(json!([v2_entry("-5"), v2_entry("7")])).unwrap();
        assert_eq!(pr.accepts.len(), 1);
        assert_eq!(pr.accepts[0].index(), 1);
        assert_eq!(pr.skipped.len(), 1);
        assert_eq!(pr.skipped[0].index, 0);
        assert_eq!(pr.skipped[0].error, EntryError::BadAmount("amount"));
        assert!(!pr.skipped[0].error.is_unsupported());
        assert_eq!(pr.raw_accepts.len(), 2);
    }

    #[test]
    fn non_evm_and_unknown_scheme_entries_are_unsupported_not_broken() {
        let solana = json!({"scheme": "exact", "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
            "amount": "10000", "asset": "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
            "payTo": "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin", "maxTimeoutSeconds": 60});
        let pr = v2_with_entries(json!([solana])).unwrap();
        assert!(pr.accepts.is_empty());
        assert!(pr.skipped[0].error.is_unsupported());

        let odd_scheme = json!({"scheme": "streaming", "network": "eip155:84532", "rate": "1/s"});
        let pr = v2_with_entries(json!([odd_scheme])).unwrap();
        assert_eq!(pr.skipped[0].error, EntryError::UnsupportedScheme("streaming".into()));

        // A well-formed non-exact EVM entry parses; selection refuses it later.
        let mut upto = v2_entry("5");
        upto["scheme"] = json!("upto");
        assert_eq!(v2_with_entries(json!([upto])).unwrap().accepts[0].scheme(), "upto");

        // A v1 name outside the EVM table (solana-devnet) is unsupported, not malformed.
        let v1 = json!({"x402Version": 1, "accepts": [{"scheme": "exact", "network": "solana-devnet",
            "maxAmountRequired": "1", "asset": "x", "payTo": "y", "maxTimeoutSeconds": 60}]});
        assert!(v1_402(&v1.to_string()).unwrap().accepts.is_empty());
    }

    #[test]
    fn v2_in_the_body_is_accepted_when_no_header() {
        let pr = v1_402(V2_REQUIRED).unwrap();
        assert_eq!(pr.version, X402Version::V2);
        assert_eq!(pr.accepts.len(), 1);
    }

    #[test]
    fn builds_a_v2_payment_header_like_the_official_client() {
        let pr = v2_402(V2_REQUIRED).unwrap();
        let req = &pr.accepts[0];
        let nonce = B256::repeat_byte(0x11);
        let signed = sign_authorization(&signer(), req, nonce, 1_796_203_347).unwrap();
        let payload = payment_payload(pr.version, req, pr.resource.as_ref(), &signed, None).unwrap();
        let (name, value) = encode_payment_header(pr.version, &payload).unwrap();
        assert_eq!(name, "payment-signature");
        // Standard padded base64 of JSON.
        let text = value.to_str().unwrap();
        assert_eq!(text.len() % 4, 0);
        assert!(!text.contains('-') && !text.contains('_'));

        let sent = decode_payment_header(&value).unwrap();
        assert_eq!(sent, payload);
        let original: Value = serde_json::from_str(V2_REQUIRED).unwrap();
        assert_eq!(sent["x402Version"], 2);
        assert_eq!(sent["accepted"], original["accepts"][0]);
        assert_eq!(sent["resource"], original["resource"]);
        assert!(sent.get("extensions").is_none());
        let auth = &sent["payload"]["authorization"];
        assert_eq!(auth["from"], "0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        assert_eq!(auth["to"], "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC");
        assert_eq!(auth["value"], "10000");
        assert_eq!(auth["validAfter"], "1796202747");
        assert_eq!(auth["validBefore"], "1796203647");
        assert_eq!(auth["nonce"], format!("0x{}", "11".repeat(32)));
        let sig = sent["payload"]["signature"].as_str().unwrap();
        assert_eq!(sig.len(), 132);
        assert!(sig.ends_with("1b") || sig.ends_with("1c"));
        let keys: Vec<_> = sent.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["accepted", "payload", "resource", "x402Version"]);
    }

    #[test]
    fn builds_a_v1_payment_header_echoing_the_original_network_name() {
        let body = V1_BODY.replace("\"base-sepolia\"", "\"Base-Sepolia\"");
        let pr = v1_402(&body).unwrap();
        let req = &pr.accepts[0];
        let signed = sign_authorization(&signer(), req, B256::ZERO, 1_796_202_752 + 600).unwrap();
        let payload = payment_payload(pr.version, req, None, &signed, Some(&json!({"x": {}}))).unwrap();
        let (name, value) = encode_payment_header(pr.version, &payload).unwrap();
        assert_eq!(name, "x-payment");
        let sent = decode_payment_header(&value).unwrap();
        assert_eq!(sent["x402Version"], 1);
        assert_eq!(sent["scheme"], "exact");
        assert_eq!(sent["network"], "Base-Sepolia");
        assert_eq!(sent["payload"]["authorization"]["value"], "10000");
        assert_eq!(sent["payload"]["authorization"]["validAfter"], "1796202752");
        assert_eq!(sent["payload"]["authorization"]["validBefore"], "1796203412");
        let mut keys: Vec<_> = sent.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["network", "payload", "scheme", "x402Version"]);
    }

    #[test]
    fn refuses_to_send_an_authorization_for_another_option() {
        let pr = v2_with_entries(json!([v2_entry("10"), v2_entry("20")])).unwrap();
        let signed = sign_authorization(&signer(), &pr.accepts[0], B256::ZERO, 1_800_000_000).unwrap();
        let err = payment_payload(pr.version, &pr.accepts[1], None, &signed, None).unwrap_err();
        assert!(matches!(err, WireError::AuthorizationMismatch("amount")));
    }

    #[test]
    fn payment_identifier_is_added_to_the_echoed_extensions() {
        let declared = json!({
            "payment-identifier": {
                "info": {"required": true},
                "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                           "properties": {"id": {"type": "string", "minLength": 16, "maxLength": 128}}}
            },
            "bazaar": {"info": {"x": 1}, "schema": {}}
        });
        let message = json!({"x402Version": 2, "accepts": [v2_entry("1")], "extensions": declared});
        let pr = v2_402(&message.to_string()).unwrap();
        assert!(pr.advertises_payment_identifier());
        assert!(pr.requires_payment_identifier());

        let id = "pay_0123456789abcdef0123456789abcdef";
        let ext = payment_extensions(pr.extensions.as_ref(), id).unwrap().unwrap();
        assert_eq!(ext["payment-identifier"]["info"]["id"], id);
        assert_eq!(ext["payment-identifier"]["info"]["required"], true);
        assert_eq!(ext["payment-identifier"]["schema"], declared["payment-identifier"]["schema"]);
        assert_eq!(ext["bazaar"], declared["bazaar"]);

        let signed = sign_authorization(&signer(), &pr.accepts[0], B256::ZERO, 1_800_000_000).unwrap();
        let payload = payment_payload(pr.version, &pr.accepts[0], None, &signed, Some(&ext)).unwrap();
        assert_eq!(payload["extensions"]["payment-identifier"]["info"]["id"], id);

        assert!(matches!(payment_extensions(pr.extensions.as_ref(), "short"), Err(WireError::InvalidPaymentId)));
        assert!(payment_extensions(pr.extensions.as_ref(), &"a".repeat(129)).is_err());
        assert!(payment_extensions(pr.extensions.as_ref(), "pay_0123456789abcdef!").is_err());
    }

    #[test]
    fn payment_identifier_absent_or_prefilled() {
        assert_eq!(payment_extensions(None, "pay_0123456789abcdef").unwrap(), None);
        assert_eq!(payment_extensions(Some(&json!({})), "pay_0123456789abcdef").unwrap(), None);
        // Not declared: other extensions are echoed untouched, no id is invented, any id is fine.
        let other = json!({"bazaar": {"info": {}, "schema": {}}});
        assert_eq!(payment_extensions(Some(&other), "x").unwrap(), Some(other));
        // Declared without `info`: it is created. With an `id` already there: kept.
        let bare = json!({"payment-identifier": {"schema": {}}});
        let ext = payment_extensions(Some(&bare), "pay_0123456789abcdef").unwrap().unwrap();
        assert_eq!(ext["payment-identifier"]["info"]["id"], "pay_0123456789abcdef");
        let prefilled = json!({"payment-identifier": {"info": {"id": "server-chosen-id-123"}}});
        let ext = payment_extensions(Some(&prefilled), "pay_0123456789abcdef").unwrap().unwrap();
        assert_eq!(ext["payment-identifier"]["info"]["id"], "server-chosen-id-123");

        let pr = v2_402(V2_REQUIRED).unwrap();
        assert!(!pr.advertises_payment_identifier());
        assert!(!pr.requires_payment_identifier());
    }

    #[test]
    fn parses_the_captured_settlement_headers() {
        let v2 = parse_settlement(&headers(&[("PAYMENT-RESPONSE", V2_SETTLEMENT)])).unwrap().unwrap();
        assert!(v2.success);
        assert_eq!(
            v2.tx_hash.unwrap().to_string(),
            "0xe686de9143674dbea9dbc997017fec64f3d7de0767f4c6b37ca3f23170ed9515"
        );
        assert_eq!(v2.network.as_deref(), Some("eip155:84532"));
        assert_eq!(v2.parsed_network(), Some(Network::BASE_SEPOLIA));
        assert_eq!(v2.payer, Some(address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8")));
        assert_eq!(v2.error_reason, None);

        let v1 = parse_settlement(&headers(&[("X-PAYMENT-RESPONSE", V1_SETTLEMENT)])).unwrap().unwrap();
        assert!(v1.success);
        assert_eq!(v1.network.as_deref(), Some("base-sepolia"));
        assert_eq!(v1.parsed_network(), Some(Network::BASE_SEPOLIA));
        assert!(v1.tx_hash.is_some());
    }

    #[test]
    fn settlement_is_tolerant_of_missing_fields_but_not_of_garbage() {
        assert_eq!(parse_settlement(&HeaderMap::new()).unwrap(), None);
        let failed = b64(
            r#"{"success":false,"errorReason":"invalid_exact_evm_nonce_already_used","transaction":"","network":"eip155:84532"}"#,
        );
        let s = parse_settlement(&headers(&[("payment-response", &failed)])).unwrap().unwrap();
        assert!(!s.success);
        assert_eq!(s.transaction, None);
        assert_eq!(s.tx_hash, None);
        assert_eq!(s.error_reason.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

        let sparse = b64(r#"{"transaction":"5xSolanaSignature","payer":"not-an-address"}"#);
        let s = parse_settlement(&headers(&[("payment-response", &sparse)])).unwrap().unwrap();
        assert!(!s.success, "missing success is not a success");
        assert_eq!(s.transaction.as_deref(), Some("5xSolanaSignature"));
        assert_eq!(s.tx_hash, None);
        assert_eq!(s.payer, None);

        for bad in ["%%%", &b64("nope"), &b64("[true]")] {
            assert!(parse_settlement(&headers(&[("payment-response", bad)])).is_err(), "{bad}");
        }
    }

    #[test]
    fn refusal_reasons_are_passed_through() {
        // v2: the new PAYMENT-REQUIRED carries the facilitator's reason.
        let refused = V2_REQUIRED.replace("Payment required", "invalid_exact_evm_nonce_already_used");
        let r = refusal_reasons(&headers(&[("payment-required", &b64(&refused))]), b"{}");
        assert_eq!(r.error.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

        // v1: the body.
        let body = r#"{"x402Version":1,"error":"invalid_exact_evm_nonce_already_used","accepts":[],"payer":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}"#;
        let r = refusal_reasons(&HeaderMap::new(), body.as_bytes());
        assert_eq!(r.error.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

        // Forwarded facilitator fields, and the settlement header's errorReason.
        let body = r#"{"invalidReason":"invalid_exact_evm_signature"}"#;
        let settle = b64(r#"{"success":false,"errorReason":"invalid_exact_evm_insufficient_balance"}"#);
        let r = refusal_reasons(&headers(&[("payment-response", &settle)]), body.as_bytes());
        assert_eq!(r.invalid_reason.as_deref(), Some("invalid_exact_evm_signature"));
        assert_eq!(r.error_reason.as_deref(), Some("invalid_exact_evm_insufficient_balance"));
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"invalidReason": "invalid_exact_evm_signature",
                   "errorReason": "invalid_exact_evm_insufficient_balance"})
        );

        // Garbage everywhere: no reasons, no panic. Huge reasons are bounded.
        let r = refusal_reasons(&headers(&[("payment-required", "%%%")]), b"\xff\xfe");
        assert!(r.is_empty());
        let long = json!({"error": "é".repeat(10_000)}).to_string();
        let r = refusal_reasons(&HeaderMap::new(), long.as_bytes());
        assert!(r.error.unwrap().len() <= MAX_REASON_BYTES);
    }

    #[test]
    fn version_numbers_and_header_names() {
        assert_eq!(X402Version::V1.payment_header(), "x-payment");
        assert_eq!(X402Version::V2.settlement_header(), "payment-response");
        assert_eq!(serde_json::to_value(X402Version::V2).unwrap(), json!(2));
        assert_eq!(X402Version::from_number(3), None);
    }
}
