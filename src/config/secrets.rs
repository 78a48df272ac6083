//! The settings of secrets at rest (`crate::secrets`): `SECRETS_KEY_FILE`,
//! `REDACT_QUERY_PARAMS`, `SECRETS_RETENTION_HOURS`.

use std::sync::Arc;

use alloy::signers::local::PrivateKeySigner;

use super::{ConfigError, secret_text};
use crate::secrets::{Keyring, Redaction};
use clap::Args;

/// Secrets at rest (docs/operations.md, "Secrets at rest").
#[derive(Debug, Args, Clone)]
pub struct SecretsArgs {
    /// A file of the keys that seal what agents forward (headers, URLs, bodies) in the ledger:
    /// one per line, `<key id> <64 hex digits>`; the first seals, every one listed opens.
    /// Unset: a key derived from the wallet key (id `wallet`).
    #[arg(long, env = "SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<String>,
    /// Query parameters whose values are redacted wherever a URL is shown or kept in the clear
    /// (receipts, the audit API, the ledger), comma-separated, any letter case.
    #[arg(long, env = "REDACT_QUERY_PARAMS", default_value = "api_key,key,token,sig")]
    pub redact_query_params: String,
    /// How long what an agent forwarded is kept (sealed) for a takeover or recovery to re-send
    /// it, in hours (1–8760); `gc` drops it after, and as soon as the payment is settled.
    #[arg(long, env = "SECRETS_RETENTION_HOURS", default_value = "48")]
    pub secrets_retention_hours: String,
}

/// The longest retention accepted: a year.
const MAX_RETENTION_HOURS: i32 = 24 * 366;

/// How secrets are sealed, shown and kept.
#[derive(Debug, Clone)]
pub struct SecretsConfig {
    pub keyring: Arc<Keyring>,
    pub redaction: Redaction,
    /// Hours after which `gc` drops an intent's secrets whatever its state.
    pub retention_hours: i32,
}

impl SecretsConfig {
    /// # Errors
    /// The first malformed setting, naming it (never quoting a key).
    pub fn from_args(args: &SecretsArgs, signer: &PrivateKeySigner) -> Result<Self, ConfigError> {
        Ok(Self {
            keyring: Arc::new(keyring(args.secrets_key_file.as_ref(), signer)?),
            redaction: Redaction::parse(&args.redact_query_params)
                .map_err(|e| ConfigError::new("REDACT_QUERY_PARAMS", e.to_string()))?,
            retention_hours: retention_hours(&args.secrets_retention_hours)?,
        })
    }
}

/// The keys of `SECRETS_KEY_FILE`, or (unset) the one derived from the wallet key.
///
/// # Errors
/// An unreadable or malformed file.
pub fn keyring(file: Option<&String>, signer: &PrivateKeySigner) -> Result<Keyring, ConfigError> {
    const ENV: &str = "SECRETS_KEY_FILE";
    let wallet_key = signer.credential().to_bytes();
    let keyring = match secret_text((ENV, None), (ENV, file))? {
        Some((_, text)) => Keyring::from_file_text(&text, &wallet_key),
        None => Keyring::derived(&wallet_key),
    };
    keyring.map_err(|e| ConfigError::new(ENV, e.to_string()))
}

/// `SECRETS_RETENTION_HOURS`: 1 to a year.
///
/// # Errors
/// Not a whole number of hours in range.
pub fn retention_hours(raw: &str) -> Result<i32, ConfigError> {
    raw.trim()
        .parse::<i32>()
        .ok()
        .filter(|h| (1..=MAX_RETENTION_HOURS).contains(h))
        .ok_or_else(|| ConfigError::new("SECRETS_RETENTION_HOURS", "expected whole hours from 1 to 8784"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_key_file_names_the_setting_and_never_a_key() {
        let signer: PrivateKeySigner =
            "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d".parse().unwrap();
        let dir = std::env::temp_dir().join(format!("x4r-secrets-{}", uuid::Uuid::new_v4()));
        std::fs::write(&dir, "k1 00ff\n").unwrap();
        let e = keyring(Some(&dir.to_string_lossy().into_owned()), &signer).unwrap_err().to_string();
        std::fs::remove_file(&dir).unwrap();
        assert!(e.contains("SECRETS_KEY_FILE") && e.contains("line 1") && !e.contains("00ff"), "{e}");
        let missing = keyring(Some(&"/nonexistent/keys".to_owned()), &signer).unwrap_err().to_string();
        assert!(missing.contains("SECRETS_KEY_FILE") && missing.contains("cannot read"), "{missing}");
        assert_eq!(keyring(None, &signer).unwrap().current_id(), crate::secrets::DERIVED_KEY_ID);
        for bad in ["0", "-1", "1.5", "", "9000"] {
            assert!(retention_hours(bad).unwrap_err().to_string().contains("SECRETS_RETENTION_HOURS"), "{bad}");
        }
        assert_eq!(retention_hours(" 48 ").unwrap(), 48);
    }
}
