//! Deterministic EIP-3009 nonces and payment-identifier ids, both derived with
//! HMAC-SHA256 from the router's secret, the agent id and the agent's `Idempotency-Key`.
//!
//! Why deterministic: every attempt for the same `(agent_id, Idempotency-Key)` signs with the
//! same nonce, so the token contract itself lets at most one of those authorizations settle
//! (per payer and asset), even if Postgres and Redis both lose state (DESIGN §6).
//!
//! Exact byte layouts (HMAC key = the router secret, as given):
//!
//! | output | HMAC message |
//! |---|---|
//! | [`deterministic_nonce`] | `uuid ‖ 0x00 ‖ key` |
//! | [`payment_identifier_id`] | `"payment-identifier" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key` |
//!
//! where `uuid` is the 36 ASCII bytes of the canonical lowercase hyphenated form
//! (`67e55044-10b1-426f-9247-bb680e5fe0c8`) and `key` the UTF-8 bytes of the idempotency key.
//! The key is visible ASCII (0x21–0x7E) and so never contains 0x00; the uuid text has a
//! fixed length and never equals the label, so the two messages can never coincide.
//!
//! Changing any of this changes every nonce: it is part of the at-most-once contract.

use alloy::primitives::{B256, hex};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// Domain-separation label of [`payment_identifier_id`].
const PAYMENT_IDENTIFIER_LABEL: &[u8] = b"payment-identifier";

/// Prefix of payment-identifier ids (the convention of the official x402 tooling).
/// Deliberately not the API-key prefix: these ids are not secrets.
pub const PAYMENT_ID_PREFIX: &str = "pay_";

/// The HMAC key of the deterministic nonces: sha256 over a label and the wallet key.
/// Derived rather than configured, so it can never drift from the wallet whose nonces
/// it spaces out (a new wallet is a new nonce space anyway).
pub fn nonce_secret(signer: &alloy::signers::local::PrivateKeySigner) -> [u8; 32] {
    use sha2::Digest;
    let mut h = Sha256::new();
    h.update(b"x402-router/nonce-secret/v1\0");
    h.update(signer.credential().to_bytes());
    h.finalize().into()
}

/// The EIP-3009 nonce for this agent's idempotency key:
/// `HMAC-SHA256(secret, uuid ‖ 0x00 ‖ key)` (layout in the module docs).
pub fn deterministic_nonce(secret: &[u8], agent_id: Uuid, idempotency_key: &str) -> B256 {
    let uuid = hyphenated(agent_id);
    B256::from(hmac_sha256(secret, &[uuid.as_bytes(), &[0x00], idempotency_key.as_bytes()]))
}

/// The `payment-identifier` extension id sent to upstreams for this agent's idempotency key:
/// `pay_` + lowercase hex of `HMAC-SHA256(secret, "payment-identifier" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key)`.
///
/// 68 characters of `[a-z0-9_]`, within the extension's 16–128 `[A-Za-z0-9_-]` rule. Stable
/// across retries of the same key, so the upstream can deduplicate; it reveals neither the
/// agent's key nor the nonce.
pub fn payment_identifier_id(secret: &[u8], agent_id: Uuid, idempotency_key: &str) -> String {
    let uuid = hyphenated(agent_id);
    let mac =
        hmac_sha256(secret, &[PAYMENT_IDENTIFIER_LABEL, &[0x00], uuid.as_bytes(), &[0x00], idempotency_key.as_bytes()]);
    format!("{PAYMENT_ID_PREFIX}{}", hex::encode(mac))
}

fn hyphenated(agent_id: Uuid) -> String {
    // `Hyphenated`'s Display is lowercase; spelled out so a future uuid change cannot alter it.
    agent_id.hyphenated().to_string().to_ascii_lowercase()
}

fn hmac_sha256(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let Ok(mut mac) = HmacSha256::new_from_slice(secret) else {
        // RFC 2104 HMAC accepts keys of every length (long keys are hashed, short ones
        // padded); hmac 0.12 never returns `InvalidLength` for it.
        unreachable!("HMAC-SHA256 accepts keys of any length")
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"router-secret-for-tests-0123456789";

    fn agent() -> Uuid {
        Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap()
    }

    #[test]
    fn nonce_is_deterministic_per_agent_and_key() {
        let a = deterministic_nonce(SECRET, agent(), "key-0000000000000001");
        let b = deterministic_nonce(SECRET, agent(), "key-0000000000000001");
        assert_eq!(a, b);
        assert_ne!(a, deterministic_nonce(SECRET, agent(), "key-0000000000000002"));
        assert_ne!(a, deterministic_nonce(SECRET, Uuid::nil(), "key-0000000000000001"));
        assert_ne!(a, deterministic_nonce(b"other-secret", agent(), "key-0000000000000001"));
    }

    #[test]
    fn known_answers_pin_the_layout() {
        // Computed independently with Python's hmac module:
        // hmac.new(b"secret", b"00000000-0000-0000-0000-000000000000\x00k", sha256)
        let nonce = deterministic_nonce(b"secret", Uuid::nil(), "k");
        assert_eq!(nonce.to_string(), "0xc5c5eb13687951cefd2652c9e22c9830f7ab41027d31d6e87e05343f1f64d90d");
        // hmac.new(b"secret", b"payment-identifier\x00" + uuid + b"\x00k", sha256)
        assert_eq!(
            payment_identifier_id(b"secret", Uuid::nil(), "k"),
            "pay_cda809bf8cdc84f567c6f7a4e9f7eff060e7eb065be70cfe968dfee60036b37b"
        );
    }

    #[test]
    fn payment_identifier_id_is_stable_valid_and_distinct_from_nonce() {
        let id = payment_identifier_id(SECRET, agent(), "key-0000000000000001");
        assert_eq!(id, payment_identifier_id(SECRET, agent(), "key-0000000000000001"));
        assert_eq!(id.len(), 68);
        assert!(id.starts_with("pay_"));
        assert!(id.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric()));
        assert!(!id.contains("key-0000000000000001"));
        let nonce = deterministic_nonce(SECRET, agent(), "key-0000000000000001");
        assert!(!id.contains(&hex::encode(nonce)));
        assert_ne!(id, payment_identifier_id(SECRET, agent(), "key-0000000000000002"));
    }

    #[test]
    fn empty_secret_still_works() {
        // Not a sensible configuration (config rejects it), but must not panic.
        let _ = deterministic_nonce(b"", agent(), "k");
    }
}
