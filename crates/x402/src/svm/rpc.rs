//! What a Solana chain says, over JSON-RPC: the reads that decide an SVM payment's fate.
//!
//! Invariants:
//! - An endpoint answers nothing until its genesis hash is the network's
//!   ([`SvmRpcError::WrongChain`]); it is checked again after any failed call.
//! - [`SvmRpc::transfer_state`] reads the finalized block height *before* the signature's
//!   status: once that height is past the blockhash's `lastValidBlockHeight`, no block can
//!   include the transaction any more, so a status read afterwards that does not know the
//!   signature proves it never landed ([`TransferState::Expired`]).
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
use super::transfer::{Blockhash, Mint, SignedSvmTransfer};
use super::{TOKEN_2022_PROGRAM, TOKEN_PROGRAM};

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
}

/// The fate of a signed transfer, as the chain tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferState {
    /// Landed and succeeded: the money moved (`finalized` once it cannot be rolled back).
    Settled { slot: u64, finalized: bool },
    /// Landed and failed: nothing moved, its signature is spent.
    Failed { slot: u64, finalized: bool, error: String },
    /// Not seen, and its blockhash can still land it.
    Pending { block_height: u64 },
    /// Not seen, and the finalized block height is past its `lastValidBlockHeight`: it can
    /// never land.
    Expired { block_height: u64 },
}

impl TransferState {
    /// True when a new transaction may be signed for the same payment: this one can never move money.
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
        let hash: Hash = value
            .get("blockhash")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .ok_or(SvmRpcError::Malformed("blockhash"))?;
        let last_valid_block_height = value
            .get("lastValidBlockHeight")
            .and_then(Value::as_u64)
            .ok_or(SvmRpcError::Malformed("lastValidBlockHeight"))?;
        Ok(Blockhash { hash, last_valid_block_height })
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
        let owner: Address = value
            .get("owner")
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .ok_or(SvmRpcError::Malformed("owner"))?;
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
        let v = self
            .call("getSignatureStatuses", json!([[transfer.signature], {"searchTransactionHistory": true}]))
            .await?;
        let status =
            v.get("value").and_then(|a| a.get(0)).ok_or(SvmRpcError::Malformed("getSignatureStatuses value"))?;
        if status.is_null() {
            return Ok(if transfer.expired_at(block_height) {
                TransferState::Expired { block_height }
            } else {
                TransferState::Pending { block_height }
            });
        }
        let slot = status.get("slot").and_then(Value::as_u64).ok_or(SvmRpcError::Malformed("slot"))?;
        let finalized = status.get("confirmationStatus").and_then(Value::as_str) == Some("finalized");
        Ok(match status.get("err") {
            None | Some(Value::Null) => TransferState::Settled { slot, finalized },
            Some(err) => TransferState::Failed { slot, finalized, error: err.to_string().chars().take(200).collect() },
        })
    }
}
