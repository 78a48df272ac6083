//! Receipts: the signed, permanent record of every routed call that reached an upstream.
//!
//! The signature is EIP-191 (`personal_sign`) by the router's key over the RFC 8785
//! (JCS) bytes of the receipt without its `signature` field, so anyone can verify a
//! receipt offline with any Ethereum tool. The receipt is written in the same
//! transaction as the idempotency row's transition to completed/errored.

pub mod store;

use alloy::primitives::{Address, Signature};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use chrono::{DateTime, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// A receipt as stored and served (`Receipt` in the OpenAPI document).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[schema(
    description = "The signed, permanent record of a routed call that reached an upstream. `signature` is EIP-191 (`personal_sign`) by `signer` over the RFC 8785 (JCS) bytes of the receipt without `signature`; check `signer` against `receipt_signer` of `/.well-known/x402-router`."
)]
pub struct Receipt {
    pub id: Uuid,
    pub agent_id: Uuid,
    pub idempotency_key: String,
    /// sha256 of the JCS request fingerprint.
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub request_hash: String,
    pub method: String,
    pub url: String,
    /// `null` when the upstream's answer never arrived.
    #[schema(required = true)]
    pub upstream_status: Option<i32>,
    #[schema(pattern = "^[0-9a-f]{64}$")]
    pub upstream_body_sha256: String,
    #[schema(required = true, schema_with = doc::payment_or_null)]
    pub payment: Option<Value>,
    /// `completed` or `errored`: the idempotency outcome of the call.
    #[schema(schema_with = doc::outcome)]
    pub outcome: String,
    /// Six fractional digits and `Z`.
    #[serde(with = "micros")]
    pub created_at: DateTime<Utc>,
    #[schema(schema_with = crate::schema_doc::address)]
    pub signer: String,
    #[schema(pattern = "^0x[0-9a-f]{130}$")]
    pub signature: String,
    /// The call's OpenTelemetry trace id (32 hex digits), present when the router exported
    /// traces; signed with the rest of the receipt (absent otherwise, so receipts without it
    /// verify as before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub trace_id: Option<String>,
}

/// The schemas of [`Receipt`]'s members that refer to other schemas of the document.
mod doc {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::openapi::{Ref, RefOr};

    /// `Payment` or null.
    pub fn payment_or_null() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(Ref::from_schema_name("Payment"))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .into()
    }

    /// `completed` or `errored`.
    pub fn outcome() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["completed", "errored"])).into()
    }
}

/// Everything but the signature; what gets signed.
#[derive(Debug, Clone)]
pub struct Draft {
    pub id: Uuid,
    pub agent_id: Uuid,
    pub idempotency_key: String,
    pub request_hash: String,
    pub method: String,
    pub url: String,
    pub upstream_status: Option<i32>,
    pub upstream_body_sha256: String,
    pub payment: Option<Value>,
    pub outcome: String,
    /// The call's trace id ([`crate::telemetry::current_trace_id`]), if traces are exported.
    pub trace_id: Option<String>,
}

/// Why a receipt does not verify.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error("receipt is not valid JSON of the expected shape: {0}")]
    Shape(String),
    #[error("signature is malformed")]
    Signature,
    #[error("signature was made by {recovered}, not by the stated signer {stated}")]
    WrongSigner { recovered: Address, stated: String },
}

impl Draft {
    /// Signs the draft, stamping `created_at` (microsecond precision, as Postgres keeps it).
    ///
    /// # Errors
    /// Signing failure (practically impossible with a local key).
    pub fn sign(self, signer: &PrivateKeySigner) -> Result<Receipt, alloy::signers::Error> {
        let mut receipt = Receipt {
            id: self.id,
            agent_id: self.agent_id,
            idempotency_key: self.idempotency_key,
            request_hash: self.request_hash,
            method: self.method,
            url: self.url,
            upstream_status: self.upstream_status,
            upstream_body_sha256: self.upstream_body_sha256,
            payment: self.payment,
            outcome: self.outcome,
            created_at: Utc::now().trunc_subsecs(6),
            signer: signer.address().to_checksum(None),
            signature: String::new(),
            trace_id: self.trace_id,
        };
        let sig = signer.sign_message_sync(&receipt.signed_bytes())?;
        receipt.signature = format!("0x{}", alloy::hex::encode(sig.as_bytes()));
        Ok(receipt)
    }
}

impl Receipt {
    /// The JCS bytes of the receipt without `signature`: the signed message.
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut v {
            map.remove("signature");
        }
        serde_jcs::to_vec(&v).unwrap_or_default()
    }

    /// Signs the receipt again, with `signer`, as it now reads: `secrets::sweep` redacts the
    /// URL of receipts written before URLs were redacted, and a receipt shows only what its
    /// signature covers. Every other field, `created_at` too, is kept.
    ///
    /// # Errors
    /// Signing failure (practically impossible with a local key).
    pub fn sign_again(&mut self, signer: &PrivateKeySigner) -> Result<(), alloy::signers::Error> {
        self.signer = signer.address().to_checksum(None);
        let sig = signer.sign_message_sync(&self.signed_bytes())?;
        self.signature = format!("0x{}", alloy::hex::encode(sig.as_bytes()));
        Ok(())
    }

    /// Verifies the signature against the stated signer.
    ///
    /// # Errors
    /// [`VerifyError`].
    pub fn verify(&self) -> Result<Address, VerifyError> {
        let raw = alloy::hex::decode(self.signature.trim_start_matches("0x")).map_err(|_| VerifyError::Signature)?;
        let sig = Signature::from_raw(&raw).map_err(|_| VerifyError::Signature)?;
        let recovered = sig.recover_address_from_msg(self.signed_bytes()).map_err(|_| VerifyError::Signature)?;
        let stated: Option<Address> = self.signer.parse().ok();
        if stated != Some(recovered) {
            return Err(VerifyError::WrongSigner { recovered, stated: self.signer.clone() });
        }
        Ok(recovered)
    }

    /// Parses and verifies a receipt JSON document.
    ///
    /// # Errors
    /// [`VerifyError`].
    pub fn verify_json(text: &str) -> Result<Address, VerifyError> {
        let r: Receipt = serde_json::from_str(text).map_err(|e| VerifyError::Shape(e.to_string()))?;
        r.verify()
    }
}

/// RFC 3339 timestamps with exactly six fractional digits and `Z`.
mod micros {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&t.format("%Y-%m-%dT%H:%M:%S%.6fZ").to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let s = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&s).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft() -> Draft {
        Draft {
            id: Uuid::new_v4(),
            agent_id: Uuid::new_v4(),
            idempotency_key: "k".repeat(16),
            request_hash: "00".repeat(32),
            method: "GET".into(),
            url: "https://api.example.com/".into(),
            upstream_status: Some(200),
            upstream_body_sha256: "11".repeat(32),
            payment: None,
            outcome: "completed".into(),
            trace_id: None,
        }
    }

    #[test]
    fn a_trace_id_is_signed_with_the_receipt_and_its_absence_changes_nothing() {
        let signer = PrivateKeySigner::random();
        let plain = draft().sign(&signer).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("trace_id"), "absent, not null");
        let traced =
            Draft { trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()), ..draft() }.sign(&signer).unwrap();
        let text = serde_json::to_string(&traced).unwrap();
        assert!(Receipt::verify_json(&text).is_ok());
        let tampered = text.replace("4bf92f3577b34da6a3ce929d0e0e4736", "00000000000000000000000000000001");
        assert!(Receipt::verify_json(&tampered).is_err(), "the trace id is signed");
    }

    #[test]
    fn signed_receipt_verifies_and_any_change_breaks_it() {
        let signer = PrivateKeySigner::random();
        let r = draft().sign(&signer).unwrap();
        assert_eq!(r.verify().unwrap(), signer.address());
        let text = serde_json::to_string(&r).unwrap();
        assert!(Receipt::verify_json(&text).is_ok());
        let tampered = text.replace("\"upstream_status\":200", "\"upstream_status\":201");
        assert!(Receipt::verify_json(&tampered).is_err());
        let mut redacted = r.clone();
        redacted.url = "https://api.example.com/?key=REDACTED".into();
        assert!(redacted.verify().is_err(), "the URL is signed");
        redacted.sign_again(&signer).unwrap();
        assert_eq!(redacted.verify().unwrap(), signer.address());
        assert_eq!((redacted.created_at, redacted.id), (r.created_at, r.id));
    }
}
