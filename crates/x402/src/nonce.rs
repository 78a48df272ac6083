//! Deterministic EIP-3009 nonces and payment-identifier ids, both derived with
//! HMAC-SHA256 from the router's secret, the agent id, the agent's `Idempotency-Key` and the
//! request fingerprint (the request hash).
//!
//! Why deterministic: every attempt of the same request under the same
//! `(agent_id, Idempotency-Key)` signs with the same nonce, so the token contract itself lets at
//! most one of those authorizations settle (per payer and asset), even if Postgres and Redis
//! both lose state (DESIGN §6). Why the request hash: a key reused after it expired, for a
//! different request, is a new payment with a nonce of its own (Stripe's and the IETF
//! draft's semantics), while the same request re-sent under it can never pay twice.
//!
//! Exact byte layouts (HMAC key = the router secret, as given):
//!
//! | output | HMAC message |
//! |---|---|
//! | [`deterministic_nonce`] | `uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash` |
//! | [`payment_identifier_id`] | `"payment-identifier" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash` |
//! | [`permit2_nonce`] | `"permit2" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash` (big-endian uint256) |
//!
//! where `uuid` is the 36 ASCII bytes of the canonical lowercase hyphenated form
//! (`67e55044-10b1-426f-9247-bb680e5fe0c8`), `key` the UTF-8 bytes of the idempotency key and
//! `hash` the 64 ASCII bytes of the lowercase hex request hash.
//! The key is visible ASCII (0x21–0x7E) and so never contains 0x00; the uuid text has a
//! fixed length and starts with a hex digit, never with a label's first letter, so the
//! three messages can never coincide.
//!
//! Changing any of this changes every nonce: it is part of the at-most-once contract.

use alloy::primitives::{B256, U256, hex};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

/// Domain-separation label of [`payment_identifier_id`].
const PAYMENT_IDENTIFIER_LABEL: &[u8] = b"payment-identifier";

/// Domain-separation label of [`permit2_nonce`].
const PERMIT2_LABEL: &[u8] = b"permit2";

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

/// The EIP-3009 nonce for this agent's request under its idempotency key:
/// `HMAC-SHA256(secret, uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash)` (layout in the module docs).
pub fn deterministic_nonce(secret: &[u8], agent_id: Uuid, idempotency_key: &str, request_hash: &str) -> B256 {
    let uuid = hyphenated(agent_id);
    B256::from(hmac_sha256(
        secret,
        &[uuid.as_bytes(), &[0x00], idempotency_key.as_bytes(), &[0x00], request_hash.as_bytes()],
    ))
}

/// The `payment-identifier` extension id sent to upstreams for this agent's request and idempotency key:
/// `pay_` + lowercase hex of `HMAC-SHA256(secret, "payment-identifier" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash)`.
///
/// 68 characters of `[a-z0-9_]`, within the extension's 16–128 `[A-Za-z0-9_-]` rule. Stable
/// across retries of the same key, so the upstream can deduplicate; it reveals neither the
/// agent's key nor the nonce.
pub fn payment_identifier_id(secret: &[u8], agent_id: Uuid, idempotency_key: &str, request_hash: &str) -> String {
    let uuid = hyphenated(agent_id);
    let parts: [&[u8]; 7] = [
        PAYMENT_IDENTIFIER_LABEL,
        &[0x00],
        uuid.as_bytes(),
        &[0x00],
        idempotency_key.as_bytes(),
        &[0x00],
        request_hash.as_bytes(),
    ];
    let mac = hmac_sha256(secret, &parts);
    format!("{PAYMENT_ID_PREFIX}{}", hex::encode(mac))
}

/// The Permit2 nonce for this agent's request under its idempotency key: the big-endian
/// uint256 of `HMAC-SHA256(secret, "permit2" ‖ 0x00 ‖ uuid ‖ 0x00 ‖ key ‖ 0x00 ‖ hash)`.
///
/// Deterministic like [`deterministic_nonce`] (every Permit2 signature for a request under a
/// key carries it, and Permit2's nonce bitmap accepts it once per owner), and derived apart
/// from it, so the EIP-3009 and the Permit2 nonce of a request are unrelated values.
pub fn permit2_nonce(secret: &[u8], agent_id: Uuid, idempotency_key: &str, request_hash: &str) -> U256 {
    let uuid = hyphenated(agent_id);
    let parts: [&[u8]; 7] = [
        PERMIT2_LABEL,
        &[0x00],
        uuid.as_bytes(),
        &[0x00],
        idempotency_key.as_bytes(),
        &[0x00],
        request_hash.as_bytes(),
    ];
    U256::from_be_bytes(hmac_sha256(secret, &parts))
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
    const H1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
    const H2: &str = "2222222222222222222222222222222222222222222222222222222222222222";

    fn agent() -> Uuid {
        Uuid::parse_str("67e55044-10b1-426f-9247-bb680e5fe0c8").unwrap()
    }

    #[test]
    fn nonce_is_deterministic_per_agent_and_key() {
        let a = deterministic_nonce(SECRET, agent(), "key-0000000000000001", H1);
        let b = deterministic_nonce(SECRET, agent(), "key-0000000000000001", H1);
        assert_eq!(a, b);
        assert_ne!(a, deterministic_nonce(SECRET, agent(), "key-0000000000000002", H1));
        assert_ne!(a, deterministic_nonce(SECRET, Uuid::nil(), "key-0000000000000001", H1));
        assert_ne!(a, deterministic_nonce(b"other-secret", agent(), "key-0000000000000001", H1));
        // The same key for another request (reused after expiry) is another nonce.
        assert_ne!(a, deterministic_nonce(SECRET, agent(), "key-0000000000000001", H2));
    }

    #[test]
    fn known_answers_pin_the_layout() {
        // Computed independently with Python's hmac module:
        // hmac.new(b"secret", b"00000000-0000-0000-0000-000000000000\x00k\x00h", sha256)
        let nonce = deterministic_nonce(b"secret", Uuid::nil(), "k", "h");
        assert_eq!(nonce.to_string(), "0xb617a1182b5da9e9028e385a19f53123cbedc75de7c02a82c9f3d85139927d4e");
        // hmac.new(b"secret", b"payment-identifier\x00" + uuid + b"\x00k\x00h", sha256)
        assert_eq!(
            payment_identifier_id(b"secret", Uuid::nil(), "k", "h"),
            "pay_80190f2dbfc842ea7af0d8ee22e99334b50249f4ed313ffc8b7d4e8cdcd915af"
        );
    }

    #[test]
    fn payment_identifier_id_is_stable_valid_and_distinct_from_nonce() {
        let id = payment_identifier_id(SECRET, agent(), "key-0000000000000001", H1);
        assert_eq!(id, payment_identifier_id(SECRET, agent(), "key-0000000000000001", H1));
        assert_eq!(id.len(), 68);
        assert!(id.starts_with("pay_"));
        assert!(id.bytes().all(|b| b == b'_' || b.is_ascii_alphanumeric()));
        assert!(!id.contains("key-0000000000000001"));
        let nonce = deterministic_nonce(SECRET, agent(), "key-0000000000000001", H1);
        assert!(!id.contains(&hex::encode(nonce)));
        assert_ne!(id, payment_identifier_id(SECRET, agent(), "key-0000000000000002", H1));
    }

    #[test]
    fn permit2_nonce_is_deterministic_and_apart_from_the_eip3009_nonce() {
        let a = permit2_nonce(SECRET, agent(), "key-0000000000000001", H1);
        assert_eq!(a, permit2_nonce(SECRET, agent(), "key-0000000000000001", H1));
        assert_ne!(a, permit2_nonce(SECRET, agent(), "key-0000000000000002", H1));
        assert_ne!(a, permit2_nonce(SECRET, agent(), "key-0000000000000001", H2));
        let eip3009 = deterministic_nonce(SECRET, agent(), "key-0000000000000001", H1);
        assert_ne!(B256::from(a), eip3009);
        // Computed independently with Python: int.from_bytes(hmac.new(b"secret",
        // b"permit2\x00" + b"00000000-0000-0000-0000-000000000000" + b"\x00k\x00h", sha256).digest(), "big")
        assert_eq!(
            permit2_nonce(b"secret", Uuid::nil(), "k", "h").to_string(),
            "131216431477653836849741943416250366326445906497415104367879592637545049196"
        );
    }

    #[test]
    fn empty_secret_still_works() {
        // Not a sensible configuration (config rejects it), but must not panic.
        let _ = deterministic_nonce(b"", agent(), "k", H1);
    }
}
