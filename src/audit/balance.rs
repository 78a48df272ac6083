//! The paying wallet's balance, as the gauge `x402_router_wallet_balance{network, asset}`
//! (atomic units of the token), so that an alert fires before payments start failing.
//!
//! A background task reads ERC-20 `balanceOf(payer)` of every configured (network, asset)
//! once at start and then every [`REFRESH`], through the router's own [`crate::x402::Chain`]
//! (the same URLs, fallback and chain-id checks as payments), each read bounded by
//! `X402_RPC_TIMEOUT_MS`; a failed read leaves the last value and is logged at debug (the
//! payment path reports RPC trouble itself). Nothing here decides anything: it only reports.

use std::time::Duration;

use alloy::primitives::U256;

use crate::state::AppState;

/// How often the balances are read.
pub const REFRESH: Duration = Duration::from_secs(60);

/// Starts the refresh task on the current runtime. Returns at once.
pub fn spawn_balance_refresh(state: &AppState) {
    let payments = &state.config.payments;
    let payer = state.config.signer.address();
    let targets: Vec<_> = payments
        .assets
        .iter()
        .filter(|(network, _)| state.chain.has_network(**network))
        .map(|(network, assets)| (*network, assets.clone()))
        .collect();
    if targets.is_empty() {
        return;
    }
    let metrics = std::sync::Arc::clone(&state.metrics);
    let chain = state.chain.clone();
    tokio::spawn(async move {
        loop {
            for (network, assets) in &targets {
                for asset in assets {
                    match chain.balance_of(*network, *asset, payer).await {
                        Ok(v) => metrics
                            .wallet_balance
                            .with_label_values(&[network.to_string().as_str(), &asset.to_checksum(None)])
                            .set(u256_to_f64(v)),
                        Err(e) => {
                            metrics.rpc_errors.with_label_values(&["balanceOf"]).inc();
                            tracing::debug!(network = %network, asset = %asset, error = %e, "wallet balance read failed")
                        }
                    }
                }
            }
            tokio::time::sleep(REFRESH).await;
        }
    });
}

/// A gauge is an f64: exact up to 2^53 atomic units (9e9 USDC), close enough beyond.
fn u256_to_f64(v: U256) -> f64 {
    v.to_string().parse().unwrap_or(f64::MAX)
}
