//! Operators: named bearer tokens with a role, for the operator API (`/audit/*`, the
//! exports, `/metrics`, and the admin endpoints).
//!
//! Tokens look like `x4o_<43 base64url chars>` (256 random bits), like agent keys (`x4r_`),
//! so that secret scanners can spot leaked ones; only their sha256 is stored. The HTTP
//! extractors (`Viewer`, `Admin`) are in `crate::auth::operator`. `viewer` reads
//! (audit, receipts, exports, metrics); `admin` may also change things. `OPERATOR_TOKEN`, when
//! set, is a bootstrap admin with no row (its [`Actor::operator_id`] is `None`).
//!
//! Every lookup of an operator token reads Postgres (no cache): a revoked token is refused
//! by every router from the moment the revocation commits (`DELETE /admin/operators/{id}` or
//! `operators revoke`, both [`manage::revoke`]).
//!
//! Every change an operator makes is recorded by [`events::record`] in the change's own
//! transaction, in the append-only `operator_events` table.

pub mod events;
pub mod manage;
pub mod store;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::idempotency::canonical::sha256_hex;

/// Who is acting: an operator row, or the bootstrap `OPERATOR_TOKEN`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Actor {
    /// `None`: the bootstrap `OPERATOR_TOKEN` (or the command line).
    pub operator_id: Option<Uuid>,
    pub name: String,
    pub role: Role,
    /// The peer's IP address (the TCP peer, never a forwarded header a client can forge).
    pub remote_addr: Option<String>,
}

/// The name events give the bootstrap `OPERATOR_TOKEN`.
pub const BOOTSTRAP_NAME: &str = "bootstrap";

impl Actor {
    /// The command line (`x402-router operators …`).
    pub fn cli() -> Self {
        Self { operator_id: None, name: "cli".into(), role: Role::Admin, remote_addr: None }
    }
}

/// Prefix of every operator token.
pub const TOKEN_PREFIX: &str = "x4o_";

/// What an operator may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads: audit, receipts, exports, metrics.
    Viewer,
    /// Reads and changes.
    Admin,
}

impl Role {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Viewer => "viewer",
            Self::Admin => "admin",
        }
    }

    /// `viewer` or `admin`; `None` otherwise.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "viewer" => Some(Self::Viewer),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A new random operator token (256 bits from the operating system's CSPRNG).
///
/// # Errors
/// If the operating system cannot provide randomness.
pub fn generate_token() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)?;
    Ok(format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// The stored form of a token.
pub fn hash_token(token: &str) -> String {
    sha256_hex(token.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_prefixed_random_and_hashed() {
        let a = generate_token().unwrap();
        let b = generate_token().unwrap();
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 43, "{a}");
        assert_ne!(a, b);
        assert_eq!(hash_token(&a).len(), 64);
        assert_ne!(hash_token(&a), hash_token(&b));
    }

    #[test]
    fn roles_round_trip() {
        for r in [Role::Viewer, Role::Admin] {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("Admin"), None);
        assert_eq!(Role::parse("root"), None);
    }
}
