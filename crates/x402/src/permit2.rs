//! Permit2 payments: scheme `exact` with `extra.assetTransferMethod == "permit2"` and scheme
//! `upto` (Permit2 only). The router signs Uniswap Permit2's `PermitWitnessTransferFrom`
//! (EIP-712, with alloy) for one of the two x402 proxies, which alone may move the tokens and
//! only to the witnessed `to`.
//!
//! | | exact | upto |
//! |---|---|---|
//! | spender | [`EXACT_PROXY`] | [`UPTO_PROXY`] |
//! | witness | `Witness(address to,uint256 validAfter)` | `Witness(address to,address facilitator,uint256 validAfter)` |
//! | moves | exactly `permitted.amount` | any amount ≤ `permitted.amount`, chosen by the facilitator |
//!
//! Invariants:
//! - The EIP-712 domain is `{name: "Permit2", chainId: <network>, verifyingContract: PERMIT2}`
//!   (no version); `permitted = {token: asset, amount: requirement amount}` — for `upto` the
//!   signed maximum, never more.
//! - The nonce is the router's deterministic Permit2 nonce of the request
//!   ([`crate::nonce::permit2_nonce`]): Permit2's nonce bitmap accepts it once per owner,
//!   so every signature ever made for a request under a key can move money at most once.
//! - `deadline = now + min(maxTimeoutSeconds, X402_MAX_AUTH_SECONDS)`, `validAfter = now − 600`:
//!   the upstream never decides how long a bearer authorization lives.
//! - A [`SignedPermit2`] serializes to JSON with decimal strings (so it can be stored and
//!   re-sent verbatim) and carries what is needed to re-verify it
//!   ([`SignedPermit2::recover_signer`]) and to check it on-chain (`nonceBitmap`).
//! - Its `Debug` output shortens the signature.

use std::fmt;

use alloy::primitives::{Address, B256, Signature, U256, address, hex};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{Eip712Domain, SolStruct};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::chain::Permit2Terms;
use super::network::Network;
use super::sign::{SignError, VALID_AFTER_SKEW_SECS, serde_helpers};
use super::wire::Requirement;

pub use super::chain::PERMIT2;
/// The x402 exact Permit2 proxy (`x402ExactPermit2ProxyAddress` of @x402/evm 2.27.0).
pub const EXACT_PROXY: Address = address!("0x402085c248EeA27D92E8b30b2C58ed07f9E20001");
/// The x402 upto Permit2 proxy (`x402UptoPermit2ProxyAddress` of @x402/evm 2.27.0).
pub const UPTO_PROXY: Address = address!("0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002");
/// `extra.assetTransferMethod` of a Permit2 requirement.
pub const PERMIT2_METHOD: &str = "permit2";
/// `extra.assetTransferMethod` of an EIP-3009 requirement (also the default when absent).
pub const EIP3009_METHOD: &str = "eip3009";
/// The `upto` scheme.
pub const UPTO: &str = "upto";

/// The EIP-712 types of the exact proxy.
pub mod exact_types {
    alloy::sol! {
        /// Permit2's token permission.
        #[derive(Debug, PartialEq, Eq)]
        struct TokenPermissions {
            address token;
            uint256 amount;
        }
        /// The exact proxy's witness.
        #[derive(Debug, PartialEq, Eq)]
        struct Witness {
            address to;
            uint256 validAfter;
        }
        /// Permit2's signature-transfer message with the exact witness.
        #[derive(Debug, PartialEq, Eq)]
        struct PermitWitnessTransferFrom {
            TokenPermissions permitted;
            address spender;
            uint256 nonce;
            uint256 deadline;
            Witness witness;
        }
    }
}

/// The EIP-712 types of the upto proxy.
pub mod upto_types {
    alloy::sol! {
        /// Permit2's token permission.
        #[derive(Debug, PartialEq, Eq)]
        struct TokenPermissions {
            address token;
            uint256 amount;
        }
        /// The upto proxy's witness (binds the facilitator that may choose the amount).
        #[derive(Debug, PartialEq, Eq)]
        struct Witness {
            address to;
            address facilitator;
            uint256 validAfter;
        }
        /// Permit2's signature-transfer message with the upto witness.
        #[derive(Debug, PartialEq, Eq)]
        struct PermitWitnessTransferFrom {
            TokenPermissions permitted;
            address spender;
            uint256 nonce;
            uint256 deadline;
            Witness witness;
        }
    }
}

/// Which Permit2 flavour a payment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit2Scheme {
    /// `exact` via Permit2: the proxy moves exactly the permitted amount.
    Exact,
    /// `upto`: the proxy moves at most the permitted amount.
    Upto,
}

impl Permit2Scheme {
    /// The x402 scheme name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Upto => UPTO,
        }
    }

    /// The proxy that is the Permit2 `spender`.
    pub fn proxy(self) -> Address {
        match self {
            Self::Exact => EXACT_PROXY,
            Self::Upto => UPTO_PROXY,
        }
    }
}

/// `permitted`: the token and the (maximum) amount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenPermissions {
    /// Token contract.
    #[serde(with = "serde_helpers::checksummed")]
    pub token: Address,
    /// Atomic units: the price (exact) or the most that may be charged (upto).
    #[serde(with = "serde_helpers::decimal_u256")]
    pub amount: U256,
}

/// The witness: where the money may go (and, for upto, who may settle).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Permit2Witness {
    /// Recipient (`payTo`).
    #[serde(with = "serde_helpers::checksummed")]
    pub to: Address,
    /// upto only: the facilitator allowed to settle (`extra.facilitatorAddress`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "serde_helpers::checksummed_opt")]
    pub facilitator: Option<Address>,
    /// Unix time from which the transfer may happen.
    #[serde(with = "serde_helpers::decimal_u64")]
    pub valid_after: u64,
}

/// The `permit2Authorization` object of the payload, in its wire form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permit2Authorization {
    /// Owner of the tokens (the router's wallet).
    #[serde(with = "serde_helpers::checksummed")]
    pub from: Address,
    /// Token and amount.
    pub permitted: TokenPermissions,
    /// The x402 proxy.
    #[serde(with = "serde_helpers::checksummed")]
    pub spender: Address,
    /// Permit2 unordered nonce (decimal string on the wire).
    #[serde(with = "serde_helpers::decimal_u256")]
    pub nonce: U256,
    /// Unix time after which Permit2 refuses the signature.
    #[serde(with = "serde_helpers::decimal_u64")]
    pub deadline: u64,
    /// The witness.
    pub witness: Permit2Witness,
}

impl Permit2Authorization {
    /// Exact or upto, from the witness shape (a facilitator is only in the upto witness).
    pub fn scheme(&self) -> Permit2Scheme {
        if self.witness.facilitator.is_some() { Permit2Scheme::Upto } else { Permit2Scheme::Exact }
    }

    /// The EIP-712 hash of the message under `domain`.
    fn signing_hash(&self, domain: &Eip712Domain) -> B256 {
        match self.witness.facilitator {
            None => exact_types::PermitWitnessTransferFrom {
                permitted: exact_types::TokenPermissions { token: self.permitted.token, amount: self.permitted.amount },
                spender: self.spender,
                nonce: self.nonce,
                deadline: U256::from(self.deadline),
                witness: exact_types::Witness { to: self.witness.to, validAfter: U256::from(self.witness.valid_after) },
            }
            .eip712_signing_hash(domain),
            Some(facilitator) => upto_types::PermitWitnessTransferFrom {
                permitted: upto_types::TokenPermissions { token: self.permitted.token, amount: self.permitted.amount },
                spender: self.spender,
                nonce: self.nonce,
                deadline: U256::from(self.deadline),
                witness: upto_types::Witness {
                    to: self.witness.to,
                    facilitator,
                    validAfter: U256::from(self.witness.valid_after),
                },
            }
            .eip712_signing_hash(domain),
        }
    }
}

/// A signed Permit2 authorization plus the network it was signed for (the domain's chainId;
/// the verifying contract is always [`PERMIT2`]).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignedPermit2 {
    network: Network,
    permit2_authorization: Permit2Authorization,
    #[serde(with = "serde_helpers::signature_hex")]
    signature: Signature,
}

impl SignedPermit2 {
    /// Network (its chain id is the domain's `chainId`).
    pub fn network(&self) -> Network {
        self.network
    }
    /// The signed fields.
    pub fn authorization(&self) -> &Permit2Authorization {
        &self.permit2_authorization
    }
    /// Exact or upto.
    pub fn scheme(&self) -> Permit2Scheme {
        self.permit2_authorization.scheme()
    }
    /// Token contract.
    pub fn asset(&self) -> Address {
        self.permit2_authorization.permitted.token
    }
    /// Payer (`from`).
    pub fn payer(&self) -> Address {
        self.permit2_authorization.from
    }
    /// Recipient (`witness.to`).
    pub fn pay_to(&self) -> Address {
        self.permit2_authorization.witness.to
    }
    /// The signed amount: the price (exact) or the maximum (upto).
    pub fn amount(&self) -> U256 {
        self.permit2_authorization.permitted.amount
    }
    /// The Permit2 nonce.
    pub fn nonce(&self) -> U256 {
        self.permit2_authorization.nonce
    }
    /// What the chain checks need to know about this authorization.
    pub fn terms(&self) -> Permit2Terms {
        let a = &self.permit2_authorization;
        Permit2Terms {
            network: self.network,
            owner: a.from,
            token: a.permitted.token,
            pay_to: a.witness.to,
            spender: a.spender,
            nonce: a.nonce,
            facilitator: a.witness.facilitator,
        }
    }
    /// The 65-byte signature as 0x-hex. Do not log it.
    pub fn signature_hex(&self) -> String {
        hex::encode_prefixed(self.signature.as_bytes())
    }

    /// The scheme payload of the wire message: `{"signature", "permit2Authorization"}`.
    pub fn payload_json(&self) -> Value {
        json!({
            "signature": self.signature_hex(),
            "permit2Authorization": &self.permit2_authorization,
        })
    }

    /// The EIP-712 hash that was signed.
    pub fn signing_hash(&self) -> B256 {
        self.permit2_authorization.signing_hash(&domain(self.network))
    }

    /// The address the signature recovers to; equals [`Self::payer`] for an intact record.
    ///
    /// # Errors
    /// [`SignError::Recover`] for a signature that recovers to no key.
    pub fn recover_signer(&self) -> Result<Address, SignError> {
        Ok(self.signature.recover_address_from_prehash(&self.signing_hash())?)
    }

    /// True when the authorization can still be submitted at `now_unix` with at least
    /// `min_remaining_secs` left before its deadline.
    pub fn is_valid_at(&self, now_unix: u64, min_remaining_secs: u64) -> bool {
        let a = &self.permit2_authorization;
        a.witness.valid_after <= now_unix && now_unix.saturating_add(min_remaining_secs) < a.deadline
    }
}

impl fmt::Debug for SignedPermit2 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sig = self.signature_hex();
        f.debug_struct("SignedPermit2")
            .field("network", &self.network)
            .field("permit2_authorization", &self.permit2_authorization)
            .field("signature", &format_args!("{}…", sig.get(..10).unwrap_or("")))
            .finish()
    }
}

/// The Permit2 EIP-712 domain of `network` (no version).
pub fn domain(network: Network) -> Eip712Domain {
    Eip712Domain::new(Some("Permit2".into()), None, Some(U256::from(network.chain_id())), Some(PERMIT2), None)
}

/// Which Permit2 flavour `requirement` asks for, if it is a Permit2 requirement at all
/// (`upto`, or `exact` with `extra.assetTransferMethod == "permit2"`). Selection has already
/// refused everything else that is not EIP-3009.
pub fn scheme_of(requirement: &Requirement) -> Option<Permit2Scheme> {
    match requirement.scheme() {
        UPTO => Some(Permit2Scheme::Upto),
        "exact" if requirement.asset_transfer_method() == Some(PERMIT2_METHOD) => Some(Permit2Scheme::Exact),
        _ => None,
    }
}

/// Signs the Permit2 authorization that pays `requirement` (exact: exactly its amount; upto:
/// at most its amount) from `signer`'s address, with the Permit2 `nonce`.
///
/// # Errors
/// [`SignError::NotPermit2`] for an EIP-3009 requirement, [`SignError::MissingFacilitator`]
/// for an `upto` requirement without a valid `extra.facilitatorAddress`,
/// [`SignError::ValidityOverflow`], [`SignError::Signer`].
pub fn sign_permit2(
    signer: &PrivateKeySigner,
    requirement: &Requirement,
    nonce: U256,
    now_unix: u64,
    max_auth_secs: u64,
) -> Result<SignedPermit2, SignError> {
    let scheme = scheme_of(requirement).ok_or(SignError::NotPermit2)?;
    let facilitator = match scheme {
        Permit2Scheme::Exact => None,
        Permit2Scheme::Upto => {
            Some(requirement.facilitator_address().filter(|a| !a.is_zero()).ok_or(SignError::MissingFacilitator)?)
        }
    };
    let timeout = requirement.max_timeout_seconds().min(max_auth_secs);
    let deadline = now_unix.checked_add(timeout).ok_or(SignError::ValidityOverflow(timeout))?;
    let authorization = Permit2Authorization {
        from: signer.address(),
        permitted: TokenPermissions { token: requirement.asset(), amount: requirement.amount().as_u256() },
        spender: scheme.proxy(),
        nonce,
        deadline,
        witness: Permit2Witness {
            to: requirement.pay_to(),
            facilitator,
            valid_after: now_unix.saturating_sub(VALID_AFTER_SKEW_SECS),
        },
    };
    sign_with(signer, requirement.network(), authorization)
}

fn sign_with(
    signer: &PrivateKeySigner,
    network: Network,
    authorization: Permit2Authorization,
) -> Result<SignedPermit2, SignError> {
    let hash = authorization.signing_hash(&domain(network));
    let signature = signer.sign_hash_sync(&hash)?;
    Ok(SignedPermit2 { network, permit2_authorization: authorization, signature })
}

#[cfg(test)]
mod tests {
    use alloy::primitives::keccak256;

    use super::*;
    use crate::wire::X402Version;

    /// anvil #1 — a public test key.
    const ANVIL1: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    const MAX_AUTH: u64 = 300;

    fn signer() -> PrivateKeySigner {
        ANVIL1.parse().unwrap()
    }

    fn requirement(scheme: &str, extra: Value) -> Requirement {
        Requirement::from_json(
            X402Version::V2,
            0,
            &json!({"scheme": scheme, "network": "eip155:84532", "amount": "50000",
                    "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
                    "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
                    "maxTimeoutSeconds": 600, "extra": extra}),
        )
        .unwrap()
    }

    #[test]
    fn type_hashes_are_permit2_witness_type_strings() {
        // Permit2 hashes "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,
        // uint256 nonce,uint256 deadline," ‖ the proxy's witness type string.
        let exact = "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,\
                     uint256 deadline,Witness witness)TokenPermissions(address token,uint256 amount)\
                     Witness(address to,uint256 validAfter)";
        let upto = "PermitWitnessTransferFrom(TokenPermissions permitted,address spender,uint256 nonce,\
                    uint256 deadline,Witness witness)TokenPermissions(address token,uint256 amount)\
                    Witness(address to,address facilitator,uint256 validAfter)";
        let e = exact_types::PermitWitnessTransferFrom {
            permitted: exact_types::TokenPermissions { token: Address::ZERO, amount: U256::ZERO },
            spender: Address::ZERO,
            nonce: U256::ZERO,
            deadline: U256::ZERO,
            witness: exact_types::Witness { to: Address::ZERO, validAfter: U256::ZERO },
        };
        assert_eq!(e.eip712_type_hash(), keccak256(exact));
        let u = upto_types::PermitWitnessTransferFrom {
            permitted: upto_types::TokenPermissions { token: Address::ZERO, amount: U256::ZERO },
            spender: Address::ZERO,
            nonce: U256::ZERO,
            deadline: U256::ZERO,
            witness: upto_types::Witness { to: Address::ZERO, facilitator: Address::ZERO, validAfter: U256::ZERO },
        };
        assert_eq!(u.eip712_type_hash(), keccak256(upto));
    }

    #[test]
    fn signs_exact_via_permit2_for_the_exact_proxy() {
        let req = requirement("exact", json!({"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2"}));
        let nonce = U256::from(12_345u64);
        let signed = sign_permit2(&signer(), &req, nonce, 1_800_000_000, MAX_AUTH).unwrap();
        let a = signed.authorization();
        assert_eq!(signed.scheme(), Permit2Scheme::Exact);
        assert_eq!(a.spender, EXACT_PROXY);
        assert_eq!(a.from, signer().address());
        assert_eq!(a.permitted.token, req.asset());
        assert_eq!(a.permitted.amount, U256::from(50_000u64));
        assert_eq!(a.nonce, nonce);
        assert_eq!(a.deadline, 1_800_000_000 + MAX_AUTH, "the upstream's 600 s are cut to the router's limit");
        assert_eq!(a.witness.valid_after, 1_800_000_000 - VALID_AFTER_SKEW_SECS);
        assert_eq!(a.witness.facilitator, None);
        assert_eq!(signed.recover_signer().unwrap(), signer().address());
        let payload = signed.payload_json();
        assert_eq!(payload["permit2Authorization"]["nonce"], "12345");
        assert_eq!(payload["permit2Authorization"]["permitted"]["amount"], "50000");
        assert_eq!(payload["permit2Authorization"]["spender"], "0x402085c248EeA27D92E8b30b2C58ed07f9E20001");
        let witness = serde_json::to_string(&signed.authorization().witness).unwrap();
        assert_eq!(witness, r#"{"to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","validAfter":"1799999400"}"#);
    }

    #[test]
    fn signs_upto_with_the_facilitator_and_refuses_without_it() {
        let facilitator = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266";
        let req = requirement(
            "upto",
            json!({"name": "USD Coin", "version": "2", "assetTransferMethod": "permit2", "facilitatorAddress": facilitator}),
        );
        let signed = sign_permit2(&signer(), &req, U256::MAX, 1_800_000_000, MAX_AUTH).unwrap();
        assert_eq!(signed.scheme(), Permit2Scheme::Upto);
        assert_eq!(signed.authorization().spender, UPTO_PROXY);
        assert_eq!(signed.authorization().witness.facilitator, Some(facilitator.parse().unwrap()));
        assert_eq!(signed.recover_signer().unwrap(), signer().address());
        let payload = signed.payload_json();
        let witness = serde_json::to_string(&signed.authorization().witness).unwrap();
        assert!(
            witness.starts_with(r#"{"to":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","facilitator":"#),
            "{witness}"
        );
        assert_eq!(payload["permit2Authorization"]["nonce"], U256::MAX.to_string());

        let none = requirement("upto", json!({"assetTransferMethod": "permit2"}));
        assert!(matches!(sign_permit2(&signer(), &none, U256::ZERO, 1, MAX_AUTH), Err(SignError::MissingFacilitator)));
        let zero = requirement("upto", json!({"facilitatorAddress": Address::ZERO.to_string()}));
        assert!(matches!(sign_permit2(&signer(), &zero, U256::ZERO, 1, MAX_AUTH), Err(SignError::MissingFacilitator)));
        let eip3009 = requirement("exact", json!({"name": "USD Coin", "version": "2"}));
        assert!(matches!(sign_permit2(&signer(), &eip3009, U256::ZERO, 1, MAX_AUTH), Err(SignError::NotPermit2)));
    }

    /// Known vectors: the same messages signed with viem (`signTypedData`) using the types,
    /// the Permit2 address and the proxy addresses exported by @x402/evm 2.27.0 (a one-off
    /// script, not kept). RFC 6979 signatures are deterministic: same key and hash, same bytes.
    #[test]
    fn reproduces_signatures_made_with_the_official_types() {
        let exact = requirement("exact", json!({"assetTransferMethod": "permit2"}));
        let signed = sign_permit2(&signer(), &exact, U256::from(12_345u64), 1_800_000_000, MAX_AUTH).unwrap();
        assert_eq!(
            signed.signature_hex(),
            "0xd60bc38b8c2f3917f0657b833ef16160414ec8b5f843fb7b30255f8ded31eb85\
             53de800c6f18e2113f00ccbca1f8173d3faabb3fdf6090abeb515324a4bb7d7e1c"
        );
        let upto = requirement("upto", json!({"facilitatorAddress": "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"}));
        let signed = sign_permit2(&signer(), &upto, U256::from(99u8), 1_800_000_000, MAX_AUTH).unwrap();
        assert_eq!(
            signed.signature_hex(),
            "0xf0f3ac5dee27d10b4b44a466cdfb5c62ed4dba8376865224f81bb17ed3aee79e\
             6b998c3ce712c22d9a2b030694fdf1c23370e459bc4aae5dcd1222b696383dc41b"
        );
    }

    #[test]
    fn a_changed_field_no_longer_recovers_to_the_payer() {
        let req = requirement("exact", json!({"assetTransferMethod": "permit2"}));
        let signed = sign_permit2(&signer(), &req, U256::from(7u8), 1_800_000_000, MAX_AUTH).unwrap();
        let mut stored = serde_json::to_value(&signed).unwrap();
        stored["permit2Authorization"]["witness"]["to"] = json!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        let tampered: SignedPermit2 = serde_json::from_value(stored).unwrap();
        assert_ne!(tampered.recover_signer().unwrap(), signer().address());
        // Another chain is another domain.
        let mut stored = serde_json::to_value(&signed).unwrap();
        stored["network"] = json!("eip155:8453");
        let other_chain: SignedPermit2 = serde_json::from_value(stored).unwrap();
        assert_ne!(other_chain.recover_signer().unwrap(), signer().address());
    }

    #[test]
    fn record_round_trips_byte_identically() {
        let req = requirement("upto", json!({"facilitatorAddress": "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"}));
        let signed = sign_permit2(&signer(), &req, U256::from(99u8), 1_800_000_000, MAX_AUTH).unwrap();
        let bytes = serde_json::to_vec(&signed).unwrap();
        let back: SignedPermit2 = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, signed);
        assert_eq!(serde_json::to_vec(&back).unwrap(), bytes);
        assert!(back.is_valid_at(1_800_000_000, 6));
        assert!(!back.is_valid_at(1_800_000_000 + MAX_AUTH - 5, 6));
        let debug = format!("{back:?}");
        assert!(!debug.contains(&back.signature_hex()[10..]));
    }
}
