//! What a Solana chain says, over JSON-RPC: the reads that decide an SVM payment's fate.
//!
//! Invariants:
//! - An endpoint answers nothing until its genesis hash is the network's
//!   ([`SvmRpcError::WrongChain`]); it is checked again after any failed call.
//! - A transaction's id is its first signature, the fee payer's, which the payer never knows
//!   beforehand: the chain is searched for the payer's own signature among the payer's
//!   transactions since the blockhash was read ([`SvmRpc::find_landed`]); an id an upstream
//!   claims is believed only when that transaction carries the payer's signature
//!   ([`SvmRpc::landed_as`]).
//! - [`SvmRpc::transfer_state`] reads the finalized block height *before* searching: once that
//!   height is past the blockhash's `lastValidBlockHeight`, no block can include the
//!   transaction any more, so a search afterwards that does not find it is this endpoint's
//!   word that it never landed ([`TransferState::Expired`]) — only when, read after the search,
//!   the finalized bank also holds the blockhash invalid (`isBlockhashValid`; else
//!   [`TransferState::Pending`]) and the endpoint's ledger reaches back to the slot the
//!   blockhash was read at (`getFirstAvailableBlock`; else [`SvmRpcError::HistoryPruned`]: a
//!   pruned ledger's search proves nothing). A search too wide to finish decides nothing.
//! - One endpoint's word is not enough to sign again: its signature index may lag or lie by
//!   omission, which no read of the same endpoint can tell. [`super::SvmEndpoints::fate`]
//!   asks every endpoint of the network.
//! - A failure is final only once finalized ([`TransferState::Failed`]`{ finalized }`): a
//!   processed failure on a fork that is dropped could still land elsewhere.
//! - Sizes are bounded: answers over [`MAX_ANSWER_BYTES`] are refused, not parsed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use solana_address::Address;
use solana_hash::Hash;

use super::network::SvmNetwork;
use super::record::{Blockhash, Mint, SignedSvmTransfer, TOKEN_2022_PROGRAM, TOKEN_PROGRAM};

/// The largest JSON-RPC answer read.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;
/// The size of an SPL mint account's base layout (Token-2022 mints may be longer).
const MINT_LEN: usize = 82;

/// Why the chain could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SvmRpcError {
    #[error("RPC transport: {0}")]
    Transport(String),
    #[error("RPC answered error {code}: {message}")]
    Rpc { code: i64, message: String },
    #[error("RPC answer malformed: {0}")]
    Malformed(&'static str),
    #[error("RPC endpoint serves genesis {actual}, not {network}")]
    WrongChain { network: String, actual: String },
    #[error("the mint account does not exist")]
    NoMint,
    #[error("the account is not an initialized SPL mint of a known token program")]
    NotAMint,
    #[error("more than {MAX_SEARCHED} transactions of the payer since the payment was signed: not searched further")]
    SearchTooWide,
    #[error(
        "the endpoint's ledger starts at slot {first_available}, after the payment's blockhash: its search proves nothing"
    )]
    HistoryPruned { first_available: u64 },
    /// The transaction can never land by one endpoint's word, and no other endpoint of the
    /// network is configured to confirm it.
    #[error("only one RPC endpoint of the network says the transaction can never land: a second one must confirm it")]
    NoSecondOpinion,
    /// One endpoint says the transaction can never land, another does not (yet).
    #[error("the network's RPC endpoints disagree on whether the transaction can still land")]
    Disagreement,
}

/// The most transactions of the payer's that one search reads (ten pages).
pub const MAX_SEARCHED: usize = 10_000;
const PAGE: usize = 1000;

/// The transaction that carried a payment, as found on chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// The transaction's id (its first signature, the fee payer's).
    pub tx_id: String,
    pub slot: u64,
    /// The chain's error when it failed (nothing moved).
    pub error: Option<String>,
    pub finalized: bool,
}

/// The fate of a signed transfer, as the chain tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferState {
    /// Landed and succeeded: the money moved (`finalized` once it cannot be rolled back).
    Settled { tx_id: String, slot: u64, finalized: bool },
    /// Landed and failed: nothing moved, its signature is spent.
    Failed { tx_id: String, slot: u64, finalized: bool, error: String },
    /// Not seen, and its blockhash can still land it.
    Pending { block_height: u64 },
    /// Not seen, the finalized block height is past its `lastValidBlockHeight` and the
    /// finalized bank holds its blockhash invalid: it can never land (by one endpoint's word:
    /// see [`super::SvmEndpoints::fate`]).
    Expired { block_height: u64 },
}

impl TransferState {
    /// True when, by this verdict, this transaction can never move money (so a new one may be
    /// signed for the same payment once every endpoint agrees: [`super::SvmEndpoints::fate`]).
    pub fn may_sign_again(&self) -> bool {
        matches!(self, Self::Expired { .. } | Self::Failed { finalized: true, .. })
    }
}

/// One RPC endpoint of one Solana network.
#[derive(Debug)]
pub struct SvmRpc {
    network: SvmNetwork,
    url: reqwest::Url,
    client: reqwest::Client,
    verified: AtomicBool,
}

impl SvmRpc {
    /// An endpoint; nothing is sent until the first read.
    ///
    /// # Errors
    /// [`SvmRpcError::Transport`] when the HTTP client cannot be built.
    pub fn new(network: SvmNetwork, url: reqwest::Url, timeout: Duration) -> Result<Self, SvmRpcError> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| SvmRpcError::Transport(e.to_string()))?;
        Ok(Self { network, url, client, verified: AtomicBool::new(false) })
    }

    /// The network this endpoint must serve.
    pub fn network(&self) -> &SvmNetwork {
        &self.network
    }

    async fn raw_call(&self, method: &str, params: Value) -> Result<Value, SvmRpcError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let mut response = self
            .client
            .post(self.url.clone())
            .json(&body)
            .send()
            .await
            .map_err(|e| SvmRpcError::Transport(e.without_url().to_string()))?;
        let mut bytes = Vec::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|e| SvmRpcError::Transport(e.without_url().to_string()))?
        {
            if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(SvmRpcError::Malformed("answer too large"));
            }
            bytes.extend_from_slice(&chunk);
        }
        let mut answer: Value = serde_json::from_slice(&bytes).map_err(|_| SvmRpcError::Malformed("not JSON"))?;
        if let Some(error) = answer.get("error") {
            let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
            let message: String =
                error.get("message").and_then(Value::as_str).unwrap_or("").chars().take(200).collect();
            return Err(SvmRpcError::Rpc { code, message });
        }
        answer.get_mut("result").map(Value::take).ok_or(SvmRpcError::Malformed("no result"))
    }

    /// A call, after the endpoint proved it serves the network.
    async fn call(&self, method: &str, params: Value) -> Result<Value, SvmRpcError> {
        if !self.verified.load(Ordering::Acquire) {
            let genesis = self.raw_call("getGenesisHash", json!([])).await?;
            let genesis = genesis.as_str().ok_or(SvmRpcError::Malformed("genesis hash"))?;
            if !self.network.matches_genesis(genesis) {
                return Err(SvmRpcError::WrongChain {
                    network: self.network.caip2(),
                    actual: genesis.chars().take(64).collect(),
                });
            }
            self.verified.store(true, Ordering::Release);
        }
        let answer = self.raw_call(method, params).await;
        if answer.is_err() {
            self.verified.store(false, Ordering::Release);
        }
        answer
    }

    /// The latest blockhash (commitment `confirmed`) and its `lastValidBlockHeight`.
    ///
    /// # Errors
    /// [`SvmRpcError`].
    pub async fn latest_blockhash(&self) -> Result<Blockhash, SvmRpcError> {
        let v = self.call("getLatestBlockhash", json!([{"commitment": "confirmed"}])).await?;
        let value = v.get("value").ok_or(SvmRpcError::Malformed("getLatestBlockhash value"))?;
        let context_slot = v
            .pointer("/context/slot")
            .and_then(Value::as_u64)
            .ok_or(SvmRpcError::Malformed("getLatestBlockhash context"))?;
        let hash: Hash = parsed(value, "blockhash")?;
        let last_valid_block_height = number(value, "lastValidBlockHeight")?;
        Ok(Blockhash { hash, last_valid_block_height, context_slot })
    }

    /// The finalized block height.
    ///
    /// # Errors
    /// [`SvmRpcError`].
    pub async fn finalized_block_height(&self) -> Result<u64, SvmRpcError> {
        self.call("getBlockHeight", json!([{"commitment": "finalized"}]))
            .await?
            .as_u64()
            .ok_or(SvmRpcError::Malformed("block height"))
    }

    /// Whether the finalized bank still accepts transactions using `blockhash` (base58).
    ///
    /// # Errors
    /// [`SvmRpcError`].
    pub async fn blockhash_valid(&self, blockhash: &str) -> Result<bool, SvmRpcError> {
        self.call("isBlockhashValid", json!([blockhash, {"commitment": "finalized"}]))
            .await?
            .get("value")
            .and_then(Value::as_bool)
            .ok_or(SvmRpcError::Malformed("isBlockhashValid"))
    }

    /// The lowest slot whose block the endpoint still serves (below it, its ledger is pruned).
    ///
    /// # Errors
    /// [`SvmRpcError`].
    pub async fn first_available_block(&self) -> Result<u64, SvmRpcError> {
        self.call("getFirstAvailableBlock", json!([]))
            .await?
            .as_u64()
            .ok_or(SvmRpcError::Malformed("first available block"))
    }

    /// The mint's token program and decimals, from its account.
    ///
    /// # Errors
    /// [`SvmRpcError::NoMint`], [`SvmRpcError::NotAMint`], or a failed read.
    pub async fn mint(&self, mint: &Address) -> Result<Mint, SvmRpcError> {
        let v = self
            .call("getAccountInfo", json!([mint.to_string(), {"encoding": "base64", "commitment": "confirmed"}]))
            .await?;
        let value = v.get("value").ok_or(SvmRpcError::Malformed("getAccountInfo value"))?;
        if value.is_null() {
            return Err(SvmRpcError::NoMint);
        }
        let owner: Address = parsed(value, "owner")?;
        let data = value
            .get("data")
            .and_then(|d| d.get(0))
            .and_then(Value::as_str)
            .and_then(|s| BASE64.decode(s).ok())
            .ok_or(SvmRpcError::Malformed("account data"))?;
        let known = owner == TOKEN_PROGRAM || owner == TOKEN_2022_PROGRAM;
        // Mint layout: mint_authority (36), supply (8), decimals (1), is_initialized (1), …
        if !known || data.len() < MINT_LEN || (owner == TOKEN_PROGRAM && data.len() != MINT_LEN) || data[45] != 1 {
            return Err(SvmRpcError::NotAMint);
        }
        Ok(Mint { address: *mint, token_program: owner, decimals: data[44] })
    }

    /// What the chain says of `transfer`: see the module's invariants for the order of reads.
    ///
    /// # Errors
    /// [`SvmRpcError`]: nothing is decided then.
    pub async fn transfer_state(&self, transfer: &SignedSvmTransfer) -> Result<TransferState, SvmRpcError> {
        let block_height = self.finalized_block_height().await?;
        Ok(match self.find_landed(transfer).await? {
            Some(Landed { tx_id, slot, error: None, finalized }) => TransferState::Settled { tx_id, slot, finalized },
            Some(Landed { tx_id, slot, error: Some(error), finalized }) => {
                TransferState::Failed { tx_id, slot, finalized, error }
            }
            None if transfer.expired_at(block_height) && self.confirms_expiry(transfer).await? => {
                TransferState::Expired { block_height }
            }
            None => TransferState::Pending { block_height },
        })
    }

    /// After a search that did not find `transfer`, its height past: false when the finalized
    /// bank still holds the blockhash valid (it may land yet).
    ///
    /// # Errors
    /// [`SvmRpcError::HistoryPruned`] when the ledger does not reach back to the slot the
    /// blockhash was read at (read after the search: pruning only moves it up), or a failed read.
    async fn confirms_expiry(&self, transfer: &SignedSvmTransfer) -> Result<bool, SvmRpcError> {
        if self.blockhash_valid(&transfer.blockhash).await? {
            return Ok(false);
        }
        let first_available = self.first_available_block().await?;
        if first_available > transfer.min_slot {
            return Err(SvmRpcError::HistoryPruned { first_available });
        }
        Ok(true)
    }

    /// The transaction carrying `transfer`, searched among the payer's transactions newest
    /// first, back to the slot its blockhash was read at.
    ///
    /// # Errors
    /// [`SvmRpcError::SearchTooWide`] past [`MAX_SEARCHED`] transactions, or a failed read.
    pub async fn find_landed(&self, transfer: &SignedSvmTransfer) -> Result<Option<Landed>, SvmRpcError> {
        let mut before: Option<String> = None;
        let mut searched = 0;
        loop {
            let mut options = json!({"limit": PAGE, "commitment": "confirmed"});
            if let Some(b) = &before {
                options["before"] = json!(b);
            }
            let page = self.call("getSignaturesForAddress", json!([transfer.payer, options])).await?;
            let page = page.as_array().ok_or(SvmRpcError::Malformed("getSignaturesForAddress"))?;
            for entry in page {
                let tx_id =
                    entry.get("signature").and_then(Value::as_str).ok_or(SvmRpcError::Malformed("signature"))?;
                let slot = number(entry, "slot")?;
                if slot < transfer.min_slot {
                    return Ok(None);
                }
                if let Some(landed) = self.landed_as(transfer, tx_id).await? {
                    return Ok(Some(landed));
                }
            }
            searched += page.len();
            if page.len() < PAGE {
                return Ok(None);
            }
            if searched >= MAX_SEARCHED {
                return Err(SvmRpcError::SearchTooWide);
            }
            before = page.last().and_then(|e| e.get("signature")).and_then(Value::as_str).map(str::to_owned);
        }
    }

    /// The transaction `tx_id` if it landed carrying `transfer` (the payer's signature among
    /// its signatures); `None` for any other or unknown transaction, whatever claimed it.
    ///
    /// # Errors
    /// A failed read.
    pub async fn landed_as(&self, transfer: &SignedSvmTransfer, tx_id: &str) -> Result<Option<Landed>, SvmRpcError> {
        if tx_id.is_empty() || tx_id.len() > 100 {
            return Ok(None);
        }
        let options = json!({"encoding": "json", "commitment": "confirmed", "maxSupportedTransactionVersion": 0});
        let tx = self.call("getTransaction", json!([tx_id, options])).await?;
        if tx.is_null() {
            return Ok(None);
        }
        let signatures = tx
            .pointer("/transaction/signatures")
            .and_then(Value::as_array)
            .ok_or(SvmRpcError::Malformed("transaction signatures"))?;
        if !signatures.iter().any(|s| s.as_str() == Some(transfer.signature.as_str())) {
            return Ok(None);
        }
        let slot = number(&tx, "slot")?;
        let error = match tx.pointer("/meta/err") {
            None | Some(Value::Null) => None,
            Some(err) => Some(err.to_string().chars().take(200).collect()),
        };
        let status = self.call("getSignatureStatuses", json!([[tx_id], {"searchTransactionHistory": true}])).await?;
        let finalized = status.pointer("/value/0/confirmationStatus").and_then(Value::as_str) == Some("finalized");
        Ok(Some(Landed { tx_id: tx_id.to_owned(), slot, error, finalized }))
    }
}

/// The string member `field` of `value`, parsed (a base58 hash or address).
fn parsed<T: std::str::FromStr>(value: &Value, field: &'static str) -> Result<T, SvmRpcError> {
    value.get(field).and_then(Value::as_str).and_then(|s| s.parse().ok()).ok_or(SvmRpcError::Malformed(field))
}

/// The unsigned integer member `field` of `value`.
fn number(value: &Value, field: &'static str) -> Result<u64, SvmRpcError> {
    value.get(field).and_then(Value::as_u64).ok_or(SvmRpcError::Malformed(field))
}
