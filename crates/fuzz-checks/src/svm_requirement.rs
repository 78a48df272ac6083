//! An SVM `exact` option (`x402::svm::SvmTerms`) from an upstream's `accepts` entry, and the
//! transaction the router's code would sign for it.
//!
//! The first byte picks the version (even: v2, odd: v1); the rest is the entry's JSON. What
//! parses must be signable or refused with an error, never a panic, and what is signed is
//! exactly what the entry asks for, with the fee payer it names and never the payer's own
//! wallet as fee payer.

use x402_router::x402::svm::{
    Blockhash, ComputeBudget, Mint, SvmSigner, SvmTerms, TOKEN_PROGRAM, TransferError, sign_transfer,
    terms::MAX_MEMO_BYTES,
};
use x402_router::x402::wire::X402Version;

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let version = if mode % 2 == 0 { X402Version::V2 } else { X402Version::V1 };
    let Ok(entry) = serde_json::from_slice::<serde_json::Value>(rest) else { return };
    let Ok(terms) = SvmTerms::from_json(version, &entry) else { return };
    assert!(terms.memo().is_none_or(|m| !m.is_empty() && m.len() <= MAX_MEMO_BYTES));
    assert_eq!(x402_router::x402::svm::SvmNetwork::parse(&terms.network().caip2()).as_ref(), Ok(terms.network()));

    let signer = SvmSigner::from_bytes(&[7u8; 32]).expect("a 32-byte seed is a key");
    let mint = Mint { address: terms.mint(), token_program: TOKEN_PROGRAM, decimals: 6 };
    let blockhash = Blockhash { hash: Default::default(), last_valid_block_height: 150, context_slot: 0 };
    match sign_transfer(&signer, &terms, &mint, &blockhash, "00", ComputeBudget::default()) {
        Ok(signed) => {
            assert_eq!(signed.amount, terms.amount().to_string());
            assert_eq!(signed.fee_payer, terms.fee_payer().to_string());
            assert_ne!(signed.fee_payer, signed.payer, "the payer never pays the fees");
            assert_eq!(signed.mint, terms.mint().to_string());
            assert!(!signed.transaction.is_empty());
        }
        Err(TransferError::FeePayerIsPayer) => assert_eq!(terms.fee_payer(), signer.address()),
        Err(TransferError::ZeroAmount) => assert_eq!(terms.amount(), 0),
        Err(e) => panic!("refused for an unexpected reason: {e}"),
    }
}
