//! x402 `exact` on Solana (SVM networks): the option an upstream offers ([`SvmTerms`]), the
//! payment transaction built and signed by the payer ([`sign_transfer`] → [`SignedSvmTransfer`],
//! the record a ledger keeps), and the chain's word on it ([`rpc::SvmRpc`]).
//!
//! At most once, chain-enforced: a transaction's signature lands at most once, and not after
//! the block height `lastValidBlockHeight` of its blockhash. A new transaction for the same
//! payment may be signed only when [`rpc::TransferState::may_sign_again`] (the old one can
//! never move money), and that verdict is believed only from every RPC endpoint of the
//! network, at least two ([`endpoints::SvmEndpoints::fate`]).

pub mod endpoints;
pub mod network;
pub mod record;
pub mod rpc;
pub mod terms;
pub mod transfer;

use solana_address::Address;

pub use endpoints::SvmEndpoints;
pub use network::{SvmNetwork, SvmNetworkError};
pub use record::{ASSOCIATED_TOKEN_PROGRAM, COMPUTE_BUDGET_PROGRAM, MEMO_PROGRAM, TOKEN_2022_PROGRAM, TOKEN_PROGRAM};
pub use rpc::{SvmRpc, SvmRpcError, TransferState};
pub use terms::{SvmTerms, TermsError, payment_payload};
pub use transfer::{
    Blockhash, ComputeBudget, Mint, SignedSvmTransfer, SvmSigner, TransferError, associated_token_address,
    sign_transfer,
};

/// A Solana address (public key).
pub type SvmAddress = Address;
