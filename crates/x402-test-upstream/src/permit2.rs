//! Verifying and settling Permit2 payments (`exact` via Permit2, and `upto`) against the test
//! chain, the way an x402 facilitator does: parse the `permit2Authorization`, check it against
//! the offer and the clock, recover the EIP-712 signer (Permit2's domain), read the nonce
//! bitmap, the balance and the allowance, and settle through the x402 proxy with the proxy's
//! `settle`, sent from the facilitator key. Independent of the router's own x402 code.

use std::str::FromStr;

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Bytes, Signature, U256, address};
use alloy::rpc::types::TransactionRequest;
use alloy::sol;
use alloy::sol_types::{Eip712Domain, SolCall, SolStruct};
use serde_json::Value;

use crate::chain::Chain;
use crate::payment::{Facilitator, error_chain, unix_now};

/// Uniswap Permit2's canonical address.
pub const PERMIT2: Address = address!("0x000000000022D473030F116dDEE9F6B43aC78BA3");
/// The x402 exact Permit2 proxy's canonical address.
pub const EXACT_PROXY: Address = address!("0x402085c248EeA27D92E8b30b2C58ed07f9E20001");
/// The x402 upto Permit2 proxy's canonical address.
pub const UPTO_PROXY: Address = address!("0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002");

mod eip712_exact {
    alloy::sol! {
        struct TokenPermissions { address token; uint256 amount; }
        struct Witness { address to; uint256 validAfter; }
        struct PermitWitnessTransferFrom {
            TokenPermissions permitted; address spender; uint256 nonce; uint256 deadline; Witness witness;
        }
    }
}

mod eip712_permit {
    alloy::sol! {
        struct Permit { address owner; address spender; uint256 value; uint256 nonce; uint256 deadline; }
    }
}

mod eip712_upto {
    alloy::sol! {
        struct TokenPermissions { address token; uint256 amount; }
        struct Witness { address to; address facilitator; uint256 validAfter; }
        struct PermitWitnessTransferFrom {
            TokenPermissions permitted; address spender; uint256 nonce; uint256 deadline; Witness witness;
        }
    }
}

sol! {
    interface IPermit2 {
        function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);
    }
    interface IErc20 {
        function balanceOf(address account) external view returns (uint256);
        function allowance(address owner, address spender) external view returns (uint256);
        function approve(address spender, uint256 value) external returns (bool);
    }
    struct AbiTokenPermissions { address token; uint256 amount; }
    struct AbiPermitTransferFrom { AbiTokenPermissions permitted; uint256 nonce; uint256 deadline; }
    struct AbiExactWitness { address to; uint256 validAfter; }
    struct AbiEip2612Permit { uint256 value; uint256 deadline; bytes32 r; bytes32 s; uint8 v; }
    struct AbiUptoWitness { address to; address facilitator; uint256 validAfter; }
    interface IExactProxy {
        function settle(AbiPermitTransferFrom permit, address owner, AbiExactWitness witness, bytes signature) external;
        function settleWithPermit(AbiEip2612Permit permit2612, AbiPermitTransferFrom permit, address owner, AbiExactWitness witness, bytes signature) external;
    }
    interface IUptoProxy {
        function settle(AbiPermitTransferFrom permit, uint256 amount, address owner, AbiUptoWitness witness, bytes signature) external;
    }
}

/// A refusal: the wire reason and a message.
#[derive(Debug)]
pub struct Refused {
    pub reason: &'static str,
    pub message: String,
}

fn refuse(reason: &'static str, message: impl Into<String>) -> Refused {
    Refused { reason, message: message.into() }
}

/// A parsed Permit2 payload (`{signature, permit2Authorization}`).
#[derive(Clone, Debug)]
pub struct Permit2Payment {
    pub from: Address,
    pub token: Address,
    pub amount: U256,
    pub spender: Address,
    pub nonce: U256,
    pub deadline: U256,
    pub to: Address,
    pub facilitator: Option<Address>,
    pub valid_after: U256,
    pub signature: Bytes,
    /// The payer's EIP-2612 permit for Permit2 (`eip2612GasSponsoring`), submitted first.
    pub permit: Option<Eip2612Permit>,
}

/// The `eip2612GasSponsoring` extension's `info` of a payment.
#[derive(Clone, Debug)]
pub struct Eip2612Permit {
    pub from: Address,
    pub asset: Address,
    pub spender: Address,
    pub amount: U256,
    pub nonce: U256,
    pub deadline: U256,
    pub signature: Signature,
}

impl Eip2612Permit {
    /// Parses `extensions.eip2612GasSponsoring.info` of a payment payload, if present.
    ///
    /// # Errors
    /// `invalid_eip2612_extension_format` for a field that does not parse.
    pub fn parse(payload: &Value) -> Result<Option<Self>, Refused> {
        let Some(info) = payload.pointer("/extensions/eip2612GasSponsoring/info") else { return Ok(None) };
        let bad = |name: &str| refuse("invalid_eip2612_extension_format", format!("{name} does not parse"));
        let text = |name: &str| info.get(name).and_then(Value::as_str).ok_or_else(|| bad(name));
        let address = |name: &str| Address::from_str(text(name)?).map_err(|_| bad(name));
        let uint = |name: &str| {
            let raw = text(name)?;
            if raw.is_empty() || raw.len() > 78 || !raw.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(name));
            }
            U256::from_str_radix(raw, 10).map_err(|_| bad(name))
        };
        let signature = text("signature")?
            .strip_prefix("0x")
            .and_then(|h| alloy::hex::decode(h).ok())
            .and_then(|b| Signature::from_raw(&b).ok())
            .ok_or_else(|| bad("signature"))?;
        if info.get("version").and_then(Value::as_str).is_none() {
            return Err(bad("version"));
        }
        Ok(Some(Self {
            from: address("from")?,
            asset: address("asset")?,
            spender: address("spender")?,
            amount: uint("amount")?,
            nonce: uint("nonce")?,
            deadline: uint("deadline")?,
            signature,
        }))
    }

    /// A facilitator's checks of the permit against the payment: same owner and token,
    /// canonical Permit2 as spender, enough value, a live deadline, and a signature by the
    /// owner under the token's EIP-712 domain (`name`, `version`, `chain_id`).
    ///
    /// # Errors
    /// The first failed check.
    pub fn check(
        &self,
        p: &Permit2Payment,
        (name, version, chain_id): (&str, &str, u64),
        now: u64,
    ) -> Result<(), Refused> {
        if self.from != p.from {
            return Err(refuse("eip2612_from_mismatch", "the permit's owner is not the payer"));
        }
        if self.asset != p.token {
            return Err(refuse("eip2612_asset_mismatch", "the permit is for another token"));
        }
        if self.spender != PERMIT2 {
            return Err(refuse("eip2612_spender_not_permit2", "the permit's spender is not Permit2"));
        }
        if self.amount < p.amount {
            return Err(refuse("eip2612_amount_mismatch", "the permit approves less than the payment"));
        }
        if self.deadline < U256::from(now + crate::payment::MIN_REMAINING_VALIDITY_SECS) {
            return Err(refuse("eip2612_deadline_expired", "the permit's deadline is too close"));
        }
        let domain = Eip712Domain::new(
            Some(name.to_owned().into()),
            Some(version.to_owned().into()),
            Some(U256::from(chain_id)),
            Some(self.asset),
            None,
        );
        let hash = eip712_permit::Permit {
            owner: self.from,
            spender: self.spender,
            value: self.amount,
            nonce: self.nonce,
            deadline: self.deadline,
        }
        .eip712_signing_hash(&domain);
        if self.signature.recover_address_from_prehash(&hash).ok() != Some(self.from) {
            return Err(refuse("invalid_eip2612_signature", "the permit's signature does not recover to the payer"));
        }
        Ok(())
    }
}

/// What the payment must match: the offer of the route.
pub struct Expected {
    pub upto: bool,
    pub chain_id: u64,
    pub token: Address,
    pub amount: U256,
    pub pay_to: Address,
    pub facilitator: Address,
}

impl Permit2Payment {
    /// # Errors
    /// `invalid_payload` naming the first field that does not parse.
    pub fn parse(payload: &Value) -> Result<Self, Refused> {
        let a =
            payload.get("permit2Authorization").ok_or_else(|| refuse("invalid_payload", "no permit2Authorization"))?;
        let text = |v: Option<&Value>, name: &str| {
            v.and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| refuse("invalid_payload", format!("{name} missing")))
        };
        let address = |v: Option<&Value>, name: &str| {
            Address::from_str(&text(v, name)?)
                .map_err(|_| refuse("invalid_payload", format!("{name} is not an address")))
        };
        let uint = |v: Option<&Value>, name: &str| {
            let raw = text(v, name)?;
            if raw.is_empty() || raw.len() > 78 || !raw.bytes().all(|b| b.is_ascii_digit()) {
                return Err(refuse("invalid_payload", format!("{name} is not a decimal string")));
            }
            U256::from_str_radix(&raw, 10).map_err(|_| refuse("invalid_payload", format!("{name} overflows")))
        };
        let w = a.get("witness");
        let facilitator = match w.and_then(|w| w.get("facilitator")) {
            None => None,
            some => Some(address(some, "witness.facilitator")?),
        };
        let sig = text(payload.get("signature"), "signature")?;
        let signature = sig
            .strip_prefix("0x")
            .and_then(|h| alloy::hex::decode(h).ok())
            .filter(|b| b.len() == 65)
            .ok_or_else(|| refuse("invalid_permit2_signature", "signature is not 65 bytes of 0x-hex"))?;
        Ok(Self {
            from: address(a.get("from"), "from")?,
            token: address(a.get("permitted").and_then(|p| p.get("token")), "permitted.token")?,
            amount: uint(a.get("permitted").and_then(|p| p.get("amount")), "permitted.amount")?,
            spender: address(a.get("spender"), "spender")?,
            nonce: uint(a.get("nonce"), "nonce")?,
            deadline: uint(a.get("deadline"), "deadline")?,
            to: address(w.and_then(|w| w.get("to")), "witness.to")?,
            facilitator,
            valid_after: uint(w.and_then(|w| w.get("validAfter")), "witness.validAfter")?,
            signature: Bytes::from(signature),
            permit: None,
        })
    }

    fn signing_hash(&self, chain_id: u64) -> B256 {
        let domain = Eip712Domain::new(Some("Permit2".into()), None, Some(U256::from(chain_id)), Some(PERMIT2), None);
        match self.facilitator {
            None => eip712_exact::PermitWitnessTransferFrom {
                permitted: eip712_exact::TokenPermissions { token: self.token, amount: self.amount },
                spender: self.spender,
                nonce: self.nonce,
                deadline: self.deadline,
                witness: eip712_exact::Witness { to: self.to, validAfter: self.valid_after },
            }
            .eip712_signing_hash(&domain),
            Some(facilitator) => eip712_upto::PermitWitnessTransferFrom {
                permitted: eip712_upto::TokenPermissions { token: self.token, amount: self.amount },
                spender: self.spender,
                nonce: self.nonce,
                deadline: self.deadline,
                witness: eip712_upto::Witness { to: self.to, facilitator, validAfter: self.valid_after },
            }
            .eip712_signing_hash(&domain),
        }
    }

    /// Checks that need no chain, in a facilitator's order.
    ///
    /// # Errors
    /// The first failed check.
    pub fn check_offline(&self, e: &Expected, now: u64) -> Result<(), Refused> {
        let proxy = if e.upto { UPTO_PROXY } else { EXACT_PROXY };
        if self.spender != proxy {
            return Err(refuse("invalid_permit2_spender", format!("spender {} is not {proxy}", self.spender)));
        }
        let sig =
            Signature::from_raw(&self.signature).map_err(|_| refuse("invalid_permit2_signature", "bad signature"))?;
        let signer = sig.recover_address_from_prehash(&self.signing_hash(e.chain_id)).ok();
        if signer != Some(self.from) {
            return Err(refuse("invalid_permit2_signature", "the signature does not recover to from"));
        }
        if self.token != e.token {
            return Err(refuse("invalid_permit2_token_mismatch", "permitted.token is not the offered asset"));
        }
        if self.amount != e.amount {
            return Err(refuse("invalid_permit2_amount_mismatch", "permitted.amount is not the offered amount"));
        }
        if self.to != e.pay_to {
            return Err(refuse("invalid_permit2_recipient_mismatch", "witness.to is not payTo"));
        }
        if e.upto && self.facilitator != Some(e.facilitator) {
            return Err(refuse("invalid_upto_facilitator_mismatch", "witness.facilitator is not this facilitator"));
        }
        if !e.upto && self.facilitator.is_some() {
            return Err(refuse("invalid_payload", "an exact witness has no facilitator"));
        }
        if self.deadline < U256::from(now + crate::payment::MIN_REMAINING_VALIDITY_SECS) {
            return Err(refuse("invalid_permit2_deadline", "the deadline is too close"));
        }
        if self.valid_after > U256::from(now) {
            return Err(refuse("invalid_permit2_valid_after", "validAfter is in the future"));
        }
        Ok(())
    }

    /// The proxy call that settles `amount` (exact: always the permitted amount).
    pub fn settle_call(&self, amount: U256) -> (Address, Vec<u8>) {
        let permit = AbiPermitTransferFrom {
            permitted: AbiTokenPermissions { token: self.token, amount: self.amount },
            nonce: self.nonce,
            deadline: self.deadline,
        };
        match (self.facilitator, &self.permit) {
            (None, Some(p)) => (
                EXACT_PROXY,
                IExactProxy::settleWithPermitCall {
                    permit2612: AbiEip2612Permit {
                        value: p.amount,
                        deadline: p.deadline,
                        r: p.signature.r().into(),
                        s: p.signature.s().into(),
                        v: 27 + u8::from(p.signature.v()),
                    },
                    permit,
                    owner: self.from,
                    witness: AbiExactWitness { to: self.to, validAfter: self.valid_after },
                    signature: self.signature.clone(),
                }
                .abi_encode(),
            ),
            (None, None) => (
                EXACT_PROXY,
                IExactProxy::settleCall {
                    permit,
                    owner: self.from,
                    witness: AbiExactWitness { to: self.to, validAfter: self.valid_after },
                    signature: self.signature.clone(),
                }
                .abi_encode(),
            ),
            (Some(facilitator), _) => (
                UPTO_PROXY,
                IUptoProxy::settleCall {
                    permit,
                    amount,
                    owner: self.from,
                    witness: AbiUptoWitness { to: self.to, facilitator, validAfter: self.valid_after },
                    signature: self.signature.clone(),
                }
                .abi_encode(),
            ),
        }
    }
}

/// Whether `nonce` of `owner` is set in Permit2's bitmap.
///
/// # Errors
/// The chain's error, as text.
pub async fn nonce_used(chain: &Chain, owner: Address, nonce: U256) -> Result<bool, String> {
    let bitmap = chain
        .call(PERMIT2, &IPermit2::nonceBitmapCall { owner, wordPos: nonce >> 8usize })
        .await
        .map_err(|e| error_chain(&e))?;
    let bit = usize::try_from(nonce & U256::from(0xffu8)).unwrap_or(0);
    Ok(bitmap.bit(bit))
}

/// Verifies against the chain: nonce unused, balance and Permit2 allowance sufficient.
///
/// # Errors
/// The first failed check.
pub async fn verify(facilitator: &Facilitator, p: &Permit2Payment, e: &Expected) -> Result<(), Refused> {
    p.check_offline(e, unix_now())?;
    let chain = facilitator.chain();
    if nonce_used(chain, p.from, p.nonce).await.map_err(|m| refuse("unexpected_verify_error", m))? {
        return Err(refuse("permit2_nonce_already_used", "the Permit2 nonce was already used"));
    }
    let balance = chain
        .call(e.token, &IErc20::balanceOfCall { account: p.from })
        .await
        .map_err(|err| refuse("unexpected_verify_error", error_chain(&err)))?;
    if balance < p.amount {
        return Err(refuse("permit2_insufficient_balance", format!("balance {balance} is below {}", p.amount)));
    }
    let allowance = chain
        .call(e.token, &IErc20::allowanceCall { owner: p.from, spender: PERMIT2 })
        .await
        .map_err(|err| refuse("unexpected_verify_error", error_chain(&err)))?;
    // A permit in the payment grants the allowance when it settles (`settleWithPermit`).
    if allowance < p.amount && p.permit.is_none() {
        return Err(refuse("permit2_allowance_required", "the payer has not approved Permit2 for the token"));
    }
    Ok(())
}

/// Simulates, sends and waits for the proxy's `settle` of `amount`.
///
/// # Errors
/// `permit2_simulation_failed` when the simulation reverts (a used nonce, a replay),
/// `unexpected_settle_error` otherwise.
pub async fn settle(facilitator: &Facilitator, p: &Permit2Payment, amount: U256) -> Result<B256, Refused> {
    let (proxy, input) = p.settle_call(amount);
    let chain = facilitator.chain();
    let hash = {
        let _turn = facilitator.send_lock().lock().await;
        let probe = TransactionRequest::default().with_from(chain.sender()).with_to(proxy).with_input(input.clone());
        if let Err(err) = chain.simulate(probe).await {
            return Err(refuse("permit2_simulation_failed", error_chain(&err)));
        }
        let tx = TransactionRequest::default().with_to(proxy).with_input(input);
        chain.send(tx).await.map_err(|e| refuse("unexpected_settle_error", error_chain(&e)))?
    };
    let receipt = chain
        .wait_for_receipt(hash, facilitator.settle_timeout())
        .await
        .map_err(|e| refuse("unexpected_settle_error", error_chain(&e)))?;
    if receipt.status() { Ok(hash) } else { Err(refuse("permit2_transaction_failed", format!("{hash} reverted"))) }
}

/// `approve(PERMIT2, max)` on `token` from `chain`'s sender (the deploy step's payer set-up).
///
/// # Errors
/// The chain's error.
pub async fn approve_permit2(
    chain: &Chain,
    token: Address,
    limit: std::time::Duration,
) -> Result<(), crate::chain::ChainError> {
    let call = IErc20::approveCall { spender: PERMIT2, value: U256::MAX };
    chain.send_and_confirm(TransactionRequest::default().with_to(token).with_input(call.abi_encode()), limit).await?;
    Ok(())
}
