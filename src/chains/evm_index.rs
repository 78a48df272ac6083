//! The chain index of each EVM network with a WebSocket URL (`X402_WS_URLS`): a live view of
//! the wallet's used nonces and their transactions (`x402::chain::watch`), read by the EVM
//! scheme before it signs and after a paid answer instead of asking the RPC endpoint
//! (docs/DESIGN.md §6, "What the chain proves, and when"). Whatever it cannot answer (not live,
//! not caught up, lagging) is read from the chain as without an index.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::x402::Network;
use crate::x402::chain::watch::{Watch, WatchSettings};
use crate::x402::{Chain, Supported};

/// How far behind the HTTP endpoint's head the index may be and still answer.
const LAG_BLOCKS: u64 = 2;
/// How often the index compares heads (and the liveness gauge is set).
const TICK: Duration = Duration::from_secs(1);

/// The indexes of the networks that have one.
#[derive(Default)]
pub struct Indexes(BTreeMap<Network, Arc<Watch>>);

impl Indexes {
    /// Starts one index per network with a WebSocket URL, over every asset configured there.
    pub fn spawn(config: &Config, supported: &Supported, chain: &Chain, metrics: &Arc<Metrics>) -> Self {
        let payments = &config.payments;
        let payer = config.signer.address();
        let mut out = BTreeMap::new();
        for (network, ws_url) in &payments.ws_urls {
            let tokens: Vec<_> = supported.payable_assets().filter(|(n, _)| n == network).map(|(_, a)| a).collect();
            let settings = WatchSettings {
                ws_url: ws_url.clone(),
                lookback_blocks: payments.index_lookback_blocks,
                lag_blocks: LAG_BLOCKS,
                tick: TICK,
            };
            let watch = Watch::spawn(chain.clone(), *network, payer, tokens, settings);
            spawn_gauge(Arc::clone(metrics), Arc::clone(&watch));
            out.insert(*network, watch);
        }
        Self(out)
    }

    /// The index of `network`, if it has one.
    pub fn of(&self, network: Network) -> Option<&Watch> {
        self.0.get(&network).map(Arc::as_ref)
    }
}

/// Keeps `x402_router_chain_index_live{network}` at 1 while the index answers.
fn spawn_gauge(metrics: Arc<Metrics>, watch: Arc<Watch>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK / 4);
        let gauge = metrics.chain_index_live.with_label_values(&[&watch.network().caip2()]);
        loop {
            tick.tick().await;
            gauge.set(i64::from(watch.is_live()));
        }
    });
}
