//! A live index of what the router's wallet has paid on one network, so that the paid path
//! needs no chain round trip in the common case (docs/DESIGN.md §6, "What the chain proves,
//! and when").
//!
//! Fed by a log subscription over WebSocket (`eth_subscribe` to the configured tokens' logs
//! whose first indexed argument is the payer: EIP-3009 `AuthorizationUsed(authorizer, nonce)`
//! and `Transfer(from, to, value)`) and caught up over HTTP (`eth_getLogs`, paged) from the
//! last block seen at every (re)connection, or from `lookback` blocks back at the first. A
//! `Transfer` from the payer in a transaction without the payer's `AuthorizationUsed` is a
//! Permit2 payment (or another transfer): its transaction is read in the background and the
//! Permit2 nonce of an x402 proxy's `settle` recorded.
//!
//! The index answers only while it is **live**: subscribed, caught up, and not behind the
//! HTTP endpoint's head by more than `lag_blocks` at the last tick (a stalled or lagging
//! subscription is dropped and caught up again). Otherwise every answer is
//! [`Seen::Unknown`], and the caller reads the chain as it would without an index. A log a
//! reorganization removed (`removed: true`) is removed. Permit2 answers are `Unknown` while a
//! transfer of the payer waits to be classified.
//!
//! What it does not know: anything used before the block it started from (the lookback). A
//! nonce used there reads as unused; the token (or Permit2) still refuses a second use of the
//! same nonce.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use alloy::primitives::{Address, B256, U256};
use alloy::providers::{Provider, ProviderBuilder, WsConnect};
use alloy::rpc::types::{Filter, Log};
use alloy::sol_types::SolEvent;
use futures_util::StreamExt;
use reqwest::Url;
use tokio::sync::Notify;

use super::{Chain, ChainError, IEIP3009};
use crate::network::Network;

alloy::sol! {
    /// ERC-20 `Transfer`: a payment of the payer that is not EIP-3009 shows as one.
    interface IErc20Transfer {
        event Transfer(address indexed from, address indexed to, uint256 value);
    }
}

/// Blocks read again at a reconnection or a reorganization (the last ones' logs may not all
/// have arrived, or may belong to blocks that were replaced).
const OVERLAP_BLOCKS: u64 = 10;
/// Block hashes kept to see a reorganization.
const KEPT_HASHES: u64 = 256;
/// How long the payer's transfers wait for their transaction's `AuthorizationUsed` before
/// they are read as possible Permit2 payments.
const CLASSIFY_AFTER: Duration = Duration::from_millis(50);

/// Most blocks one `eth_getLogs` of the catch-up asks for.
const PAGE_BLOCKS: u64 = 5_000;

/// How an index runs.
#[derive(Debug, Clone)]
pub struct WatchSettings {
    /// The network's WebSocket JSON-RPC endpoint.
    pub ws_url: Url,
    /// How many blocks back the first catch-up starts.
    pub lookback_blocks: u64,
    /// How far behind the HTTP endpoint's head the index may be and still answer.
    pub lag_blocks: u64,
    /// How often the head is compared.
    pub tick: Duration,
}

/// A use of a nonce: the transaction that used it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Used {
    pub tx: B256,
    pub block: u64,
}

/// What the index says of a nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    Used(Used),
    Unused,
    /// Not live (or, Permit2, a transfer not yet classified): ask the chain.
    Unknown,
}

/// The index of one network. Its task runs as long as the process.
pub struct Watch {
    network: Network,
    payer: Address,
    state: Mutex<State>,
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    live: bool,
    /// Every log up to this block is in the index (0: not caught up yet).
    head: u64,
    eip3009: HashMap<(Address, B256), Used>,
    permit2: HashMap<U256, Used>,
    /// Transactions with a `Transfer` from the payer, not classified yet.
    unclassified: HashSet<(B256, u64)>,
    /// Transactions that carried the payer's `AuthorizationUsed` (EIP-3009, not Permit2).
    eip3009_txs: HashSet<B256>,
    /// The hashes of the last blocks announced, to see a reorganization.
    hashes: std::collections::BTreeMap<u64, B256>,
}

impl State {
    /// Forgets everything learnt from block `from` on (it is about to be read again).
    fn forget_from(&mut self, from: u64) {
        let gone: HashSet<B256> = self
            .eip3009
            .values()
            .chain(self.permit2.values())
            .filter(|u| u.block >= from)
            .map(|u| u.tx)
            .chain(self.unclassified.iter().filter(|(_, b)| *b >= from).map(|(t, _)| *t))
            .collect();
        self.eip3009.retain(|_, u| u.block < from);
        self.permit2.retain(|_, u| u.block < from);
        self.unclassified.retain(|(_, b)| *b < from);
        self.eip3009_txs.retain(|t| !gone.contains(t));
        self.hashes.retain(|b, _| *b < from);
    }
}

/// Why a session of the index ended.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("websocket: {0}")]
    Ws(String),
    #[error(transparent)]
    Chain(#[from] ChainError),
    #[error("the websocket endpoint serves chain {0}")]
    WrongChain(u64),
    #[error("the subscription ended")]
    Closed,
    #[error("the subscription lags {behind} blocks behind the HTTP endpoint")]
    Lagging { behind: u64 },
}

impl Watch {
    /// Starts the index of `network` for `payer` over `tokens` (every configured token of the
    /// network); it answers once caught up.
    pub fn spawn(
        chain: Chain,
        network: Network,
        payer: Address,
        tokens: Vec<Address>,
        settings: WatchSettings,
    ) -> Arc<Self> {
        let watch = Arc::new(Self { network, payer, state: Mutex::new(State::default()), changed: Notify::new() });
        let task = Arc::clone(&watch);
        tokio::spawn(async move { task.run(chain, tokens, settings).await });
        watch
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update leaves the maps consistent: a panic elsewhere leaves nothing half-done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the index answers now.
    pub fn is_live(&self) -> bool {
        self.state().live
    }

    /// The network it indexes.
    pub fn network(&self) -> Network {
        self.network
    }

    /// Whether the payer's EIP-3009 `nonce` is used on `token`.
    pub fn eip3009(&self, token: Address, nonce: B256) -> Seen {
        let s = self.state();
        if !s.live {
            return Seen::Unknown;
        }
        s.eip3009.get(&(token, nonce)).map_or(Seen::Unused, |u| Seen::Used(*u))
    }

    /// Whether the payer's Permit2 `nonce` is used (through an x402 proxy).
    pub fn permit2(&self, nonce: U256) -> Seen {
        let s = self.state();
        if !s.live || !s.unclassified.is_empty() {
            return Seen::Unknown;
        }
        s.permit2.get(&nonce).map_or(Seen::Unused, |u| Seen::Used(*u))
    }

    /// Waits up to `limit` for the payer's EIP-3009 `nonce` on `token` to show used (the
    /// settlement of a payment that just left); `None` when it does not by then, or the index
    /// is not live.
    pub async fn wait_eip3009(&self, token: Address, nonce: B256, limit: Duration) -> Option<Used> {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                match self.eip3009(token, nonce) {
                    Seen::Used(u) => return Some(u),
                    Seen::Unknown => return None,
                    Seen::Unused => changed.await,
                }
            }
        };
        tokio::time::timeout(limit, wait).await.ok().flatten()
    }

    async fn run(self: Arc<Self>, chain: Chain, tokens: Vec<Address>, settings: WatchSettings) {
        let mut pause = Duration::from_millis(100);
        loop {
            let ended = self.session(&chain, &tokens, &settings).await;
            let was_live = std::mem::replace(&mut self.state().live, false);
            self.changed.notify_waiters();
            tracing::warn!(payment.network = %self.network, error = %ended, "the chain index stopped answering; reading the chain until it catches up");
            if was_live {
                pause = Duration::from_millis(100);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// One connection: subscribe, catch up, answer until the subscription ends or lags.
    async fn session(&self, chain: &Chain, tokens: &[Address], settings: &WatchSettings) -> SessionEnd {
        match self.session_inner(chain, tokens, settings).await {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    async fn session_inner(
        &self,
        chain: &Chain,
        tokens: &[Address],
        settings: &WatchSettings,
    ) -> Result<std::convert::Infallible, SessionEnd> {
        let ws_err = |e: &dyn std::fmt::Display| SessionEnd::Ws(e.to_string());
        let connect = ProviderBuilder::new().connect_ws(WsConnect::new(settings.ws_url.as_str()).with_max_retries(0));
        let ws = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .map_err(|e| ws_err(&e))?
            .map_err(|e| ws_err(&e))?;
        let chain_id = ws.get_chain_id().await.map_err(|e| ws_err(&e))?;
        if chain_id != self.network.chain_id() {
            return Err(SessionEnd::WrongChain(chain_id));
        }
        let filter = Filter::new()
            .address(tokens.to_vec())
            .event_signature(vec![
                IEIP3009::AuthorizationUsed::SIGNATURE_HASH,
                IErc20Transfer::Transfer::SIGNATURE_HASH,
            ])
            .topic1(self.payer.into_word());
        let mut logs = ws.subscribe_logs(&filter).await.map_err(|e| ws_err(&e))?.into_stream();
        let mut heads = ws.subscribe_blocks().await.map_err(|e| ws_err(&e))?.into_stream();
        self.catch_up(chain, &filter, settings.lookback_blocks).await?;
        self.classify(chain).await?;
        self.state().live = true;
        self.changed.notify_waiters();
        tracing::info!(payment.network = %self.network, "the chain index is live");
        let mut tick = tokio::time::interval(settings.tick);
        let mut behind_ticks = 0;
        let mut classify_at: Option<tokio::time::Instant> = None;
        loop {
            let classify = async {
                match classify_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                log = logs.next() => {
                    if self.absorb(&log.ok_or(SessionEnd::Closed)?) && classify_at.is_none() {
                        classify_at = Some(tokio::time::Instant::now() + CLASSIFY_AFTER);
                    }
                }
                head = heads.next() => {
                    let head = head.ok_or(SessionEnd::Closed)?;
                    if let Some(from) = self.announced(head.number, head.hash, head.parent_hash) {
                        tracing::warn!(payment.network = %self.network, block = head.number,
                            "a reorganization replaced indexed blocks: reading them again");
                        self.state().live = false;
                        self.catch_up_from(chain, &filter, from).await?;
                        self.state().live = true;
                        self.changed.notify_waiters();
                    }
                }
                () = classify => {
                    classify_at = None;
                    self.classify(chain).await?;
                }
                _ = tick.tick() => {
                    self.classify(chain).await?;
                    let http = chain.block_number(self.network).await?;
                    let head = self.state().head;
                    if http > head.saturating_add(settings.lag_blocks) {
                        behind_ticks += 1;
                        if behind_ticks >= 2 {
                            return Err(SessionEnd::Lagging { behind: http - head });
                        }
                    } else {
                        behind_ticks = 0;
                    }
                }
            }
        }
    }

    /// Records an announced block; `Some(from)`: it replaces a block the index had seen (or
    /// does not follow it), so everything from `from` must be read again.
    fn announced(&self, number: u64, hash: B256, parent: B256) -> Option<u64> {
        let mut s = self.state();
        let replaced = s.hashes.get(&number).is_some_and(|h| *h != hash)
            || s.hashes.get(&number.saturating_sub(1)).is_some_and(|p| *p != parent);
        s.head = s.head.max(number);
        s.hashes.insert(number, hash);
        let keep_from = number.saturating_sub(KEPT_HASHES);
        s.hashes.retain(|b, _| *b >= keep_from);
        replaced.then(|| number.saturating_sub(OVERLAP_BLOCKS))
    }

    /// Reads every matching log from the last block seen (a few blocks before it: they are
    /// read again) or, at first, `lookback` blocks back, to the HTTP endpoint's head.
    async fn catch_up(&self, chain: &Chain, filter: &Filter, lookback: u64) -> Result<(), SessionEnd> {
        let head = self.state().head;
        let from = if head == 0 {
            chain.block_number(self.network).await?.saturating_sub(lookback)
        } else {
            head.saturating_sub(OVERLAP_BLOCKS)
        };
        self.catch_up_from(chain, filter, from).await
    }

    /// Forgets what the index learnt from block `from` on, and reads it again, page by page, to
    /// the HTTP endpoint's head.
    async fn catch_up_from(&self, chain: &Chain, filter: &Filter, mut from: u64) -> Result<(), SessionEnd> {
        let latest = chain.block_number(self.network).await?;
        self.state().forget_from(from);
        while from <= latest {
            let to = from.saturating_add(PAGE_BLOCKS - 1).min(latest);
            for log in chain.logs(self.network, &filter.clone().from_block(from).to_block(to)).await? {
                self.absorb(&log);
            }
            from = to.saturating_add(1);
        }
        let mut s = self.state();
        s.head = s.head.max(latest);
        Ok(())
    }

    /// Adds (or, removed by a reorganization, takes out) one log of the payer; `true` when a
    /// transfer waits to be classified.
    fn absorb(&self, log: &Log) -> bool {
        let (Some(tx), Some(block)) = (log.transaction_hash, log.block_number) else { return false };
        let topics = log.topics();
        let mut s = self.state();
        let mut waits = false;
        if topics.len() == 3 && topics[0] == IEIP3009::AuthorizationUsed::SIGNATURE_HASH {
            let key = (log.address(), topics[2]);
            if log.removed {
                s.eip3009.remove(&key);
                s.eip3009_txs.remove(&tx);
            } else {
                s.eip3009.insert(key, Used { tx, block });
                s.eip3009_txs.insert(tx);
                // Its transfer is EIP-3009's, not a Permit2 payment.
                s.unclassified.remove(&(tx, block));
            }
        } else if topics.len() == 3 && topics[0] == IErc20Transfer::Transfer::SIGNATURE_HASH {
            if log.removed {
                s.unclassified.remove(&(tx, block));
                s.permit2.retain(|_, u| u.tx != tx);
            } else if !s.eip3009_txs.contains(&tx) {
                waits = s.unclassified.insert((tx, block));
            }
        }
        drop(s);
        self.changed.notify_waiters();
        waits
    }

    /// Classifies the payer's transfers: those of an EIP-3009 transaction are done; the others
    /// are read (the transaction's calldata) and, an x402 proxy's `settle`, their Permit2
    /// nonce recorded.
    async fn classify(&self, chain: &Chain) -> Result<(), SessionEnd> {
        let pending: Vec<(B256, u64)> = {
            let mut s = self.state();
            let done: HashSet<B256> = s.eip3009_txs.clone();
            s.unclassified.retain(|(tx, _)| !done.contains(tx));
            s.unclassified.iter().copied().collect()
        };
        for (tx, block) in pending {
            let call = chain.transaction_call(self.network, tx).await?;
            let nonce = call.and_then(|(_, input)| super::permit2::settled_permit2_nonce(&input, self.payer));
            let mut s = self.state();
            if s.eip3009_txs.contains(&tx) {
                s.unclassified.remove(&(tx, block));
                continue;
            }
            if let Some(nonce) = nonce {
                s.permit2.insert(nonce, Used { tx, block });
            }
            s.unclassified.remove(&(tx, block));
        }
        self.changed.notify_waiters();
        Ok(())
    }
}
