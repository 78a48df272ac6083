//! What the router is willing to pay with: networks and their RPC URLs, assets (Circle's USDC
//! built in), the authorization lifetime, batch-settlement channels and the budget currency.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use alloy::primitives::Address;
use url::Url;

use super::parse::{Assets, parse_assets};
use super::usdc::{DEFAULT_ASSETS, USDC_DECIMALS, built_in_usdc};
use super::{ConfigError, budget};
use crate::x402::Network;

/// What the router is willing to pay with.
#[derive(Debug, Clone)]
pub struct PaymentConfig {
    /// Network → its RPC URLs, in order of preference (fallback, see `x402::rpc`). A network
    /// without one is never paid on.
    pub rpc_urls: BTreeMap<Network, Vec<Url>>,
    /// Network → token contracts the router pays with.
    pub assets: BTreeMap<Network, Vec<Address>>,
    /// Decimals of the assets that are configured (`@6`) or built in; the others are read
    /// from the token before serving (`startup::preflight`).
    pub decimals: BTreeMap<(Network, Address), u8>,
    /// Assets configured `+permit2` (no EIP-3009): paid only via Permit2, and their
    /// `authorizationState` is never asked.
    pub permit2_only: BTreeSet<(Network, Address)>,
    /// Symbols of the assets, only ever shown: `USDC` for the built-in USDC, the others read
    /// from the token before serving (`startup::preflight`; none when unreadable).
    pub symbols: BTreeMap<(Network, Address), String>,
    pub rpc_timeout: Duration,
    /// Network → its WebSocket URL for the chain index (`X402_WS_URLS`; none: no index).
    pub ws_urls: BTreeMap<Network, Url>,
    /// How many blocks back the chain index reads at start-up.
    pub index_lookback_blocks: u64,
    /// Longest lifetime of a signed authorization, whatever an upstream asks
    /// (`validBefore = now + min(maxTimeoutSeconds, this)`).
    pub max_auth_secs: u64,
    /// Paying with x402 `batch-settlement` channels (`X402_SCHEMES` names it); `None`: off.
    pub batch: Option<BatchConfig>,
    /// The budget currency (`BUDGET_CURRENCY`): assets of different decimals share budgets
    /// counted in it; `None`: every asset shares one unit (checked by [`Self::check_one_unit`]).
    pub budget: Option<budget::BudgetConfig>,
}

/// The operator's bounds on batch-settlement channels (`X402_BATCH_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchConfig {
    /// A new deposit is this many times the price (or the server's announced minimum, if more).
    pub deposit_multiplier: u64,
    /// The most one channel's deposits may hold (atomic units).
    pub max_deposit: crate::money::Amount,
    /// The longest withdraw delay a channel may lock the deposit for (seconds).
    pub max_withdraw_delay: u64,
    /// Lanes (channels) per upstream: parallel calls beyond this wait.
    pub lanes: u32,
}

impl PaymentConfig {
    /// Checks that every asset whose decimals are known has the same decimals: caps and
    /// budgets are numbers of atomic units, so one budget can only span assets whose atomic
    /// units are equal.
    ///
    /// # Errors
    /// [`ConfigError`] naming two assets of different decimals.
    pub fn check_one_unit(&self) -> Result<(), ConfigError> {
        if self.budget.is_some() {
            return Ok(()); // budgets are counted in the budget currency
        }
        let mut first: Option<(&(Network, Address), u8)> = None;
        for (asset, d) in &self.decimals {
            match first {
                None => first = Some((asset, *d)),
                Some((a, d0)) if d0 != *d => {
                    return Err(ConfigError::new(
                        "X402_ASSETS",
                        format!(
                            "mixes assets of different units: {}={} has {d0} decimals, {}={} has {d}; agents' caps \
                             and budgets are in atomic units, so one budget cannot span them (set BUDGET_CURRENCY \
                             and X402_ASSET_VALUES, or run one router per unit)",
                            a.0, a.1, asset.0, asset.1
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

/// The assets the router pays with: `X402_ASSETS` (empty: USDC on Base and Base Sepolia),
/// plus the built-in USDC of every network of `rpc_urls` that `X402_ASSETS` gives no asset
/// for. A network with neither gets nothing (it is never paid on).
///
/// # Errors
/// A malformed `X402_ASSETS`.
pub fn configured_assets(raw: &str, rpc_urls: &BTreeMap<Network, Vec<Url>>) -> Result<Assets, ConfigError> {
    let raw = if raw.trim().is_empty() { DEFAULT_ASSETS } else { raw };
    let (mut assets, mut decimals, permit2_only) = parse_assets(raw)?;
    for network in rpc_urls.keys() {
        if !assets.contains_key(network)
            && let Some(usdc) = built_in_usdc(*network)
        {
            assets.insert(*network, vec![usdc]);
            decimals.insert((*network, usdc), USDC_DECIMALS);
        }
    }
    Ok((assets, decimals, permit2_only))
}
