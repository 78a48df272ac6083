//! The OpenAPI schemas of the `/route` bodies that [`super::envelope`] renders member by
//! member (the upstream's JSON is embedded verbatim, so there is no struct to serialize):
//! one type per body, whose members are the names the writer sets (unit tests render real
//! envelopes and hold the two equal). The `code` enums are filled from `Code` by the
//! document's builder.

#![allow(dead_code)] // Types of the document only: never built.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::ToSchema;
use uuid::Uuid;

use super::view::PaymentView;

/// The 200 envelope: the upstream's answer, the payment made for it and the receipt.
#[derive(ToSchema)]
#[schema(as = RouteEnvelope)]
pub struct RouteEnvelopeDoc {
    /// The upstream's HTTP status.
    status: u16,
    /// The upstream's response headers (lowercase; repeated values joined by ", ").
    headers: BTreeMap<String, String>,
    #[schema(schema_with = doc::body)]
    body: Value,
    #[schema(required = true)]
    payment: Option<PaymentView>,
    receipt_id: Uuid,
}

/// The 402 body: the upstream asks for a payment the router will not make.
#[derive(ToSchema)]
#[schema(as = PaymentDeclined)]
pub struct PaymentDeclinedDoc {
    error: String,
    /// See `Error_<code>`.
    code: String,
    /// The upstream's x402 payment requirements, verbatim.
    accepts: Vec<BTreeMap<String, Value>>,
    receipt_id: Uuid,
}

/// A 502/504 body (members absent, never null, when not known).
#[derive(ToSchema)]
#[schema(as = RouteError, description = "An error plus the envelope members known so far.")]
pub struct RouteErrorDoc {
    error: String,
    /// See `Error_<code>`. Whether a new key is safe also follows from `payment`: null, or
    /// `payment.status` `expired` → safe; anything else (including `rejected` and
    /// `not_settled`, an upstream's word only) → never re-key.
    code: String,
    /// The upstream's status, when it answered.
    #[schema(required = false)]
    status: u16,
    #[schema(required = false)]
    headers: BTreeMap<String, String>,
    #[schema(schema_with = doc::any, required = false)]
    body: Option<Value>,
    #[schema(required = true)]
    payment: Option<PaymentView>,
    #[schema(required = true)]
    receipt_id: Option<Uuid>,
    /// The facilitator's reason, unchanged (payment refused).
    #[serde(rename = "invalidReason")]
    #[schema(required = false)]
    invalid_reason: String,
    /// The facilitator's reason, unchanged (payment refused).
    #[serde(rename = "errorReason")]
    #[schema(required = false)]
    error_reason: String,
}

mod doc {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType};

    pub fn body() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(
                "The upstream's JSON; `{\"text\": …}` for other UTF-8; `{\"base64\": …}` otherwise; `null` when empty.",
            ))
            .into()
    }

    pub fn any() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(SchemaType::AnyValue).into()
    }
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderMap;
    use serde_json::Value;
    use utoipa::PartialSchema;
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;

    use super::*;
    use crate::codes::Code;
    use crate::relay::envelope;
    use crate::upstream::UpstreamResponse;

    fn members<T: PartialSchema>() -> Vec<String> {
        let RefOr::T(Schema::Object(o)) = T::schema() else { panic!("an object schema") };
        o.properties.keys().cloned().collect()
    }

    fn keys(bytes: &[u8]) -> Vec<String> {
        let v: Value = serde_json::from_slice(bytes).unwrap();
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    fn sorted(mut v: Vec<String>) -> Vec<String> {
        v.sort();
        v
    }

    #[test]
    fn the_documented_members_are_the_ones_the_writer_sets() {
        let resp = UpstreamResponse { status: 200, headers: HeaderMap::new(), body: b"{}".to_vec() };
        let ok = envelope::envelope(&resp, None, Uuid::nil()).to_bytes();
        assert_eq!(keys(&ok), sorted(members::<RouteEnvelopeDoc>()));
        let err = envelope::error_envelope(Code::UpstreamFailed, "x", Some(&resp), None, None).to_bytes();
        let documented = members::<RouteErrorDoc>();
        for k in keys(&err) {
            assert!(documented.contains(&k), "{k} is written but not documented");
        }
        let bare = envelope::error_envelope(Code::UpstreamFailed, "x", None, None, None).to_bytes();
        for k in keys(&bare) {
            assert!(documented.contains(&k), "{k} is written but not documented");
        }
    }
}
