//! What a Solana payment is, as data: the mint and blockhash the chain gave, the signed transfer
//! the ledger keeps ([`SignedSvmTransfer`]), and the programs involved. Nothing here signs: the
//! chain's readers (`rpc`) and the router's recovery use these without reaching the signing code
//! (`transfer`).

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use solana_address::Address;
use solana_hash::Hash;

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

/// An SPL mint as the chain describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mint {
    pub address: Address,
    /// The program that owns the mint account: SPL Token or Token-2022.
    pub token_program: Address,
    pub decimals: u8,
}

/// A recent blockhash and the last block height at which a transaction using it can land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blockhash {
    pub hash: Hash,
    pub last_valid_block_height: u64,
    /// The slot at which the chain answered it: a transaction signed afterwards lands later.
    pub context_slot: u64,
}

/// A payment transaction signed by the payer, and what it does: the record the ledger keeps.
/// Its signature is the transaction's id on chain; it can land at most once, and not after
/// the block height `last_valid_block_height`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignedSvmTransfer {
    /// CAIP-2 id.
    pub network: String,
    pub mint: String,
    pub token_program: String,
    pub decimals: u8,
    pub payer: String,
    pub pay_to: String,
    /// The destination token account (`payTo`'s associated token account).
    pub destination: String,
    /// Atomic units, decimal.
    pub amount: String,
    pub fee_payer: String,
    pub memo: String,
    pub compute_unit_limit: u32,
    pub compute_unit_price: String,
    pub blockhash: String,
    pub last_valid_block_height: u64,
    /// The slot at which the blockhash was read: the transaction cannot land before it.
    pub min_slot: u64,
    /// The payer's signature (base58). The transaction's id on chain is its first signature,
    /// the fee payer's, known only once the facilitator signs: the chain is searched for this one.
    pub signature: String,
    /// The partially signed transaction, base64 (the scheme payload's `transaction`).
    pub transaction: String,
}

impl SignedSvmTransfer {
    /// The scheme payload of the paid retry: `{"transaction": <base64>}`.
    pub fn payload_json(&self) -> Value {
        json!({ "transaction": self.transaction })
    }
    /// True when the chain at `block_height` can no longer include it.
    pub fn expired_at(&self, block_height: u64) -> bool {
        block_height > self.last_valid_block_height
    }
}
