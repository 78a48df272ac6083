//! Agent API keys: `x4r_<43 base64url chars>` (256 random bits), stored only as their
//! sha256. A leaf module: authentication (`auth`) checks keys, the control plane (`admin`)
//! issues them.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use crate::idempotency::canonical::sha256_hex;

/// Prefix of every agent API key.
pub const KEY_PREFIX: &str = "x4r_";

/// A new random API key (256 bits from the operating system's CSPRNG).
///
/// # Errors
/// If the operating system cannot provide randomness.
pub fn generate_api_key() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes)?;
    Ok(format!("{KEY_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes)))
}

/// The stored form of a key.
pub fn hash_api_key(key: &str) -> String {
    sha256_hex(key.as_bytes())
}
