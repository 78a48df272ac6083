//! [`SignedPayment`]: what the router signed for one payment, whatever its transfer method —
//! an EIP-3009 authorization (`exact`) or a Permit2 authorization (`exact` via Permit2, `upto`).
//! This is the record stored in the payments ledger (`payments.signed_authorization`) and
//! re-sent verbatim.
//!
//! Stored form: each variant serializes as its own record, untagged. The two records have
//! disjoint required fields (`asset`/`domainName`/`authorization` against
//! `permit2Authorization`), so reading picks exactly one; EIP-3009 records written before
//! Permit2 existed read unchanged.

use alloy::primitives::{Address, B256, U256};
use alloy::signers::local::PrivateKeySigner;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::chain::{Chain, ChainError};
use super::network::Network;
use super::permit2::{self, SignedPermit2};
use super::sign::{SignError, SignedAuthorization, sign_authorization};
use super::wire::Requirement;

/// A signed payment of either transfer method.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SignedPayment {
    /// EIP-3009 `TransferWithAuthorization` on the token (`exact`).
    Eip3009(SignedAuthorization),
    /// Permit2 `PermitWitnessTransferFrom` through an x402 proxy (`exact` or `upto`).
    Permit2(SignedPermit2),
}

impl From<SignedAuthorization> for SignedPayment {
    fn from(s: SignedAuthorization) -> Self {
        Self::Eip3009(s)
    }
}

impl From<SignedPermit2> for SignedPayment {
    fn from(s: SignedPermit2) -> Self {
        Self::Permit2(s)
    }
}

impl SignedPayment {
    /// Network.
    pub fn network(&self) -> Network {
        match self {
            Self::Eip3009(s) => s.network(),
            Self::Permit2(s) => s.network(),
        }
    }
    /// Token contract.
    pub fn asset(&self) -> Address {
        match self {
            Self::Eip3009(s) => s.asset(),
            Self::Permit2(s) => s.asset(),
        }
    }
    /// Payer.
    pub fn payer(&self) -> Address {
        match self {
            Self::Eip3009(s) => s.payer(),
            Self::Permit2(s) => s.payer(),
        }
    }
    /// Recipient.
    pub fn pay_to(&self) -> Address {
        match self {
            Self::Eip3009(s) => s.authorization().to,
            Self::Permit2(s) => s.pay_to(),
        }
    }
    /// The signed amount: the price, or for `upto` the most that may be charged.
    pub fn amount(&self) -> U256 {
        match self {
            Self::Eip3009(s) => s.authorization().value,
            Self::Permit2(s) => s.amount(),
        }
    }
    /// The nonce as 32 bytes (the Permit2 uint256 big-endian): the ledger's `nonce` column.
    pub fn nonce(&self) -> B256 {
        match self {
            Self::Eip3009(s) => s.nonce(),
            Self::Permit2(s) => B256::from(s.nonce()),
        }
    }
    /// Unix time from which it is valid.
    pub fn valid_after(&self) -> u64 {
        match self {
            Self::Eip3009(s) => s.authorization().valid_after,
            Self::Permit2(s) => s.authorization().witness.valid_after,
        }
    }
    /// Unix time before which it must be used (EIP-3009 `validBefore`, Permit2 `deadline`).
    pub fn valid_before(&self) -> u64 {
        match self {
            Self::Eip3009(s) => s.authorization().valid_before,
            Self::Permit2(s) => s.authorization().deadline,
        }
    }
    /// The x402 scheme: `exact` or `upto`.
    pub fn scheme(&self) -> &'static str {
        match self {
            Self::Eip3009(_) => "exact",
            Self::Permit2(s) => s.scheme().as_str(),
        }
    }
    /// The asset transfer method: `eip3009` or `permit2`.
    pub fn transfer_method(&self) -> &'static str {
        match self {
            Self::Eip3009(_) => permit2::EIP3009_METHOD,
            Self::Permit2(_) => permit2::PERMIT2_METHOD,
        }
    }
    /// True for `upto`: the amount moved may be less than [`Self::amount`].
    pub fn is_upto(&self) -> bool {
        matches!(self, Self::Permit2(s) if s.scheme() == permit2::Permit2Scheme::Upto)
    }
    /// The scheme payload of the wire message.
    pub fn payload_json(&self) -> Value {
        match self {
            Self::Eip3009(s) => s.payload_json(),
            Self::Permit2(s) => s.payload_json(),
        }
    }
    /// The address the signature recovers to.
    ///
    /// # Errors
    /// [`SignError::Recover`].
    pub fn recover_signer(&self) -> Result<Address, SignError> {
        match self {
            Self::Eip3009(s) => s.recover_signer(),
            Self::Permit2(s) => s.recover_signer(),
        }
    }
    /// True when it can still be submitted at `now_unix` with `min_remaining_secs` to spare.
    pub fn is_valid_at(&self, now_unix: u64, min_remaining_secs: u64) -> bool {
        match self {
            Self::Eip3009(s) => s.is_valid_at(now_unix, min_remaining_secs),
            Self::Permit2(s) => s.is_valid_at(now_unix, min_remaining_secs),
        }
    }
}

/// The transaction that used a signed payment, and, when known, what it moved (Permit2:
/// from the transaction's logs; EIP-3009: `None`, the authorization's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PaymentSettlement {
    /// The settling transaction.
    pub tx_hash: B256,
    /// The amount moved to `payTo`, from the logs (Permit2 only).
    pub transferred: Option<U256>,
}

impl SignedPayment {
    /// True when the payment's nonce is used on-chain: EIP-3009 `authorizationState` on the
    /// token, Permit2 `nonceBitmap`.
    ///
    /// # Errors
    /// [`ChainError`] (a network without Permit2 is [`ChainError::NoContract`]).
    pub async fn used_on(&self, chain: &Chain) -> Result<bool, ChainError> {
        match self {
            Self::Eip3009(s) => chain.authorization_state(s.network(), s.asset(), s.payer(), s.nonce()).await,
            Self::Permit2(s) => chain.permit2_nonce_used(s.network(), s.payer(), s.nonce()).await,
        }
    }

    /// Whether the transaction `tx` (an upstream's claim) settled this payment, checked on
    /// its receipt alone (and, Permit2, its input): a used nonce and its transaction proven in
    /// one look. `None`: it did not (the caller asks the chain the longer way).
    ///
    /// # Errors
    /// [`ChainError`].
    pub async fn settled_by(&self, chain: &Chain, tx: B256) -> Result<Option<PaymentSettlement>, ChainError> {
        Ok(match self {
            Self::Eip3009(s) => chain
                .authorization_used_in(s.network(), s.asset(), s.payer(), s.nonce(), tx)
                .await?
                .then_some(PaymentSettlement { tx_hash: tx, transferred: None }),
            Self::Permit2(s) => chain
                .permit2_check(&s.terms(), Some(tx))
                .await?
                .map(|p| PaymentSettlement { tx_hash: p.tx_hash, transferred: Some(p.transferred) }),
        })
    }

    /// The transaction the chain shows using the payment (the upstream's `claimed` hash is
    /// only a hint): [`Chain::authorization_tx`] or [`Chain::permit2_settlement`].
    ///
    /// # Errors
    /// [`ChainError`].
    pub async fn settlement_on(
        &self,
        chain: &Chain,
        claimed: Option<B256>,
    ) -> Result<Option<PaymentSettlement>, ChainError> {
        Ok(match self {
            Self::Eip3009(s) => chain
                .authorization_tx(s.network(), s.asset(), s.payer(), s.nonce(), claimed)
                .await?
                .map(|tx_hash| PaymentSettlement { tx_hash, transferred: None }),
            Self::Permit2(s) => chain
                .permit2_settlement(&s.terms(), claimed)
                .await?
                .map(|p| PaymentSettlement { tx_hash: p.tx_hash, transferred: Some(p.transferred) }),
        })
    }
}

/// Signs `requirement` with the method it asks for: Permit2 for `upto` and for `exact` with
/// `assetTransferMethod: "permit2"` (the 32 bytes of `nonce` as the uint256 Permit2 nonce),
/// EIP-3009 otherwise. Selection ([`crate::select()`]) has refused every other method.
///
/// # Errors
/// [`SignError`].
pub fn sign_payment(
    signer: &PrivateKeySigner,
    requirement: &Requirement,
    nonce: B256,
    now_unix: u64,
    max_auth_secs: u64,
) -> Result<SignedPayment, SignError> {
    if permit2::scheme_of(requirement).is_some() {
        let nonce = U256::from_be_bytes(nonce.0);
        Ok(permit2::sign_permit2(signer, requirement, nonce, now_unix, max_auth_secs)?.into())
    } else {
        Ok(sign_authorization(signer, requirement, nonce, now_unix, max_auth_secs)?.into())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::wire::X402Version;

    fn requirement(scheme: &str, extra: Value) -> Requirement {
        Requirement::from_json(
            X402Version::V2,
            0,
            &json!({"scheme": scheme, "network": "eip155:84532", "amount": "10000",
                    "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
                    "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
                    "maxTimeoutSeconds": 60, "extra": extra}),
        )
        .unwrap()
    }

    #[test]
    fn both_kinds_round_trip_through_the_stored_form_as_themselves() {
        let signer: PrivateKeySigner =
            "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d".parse().unwrap();
        let nonce = B256::repeat_byte(3);
        let eip3009 = sign_payment(
            &signer,
            &requirement("exact", json!({"name": "USD Coin", "version": "2"})),
            nonce,
            1_800_000_000,
            300,
        )
        .unwrap();
        let permit2 = sign_payment(
            &signer,
            &requirement("exact", json!({"assetTransferMethod": "permit2"})),
            nonce,
            1_800_000_000,
            300,
        )
        .unwrap();
        assert!(matches!(eip3009, SignedPayment::Eip3009(_)));
        assert!(matches!(permit2, SignedPayment::Permit2(_)));
        for signed in [eip3009, permit2] {
            let bytes = serde_json::to_vec(&signed).unwrap();
            let back: SignedPayment = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back, signed);
            assert_eq!(serde_json::to_vec(&back).unwrap(), bytes, "re-sendable byte for byte");
            assert_eq!(back.nonce(), nonce, "the ledger's nonce column is the same 32 bytes");
            assert_eq!(back.recover_signer().unwrap(), signer.address());
            assert_eq!(back.valid_before(), 1_800_000_060);
            assert_eq!(back.amount(), U256::from(10_000u64));
        }
        // An EIP-3009 record of the shape stored before Permit2 existed reads as EIP-3009.
        let old = json!({"network": "eip155:84532", "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
            "domainName": "USD Coin", "domainVersion": "2",
            "authorization": {"from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                "to": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "value": "10000", "validAfter": "1796202752",
                "validBefore": "1796203412", "nonce": "0xddd91036a0a4b67eb9982925de5218b40432f1c16ec1ca705f9dfd27cb1b0f6d"},
            "signature": "0x80a92f40ba2f5947809f0089442cbf019a8de4443b19d781768796dec961af1d368224993a06c1cae48a831aa1cb16fff11cb4556723c088ae765f80f1f379c11c"});
        assert!(matches!(serde_json::from_value::<SignedPayment>(old).unwrap(), SignedPayment::Eip3009(_)));
    }
}
