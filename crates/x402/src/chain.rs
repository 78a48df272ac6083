//! On-chain checks through the configured JSON-RPC endpoints (one or more per network,
//! `X402_RPC_URLS`; see [`super::rpc`] for the fallback and retry between them): whether an
//! EIP-3009 authorization has been used, which transaction used it, whether a transaction
//! succeeded, a token's decimals and symbol.
//!
//! Invariants:
//! - Chain identity: each URL answers nothing until its own `eth_chainId` equals its network's
//!   chain id (no payment decision is ever made from another chain's state); a call that no
//!   URL could answer while one of them serves another chain is
//!   [`ChainError::ChainIdMismatch`]. The check is made again after any failure of that URL,
//!   so a reconnect to a different node is checked too.
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
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{Provider, RootProvider};
use alloy::rpc::types::Filter;
use alloy::sol;
use alloy::sol_types::SolEvent;
use reqwest::Url;

use super::network::Network;
use super::rpc::{EndpointMetrics, UrlTransport};

mod permit2;
mod transfers;
pub mod watch;
pub use permit2::{PERMIT2, Permit2Settlement, Permit2Terms, nonce_position, settled_permit2_nonce};

sol! {
    /// The EIP-3009 view used to learn whether a nonce has been consumed.
    #[sol(rpc)]
    interface IEIP3009 {
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        function decimals() external view returns (uint8);
        function symbol() external view returns (string);
        function balanceOf(address owner) external view returns (uint256);
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
    #[error("RPC endpoint {endpoint} of {network} serves chain id {actual}")]
    ChainIdMismatch {
        /// Configured network.
        network: Network,
        /// Position of the URL among the network's URLs in `X402_RPC_URLS` (from 0).
        endpoint: usize,
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
    /// All the network's URLs, behind the fallback and retry layers.
    provider: RootProvider<Ethereum>,
    /// The same URLs one by one (start-up checks, mismatch reports).
    urls: Vec<UrlTransport>,
    /// Each URL as configured and as normalized, to scrub from error messages.
    redact: Vec<String>,
    /// The per-call limit (reported by a call whose every attempt timed out).
    timeout: Duration,
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
    /// One JSON-RPC client per network over its URLs (in order of preference); nothing is
    /// contacted until the first call. `timeout` bounds every call.
    pub fn new(rpc_urls: impl IntoIterator<Item = (Network, Vec<Url>)>, timeout: Duration) -> Self {
        Self::build(rpc_urls, timeout, None)
    }

    /// [`Self::new`], counting every request to every URL in `metrics`.
    pub fn with_metrics(
        rpc_urls: impl IntoIterator<Item = (Network, Vec<Url>)>,
        timeout: Duration,
        metrics: EndpointMetrics,
    ) -> Self {
        Self::build(rpc_urls, timeout, Some(&metrics))
    }

    fn build(
        rpc_urls: impl IntoIterator<Item = (Network, Vec<Url>)>,
        timeout: Duration,
        metrics: Option<&EndpointMetrics>,
    ) -> Self {
        let endpoints = rpc_urls
            .into_iter()
            .filter(|(_, urls)| !urls.is_empty())
            .map(|(network, urls)| {
                let redact = urls
                    .iter()
                    .flat_map(|u| {
                        let s = u.as_str().to_owned();
                        let trimmed = s.trim_end_matches('/').to_owned();
                        [s, trimmed]
                    })
                    .collect();
                let (client, urls) = super::rpc::client(network, urls, timeout, metrics);
                (network, Endpoint { provider: RootProvider::new(client), urls, redact, timeout })
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
        let endpoint = self.endpoint(network)?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.decimals();
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(d) => Ok(d),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The token's `symbol()`, as the contract returns it (unchecked: the caller decides what
    /// it shows).
    ///
    /// # Errors
    /// As [`Self::authorization_state`].
    pub async fn symbol(&self, network: Network, asset: Address) -> Result<String, ChainError> {
        let endpoint = self.endpoint(network)?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.symbol();
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(s) => Ok(s),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The token's `balanceOf(owner)`.
    ///
    /// # Errors
    /// As [`Self::authorization_state`].
    pub async fn balance_of(&self, network: Network, asset: Address, owner: Address) -> Result<U256, ChainError> {
        let endpoint = self.endpoint(network)?;
        let token = IEIP3009::new(asset, &endpoint.provider);
        let call = token.balanceOf(owner);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(v) => Ok(v),
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
        let endpoint = self.endpoint(network)?;
        let topics = [IEIP3009::AuthorizationUsed::SIGNATURE_HASH, authorizer.into_word(), nonce];
        let matches = |addr: Address, t: &[B256]| addr == asset && t.len() >= 3 && t[..3] == topics;
        if let Some(hash) = claimed
            && self.authorization_used_in(network, asset, authorizer, nonce, hash).await?
        {
            return Ok(Some(hash));
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

    /// Whether the successful transaction `tx` used `(authorizer, nonce)` on the token `asset`
    /// (its receipt carries the token's `AuthorizationUsed` event): one receipt read.
    ///
    /// # Errors
    /// As [`Self::authorization_state`].
    pub async fn authorization_used_in(
        &self,
        network: Network,
        asset: Address,
        authorizer: Address,
        nonce: B256,
        tx: B256,
    ) -> Result<bool, ChainError> {
        let endpoint = self.endpoint(network)?;
        let topics = [IEIP3009::AuthorizationUsed::SIGNATURE_HASH, authorizer.into_word(), nonce];
        let receipt = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(tx))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        Ok(receipt.is_some_and(|r| {
            r.status()
                && r.inner
                    .logs()
                    .iter()
                    .any(|l| l.address() == asset && l.topics().len() >= 3 && l.topics()[..3] == topics)
        }))
    }

    /// Status of a transaction from its receipt: `Some(true)` succeeded, `Some(false)`
    /// reverted, `None` unknown to the node or still pending.
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`], [`ChainError::Timeout`], [`ChainError::Rpc`].
    pub async fn transaction_status(&self, network: Network, tx_hash: B256) -> Result<Option<bool>, ChainError> {
        let endpoint = self.endpoint(network)?;
        let receipt = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(tx_hash))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        Ok(receipt.map(|r| r.status()))
    }

    /// Checks each URL of `network` on its own (a start-up check): one result per URL, in
    /// configuration order. A URL that serves another chain is
    /// [`ChainError::ChainIdMismatch`]; one that does not answer, [`ChainError::Rpc`] or
    /// [`ChainError::Timeout`].
    ///
    /// # Errors
    /// [`ChainError::UnknownNetwork`].
    pub async fn verify_chain_ids(&self, network: Network) -> Result<Vec<Result<(), ChainError>>, ChainError> {
        let endpoint = self.endpoint(network)?;
        let mut out = Vec::with_capacity(endpoint.urls.len());
        for url in &endpoint.urls {
            let checked = match tokio::time::timeout(self.inner.timeout, url.check_chain_id()).await {
                Err(_) => Err(ChainError::Timeout { network, timeout: self.inner.timeout }),
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(match url.wrong_chain() {
                    Some(actual) => ChainError::ChainIdMismatch { network, endpoint: url.index(), actual },
                    None => endpoint.rpc_error(network, &e),
                }),
            };
            out.push(checked);
        }
        Ok(out)
    }

    /// The network's latest block number.
    ///
    /// # Errors
    /// As [`Self::transaction_status`].
    pub async fn block_number(&self, network: Network) -> Result<u64, ChainError> {
        let endpoint = self.endpoint(network)?;
        self.bounded(endpoint, network, endpoint.provider.get_block_number())
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))
    }

    /// The logs `filter` matches (a bounded block range: callers page it).
    ///
    /// # Errors
    /// As [`Self::transaction_status`].
    pub async fn logs(&self, network: Network, filter: &Filter) -> Result<Vec<alloy::rpc::types::Log>, ChainError> {
        let endpoint = self.endpoint(network)?;
        self.bounded(endpoint, network, endpoint.provider.get_logs(filter))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))
    }

    /// The recipient and calldata of transaction `hash` (`None`: unknown to the node).
    ///
    /// # Errors
    /// As [`Self::transaction_status`].
    pub async fn transaction_call(
        &self,
        network: Network,
        hash: B256,
    ) -> Result<Option<(Option<Address>, alloy::primitives::Bytes)>, ChainError> {
        use alloy::rpc::types::TransactionTrait;
        let endpoint = self.endpoint(network)?;
        let tx = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_by_hash(hash))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        Ok(tx.map(|tx| (tx.to(), tx.input().clone())))
    }

    /// The batch-settlement channel `channel_id`'s `(balance, totalClaimed)` on `network`.
    ///
    /// # Errors
    /// As [`Self::authorization_state`] (the settlement contract in place of the token).
    pub async fn batch_channel(&self, network: Network, channel_id: B256) -> Result<(U256, U256), ChainError> {
        let endpoint = self.endpoint(network)?;
        let settlement = crate::batch::IBatchSettlement::new(crate::batch::SETTLEMENT, &endpoint.provider);
        let call = settlement.channels(channel_id);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(r) => Ok((U256::from(r.balance), U256::from(r.totalClaimed))),
            Err(alloy::contract::Error::ZeroData(..)) => {
                Err(ChainError::NoContract { network, address: crate::batch::SETTLEMENT })
            }
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The batch-settlement channel `channel_id`'s pending withdrawal on `network`:
    /// `(amount, initiatedAt)`, `initiatedAt` zero when none is pending.
    ///
    /// # Errors
    /// As [`Self::batch_channel`].
    pub async fn batch_withdrawal(&self, network: Network, channel_id: B256) -> Result<(U256, u64), ChainError> {
        let endpoint = self.endpoint(network)?;
        let settlement = crate::batch::IBatchSettlement::new(crate::batch::SETTLEMENT, &endpoint.provider);
        let call = settlement.pendingWithdrawals(channel_id);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(r) => Ok((U256::from(r.amount), r.initiatedAt.to::<u64>())),
            Err(alloy::contract::Error::ZeroData(..)) => {
                Err(ChainError::NoContract { network, address: crate::batch::SETTLEMENT })
            }
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    fn endpoint(&self, network: Network) -> Result<&Endpoint, ChainError> {
        self.inner.endpoints.get(&network).ok_or(ChainError::UnknownNetwork(network))
    }

    /// Runs `call` under the per-call timeout (each URL's attempt has its share of it, and a
    /// URL whose attempt timed out checks its chain id again before its next answer).
    async fn bounded<F: IntoFuture>(
        &self,
        _endpoint: &Endpoint,
        network: Network,
        call: F,
    ) -> Result<F::Output, ChainError> {
        use tracing::Instrument;
        let timeout = self.inner.timeout;
        // One span per chain read (a trace shows each RPC round trip of a paid call).
        let span = tracing::info_span!("chain", payment.network = %network);
        tokio::time::timeout(timeout, call).instrument(span).await.map_err(|_| ChainError::Timeout { network, timeout })
    }
}

impl Endpoint {
    /// A failed call: [`ChainError::ChainIdMismatch`] when no URL is fit to answer and one
    /// of them serves another chain, else the message without the URLs.
    fn rpc_error(&self, network: Network, error: &(dyn std::error::Error + 'static)) -> ChainError {
        if !self.urls.iter().any(UrlTransport::verified)
            && let Some((endpoint, actual)) = self.urls.iter().find_map(|u| u.wrong_chain().map(|a| (u.index(), a)))
        {
            return ChainError::ChainIdMismatch { network, endpoint, actual };
        }
        let mut cause = Some(error);
        while let Some(e) = cause {
            if e.downcast_ref::<super::rpc::AttemptTimeout>().is_some() {
                return ChainError::Timeout { network, timeout: self.timeout };
            }
            cause = e.source();
        }
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
        Chain::new([(Network::BASE_SEPOLIA, vec![url.parse().unwrap()])], timeout)
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
