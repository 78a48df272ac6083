//! JSON-RPC access to the test chain: typed `eth_call`s, sending transactions from one key, and
//! waiting for receipts. Every call runs under a timeout.

use std::time::Duration;

use alloy::network::{EthereumWallet, TransactionBuilder};
use alloy::primitives::{Address, B256, Bytes};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::{TransactionReceipt, TransactionRequest};
use alloy::signers::local::PrivateKeySigner;
use alloy::sol;
use alloy::sol_types::SolCall;
use url::Url;

sol! {
    /// The parts of TestToken (and of USDC) this binary calls.
    interface ITestToken {
        function eip712Domain() external view returns (
            bytes1 fields,
            string name,
            string version,
            uint256 chainId,
            address verifyingContract,
            bytes32 salt,
            uint256[] extensions
        );
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        function balanceOf(address account) external view returns (uint256);
        function allowance(address owner, address spender) external view returns (uint256);
        function mint(address to, uint256 value) external returns (bool);
        function transferWithAuthorization(
            address from,
            address to,
            uint256 value,
            uint256 validAfter,
            uint256 validBefore,
            bytes32 nonce,
            uint8 v,
            bytes32 r,
            bytes32 s
        ) external;
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    #[error("JSON-RPC call {0} timed out after {1:?}")]
    Timeout(&'static str, Duration),
    #[error("JSON-RPC call {method} failed")]
    Rpc {
        method: &'static str,
        #[source]
        source: alloy::transports::TransportError,
    },
    #[error("could not decode the answer of {method}")]
    Decode {
        method: &'static str,
        #[source]
        source: alloy::sol_types::Error,
    },
    #[error("transaction {0} was not mined within {1:?}")]
    NotMined(B256, Duration),
    #[error("transaction {0} reverted")]
    Reverted(B256),
}

/// A provider whose wallet is one key; cheap to clone.
#[derive(Clone, Debug)]
pub struct Chain {
    provider: DynProvider,
    sender: Address,
    rpc_timeout: Duration,
}

impl Chain {
    pub fn connect(rpc_url: Url, signer: PrivateKeySigner, rpc_timeout: Duration) -> Self {
        let sender = signer.address();
        let provider = ProviderBuilder::new().wallet(EthereumWallet::from(signer)).connect_http(rpc_url).erased();
        Self { provider, sender, rpc_timeout }
    }

    /// The address transactions are sent from.
    pub fn sender(&self) -> Address {
        self.sender
    }

    async fn bounded<T, F>(&self, method: &'static str, fut: F) -> Result<T, ChainError>
    where
        F: IntoFuture<Output = Result<T, alloy::transports::TransportError>>,
    {
        match tokio::time::timeout(self.rpc_timeout, fut).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(ChainError::Rpc { method, source }),
            Err(_) => Err(ChainError::Timeout(method, self.rpc_timeout)),
        }
    }

    pub async fn chain_id(&self) -> Result<u64, ChainError> {
        self.bounded("eth_chainId", self.provider.get_chain_id()).await
    }

    pub async fn code_at(&self, address: Address) -> Result<Bytes, ChainError> {
        self.bounded("eth_getCode", self.provider.get_code_at(address)).await
    }

    /// `eth_call` of `call` on `to`, from the sender, decoded.
    pub async fn call<C: SolCall>(&self, to: Address, call: &C) -> Result<C::Return, ChainError> {
        let tx = TransactionRequest::default().with_from(self.sender).with_to(to).with_input(call.abi_encode());
        let out = self.bounded("eth_call", self.provider.call(tx)).await?;
        C::abi_decode_returns(&out).map_err(|source| ChainError::Decode { method: C::SIGNATURE, source })
    }

    /// `eth_call` of a prepared transaction: the raw return data, or the revert as an error.
    pub async fn simulate(&self, tx: TransactionRequest) -> Result<Bytes, ChainError> {
        self.bounded("eth_call", self.provider.call(tx)).await
    }

    /// Sends `tx` from the sender with the next pending nonce and returns its hash without
    /// waiting. Callers that send concurrently must serialise calls to this (see
    /// `payment::Settler`): the nonce is read, not reserved.
    pub async fn send(&self, tx: TransactionRequest) -> Result<B256, ChainError> {
        let nonce =
            self.bounded("eth_getTransactionCount", self.provider.get_transaction_count(self.sender).pending()).await?;
        let tx = tx.with_from(self.sender).with_nonce(nonce);
        let pending = self.bounded("eth_sendRawTransaction", self.provider.send_transaction(tx)).await?;
        Ok(*pending.tx_hash())
    }

    /// Polls for the receipt of `hash` (anvil mines at once, so the first poll usually hits;
    /// alloy's own watcher polls every 250 ms on local chains, which is too slow for tests).
    pub async fn wait_for_receipt(&self, hash: B256, limit: Duration) -> Result<TransactionReceipt, ChainError> {
        let deadline = tokio::time::Instant::now() + limit;
        let mut pause = Duration::from_millis(5);
        loop {
            let receipt =
                self.bounded("eth_getTransactionReceipt", self.provider.get_transaction_receipt(hash)).await?;
            if let Some(receipt) = receipt {
                return Ok(receipt);
            }
            if tokio::time::Instant::now() + pause > deadline {
                return Err(ChainError::NotMined(hash, limit));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Sends and waits; a reverted transaction is an error.
    pub async fn send_and_confirm(
        &self,
        tx: TransactionRequest,
        limit: Duration,
    ) -> Result<TransactionReceipt, ChainError> {
        let hash = self.send(tx).await?;
        let receipt = self.wait_for_receipt(hash, limit).await?;
        if receipt.status() { Ok(receipt) } else { Err(ChainError::Reverted(hash)) }
    }

    /// anvil's `anvil_setCode`: puts `code` at `address` without running a constructor.
    pub async fn set_code(&self, address: Address, code: Bytes) -> Result<(), ChainError> {
        let _: serde_json::Value =
            self.bounded("anvil_setCode", self.provider.raw_request("anvil_setCode".into(), (address, code))).await?;
        Ok(())
    }
}
