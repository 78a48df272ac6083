//! Offline verification of a receipt document (`x402-router receipts verify`).
//!
//! Stricter than [`Receipt::verify_json`]: the signature must cover the document exactly as
//! given. The signed message is the JCS (RFC 8785) form of the document without its
//! `signature` member, which is also what a generic Ethereum tool checks (docs/operations.md, "Verifying
//! a receipt"). A document with an extra member, or a value written differently from how the
//! router signed it, is refused even though its known fields would verify.

use alloy::primitives::Address;
use serde_json::Value;

use crate::receipts::Receipt;

/// Why a receipt document does not verify (one line).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotVerified(pub String);

impl From<String> for NotVerified {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for NotVerified {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// The signer of a receipt document, or why it does not verify.
///
/// # Errors
/// A one-line reason.
pub fn verify_receipt(text: &str) -> Result<Address, NotVerified> {
    let document: Value = serde_json::from_str(text.trim()).map_err(|e| format!("not a JSON document: {e}"))?;
    let receipt: Receipt = serde_json::from_value(document.clone()).map_err(|e| format!("not a receipt: {e}"))?;
    let mut unsigned = document;
    if let Value::Object(map) = &mut unsigned {
        map.remove("signature");
    }
    let as_given = serde_jcs::to_vec(&unsigned).map_err(|e| format!("not canonicalizable: {e}"))?;
    if as_given != receipt.signed_bytes() {
        return Err("the document holds members or values that the signature does not cover".into());
    }
    receipt.verify().map_err(|e| NotVerified(e.to_string()))
}

#[cfg(test)]
mod tests {
    use alloy::signers::local::PrivateKeySigner;
    use uuid::Uuid;

    use super::*;
    use crate::receipts::Draft;

    fn signed() -> (PrivateKeySigner, String) {
        let signer = PrivateKeySigner::random();
        let r = Draft {
            id: Uuid::new_v4(),
            agent_id: Uuid::new_v4(),
            idempotency_key: "key-\"quoted\"-\\-0123456789".into(),
            request_hash: "ab".repeat(32),
            method: "GET".into(),
            url: "https://api.example.com/x?q=%C3%A9".into(),
            upstream_status: Some(200),
            upstream_body_sha256: "cd".repeat(32),
            payment: Some(serde_json::json!({"amount": "10000", "x402_version": 2})),
            outcome: "completed".into(),
            trace_id: Some("4bf92f3577b34da6a3ce929d0e0e4736".into()),
        }
        .sign(&signer)
        .unwrap();
        (signer, serde_json::to_string_pretty(&r).unwrap())
    }

    #[test]
    fn a_receipt_as_served_verifies() {
        let (signer, text) = signed();
        assert_eq!(verify_receipt(&text).unwrap(), signer.address());
    }

    #[test]
    fn an_extra_member_or_a_changed_byte_is_invalid() {
        let (_, text) = signed();
        let extra = text.replacen('{', "{\"note\": \"unsigned\",", 1);
        assert!(verify_receipt(&extra).unwrap_err().0.contains("does not cover"));
        let changed = text.replacen("\"GET\"", "\"PUT\"", 1);
        assert!(verify_receipt(&changed).unwrap_err().0.contains("signature"));
        assert!(verify_receipt("[]").is_err());
        assert!(verify_receipt("not json").is_err());
    }
}
