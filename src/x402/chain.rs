//! On-chain checks through the configured JSON-RPC endpoints (one per network, `X402_RPC_URLS`):
//! whether an EIP-3009 authorization has been used, and whether a transaction succeeded.
//!
//! Invariants:
//! - Every call is bounded by the per-call timeout given at construction
//!   (`tokio::time::timeout`), and a timeout is an error, never an answer.
//! - A network without an RPC URL is an error ([`ChainError::UnknownNetwork`]), never "false".
//! - A view call to an address without code is an error ([`ChainError::NoContract`]): an empty
//!   reply must not read as "authorization unused", which could lead to paying twice.
//! - Error messages never contain the RPC URL (it often embeds an API key).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use alloy::network::Ethereum;
use alloy::primitives::{Address, B256};
use alloy::providers::{Provider, RootProvider};
use alloy::sol;
use reqwest::Url;

use super::network::Network;

sol! {
    /// The EIP-3009 view used to learn whether a nonce has been consumed.
    #[sol(rpc)]
    interface IEIP3009 {
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
    }
}

/// Why an on-chain check gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// No RPC URL is configured for the network.
    #[error("no RPC URL configured for {0}")]
    UnknownNetwork(Network),
    /// The RPC call did not finish within the per-call timeout.
    #[error("RPC call on {network} timed out after {timeout:?}")]
    Timeout {
        /// Network.
        network: Network,
        /// The limit that was hit.
        timeout: Duration,
    },
    /// The called address has no code (wrong asset address or wrong chain).
    #[error("{address} on {network} is not a contract (call returned no data)")]
    NoContract {
        /// Network.
        network: Network,
        /// Called address.
        address: Address,
    },
    /// The RPC endpoint serves another chain than the one it is configured for.
    #[error("RPC URL for {network} serves chain id {actual}")]
    ChainIdMismatch {
        /// Configured network.
        network: Network,
        /// Chain id the endpoint reported.
        actual: u64,
    },
    /// Transport, JSON-RPC or decoding failure (message with the RPC URL removed).
    #[error("RPC call on {network} failed: {message}")]
    Rpc {
        /// Network.
        network: Network,
        /// What went wrong.
        message: String,
    },
}

/// JSON-RPC access to the configured networks. Cheap to clone (one `Arc`).
#[derive(Clone)]
pub struct Chain {
    inner: Arc<Inner>,
}

struct Inner {
    endpoints: HashMap<Network, Endpoint>,
    timeout: Duration,
}

struct Endpoint {
    provider: RootProvider<Ethereum>,
    /// The URL as configured and as normalized, to scrub from error messages.
    redact: [String; 2],
}

impl std::fmt::Debug for Chain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Deliberately without URLs: they may embed API keys.
        let mut networks: Vec<_> = self.inner.endpoints.keys().collect();
        networks.sort();
        f.debug_struct("Chain").field("networks", &networks).field("timeout", &self.inner.timeout).finish()
    }
}

impl Chain {
    /// One HTTP JSON-RPC client per network; nothing is contacted until the first call.
    /// `timeout` bounds every call.
    pub fn new(rpc_urls: impl IntoIterator<Item = (Network, Url)>, timeout: Duration) -> Self {
        let endpoints = rpc_urls
            .into_iter()
            .map(|(network, url)| {
                let as_str = url.as_str().to_owned();
                let trimmed = as_str.trim_end_matches('/').to_owned();
                let endpoint = Endpoint { provider: RootProvider::new_http(url), redact: [as_str, trimmed] };
                (network, endpoint)
            })
            .collect();
        Self { inner: Arc::new(Inner { endpoints, timeout }) }
    }

    /// The networks that have an RPC URL (the only ones the router may pay on), sorted.
    pub fn networks(&self) -> Vec<Network> {
        let mut networks: Vec<_> = self.inner.endpoints.keys().copied().collect();
        networks.sort();
        networks
    }

    /// True when `network` has an RPC URL.
    pub fn has_network(&self, network: Network) -> bool {
        self.inner.endpoints.contains_key(&network)
    }

    /// EIP-3009 `authorizationState(authorizer, nonce)` of the token `asset`: `true` when the
    /// authorization was used (settled) or canceled, `false` when it is still unused.
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`], [`ChainError::Timeout`], [`ChainError::NoContract`]
    /// when `asset` has no code, [`ChainError::Rpc`] for anything else (including a revert).
    pub async fn authorization_state(
        &self,
        network: Network,
        asset: Address,
        authorizer: Address,
        nonce: B256,
    ) -> Result<bool, ChainError> {
        let endpoint = self.endpoint(network)?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.authorizationState(authorizer, nonce);
        match self.bounded(network, call.call()).await? {
            Ok(used) => Ok(used),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// Status of a transaction from its receipt: `Some(true)` succeeded, `Some(false)`
    /// reverted, `None` unknown to the node or still pending.
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`], [`ChainError::Timeout`], [`ChainError::Rpc`].
    pub async fn transaction_status(&self, network: Network, tx_hash: B256) -> Result<Option<bool>, ChainError> {
        let endpoint = self.endpoint(network)?;
        let receipt = self
            .bounded(network, endpoint.provider.get_transaction_receipt(tx_hash))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        Ok(receipt.map(|r| r.status()))
    }

    /// Checks that the endpoint of `network` serves that chain (a start-up sanity check).
    ///
    /// # Errors
    /// [`ChainError::ChainIdMismatch`], or the errors of any call.
    pub async fn verify_chain_id(&self, network: Network) -> Result<(), ChainError> {
        let endpoint = self.endpoint(network)?;
        let actual = self
            .bounded(network, endpoint.provider.get_chain_id())
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        if actual == network.chain_id() { Ok(()) } else { Err(ChainError::ChainIdMismatch { network, actual }) }
    }

    fn endpoint(&self, network: Network) -> Result<&Endpoint, ChainError> {
        self.inner.endpoints.get(&network).ok_or(ChainError::UnknownNetwork(network))
    }

    async fn bounded<F: IntoFuture>(&self, network: Network, call: F) -> Result<F::Output, ChainError> {
        let timeout = self.inner.timeout;
        tokio::time::timeout(timeout, call).await.map_err(|_| ChainError::Timeout { network, timeout })
    }
}

impl Endpoint {
    fn rpc_error(&self, network: Network, error: &dyn std::error::Error) -> ChainError {
        let mut message = error.to_string();
        for url in &self.redact {
            if !url.is_empty() {
                message = message.replace(url.as_str(), "<rpc url>");
            }
        }
        ChainError::Rpc { network, message }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(url: &str, timeout: Duration) -> Chain {
        Chain::new([(Network::BASE_SEPOLIA, url.parse().unwrap())], timeout)
    }

    #[tokio::test]
    async fn network_without_rpc_url_is_an_error() {
        let chain = chain("http://127.0.0.1:9", Duration::from_secs(1));
        let err = chain.authorization_state(Network::BASE, Address::ZERO, Address::ZERO, B256::ZERO).await.unwrap_err();
        assert!(matches!(err, ChainError::UnknownNetwork(n) if n == Network::BASE));
        assert!(matches!(
            chain.transaction_status(Network::BASE, B256::ZERO).await,
            Err(ChainError::UnknownNetwork(_))
        ));
        assert_eq!(chain.networks(), vec![Network::BASE_SEPOLIA]);
    }

    #[tokio::test]
    async fn unreachable_rpc_is_an_error_without_the_url() {
        // Port 9 (discard) on loopback: connection refused, or a timeout; both are errors.
        let chain = chain("http://127.0.0.1:9/secret-api-key", Duration::from_secs(5));
        let err = chain
            .authorization_state(Network::BASE_SEPOLIA, Address::ZERO, Address::ZERO, B256::ZERO)
            .await
            .unwrap_err();
        assert!(matches!(err, ChainError::Rpc { .. } | ChainError::Timeout { .. }));
        assert!(!err.to_string().contains("secret-api-key"), "{err}");
        assert!(!format!("{chain:?}").contains("secret-api-key"));
    }

    #[tokio::test]
    async fn a_silent_rpc_times_out() {
        // A listener that accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let chain = chain(&format!("http://{addr}"), Duration::from_millis(200));
        let err = chain.transaction_status(Network::BASE_SEPOLIA, B256::ZERO).await.unwrap_err();
        assert!(matches!(err, ChainError::Timeout { .. }), "{err}");
        hold.abort();
    }
}
