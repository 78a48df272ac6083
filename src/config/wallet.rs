//! The router's key (`ROUTER_PRIVATE_KEY` or `ROUTER_PRIVATE_KEY_FILE`): the paying wallet and
//! the receipt signer.

use std::str::FromStr;

use alloy::signers::local::PrivateKeySigner;
use clap::Args;

use super::{ConfigError, secret_text};

/// The router's key (`serve`: the paying wallet and the receipt signer; `reconcile`: the
/// receipt signer of recovered answers only).
#[derive(Debug, Args, Clone)]
pub struct KeyArgs {
    /// The paying wallet's secp256k1 key, hex. Prefer --router-private-key-file.
    #[arg(long, env = "ROUTER_PRIVATE_KEY", hide_env_values = true)]
    pub router_private_key: Option<String>,
    /// A file holding the paying wallet's key (hex).
    #[arg(long, env = "ROUTER_PRIVATE_KEY_FILE")]
    pub router_private_key_file: Option<String>,
}

/// The router's key from `ROUTER_PRIVATE_KEY` or `ROUTER_PRIVATE_KEY_FILE`; `None` when
/// neither is set.
///
/// # Errors
/// Both set, an unreadable file, or a value that is not a key.
pub fn load_signer(args: &KeyArgs) -> Result<Option<PrivateKeySigner>, ConfigError> {
    let Some((env, raw)) = secret_text(
        ("ROUTER_PRIVATE_KEY", args.router_private_key.as_ref()),
        ("ROUTER_PRIVATE_KEY_FILE", args.router_private_key_file.as_ref()),
    )?
    else {
        return Ok(None);
    };
    let hex = raw.trim();
    PrivateKeySigner::from_str(hex)
        .map(Some)
        .map_err(|_| ConfigError::new(env, "is not a 32-byte hex secp256k1 private key"))
}
