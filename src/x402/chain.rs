//! On-chain checks through the configured JSON-RPC endpoints (one per network, `X402_RPC_URLS`):
//! whether an EIP-3009 authorization has been used, which transaction used it, whether a
//! transaction succeeded, a token's decimals.
//!
//! Invariants:
//! - Chain identity: an endpoint answers nothing until its `eth_chainId` equals its network's
//!   chain id ([`ChainError::ChainIdMismatch`] otherwise, on every call: no payment decision
//!   is ever made from another chain's state). The check is made again after any transport
//!   error, so a reconnect to a different node is checked too.
//! - Every call is bounded by the per-call timeout given at construction
//!   (`tokio::time::timeout`), and a timeout is an error, never an answer.
//! - A network without an RPC URL is an error ([`ChainError::UnknownNetwork`]), never "false".
//! - A view call to an address without code is an error ([`ChainError::NoContract`]): an empty
//!   reply must not read as "authorization unused", which could lead to paying twice.
//! - Error messages never contain the RPC URL (it often embeds an API key).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use alloy::network::Ethereum;
use alloy::primitives::{Address, B256};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::Filter;
use alloy::sol;
use alloy::sol_types::SolEvent;
use reqwest::Url;

use super::network::Network;

sol! {
    /// The EIP-3009 view used to learn whether a nonce has been consumed.
    #[sol(rpc)]
    interface IEIP3009 {
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        function decimals() external view returns (uint8);
        event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
    }
}

/// How far back [`Chain::authorization_tx`] searches the logs for the transaction that used a
/// nonce (authorizations live minutes, so the use is recent).
const LOG_LOOKBACK_BLOCKS: u64 = 20_000;

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
    /// `eth_chainId` answered the configured network's id since the last transport error.
    verified: AtomicBool,
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
                let endpoint = Endpoint {
                    provider: RootProvider::new_http(url),
                    verified: AtomicBool::new(false),
                    redact: [as_str, trimmed],
                };
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
        let endpoint = self.ready(network).await?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.authorizationState(authorizer, nonce);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(used) => Ok(used),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The token's `decimals()`.
    ///
    /// # Errors
    /// As [`Self::authorization_state`].
    pub async fn decimals(&self, network: Network, asset: Address) -> Result<u8, ChainError> {
        let endpoint = self.ready(network).await?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.decimals();
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(d) => Ok(d),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The transaction that used `(authorizer, nonce)` on the token `asset`, from its
    /// `AuthorizationUsed` event: `claimed` when its receipt succeeded and carries that event,
    /// else the first such event in the recent logs. `None`: not found (an upstream's claimed
    /// hash is never recorded without this proof).
    ///
    /// # Errors
    /// As [`Self::authorization_state`].
    pub async fn authorization_tx(
        &self,
        network: Network,
        asset: Address,
        authorizer: Address,
        nonce: B256,
        claimed: Option<B256>,
    ) -> Result<Option<B256>, ChainError> {
        let endpoint = self.ready(network).await?;
        let topics = [IEIP3009::AuthorizationUsed::SIGNATURE_HASH, authorizer.into_word(), nonce];
        let matches = |addr: Address, t: &[B256]| addr == asset && t.len() >= 3 && t[..3] == topics;
        if let Some(hash) = claimed {
            let receipt = self
                .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(hash))
                .await?
                .map_err(|e| endpoint.rpc_error(network, &e))?;
            if let Some(r) = receipt
                && r.status()
                && r.inner.logs().iter().any(|l| matches(l.address(), l.topics()))
            {
                return Ok(Some(hash));
            }
        }
        let latest = self
            .bounded(endpoint, network, endpoint.provider.get_block_number())
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        let filter = Filter::new()
            .address(asset)
            .event_signature(topics[0])
            .topic1(topics[1])
            .topic2(topics[2])
            .from_block(latest.saturating_sub(LOG_LOOKBACK_BLOCKS));
        let logs = self
            .bounded(endpoint, network, endpoint.provider.get_logs(&filter))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        Ok(logs.iter().find(|l| matches(l.address(), l.topics())).and_then(|l| l.transaction_hash))
    }

    /// Status of a transaction from its receipt: `Some(true)` succeeded, `Some(false)`
    /// reverted, `None` unknown to the node or still pending.
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`], [`ChainError::Timeout`], [`ChainError::Rpc`].
    pub async fn transaction_status(&self, network: Network, tx_hash: B256) -> Result<Option<bool>, ChainError> {
        let endpoint = self.ready(network).await?;
        let receipt = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(tx_hash))
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
            .bounded(endpoint, network, endpoint.provider.get_chain_id())
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        if actual == network.chain_id() {
            endpoint.verified.store(true, Ordering::Release);
            Ok(())
        } else {
            endpoint.verified.store(false, Ordering::Release);
            Err(ChainError::ChainIdMismatch { network, actual })
        }
    }

    /// The endpoint of `network`, its chain id checked (once per connection).
    async fn ready(&self, network: Network) -> Result<&Endpoint, ChainError> {
        let endpoint = self.endpoint(network)?;
        if !endpoint.verified.load(Ordering::Acquire) {
            self.verify_chain_id(network).await?;
        }
        Ok(endpoint)
    }

    fn endpoint(&self, network: Network) -> Result<&Endpoint, ChainError> {
        self.inner.endpoints.get(&network).ok_or(ChainError::UnknownNetwork(network))
    }

    /// Runs `call` under the per-call timeout. A timeout un-verifies the endpoint: the next
    /// call checks the chain id again (it may reach another node).
    async fn bounded<F: IntoFuture>(
        &self,
        endpoint: &Endpoint,
        network: Network,
        call: F,
    ) -> Result<F::Output, ChainError> {
        let timeout = self.inner.timeout;
        tokio::time::timeout(timeout, call).await.map_err(|_| {
            endpoint.verified.store(false, Ordering::Release);
            ChainError::Timeout { network, timeout }
        })
    }
}

impl Endpoint {
    /// A failed call: the message without the URL; the endpoint is checked again next time.
    fn rpc_error(&self, network: Network, error: &dyn std::error::Error) -> ChainError {
        self.verified.store(false, Ordering::Release);
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
