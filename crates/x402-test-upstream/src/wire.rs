//! x402 on the wire, v1 and v2, as the official servers put it: headers carry standard base64
//! of UTF-8 JSON; amounts, times and nonces are strings. Field order in the `Serialize` types
//! follows the official implementations so that captured exchanges look alike.

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub const PAYMENT_REQUIRED: &str = "PAYMENT-REQUIRED";
pub const PAYMENT_SIGNATURE: &str = "PAYMENT-SIGNATURE";
pub const PAYMENT_RESPONSE: &str = "PAYMENT-RESPONSE";
pub const X_PAYMENT: &str = "X-PAYMENT";
pub const X_PAYMENT_RESPONSE: &str = "X-PAYMENT-RESPONSE";

/// Key of the payment-identifier extension in `extensions` (x402 v2).
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";

/// Writes padded standard base64; reads it with or without padding, like `Buffer.from(s, "base64")`.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

pub fn encode_header<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    Ok(BASE64.encode(serde_json::to_vec(value)?))
}

/// `None` when the header is not base64 of JSON of the expected shape.
pub fn decode_header<T: DeserializeOwned>(raw: &[u8]) -> Option<T> {
    let json = BASE64.decode(raw.trim_ascii()).ok()?;
    serde_json::from_slice(&json).ok()
}

// ------------------------------------------------------------------ client -> server

/// The EIP-3009 authorization as signed, fields still as the client wrote them.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    pub from: String,
    pub to: String,
    pub value: String,
    pub valid_after: String,
    pub valid_before: String,
    pub nonce: String,
}

/// `payload` of the `exact` scheme on EVM.
#[derive(Clone, Debug, Deserialize)]
pub struct ExactEvmPayload {
    pub signature: String,
    pub authorization: Authorization,
}

/// The chosen requirement, copied back by a v2 client. Only the fields that identify the offer.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedV2 {
    pub scheme: String,
    pub network: String,
    pub amount: String,
    pub asset: String,
    pub pay_to: String,
}

/// Decoded `PAYMENT-SIGNATURE`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayloadV2 {
    pub x402_version: u64,
    pub payload: ExactEvmPayload,
    pub accepted: AcceptedV2,
    #[serde(default)]
    pub extensions: Option<Map<String, Value>>,
}

impl PaymentPayloadV2 {
    /// `extensions["payment-identifier"].info.id`, when the client sent one.
    pub fn payment_identifier(&self) -> Option<String> {
        self.extensions.as_ref()?.get(PAYMENT_IDENTIFIER)?.get("info")?.get("id")?.as_str().map(str::to_owned)
    }
}

/// Decoded `X-PAYMENT`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentPayloadV1 {
    pub x402_version: u64,
    pub scheme: String,
    pub network: String,
    pub payload: ExactEvmPayload,
}

// ------------------------------------------------------------------ server -> client

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    pub url: String,
    pub description: String,
    pub mime_type: String,
}

/// One entry of a v2 `accepts`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequirementV2 {
    pub scheme: String,
    pub network: String,
    pub amount: String,
    pub asset: String,
    pub pay_to: String,
    pub max_timeout_seconds: u64,
    pub extra: Value,
}

/// The JSON inside `PAYMENT-REQUIRED`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequiredV2 {
    pub x402_version: u8,
    pub error: String,
    pub resource: ResourceInfo,
    pub accepts: Vec<RequirementV2>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Value>,
}

/// One entry of a v1 `accepts`: resource, description and mime type sit inside it.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequirementV1 {
    pub scheme: String,
    pub network: String,
    pub max_amount_required: String,
    pub resource: String,
    pub description: String,
    pub mime_type: String,
    pub pay_to: String,
    pub max_timeout_seconds: u64,
    pub asset: String,
    pub output_schema: Value,
    pub extra: Value,
}

/// The v1 402 body.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequiredV1 {
    pub x402_version: u8,
    pub error: String,
    pub accepts: Vec<RequirementV1>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

/// The JSON inside `PAYMENT-RESPONSE`.
#[derive(Clone, Debug, Serialize)]
pub struct SettlementV2 {
    pub success: bool,
    pub payer: String,
    pub transaction: String,
    pub network: String,
}

/// The JSON inside `X-PAYMENT-RESPONSE`.
#[derive(Clone, Debug, Serialize)]
pub struct SettlementV1 {
    pub success: bool,
    pub transaction: String,
    pub network: String,
    pub payer: String,
}

/// A facilitator-style `/verify` refusal, used as the body of `/v2/reject`.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyRefusal {
    pub is_valid: bool,
    pub invalid_reason: String,
    pub invalid_message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

/// What `/v2/pid` advertises: the payment-identifier extension with its JSON Schema, id optional.
pub fn payment_identifier_declaration() -> Value {
    serde_json::json!({
        PAYMENT_IDENTIFIER: {
            "info": { "required": false },
            "schema": {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "type": "object",
                "properties": {
                    "required": { "type": "boolean" },
                    "id": {
                        "type": "string",
                        "minLength": 16,
                        "maxLength": 128,
                        "pattern": "^[a-zA-Z0-9_-]+$"
                    }
                },
                "required": ["required"]
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_round_trip_and_tolerate_missing_padding() {
        let settlement = SettlementV2 {
            success: true,
            payer: "0xabc".into(),
            transaction: "0x01".into(),
            network: "eip155:84532".into(),
        };
        let header = encode_header(&settlement).unwrap();
        assert_eq!(header.len() % 4, 0, "written padded: {header}");
        // Field order as the official servers write it.
        assert_eq!(
            String::from_utf8(BASE64.decode(&header).unwrap()).unwrap(),
            r#"{"success":true,"payer":"0xabc","transaction":"0x01","network":"eip155:84532"}"#
        );
        // `{"a":1}` is 7 bytes, so its padded form ends in "=".
        let padded = encode_header(&serde_json::json!({"a": 1})).unwrap();
        assert!(padded.ends_with('='), "{padded}");
        let unpadded = padded.trim_end_matches('=');
        assert_eq!(decode_header::<Value>(unpadded.as_bytes()), Some(serde_json::json!({"a": 1})));
    }

    #[test]
    fn undecodable_headers_are_none() {
        assert!(decode_header::<PaymentPayloadV2>(b"not base64!").is_none());
        let not_json = BASE64.encode(b"hello");
        assert!(decode_header::<Value>(not_json.as_bytes()).is_none());
        let wrong_shape = BASE64.encode(br#"{"x402Version":2}"#);
        assert!(decode_header::<PaymentPayloadV2>(wrong_shape.as_bytes()).is_none());
    }

    #[test]
    fn payment_identifier_is_read_from_info_id() {
        let json = serde_json::json!({
            "x402Version": 2,
            "payload": {"signature": "0x", "authorization": {"from": "a", "to": "b", "value": "1",
                "validAfter": "0", "validBefore": "9", "nonce": "0x"}},
            "accepted": {"scheme": "exact", "network": "eip155:84532", "amount": "1",
                "asset": "0x", "payTo": "0x", "maxTimeoutSeconds": 300, "extra": {}},
            "extensions": {"payment-identifier": {"info": {"required": false, "id": "pay_0123456789abcdef"}}}
        });
        let payload: PaymentPayloadV2 = serde_json::from_value(json).unwrap();
        assert_eq!(payload.payment_identifier().as_deref(), Some("pay_0123456789abcdef"));
    }
}
