//! Verifying and settling `exact` EVM payments, the way an x402 facilitator does, against the
//! test chain: parse the signed authorization, check it against the offer and the clock, recover
//! the EIP-712 signer, read `authorizationState` and the balance, and settle with
//! `transferWithAuthorization(…, v, r, s)` sent from the facilitator key.
//!
//! Refusal reasons are the official facilitator's strings (`invalid_exact_evm_*`), so a client
//! under test sees what it would see in production.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Signature, U256};
use alloy::rpc::types::TransactionRequest;
use alloy::sol;
use alloy::sol_types::{Eip712Domain, SolCall, SolStruct};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::chain::{Chain, ChainError, ITestToken};
use crate::wire::ExactEvmPayload;

sol! {
    /// EIP-3009's signed message; field order is part of the type hash.
    struct TransferWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }
}

/// A `validBefore` closer than this to now is refused: the settlement might land after it.
pub const MIN_REMAINING_VALIDITY_SECS: u64 = 6;

/// Why a payment was not accepted or not settled.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the payment payload is malformed: {0}")]
    InvalidPayload(String),
    #[error("x402Version {0} is not served on this route")]
    InvalidVersion(u64),
    #[error("the payment does not match any offered requirement")]
    NoMatchingRequirement,
    #[error("scheme {0:?} is offered but cannot be settled here")]
    UnsupportedScheme(String),
    #[error("network {0:?} is offered but not served here")]
    InvalidNetwork(String),
    #[error("asset {0} is not the token deployed here")]
    AssetNotDeployed(Address),
    #[error("the signature does not recover to authorization.from")]
    Signature,
    #[error("authorization.to {got} is not payTo {want}")]
    RecipientMismatch { got: Address, want: Address },
    #[error("validBefore {valid_before} is earlier than now + {MIN_REMAINING_VALIDITY_SECS} s ({now})")]
    ValidBefore { valid_before: U256, now: u64 },
    #[error("validAfter {valid_after} is later than now ({now})")]
    ValidAfter { valid_after: U256, now: u64 },
    #[error("authorization value {got} is not the price {want}")]
    ValueMismatch { got: U256, want: U256 },
    #[error("the authorization nonce was already used or canceled")]
    NonceAlreadyUsed,
    #[error("balance {balance} is below value {value}")]
    InsufficientBalance { balance: U256, value: U256 },
    #[error("simulating transferWithAuthorization failed: {0}")]
    SimulationFailed(String),
    #[error("settlement transaction {0} reverted")]
    TransactionFailed(B256),
    #[error("chain unavailable while verifying: {0}")]
    VerifyRpc(String),
    #[error("chain unavailable while settling: {0}")]
    SettleRpc(String),
    #[error("{message}")]
    Forced { reason: String, message: String },
}

impl Refusal {
    /// The wire reason (`invalidReason` / `errorReason` / `error` in PAYMENT-REQUIRED).
    pub fn reason(&self) -> &str {
        match self {
            Self::InvalidPayload(_) => "invalid_payload",
            Self::InvalidVersion(_) => "invalid_x402_version",
            Self::NoMatchingRequirement => "No matching payment requirements",
            Self::UnsupportedScheme(_) => "unsupported_scheme",
            Self::InvalidNetwork(_) => "invalid_network",
            Self::AssetNotDeployed(_) => "asset_not_deployed_contract",
            Self::Signature => "invalid_exact_evm_signature",
            Self::RecipientMismatch { .. } => "invalid_exact_evm_recipient_mismatch",
            Self::ValidBefore { .. } => "invalid_exact_evm_payload_authorization_valid_before",
            Self::ValidAfter { .. } => "invalid_exact_evm_payload_authorization_valid_after",
            Self::ValueMismatch { .. } => "invalid_exact_evm_payload_authorization_value_mismatch",
            Self::NonceAlreadyUsed => "invalid_exact_evm_nonce_already_used",
            Self::InsufficientBalance { .. } => "invalid_exact_evm_insufficient_balance",
            Self::SimulationFailed(_) => "invalid_exact_evm_transaction_simulation_failed",
            Self::TransactionFailed(_) => "invalid_exact_evm_transaction_failed",
            Self::VerifyRpc(_) => "unexpected_verify_error",
            Self::SettleRpc(_) => "unexpected_settle_error",
            Self::Forced { reason, .. } => reason,
        }
    }
}

/// One `accepts` entry as this server means it (before it is put on the wire).
#[derive(Clone, Debug)]
pub struct Offer {
    pub scheme: String,
    pub network: String,
    pub amount: U256,
    pub asset: Address,
    pub pay_to: Address,
    pub extra: Value,
}

/// A parsed `exact` EVM payload: the authorization fields as chain types plus the signature.
#[derive(Clone, Debug)]
pub struct SignedAuthorization {
    pub from: Address,
    pub to: Address,
    pub value: U256,
    pub valid_after: U256,
    pub valid_before: U256,
    pub nonce: B256,
    pub signature: Signature,
}

impl SignedAuthorization {
    /// # Errors
    /// `InvalidPayload` naming the first field that does not parse; `Signature` when the
    /// signature is not 65 bytes `r ‖ s ‖ v` (smart-wallet signatures are not served here).
    pub fn parse(payload: &ExactEvmPayload) -> Result<Self, Refusal> {
        let a = &payload.authorization;
        let address = |field: &str, raw: &str| {
            Address::from_str(raw)
                .map_err(|_| Refusal::InvalidPayload(format!("authorization.{field} is not an address")))
        };
        let uint = |field: &str, raw: &str| {
            if raw.is_empty() || raw.len() > 78 || !raw.bytes().all(|b| b.is_ascii_digit()) {
                return Err(Refusal::InvalidPayload(format!("authorization.{field} is not a decimal string")));
            }
            U256::from_str_radix(raw, 10)
                .map_err(|_| Refusal::InvalidPayload(format!("authorization.{field} overflows uint256")))
        };
        let nonce = parse_hex_exact::<32>(&a.nonce)
            .map(B256::from)
            .ok_or_else(|| Refusal::InvalidPayload("authorization.nonce is not 32 bytes of 0x-hex".into()))?;
        let raw_sig = parse_hex_exact::<65>(&payload.signature).ok_or(Refusal::Signature)?;
        // v as 27/28 (or the bare recovery id 0/1), exactly what TestToken and USDC accept.
        if !matches!(raw_sig[64], 0 | 1 | 27 | 28) {
            return Err(Refusal::Signature);
        }
        let signature = Signature::from_raw_array(&raw_sig).map_err(|_| Refusal::Signature)?;
        Ok(Self {
            from: address("from", &a.from)?,
            to: address("to", &a.to)?,
            value: uint("value", &a.value)?,
            valid_after: uint("validAfter", &a.valid_after)?,
            valid_before: uint("validBefore", &a.valid_before)?,
            nonce,
            signature,
        })
    }

    /// The EIP-712 digest the payer signed over `domain`.
    pub fn signing_hash(&self, domain: &Eip712Domain) -> B256 {
        TransferWithAuthorization {
            from: self.from,
            to: self.to,
            value: self.value,
            validAfter: self.valid_after,
            validBefore: self.valid_before,
            nonce: self.nonce,
        }
        .eip712_signing_hash(domain)
    }

    /// # Errors
    /// `Signature` when `s` is in the high half (a malleable copy the token refuses) or the
    /// recovered signer is not `from`.
    pub fn check_signature(&self, domain: &Eip712Domain) -> Result<(), Refusal> {
        if self.signature.normalize_s().is_some() {
            return Err(Refusal::Signature);
        }
        let signer =
            self.signature.recover_address_from_prehash(&self.signing_hash(domain)).map_err(|_| Refusal::Signature)?;
        if signer == self.from { Ok(()) } else { Err(Refusal::Signature) }
    }

    /// Checks that need no chain: signature, recipient, validity window, exact value.
    ///
    /// # Errors
    /// The first check that fails, in the official facilitator's order.
    pub fn check_offline(&self, offer: &Offer, domain: &Eip712Domain, now: u64) -> Result<(), Refusal> {
        self.check_signature(domain)?;
        if self.to != offer.pay_to {
            return Err(Refusal::RecipientMismatch { got: self.to, want: offer.pay_to });
        }
        if self.valid_before < U256::from(now) + U256::from(MIN_REMAINING_VALIDITY_SECS) {
            return Err(Refusal::ValidBefore { valid_before: self.valid_before, now });
        }
        if self.valid_after > U256::from(now) {
            return Err(Refusal::ValidAfter { valid_after: self.valid_after, now });
        }
        if self.value != offer.amount {
            return Err(Refusal::ValueMismatch { got: self.value, want: offer.amount });
        }
        Ok(())
    }

    fn transfer_call(&self) -> ITestToken::transferWithAuthorizationCall {
        ITestToken::transferWithAuthorizationCall {
            from: self.from,
            to: self.to,
            value: self.value,
            validAfter: self.valid_after,
            validBefore: self.valid_before,
            nonce: self.nonce,
            v: 27 + u8::from(self.signature.v()),
            r: B256::from(self.signature.r()),
            s: B256::from(self.signature.s()),
        }
    }
}

/// `0x` + exactly `2 * N` hex digits.
fn parse_hex_exact<const N: usize>(raw: &str) -> Option<[u8; N]> {
    let digits = raw.strip_prefix("0x")?;
    if digits.len() != 2 * N {
        return None;
    }
    let bytes = alloy::hex::decode(digits).ok()?;
    bytes.try_into().ok()
}

pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

/// The server's facilitator: verifies against the chain and settles from its own key.
#[derive(Clone, Debug)]
pub struct Facilitator {
    chain: Chain,
    token: Address,
    network: String,
    domain: Eip712Domain,
    settle_timeout: Duration,
    /// Serialises simulate + send, so that concurrent settlements get distinct account nonces
    /// and a second settlement of the same authorization is refused before it is sent.
    /// Shared by every worker.
    send_lock: Arc<Mutex<()>>,
}

impl Facilitator {
    pub fn new(
        chain: Chain,
        token: Address,
        network: String,
        domain: Eip712Domain,
        settle_timeout: Duration,
        send_lock: Arc<Mutex<()>>,
    ) -> Self {
        Self { chain, token, network, domain, settle_timeout, send_lock }
    }

    /// The chain client (its sender is the facilitator's key).
    pub fn chain(&self) -> &Chain {
        &self.chain
    }

    /// The lock that serialises simulate + send across workers.
    pub fn send_lock(&self) -> &Arc<Mutex<()>> {
        &self.send_lock
    }

    /// How long a settlement may take to be mined.
    pub fn settle_timeout(&self) -> Duration {
        self.settle_timeout
    }

    /// Whether this server can settle `offer` at all (network, asset, scheme).
    ///
    /// # Errors
    /// The reason the offer is unpayable here.
    pub fn check_offer(&self, offer: &Offer) -> Result<(), Refusal> {
        if offer.scheme != "exact" {
            return Err(Refusal::UnsupportedScheme(offer.scheme.clone()));
        }
        if offer.network != self.network {
            return Err(Refusal::InvalidNetwork(offer.network.clone()));
        }
        if offer.asset != self.token {
            return Err(Refusal::AssetNotDeployed(offer.asset));
        }
        Ok(())
    }

    /// Full verification: the offer, the offline checks, then the chain (nonce unused, balance).
    ///
    /// # Errors
    /// The first failed check as a `Refusal`.
    pub async fn verify(&self, offer: &Offer, auth: &SignedAuthorization) -> Result<(), Refusal> {
        self.check_offer(offer)?;
        auth.check_offline(offer, &self.domain, unix_now())?;
        let used = ITestToken::authorizationStateCall { authorizer: auth.from, nonce: auth.nonce };
        let balance = ITestToken::balanceOfCall { account: auth.from };
        let (used, balance) = tokio::join!(self.chain.call(self.token, &used), self.chain.call(self.token, &balance));
        if used.map_err(|e| Refusal::VerifyRpc(error_chain(&e)))? {
            return Err(Refusal::NonceAlreadyUsed);
        }
        let balance = balance.map_err(|e| Refusal::VerifyRpc(error_chain(&e)))?;
        if balance < auth.value {
            return Err(Refusal::InsufficientBalance { balance, value: auth.value });
        }
        Ok(())
    }

    /// Submits `transferWithAuthorization(…, v, r, s)` and waits for a successful receipt.
    /// Callers verify first; this re-simulates under the send lock, so a concurrent duplicate
    /// is refused here rather than reverting on chain.
    ///
    /// # Errors
    /// `NonceAlreadyUsed`/`InsufficientBalance`/`SimulationFailed` when the simulation
    /// reverts, `TransactionFailed` when the mined transaction reverted, `SettleRpc` otherwise.
    pub async fn settle(&self, auth: &SignedAuthorization) -> Result<B256, Refusal> {
        let hash = self.broadcast(auth).await?;
        let receipt = self
            .chain
            .wait_for_receipt(hash, self.settle_timeout)
            .await
            .map_err(|e| Refusal::SettleRpc(error_chain(&e)))?;
        if receipt.status() { Ok(hash) } else { Err(Refusal::TransactionFailed(hash)) }
    }

    /// Simulates and sends `transferWithAuthorization(…, v, r, s)` under the send lock and
    /// returns the transaction hash without waiting for it to be mined.
    ///
    /// # Errors
    /// As [`Self::settle`], before anything is sent.
    pub async fn broadcast(&self, auth: &SignedAuthorization) -> Result<B256, Refusal> {
        let call = auth.transfer_call();
        let _turn = self.send_lock.lock().await;
        if let Err(err) = self.chain.call(self.token, &call).await {
            return Err(self.explain_failed_simulation(auth, &err).await);
        }
        let tx = TransactionRequest::default().with_to(self.token).with_input(call.abi_encode());
        self.chain.send(tx).await.map_err(|e| Refusal::SettleRpc(error_chain(&e)))
    }

    /// Sends 0 ETH from the facilitator to itself and waits for it to be mined: a real
    /// transaction that moves no token (for a hostile claim).
    ///
    /// # Errors
    /// `SettleRpc` when the chain does not take or mine it.
    pub async fn send_unrelated(&self) -> Result<B256, Refusal> {
        let hash = {
            let _turn = self.send_lock.lock().await;
            let tx = TransactionRequest::default().with_to(self.chain.sender());
            self.chain.send(tx).await.map_err(|e| Refusal::SettleRpc(error_chain(&e)))?
        };
        self.chain
            .wait_for_receipt(hash, self.settle_timeout)
            .await
            .map_err(|e| Refusal::SettleRpc(error_chain(&e)))?;
        Ok(hash)
    }

    /// The token's ERC-20 `allowance(owner, spender)`.
    ///
    /// # Errors
    /// `VerifyRpc` when the chain does not answer.
    pub async fn allowance(&self, owner: Address, spender: Address) -> Result<U256, Refusal> {
        let call = ITestToken::allowanceCall { owner, spender };
        self.chain.call(self.token, &call).await.map_err(|e| Refusal::VerifyRpc(error_chain(&e)))
    }

    /// Names why a simulation reverted, like the official facilitator does with Multicall3.
    async fn explain_failed_simulation(&self, auth: &SignedAuthorization, err: &ChainError) -> Refusal {
        let used = ITestToken::authorizationStateCall { authorizer: auth.from, nonce: auth.nonce };
        if let Ok(true) = self.chain.call(self.token, &used).await {
            return Refusal::NonceAlreadyUsed;
        }
        let balance = ITestToken::balanceOfCall { account: auth.from };
        if let Ok(balance) = self.chain.call(self.token, &balance).await
            && balance < auth.value
        {
            return Refusal::InsufficientBalance { balance, value: auth.value };
        }
        Refusal::SimulationFailed(error_chain(err))
    }
}

/// An error and its causes on one line, for logs and refusal messages.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Authorization;
    use alloy::primitives::{address, b256};
    use alloy::signers::SignerSync;
    use alloy::signers::local::PrivateKeySigner;
    use alloy::sol_types::eip712_domain;

    const PAYER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    const PAY_TO: Address = address!("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC");
    const TOKEN: Address = address!("0x5FbDB2315678afecb367f032d93F642f64180aa3");

    fn domain() -> Eip712Domain {
        eip712_domain! {
            name: "USD Coin",
            version: "2",
            chain_id: 84532,
            verifying_contract: TOKEN,
        }
    }

    fn offer() -> Offer {
        Offer {
            scheme: "exact".into(),
            network: "eip155:84532".into(),
            amount: U256::from(10_000u64),
            asset: TOKEN,
            pay_to: PAY_TO,
            extra: serde_json::json!({"name": "USD Coin", "version": "2"}),
        }
    }

    /// Signs like an x402 client: EIP-712 over the authorization, 65 bytes r‖s‖v.
    fn signed_payload(value: &str, valid_before: u64) -> ExactEvmPayload {
        let signer: PrivateKeySigner = PAYER_KEY.parse().unwrap();
        let message = TransferWithAuthorization {
            from: signer.address(),
            to: PAY_TO,
            value: U256::from_str_radix(value, 10).unwrap(),
            validAfter: U256::ZERO,
            validBefore: U256::from(valid_before),
            nonce: B256::repeat_byte(0x42),
        };
        let sig = signer.sign_hash_sync(&message.eip712_signing_hash(&domain())).unwrap();
        ExactEvmPayload {
            signature: format!("0x{}", alloy::hex::encode(sig.as_bytes())),
            authorization: Authorization {
                from: signer.address().to_string(),
                to: PAY_TO.to_string(),
                value: value.into(),
                valid_after: "0".into(),
                valid_before: valid_before.to_string(),
                nonce: format!("{:#x}", B256::repeat_byte(0x42)),
            },
        }
    }

    #[test]
    fn type_hash_is_eip3009s() {
        // keccak256("TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)")
        assert_eq!(
            TransferWithAuthorization::eip712_type_hash(&TransferWithAuthorization {
                from: Address::ZERO,
                to: Address::ZERO,
                value: U256::ZERO,
                validAfter: U256::ZERO,
                validBefore: U256::ZERO,
                nonce: B256::ZERO,
            }),
            b256!("0x7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267")
        );
    }

    #[test]
    fn a_correctly_signed_authorization_passes_offline_checks() {
        let now = 1_800_000_000;
        let auth = SignedAuthorization::parse(&signed_payload("10000", now + 300)).unwrap();
        auth.check_offline(&offer(), &domain(), now).unwrap();
    }

    #[test]
    fn offline_checks_name_the_failure() {
        let now = 1_800_000_000;
        let auth = SignedAuthorization::parse(&signed_payload("9999", now + 300)).unwrap();
        let err = auth.check_offline(&offer(), &domain(), now).unwrap_err();
        assert_eq!(err.reason(), "invalid_exact_evm_payload_authorization_value_mismatch");

        let auth = SignedAuthorization::parse(&signed_payload("10000", now + 5)).unwrap();
        let err = auth.check_offline(&offer(), &domain(), now).unwrap_err();
        assert_eq!(err.reason(), "invalid_exact_evm_payload_authorization_valid_before");

        let mut other_domain = domain();
        other_domain.chain_id = Some(U256::from(8453u64));
        let auth = SignedAuthorization::parse(&signed_payload("10000", now + 300)).unwrap();
        let err = auth.check_offline(&offer(), &other_domain, now).unwrap_err();
        assert_eq!(err.reason(), "invalid_exact_evm_signature");
    }

    #[test]
    fn tampered_or_malformed_signatures_are_refused() {
        let now = 1_800_000_000;
        let mut payload = signed_payload("10000", now + 300);
        payload.authorization.value = "10001".into();
        let auth = SignedAuthorization::parse(&payload).unwrap();
        assert_eq!(auth.check_offline(&offer(), &domain(), now).unwrap_err().reason(), "invalid_exact_evm_signature");

        let mut short = signed_payload("10000", now + 300);
        short.signature.truncate(10);
        assert!(matches!(SignedAuthorization::parse(&short), Err(Refusal::Signature)));

        let mut bad_number = signed_payload("10000", now + 300);
        bad_number.authorization.valid_before = "1e9".into();
        assert!(matches!(SignedAuthorization::parse(&bad_number), Err(Refusal::InvalidPayload(_))));
    }

    #[test]
    fn high_s_copies_of_a_valid_signature_are_refused() {
        let now = 1_800_000_000;
        let payload = signed_payload("10000", now + 300);
        let auth = SignedAuthorization::parse(&payload).unwrap();
        let order =
            U256::from_str_radix("fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141", 16).unwrap();
        let flipped = Signature::new(auth.signature.r(), order - auth.signature.s(), !auth.signature.v());
        let malleable = SignedAuthorization { signature: flipped, ..auth };
        assert!(matches!(malleable.check_signature(&domain()), Err(Refusal::Signature)));
    }

    #[test]
    fn settlement_call_carries_v_r_s_of_the_signature() {
        let payload = signed_payload("10000", 1_800_000_300);
        let auth = SignedAuthorization::parse(&payload).unwrap();
        let call = auth.transfer_call();
        let raw = alloy::hex::decode(payload.signature.trim_start_matches("0x")).unwrap();
        assert_eq!(call.r.as_slice(), &raw[..32]);
        assert_eq!(call.s.as_slice(), &raw[32..64]);
        assert_eq!(call.v, raw[64]);
    }
}
