//! Paying on Solana: the wallet, the configured networks and mints, and each network's RPC
//! endpoints ([`SolanaRpcs`], also what `reconcile` asks). The payment flow itself is
//! `relay/pay/svm/`; the protocol is `x402::svm`.
//!
//! A network's first URL is read to pay; the others are witnesses. A Solana payment is signed
//! again, or released as never landing, only on the word of every endpoint, at least two
//! (`SvmEndpoints::fate`): a network with one URL never does either (docs/operations.md,
//! "Solana"), and a warning says so at start.

use std::collections::BTreeMap;
use std::time::Duration;

use url::Url;

use crate::config::solana::SolanaConfig;
use crate::x402::svm::{SvmEndpoints, SvmNetwork, SvmRpc, SvmRpcError};

/// True for a ledger `network` column of a Solana intent (its CAIP-2 namespace).
pub fn is_solana_network(network: &str) -> bool {
    network.starts_with("solana:")
}

/// Each Solana network's endpoints. Each checks, before any read and after any failure, that
/// it serves its network's genesis hash (`SvmRpc`).
#[derive(Debug, Default)]
pub struct SolanaRpcs(BTreeMap<SvmNetwork, SvmEndpoints>);

impl SolanaRpcs {
    /// The endpoints of `urls` (per network, the first is the primary); nothing is sent yet.
    ///
    /// # Errors
    /// An HTTP client that cannot be built, or a network without a URL.
    pub fn new(urls: &BTreeMap<SvmNetwork, Vec<Url>>, timeout: Duration) -> Result<Self, SvmRpcError> {
        let mut out = BTreeMap::new();
        for (network, urls) in urls {
            let mut rpcs = Vec::with_capacity(urls.len());
            for url in urls {
                rpcs.push(SvmRpc::new(network.clone(), url.clone(), timeout)?);
            }
            let mut rpcs = rpcs.into_iter();
            let primary = rpcs.next().ok_or(SvmRpcError::Malformed("a Solana network without an RPC URL"))?;
            let endpoints = SvmEndpoints::new(primary, rpcs.collect())?;
            if endpoints.witnesses() == 0 {
                tracing::warn!(
                    payment.network = %network,
                    "one RPC URL for this Solana network: a payment whose transaction may never land is never signed \
                     again nor released (no second endpoint can confirm it); give X402_RPC_URLS a second URL of it"
                );
            }
            out.insert(network.clone(), endpoints);
        }
        Ok(Self(out))
    }

    /// The endpoints of the network whose CAIP-2 id is `network`, if configured.
    pub fn of(&self, network: &str) -> Option<&SvmEndpoints> {
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
        let urls = config.networks.iter().map(|(n, c)| (n.clone(), c.rpc_urls.clone())).collect();
        let rpcs = std::sync::Arc::new(SolanaRpcs::new(&urls, timeout)?);
        Ok(Self { config, rpcs })
    }
}
