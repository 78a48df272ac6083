//! The paying wallet's balance, as the gauge `x402_router_wallet_balance{network, asset}`
//! (atomic units of the token), so that an alert fires before payments start failing.
//!
//! A background task reads ERC-20 `balanceOf(payer)` of every configured (network, asset)
//! once at start and then every [`REFRESH`]. It uses its own read-only RPC clients on the
//! configured URLs, bounded by `X402_RPC_TIMEOUT_MS`; a failed read leaves the last value
//! and is logged at debug (the payment path reports RPC trouble itself). Nothing here
//! decides anything: it only reports.

use std::time::Duration;

use alloy::primitives::{Address, U256};
use alloy::providers::RootProvider;
use alloy::sol;

use crate::state::AppState;

/// How often the balances are read.
pub const REFRESH: Duration = Duration::from_secs(60);

sol! {
    #[sol(rpc)]
    interface IERC20Balance {
        function balanceOf(address owner) external view returns (uint256);
    }
}

/// Starts the refresh task on the current runtime. Returns at once.
pub fn spawn_balance_refresh(state: &AppState) {
    let payments = &state.config.payments;
    let payer = state.config.signer.address();
    let timeout = payments.rpc_timeout;
    let targets: Vec<_> = payments
        .assets
        .iter()
        .filter_map(|(network, assets)| {
            let url = payments.rpc_urls.get(network)?.clone();
            Some((network.to_string(), RootProvider::new_http(url), assets.clone()))
        })
        .collect();
    if targets.is_empty() {
        return;
    }
    let metrics = std::sync::Arc::clone(&state.metrics);
    tokio::spawn(async move {
        loop {
            for (network, provider, assets) in &targets {
                for asset in assets {
                    match read_balance(provider, *asset, payer, timeout).await {
                        Some(v) => metrics
                            .wallet_balance
                            .with_label_values(&[network.as_str(), &asset.to_checksum(None)])
                            .set(u256_to_f64(v)),
                        None => {
                            metrics.rpc_errors.with_label_values(&["balanceOf"]).inc();
                            tracing::debug!(network = %network, asset = %asset, "wallet balance read failed")
                        }
                    }
                }
            }
            tokio::time::sleep(REFRESH).await;
        }
    });
}

async fn read_balance(provider: &RootProvider, asset: Address, owner: Address, timeout: Duration) -> Option<U256> {
    let token = IERC20Balance::new(asset, provider);
    let call = token.balanceOf(owner);
    tokio::time::timeout(timeout, call.call()).await.ok()?.ok()
}

/// A gauge is an f64: exact up to 2^53 atomic units (9e9 USDC), close enough beyond.
fn u256_to_f64(v: U256) -> f64 {
    v.to_string().parse().unwrap_or(f64::MAX)
}
