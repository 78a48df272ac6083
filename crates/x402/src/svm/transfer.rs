//! Building and signing the payment transaction of SVM `exact`: a v0 message with the
//! facilitator's fee payer first, a compute-unit limit and price, one SPL `TransferChecked` of
//! exactly the price from the payer's associated token account to the `payTo`'s, and a memo;
//! signed by the payer (the token owner) only. The facilitator adds the fee payer's signature,
//! which comes first and is the transaction's id on chain.
//!
//! Fail closed, whatever the upstream says:
//! - the payer's key never signs a transaction in which it pays the fees ([`TransferError::FeePayerIsPayer`]);
//! - the amount is the terms' price, never more, and the mint's decimals and token program are
//!   the chain's ([`Mint`], read by [`super::rpc::SvmRpc::mint`]), not the upstream's;
//! - the blockhash and its `lastValidBlockHeight` are the router's own RPC's ([`Blockhash`]);
//! - the compute-unit price is bounded ([`MAX_COMPUTE_UNIT_PRICE`]).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use solana_address::Address;
use solana_instruction::{AccountMeta, Instruction};
use solana_keypair::Keypair;
use solana_message::VersionedMessage;
use solana_message::v0;
use solana_signature::Signature;
use solana_signer::Signer;
use solana_transaction::versioned::VersionedTransaction;

use super::record::{
    ASSOCIATED_TOKEN_PROGRAM, COMPUTE_BUDGET_PROGRAM, MEMO_PROGRAM, TOKEN_2022_PROGRAM, TOKEN_PROGRAM,
};
pub use super::record::{Blockhash, Mint, SignedSvmTransfer};
use super::terms::SvmTerms;

/// The highest compute-unit price the router ever sets (micro-lamports), the official
/// facilitator's own limit: a higher one would be refused anyway.
pub const MAX_COMPUTE_UNIT_PRICE: u64 = 5_000_000;
/// The highest compute-unit limit the router ever sets.
pub const MAX_COMPUTE_UNIT_LIMIT: u32 = 200_000;

/// `SetComputeUnitLimit` and `SetComputeUnitPrice` of the compute-budget program.
const IX_SET_COMPUTE_UNIT_LIMIT: u8 = 2;
const IX_SET_COMPUTE_UNIT_PRICE: u8 = 3;
/// `TransferChecked` of the SPL Token programs.
const IX_TRANSFER_CHECKED: u8 = 12;

/// Why a transfer is not signed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("the fee payer the upstream names is the router's own wallet: it would pay the fees")]
    FeePayerIsPayer,
    #[error("the mint read from the chain is not the one the terms name")]
    MintMismatch,
    #[error("the mint is not owned by the SPL Token or Token-2022 program")]
    UnknownTokenProgram,
    #[error("compute budget out of bounds (limit 1..={MAX_COMPUTE_UNIT_LIMIT}, price ≤ {MAX_COMPUTE_UNIT_PRICE})")]
    ComputeBudget,
    #[error("the price is zero")]
    ZeroAmount,
    #[error("the memo is not 1..=256 bytes")]
    BadMemo,
    #[error("the transaction could not be compiled: {0}")]
    Compile(String),
}

/// The payer's Solana key. Its `Debug` shows the address only.
pub struct SvmSigner {
    keypair: Keypair,
}

impl SvmSigner {
    /// From the 64-byte keypair (secret seed, then public key) of a Solana key file, or from
    /// a 32-byte seed. A 64-byte keypair whose public half does not match its secret is refused.
    ///
    /// # Errors
    /// A message without any key material in it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, &'static str> {
        let seed: [u8; 32] = bytes.get(..32).and_then(|s| s.try_into().ok()).ok_or("a Solana key is 32 or 64 bytes")?;
        let keypair = Keypair::new_from_array(seed);
        match bytes.len() {
            32 => {}
            64 if bytes[32..] == keypair.pubkey().to_bytes() => {}
            64 => return Err("the key file's public key does not match its secret key"),
            _ => return Err("a Solana key is 32 or 64 bytes"),
        }
        Ok(Self { keypair })
    }

    /// From a key file's text (a JSON array of 64 numbers) or a base58 secret.
    ///
    /// # Errors
    /// A message without any key material in it.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let text = text.trim();
        if text.starts_with('[') {
            let bytes: Vec<u8> = serde_json::from_str(text).map_err(|_| "not a JSON array of bytes")?;
            return Self::from_bytes(&bytes);
        }
        let keypair = Keypair::try_from_base58_string(text).map_err(|_| "not a base58 Solana keypair")?;
        Self::from_bytes(&keypair.to_bytes())
    }

    /// The payer's address (the token owner).
    pub fn address(&self) -> Address {
        self.keypair.pubkey()
    }
}

impl fmt::Debug for SvmSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SvmSigner").field("address", &self.address().to_string()).finish_non_exhaustive()
    }
}

/// The compute budget the router sets on its transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeBudget {
    pub unit_limit: u32,
    /// Micro-lamports per compute unit (paid by the fee payer).
    pub unit_price: u64,
}

impl Default for ComputeBudget {
    /// The official client's: 20 000 units at 1 micro-lamport.
    fn default() -> Self {
        Self { unit_limit: 20_000, unit_price: 1 }
    }
}

/// The associated token account of `owner` for `mint` under `token_program`.
pub fn associated_token_address(owner: &Address, mint: &Address, token_program: &Address) -> Address {
    Address::find_program_address(&[owner.as_ref(), token_program.as_ref(), mint.as_ref()], &ASSOCIATED_TOKEN_PROGRAM).0
}

/// Builds and signs the payment of `terms`: see the module's rules.
///
/// `memo` is used when the terms ask for none (the router passes a nonce derived from the
/// agent and its Idempotency-Key, so that two requests never share a transaction message).
///
/// # Errors
/// [`TransferError`]; nothing is signed then.
pub fn sign_transfer(
    signer: &SvmSigner,
    terms: &SvmTerms,
    mint: &Mint,
    blockhash: &Blockhash,
    memo: &str,
    compute: ComputeBudget,
) -> Result<SignedSvmTransfer, TransferError> {
    let payer = signer.address();
    if terms.fee_payer() == payer {
        return Err(TransferError::FeePayerIsPayer);
    }
    if mint.address != terms.mint() {
        return Err(TransferError::MintMismatch);
    }
    if mint.token_program != TOKEN_PROGRAM && mint.token_program != TOKEN_2022_PROGRAM {
        return Err(TransferError::UnknownTokenProgram);
    }
    if compute.unit_limit == 0
        || compute.unit_limit > MAX_COMPUTE_UNIT_LIMIT
        || compute.unit_price > MAX_COMPUTE_UNIT_PRICE
    {
        return Err(TransferError::ComputeBudget);
    }
    if terms.amount() == 0 {
        return Err(TransferError::ZeroAmount);
    }
    let memo = terms.memo().unwrap_or(memo);
    if memo.is_empty() || memo.len() > super::terms::MAX_MEMO_BYTES {
        return Err(TransferError::BadMemo);
    }
    let source = associated_token_address(&payer, &mint.address, &mint.token_program);
    let destination = associated_token_address(&terms.pay_to(), &mint.address, &mint.token_program);
    let instructions = instructions(terms, mint, compute, &payer, &source, &destination, memo);
    let message = v0::Message::try_compile(&terms.fee_payer(), &instructions, &[], blockhash.hash.clone())
        .map_err(|e| TransferError::Compile(e.to_string()))?;
    let message = VersionedMessage::V0(message);
    let signers = usize::from(message.header().num_required_signatures);
    let position = message
        .static_account_keys()
        .iter()
        .take(signers)
        .position(|k| *k == payer)
        .ok_or_else(|| TransferError::Compile("the payer is not a signer".to_owned()))?;
    let signature = signer.keypair.sign_message(&message.serialize());
    let mut signatures = vec![Signature::default(); signers];
    signatures[position] = signature;
    let tx = VersionedTransaction { signatures, message };
    let bytes = wincode::serialize(&tx).map_err(|e| TransferError::Compile(e.to_string()))?;
    Ok(SignedSvmTransfer {
        network: terms.network().caip2(),
        mint: mint.address.to_string(),
        token_program: mint.token_program.to_string(),
        decimals: mint.decimals,
        payer: payer.to_string(),
        pay_to: terms.pay_to().to_string(),
        destination: destination.to_string(),
        amount: terms.amount().to_string(),
        fee_payer: terms.fee_payer().to_string(),
        memo: memo.to_owned(),
        compute_unit_limit: compute.unit_limit,
        compute_unit_price: compute.unit_price.to_string(),
        blockhash: blockhash.hash.to_string(),
        last_valid_block_height: blockhash.last_valid_block_height,
        min_slot: blockhash.context_slot,
        signature: signature.to_string(),
        transaction: BASE64.encode(bytes),
    })
}

/// Compute limit, compute price, `TransferChecked`, memo: the order the official
/// facilitator checks.
fn instructions(
    terms: &SvmTerms,
    mint: &Mint,
    compute: ComputeBudget,
    payer: &Address,
    source: &Address,
    destination: &Address,
    memo: &str,
) -> [Instruction; 4] {
    let mut limit = vec![IX_SET_COMPUTE_UNIT_LIMIT];
    limit.extend_from_slice(&compute.unit_limit.to_le_bytes());
    let mut price = vec![IX_SET_COMPUTE_UNIT_PRICE];
    price.extend_from_slice(&compute.unit_price.to_le_bytes());
    let mut transfer = vec![IX_TRANSFER_CHECKED];
    transfer.extend_from_slice(&terms.amount().to_le_bytes());
    transfer.push(mint.decimals);
    [
        Instruction::new_with_bytes(COMPUTE_BUDGET_PROGRAM, &limit, vec![]),
        Instruction::new_with_bytes(COMPUTE_BUDGET_PROGRAM, &price, vec![]),
        Instruction::new_with_bytes(
            mint.token_program,
            &transfer,
            vec![
                AccountMeta::new(*source, false),
                AccountMeta::new_readonly(mint.address, false),
                AccountMeta::new(*destination, false),
                AccountMeta::new_readonly(*payer, true),
            ],
        ),
        Instruction::new_with_bytes(MEMO_PROGRAM, memo.as_bytes(), vec![]),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use solana_hash::Hash;

    use super::*;
    use crate::wire::X402Version;

    // The local test chain's public test-only fixtures (tools/solana-chain/keys) and the
    // associated token accounts the official @solana/kit derives for them.
    const PAYER_KEY: &str = include_str!("../../../../tools/solana-chain/keys/payer.json");
    const PAYER: &str = "CsMmmtHt4Pq5euz2G1rewKdAYwJU5cAv22gt8ToxWq8U";
    const PAYER_ATA: &str = "7xDVTAvSEzCrj9WV8Ts6zaYEmmgJwkVwhZkveaDGfPwA";
    const MINT: &str = "H7po8GzzytgPCncihov4jk2BWGKhRNhMH8nRZdURCm4U";
    const PAY_TO: &str = "EmPfs5hbdp1FsvxQjan7TaNCp2KWZSQ79U8tX2zLKoTn";
    const PAY_TO_ATA: &str = "HrBQ29kjxB5geAuJZPtnfkvrwaNvt7NSzcN3AQeiivzr";
    const FEE_PAYER: &str = "E3oiJ364EyMniLYW1ksm3CTwNxhdSSFMnKBsbSZb6H9E";

    fn terms(fee_payer: &str, extra_memo: Option<&str>) -> SvmTerms {
        let mut extra = json!({"feePayer": fee_payer});
        if let Some(m) = extra_memo {
            extra["memo"] = json!(m);
        }
        let entry = json!({"scheme": "exact", "network": "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "amount": "10000",
            "asset": MINT, "payTo": PAY_TO, "maxTimeoutSeconds": 60, "extra": extra});
        SvmTerms::from_json(X402Version::V2, &entry).unwrap()
    }

    fn mint() -> Mint {
        Mint { address: MINT.parse().unwrap(), token_program: TOKEN_PROGRAM, decimals: 6 }
    }

    fn blockhash() -> Blockhash {
        Blockhash { hash: Hash::new_from_array([7; 32]), last_valid_block_height: 1150, context_slot: 1000 }
    }

    #[test]
    fn associated_token_accounts_match_the_official_derivation() {
        let token = TOKEN_PROGRAM;
        let mint: Address = MINT.parse().unwrap();
        assert_eq!(associated_token_address(&PAYER.parse().unwrap(), &mint, &token).to_string(), PAYER_ATA);
        assert_eq!(associated_token_address(&PAY_TO.parse().unwrap(), &mint, &token).to_string(), PAY_TO_ATA);
    }

    #[test]
    fn key_files_are_checked() {
        let signer = SvmSigner::parse(PAYER_KEY).unwrap();
        assert_eq!(signer.address().to_string(), PAYER);
        assert!(!format!("{signer:?}").contains(&PAYER_KEY[..20]));
        let mut bytes: Vec<u8> = serde_json::from_str(PAYER_KEY).unwrap();
        bytes[63] ^= 1;
        assert!(SvmSigner::from_bytes(&bytes).is_err(), "a public half that does not match is refused");
        assert!(SvmSigner::from_bytes(&bytes[..31]).is_err());
        assert!(SvmSigner::parse("[1, 2, 3]").is_err());
        assert!(SvmSigner::parse("not a key").is_err());
    }

    #[test]
    fn the_transaction_is_the_scheme_s_layout_signed_by_the_payer_only() {
        let signer = SvmSigner::parse(PAYER_KEY).unwrap();
        let signed =
            sign_transfer(&signer, &terms(FEE_PAYER, None), &mint(), &blockhash(), "00ff", ComputeBudget::default())
                .unwrap();
        let bytes = BASE64.decode(&signed.transaction).unwrap();
        let tx: VersionedTransaction = wincode::deserialize(&bytes).unwrap();
        let keys = tx.message.static_account_keys();
        assert_eq!(keys[0].to_string(), FEE_PAYER, "the facilitator's fee payer comes first");
        assert_eq!(tx.message.header().num_required_signatures, 2);
        assert_eq!(tx.signatures[0], Signature::default(), "the fee payer's signature is left empty");
        let payer_index = keys.iter().position(|k| k.to_string() == PAYER).unwrap();
        assert_eq!(payer_index, 1);
        assert!(tx.signatures[1].verify(keys[1].as_ref(), &tx.message.serialize()));
        assert_eq!(tx.signatures[1].to_string(), signed.signature);
        let ixs = tx.message.instructions();
        assert_eq!(ixs.len(), 4);
        let program = |i: usize| keys[usize::from(ixs[i].program_id_index)];
        assert_eq!((program(0), ixs[0].data[0]), (COMPUTE_BUDGET_PROGRAM, 2));
        assert_eq!((program(1), ixs[1].data[0]), (COMPUTE_BUDGET_PROGRAM, 3));
        assert_eq!(program(2), TOKEN_PROGRAM);
        let data = &ixs[2].data;
        assert_eq!((data[0], u64::from_le_bytes(data[1..9].try_into().unwrap()), data[9]), (12, 10_000, 6));
        let accounts: Vec<String> = ixs[2].accounts.iter().map(|&i| keys[usize::from(i)].to_string()).collect();
        assert_eq!(accounts, [PAYER_ATA, MINT, PAY_TO_ATA, PAYER]);
        assert_eq!((program(3), ixs[3].data.as_slice()), (MEMO_PROGRAM, b"00ff".as_slice()));
        assert_eq!(tx.message.recent_blockhash(), &blockhash().hash);
        assert_eq!(signed.last_valid_block_height, 1150);
        assert_eq!(signed.payload_json(), json!({"transaction": signed.transaction}));
        // The ledger's record reads back as written, and nothing else.
        let stored = serde_json::to_value(&signed).unwrap();
        assert_eq!(serde_json::from_value::<SignedSvmTransfer>(stored.clone()).unwrap(), signed);
        let mut extra = stored;
        extra["x"] = json!(1);
        assert!(serde_json::from_value::<SignedSvmTransfer>(extra).is_err());
    }

    #[test]
    fn an_upstream_memo_is_used_and_two_memos_give_two_transactions() {
        let signer = SvmSigner::parse(PAYER_KEY).unwrap();
        let asked = sign_transfer(
            &signer,
            &terms(FEE_PAYER, Some("order-7")),
            &mint(),
            &blockhash(),
            "00ff",
            ComputeBudget::default(),
        )
        .unwrap();
        assert_eq!(asked.memo, "order-7");
        let a = sign_transfer(&signer, &terms(FEE_PAYER, None), &mint(), &blockhash(), "aa", ComputeBudget::default())
            .unwrap();
        let b = sign_transfer(&signer, &terms(FEE_PAYER, None), &mint(), &blockhash(), "bb", ComputeBudget::default())
            .unwrap();
        assert_ne!(a.signature, b.signature);
        let again =
            sign_transfer(&signer, &terms(FEE_PAYER, None), &mint(), &blockhash(), "aa", ComputeBudget::default())
                .unwrap();
        assert_eq!(a, again, "ed25519 signing is deterministic: the same payment is the same transaction");
    }

    #[test]
    fn hostile_terms_are_never_signed() {
        let signer = SvmSigner::parse(PAYER_KEY).unwrap();
        let sign = |t: &SvmTerms, m: &Mint, c: ComputeBudget| sign_transfer(&signer, t, m, &blockhash(), "00", c);
        let ok = ComputeBudget::default();
        assert_eq!(sign(&terms(PAYER, None), &mint(), ok), Err(TransferError::FeePayerIsPayer));
        let other_mint = Mint { address: Address::new_from_array([9; 32]), ..mint() };
        assert_eq!(sign(&terms(FEE_PAYER, None), &other_mint, ok), Err(TransferError::MintMismatch));
        let foreign = Mint { token_program: COMPUTE_BUDGET_PROGRAM, ..mint() };
        assert_eq!(sign(&terms(FEE_PAYER, None), &foreign, ok), Err(TransferError::UnknownTokenProgram));
        for c in [
            ComputeBudget { unit_limit: 0, unit_price: 1 },
            ComputeBudget { unit_limit: MAX_COMPUTE_UNIT_LIMIT + 1, unit_price: 1 },
            ComputeBudget { unit_limit: 20_000, unit_price: MAX_COMPUTE_UNIT_PRICE + 1 },
        ] {
            assert_eq!(sign(&terms(FEE_PAYER, None), &mint(), c), Err(TransferError::ComputeBudget));
        }
        assert_eq!(
            sign_transfer(&signer, &terms(FEE_PAYER, None), &mint(), &blockhash(), "", ok),
            Err(TransferError::BadMemo)
        );
    }
}
