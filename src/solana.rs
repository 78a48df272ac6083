//! Paying on Solana: the wallet, the configured networks and mints, and one RPC endpoint per
//! network ([`SolanaRpcs`], also what `reconcile` asks). The payment flow itself is
//! `relay/pay/svm/`; the protocol is `x402::svm`.

use std::collections::BTreeMap;
use std::time::Duration;

use url::Url;

use crate::config::solana::SolanaConfig;
use crate::x402::svm::{SvmNetwork, SvmRpc, SvmRpcError};

/// True for a ledger `network` column of a Solana intent (its CAIP-2 namespace).
pub fn is_solana_network(network: &str) -> bool {
    network.starts_with("solana:")
}

/// One RPC endpoint per Solana network. Each checks, before any read and after any failure,
/// that it serves its network's genesis hash (`SvmRpc`).
#[derive(Debug, Default)]
pub struct SolanaRpcs(BTreeMap<SvmNetwork, SvmRpc>);

impl SolanaRpcs {
    /// The endpoints of `urls`; nothing is sent yet.
    ///
    /// # Errors
    /// An HTTP client that cannot be built.
    pub fn new(urls: &BTreeMap<SvmNetwork, Url>, timeout: Duration) -> Result<Self, SvmRpcError> {
        let mut out = BTreeMap::new();
        for (network, url) in urls {
            out.insert(network.clone(), SvmRpc::new(network.clone(), url.clone(), timeout)?);
        }
        Ok(Self(out))
    }

    /// The endpoint of the network whose CAIP-2 id is `network`, if configured.
    pub fn of(&self, network: &str) -> Option<&SvmRpc> {
        let network = SvmNetwork::parse(network).ok()?;
        self.0.get(&network)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The router's Solana side: its settings and endpoints.
#[derive(Debug)]
pub struct Solana {
    pub config: SolanaConfig,
    /// Shared with the operator's `reconcile` runs.
    pub rpcs: std::sync::Arc<SolanaRpcs>,
}

impl Solana {
    /// # Errors
    /// An HTTP client that cannot be built.
    pub fn new(config: SolanaConfig, timeout: Duration) -> Result<Self, SvmRpcError> {
        let urls = config.networks.iter().map(|(n, c)| (n.clone(), c.rpc_url.clone())).collect();
        let rpcs = std::sync::Arc::new(SolanaRpcs::new(&urls, timeout)?);
        Ok(Self { config, rpcs })
    }
}
