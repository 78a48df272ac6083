//! x402 `exact` on Solana (SVM networks): the option an upstream offers ([`SvmTerms`]), the
//! payment transaction built and signed by the payer ([`sign_transfer`] → [`SignedSvmTransfer`],
//! the record a ledger keeps), and the chain's word on it ([`rpc::SvmRpc`]).
//!
//! At most once, chain-enforced: a transaction's signature lands at most once, and not after
//! the block height `lastValidBlockHeight` of its blockhash. A new transaction for the same
//! payment may be signed only when [`rpc::TransferState::may_sign_again`] (the old one can
//! never move money).

pub mod network;
pub mod rpc;
pub mod terms;
pub mod transfer;

use solana_address::Address;

pub use network::{SvmNetwork, SvmNetworkError};
pub use rpc::{SvmRpc, SvmRpcError, TransferState};
pub use terms::{SvmTerms, TermsError, payment_payload};
pub use transfer::{
    Blockhash, ComputeBudget, Mint, SignedSvmTransfer, SvmSigner, TransferError, associated_token_address,
    sign_transfer,
};

/// A Solana address (public key).
pub type SvmAddress = Address;

/// The SPL Token program.
pub const TOKEN_PROGRAM: Address = Address::from_str_const("TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA");
/// The SPL Token-2022 program.
pub const TOKEN_2022_PROGRAM: Address = Address::from_str_const("TokenzQdBNbLqP5VEhdkAS6EPFLC1PHnBqCXEpPxuEb");
/// The associated token account program.
pub const ASSOCIATED_TOKEN_PROGRAM: Address = Address::from_str_const("ATokenGPvbdGVxr1b2hvZbsiqW5xWH25efTNsLJA8knL");
/// The compute-budget program.
pub const COMPUTE_BUDGET_PROGRAM: Address = Address::from_str_const("ComputeBudget111111111111111111111111111111");
/// The SPL Memo program (v2).
pub const MEMO_PROGRAM: Address = Address::from_str_const("MemoSq4gqABAXKb96qnH8TysNcWxMyWCqXgDLGmfcHr");
