//! The payment header of the paid retry: encoding, decoding, and the extensions echoed.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::HeaderValue;
use serde_json::{Map, Value};

use super::primitives::decode_json_header;
use super::{
    MAX_HEADER_BYTES, PAYMENT_ID_MAX_LEN, PAYMENT_ID_MIN_LEN, PAYMENT_IDENTIFIER, PAYMENT_SIGNATURE_HEADER, WireError,
    X402Version,
};

/// The x402 message of a paid retry around a scheme's `payload`, whatever the scheme:
/// - v2: `{x402Version: 2, payload, resource: <the 402's, if any>, accepted: <the entry
///   verbatim>, extensions: <if given and non-empty>}`;
/// - v1: `{x402Version: 1, scheme, network: <the name the upstream sent>, payload}`
///   (`resource` and `extensions` do not exist in v1 and are ignored).
pub fn payment_message(
    version: X402Version,
    accepted: &Map<String, Value>,
    (scheme, network_raw): (&str, &str),
    resource: Option<&Value>,
    payload: Value,
    extensions: Option<&Value>,
) -> Value {
    match version {
        X402Version::V2 => {
            let mut message = Map::new();
            message.insert("x402Version".to_owned(), Value::from(2));
            message.insert("payload".to_owned(), payload);
            if let Some(resource) = resource.filter(|r| !r.is_null()) {
                message.insert("resource".to_owned(), resource.clone());
            }
            message.insert("accepted".to_owned(), Value::Object(accepted.clone()));
            if let Some(ext) = extensions.filter(|e| e.as_object().is_some_and(|m| !m.is_empty())) {
                message.insert("extensions".to_owned(), ext.clone());
            }
            Value::Object(message)
        }
        X402Version::V1 => serde_json::json!({
            "x402Version": 1,
            "scheme": scheme,
            "network": network_raw,
            "payload": payload,
        }),
    }
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
/// the caller derived for this payment ([`crate::nonce::payment_identifier_id`]).
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
