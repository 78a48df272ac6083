//! Gas sponsoring for Permit2 (`eip2612GasSponsoring`, x402 `specs/extensions/`): a payer
//! whose wallet has not approved Uniswap Permit2 for a token signs an EIP-2612 `permit` of the
//! token for Permit2, and the facilitator submits it (paying the gas) together with the
//! Permit2 transfer through the x402 proxy's `settleWithPermit`.
//!
//! Invariants:
//! - The permit's fields are the payer's own, never the upstream's: `owner` = the wallet,
//!   `spender` = canonical [`PERMIT2`], `value` = the price of the payment it enables (never
//!   an unlimited approval), `nonce` = the token's `nonces(owner)` read from the chain,
//!   `deadline` = the Permit2 authorization's deadline (so both die together).
//! - The EIP-712 domain is the token's: `{name: extra.name, version: extra.version, chainId:
//!   <network>, verifyingContract: asset}`; [`domain_separator`] is compared with the token's
//!   own `DOMAIN_SEPARATOR()` before anything is signed.
//! - An offer that names a value the payer would not sign (another spender, chain, token, owner
//!   or amount, or a deadline past the payer's) is refused by [`check_offer`]: nothing is
//!   signed for it.
//! - A [`SignedEip2612Permit`] serializes to the extension's `info` (decimal strings, 0x-hex
//!   signature, `version: "1"`) as @x402/evm 2.27 sends it; its `Debug` output shortens the
//!   signature.

use std::fmt;
use std::str::FromStr;

use alloy::primitives::{Address, B256, Signature, U256, hex};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::{Eip712Domain, SolStruct};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::chain::PERMIT2;
use super::network::Network;
use super::sign::{SignError, serde_helpers};

/// The extension's key in `extensions`.
pub const EIP2612_GAS_SPONSORING: &str = "eip2612GasSponsoring";
/// The `erc20ApprovalGasSponsoring` extension (a signed `approve` transaction; not signed by
/// this router: its wallet sends no transactions but `wallet approve-permit2`).
pub const ERC20_APPROVAL_GAS_SPONSORING: &str = "erc20ApprovalGasSponsoring";
/// `info.version` of the extension's payload.
pub const INFO_VERSION: &str = "1";

/// The EIP-2612 type.
pub mod types {
    alloy::sol! {
        /// EIP-2612 `Permit`.
        #[derive(Debug, PartialEq, Eq)]
        struct Permit {
            address owner;
            address spender;
            uint256 value;
            uint256 nonce;
            uint256 deadline;
        }
    }
}

/// The token's EIP-712 domain, as the requirement names it (`extra.name`, `extra.version`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenDomain {
    /// `extra.name`.
    pub name: String,
    /// `extra.version`.
    pub version: String,
    /// Network (its chain id is the domain's `chainId`).
    pub network: Network,
    /// Token contract (the domain's `verifyingContract`).
    pub asset: Address,
}

impl TokenDomain {
    fn eip712(&self) -> Eip712Domain {
        Eip712Domain::new(
            Some(self.name.clone().into()),
            Some(self.version.clone().into()),
            Some(U256::from(self.network.chain_id())),
            Some(self.asset),
            None,
        )
    }
}

/// The EIP-712 domain separator of `domain`: what the token's `DOMAIN_SEPARATOR()` must
/// answer before a permit for it is signed.
pub fn domain_separator(domain: &TokenDomain) -> B256 {
    domain.eip712().separator()
}

/// The extension's `info`: a signed EIP-2612 permit for Permit2, in its wire form.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedEip2612Permit {
    /// Owner (the router's wallet).
    #[serde(with = "serde_helpers::checksummed")]
    pub from: Address,
    /// Token contract.
    #[serde(with = "serde_helpers::checksummed")]
    pub asset: Address,
    /// Always [`PERMIT2`].
    #[serde(with = "serde_helpers::checksummed")]
    pub spender: Address,
    /// The approved value (the payment's price).
    #[serde(with = "serde_helpers::decimal_u256")]
    pub amount: U256,
    /// The token's `nonces(owner)` when signed.
    #[serde(with = "serde_helpers::decimal_u256")]
    pub nonce: U256,
    /// Unix time after which the token refuses the permit.
    #[serde(with = "serde_helpers::decimal_u64")]
    pub deadline: u64,
    /// 65 bytes, 0x-hex. Do not log it.
    #[serde(with = "serde_helpers::signature_hex")]
    pub signature: Signature,
    /// [`INFO_VERSION`].
    pub version: String,
}

impl SignedEip2612Permit {
    /// `{"eip2612GasSponsoring": {"info": …}}`, to merge into the payment's extensions.
    pub fn extension(&self) -> Value {
        json!({ EIP2612_GAS_SPONSORING: { "info": self } })
    }

    /// The EIP-712 hash signed under `domain`.
    pub fn signing_hash(&self, domain: &TokenDomain) -> B256 {
        types::Permit {
            owner: self.from,
            spender: self.spender,
            value: self.amount,
            nonce: self.nonce,
            deadline: U256::from(self.deadline),
        }
        .eip712_signing_hash(&domain.eip712())
    }

    /// The address the signature recovers to under `domain`.
    ///
    /// # Errors
    /// [`SignError::Recover`].
    pub fn recover_signer(&self, domain: &TokenDomain) -> Result<Address, SignError> {
        Ok(self.signature.recover_address_from_prehash(&self.signing_hash(domain))?)
    }
}

impl fmt::Debug for SignedEip2612Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sig = hex::encode_prefixed(self.signature.as_bytes());
        f.debug_struct("SignedEip2612Permit")
            .field("from", &self.from)
            .field("asset", &self.asset)
            .field("spender", &self.spender)
            .field("amount", &self.amount)
            .field("nonce", &self.nonce)
            .field("deadline", &self.deadline)
            .field("signature", &format_args!("{}…", sig.get(..10).unwrap_or("")))
            .finish()
    }
}

/// Signs the EIP-2612 permit that lets [`PERMIT2`] take `amount` of `domain.asset` from
/// `signer`, with the token's `nonce`, valid until `deadline`.
///
/// # Errors
/// [`SignError::Signer`].
pub fn sign_eip2612_permit(
    signer: &PrivateKeySigner,
    domain: &TokenDomain,
    amount: U256,
    nonce: U256,
    deadline: u64,
) -> Result<SignedEip2612Permit, SignError> {
    let mut permit = SignedEip2612Permit {
        from: signer.address(),
        asset: domain.asset,
        spender: PERMIT2,
        amount,
        nonce,
        deadline,
        signature: Signature::new(U256::ZERO, U256::ZERO, false),
        version: INFO_VERSION.to_owned(),
    };
    permit.signature = signer.sign_hash_sync(&permit.signing_hash(domain))?;
    Ok(permit)
}

/// Why an upstream's `eip2612GasSponsoring` offer is refused (nothing is signed for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The offer is not a JSON object (or its `info` is neither absent nor an object).
    #[error("the offer is not an object")]
    Malformed,
    /// The offer names a spender other than canonical Permit2.
    #[error("the offer names spender {0}, not the canonical Permit2")]
    Spender(String),
    /// The offer names a deadline past the router's bound (or not a number).
    #[error("the offer names deadline {0}, past the router's bound {1}")]
    Deadline(String, u64),
    /// The offer names another chain than the requirement's network.
    #[error("the offer names chain {0}, not the requirement's {1}")]
    Chain(String, Network),
    /// The offer names another token, owner or amount than the payment's.
    #[error("the offer names {0} {1}, not the payment's")]
    Field(&'static str, String),
}

/// What the payer will sign, against which an offer is checked.
#[derive(Debug, Clone, Copy)]
pub struct Terms {
    /// The payer.
    pub owner: Address,
    /// The token.
    pub asset: Address,
    /// The requirement's network.
    pub network: Network,
    /// The price (the permit's value).
    pub amount: U256,
    /// The latest deadline the payer would sign.
    pub deadline: u64,
}

/// Checks the upstream's `eip2612GasSponsoring` declaration: every value it names (the spec
/// names none: the client fills them all) must be the one the payer signs. Unknown members
/// (`description`, `version`, `schema`) are ignored.
///
/// # Errors
/// The first [`OfferError`].
pub fn check_offer(offer: &Value, terms: &Terms) -> Result<(), OfferError> {
    let offer = offer.as_object().ok_or(OfferError::Malformed)?;
    let info = match offer.get("info") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(info)) => info,
        Some(_) => return Err(OfferError::Malformed),
    };
    let shown = |v: &Value| {
        let s = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        s.chars().take(80).collect::<String>()
    };
    let address = |v: &Value| v.as_str().and_then(|s| Address::from_str(s).ok());
    let uint = |v: &Value| match v {
        Value::String(s) if !s.is_empty() && s.len() <= 78 && s.bytes().all(|b| b.is_ascii_digit()) => {
            U256::from_str_radix(s, 10).ok()
        }
        Value::Number(n) => n.as_u64().map(U256::from),
        _ => None,
    };
    if let Some(v) = info.get("spender")
        && address(v) != Some(PERMIT2)
    {
        return Err(OfferError::Spender(shown(v)));
    }
    if let Some(v) = info.get("deadline")
        && uint(v).is_none_or(|d| d > U256::from(terms.deadline))
    {
        return Err(OfferError::Deadline(shown(v), terms.deadline));
    }
    for key in ["chainId", "network"] {
        if let Some(v) = info.get(key) {
            let same = match v {
                Value::String(s) => {
                    Network::parse(s).ok() == Some(terms.network) || s == &terms.network.chain_id().to_string()
                }
                Value::Number(n) => n.as_u64() == Some(terms.network.chain_id()),
                _ => false,
            };
            if !same {
                return Err(OfferError::Chain(shown(v), terms.network));
            }
        }
    }
    for (key, expected) in [("asset", terms.asset), ("from", terms.owner)] {
        if let Some(v) = info.get(key)
            && address(v) != Some(expected)
        {
            return Err(OfferError::Field(if key == "asset" { "asset" } else { "from" }, shown(v)));
        }
    }
    if let Some(v) = info.get("amount")
        && uint(v) != Some(terms.amount)
    {
        return Err(OfferError::Field("amount", shown(v)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use alloy::primitives::{address, keccak256};

    use super::*;

    /// anvil #1 — a public test key.
    const ANVIL1: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
    const TOKEN: Address = address!("0x5FbDB2315678afecb367f032d93F642f64180aa3");

    fn domain() -> TokenDomain {
        TokenDomain {
            name: "Permit Dollar".into(),
            version: "1".into(),
            network: Network::from_chain_id(84532).unwrap(),
            asset: TOKEN,
        }
    }

    fn terms() -> Terms {
        let signer: PrivateKeySigner = ANVIL1.parse().unwrap();
        Terms {
            owner: signer.address(),
            asset: TOKEN,
            network: Network::from_chain_id(84532).unwrap(),
            amount: U256::from(10_000u64),
            deadline: 1_800_000_600,
        }
    }

    #[test]
    fn the_permit_type_is_eip2612s() {
        assert_eq!(
            types::Permit::eip712_type_hash(&types::Permit {
                owner: Address::ZERO,
                spender: Address::ZERO,
                value: U256::ZERO,
                nonce: U256::ZERO,
                deadline: U256::ZERO,
            }),
            keccak256("Permit(address owner,address spender,uint256 value,uint256 nonce,uint256 deadline)")
        );
    }

    #[test]
    fn a_signed_permit_is_the_wire_info_and_recovers_to_the_owner() {
        let signer: PrivateKeySigner = ANVIL1.parse().unwrap();
        let permit =
            sign_eip2612_permit(&signer, &domain(), U256::from(10_000u64), U256::from(3u8), 1_800_000_000).unwrap();
        assert_eq!(permit.recover_signer(&domain()).unwrap(), signer.address());
        let ext = permit.extension();
        let info = &ext[EIP2612_GAS_SPONSORING]["info"];
        assert_eq!(info["from"], "0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        assert_eq!(info["spender"], "0x000000000022D473030F116dDEE9F6B43aC78BA3");
        assert_eq!(info["amount"], "10000");
        assert_eq!(info["nonce"], "3");
        assert_eq!(info["deadline"], "1800000000");
        assert_eq!(info["version"], "1");
        assert_eq!(info["signature"].as_str().unwrap().len(), 132);
        let back: SignedEip2612Permit = serde_json::from_value(info.clone()).unwrap();
        assert_eq!(back, permit);
        assert!(!format!("{permit:?}").contains(&info["signature"].as_str().unwrap()[10..]));
        // Another domain (chain) recovers to someone else.
        let other = TokenDomain { network: Network::from_chain_id(8453).unwrap(), ..domain() };
        assert_ne!(permit.recover_signer(&other).unwrap(), signer.address());
    }

    #[test]
    fn offers_naming_only_what_the_payer_signs_pass() {
        let t = terms();
        assert_eq!(check_offer(&json!({}), &t), Ok(()));
        assert_eq!(check_offer(&json!({"info": {"description": "x", "version": "1"}, "schema": {}}), &t), Ok(()));
        let same = json!({"info": {"spender": PERMIT2.to_string(), "deadline": "1800000000", "chainId": 84532,
                                   "network": "eip155:84532", "asset": TOKEN.to_string(), "amount": "10000"}});
        assert_eq!(check_offer(&same, &t), Ok(()));
    }

    #[test]
    fn hostile_offers_are_refused() {
        let t = terms();
        let refused = |info: Value| check_offer(&json!({ "info": info }), &t).unwrap_err();
        assert!(matches!(refused(json!({"spender": TOKEN.to_string()})), OfferError::Spender(_)));
        assert!(matches!(refused(json!({"spender": 7})), OfferError::Spender(_)));
        assert!(matches!(refused(json!({"deadline": U256::MAX.to_string()})), OfferError::Deadline(..)));
        assert!(matches!(refused(json!({"deadline": "1800000601"})), OfferError::Deadline(..)));
        assert!(matches!(refused(json!({"deadline": "-1"})), OfferError::Deadline(..)));
        assert!(matches!(refused(json!({"chainId": 1})), OfferError::Chain(..)));
        assert!(matches!(refused(json!({"network": "eip155:1"})), OfferError::Chain(..)));
        assert!(matches!(refused(json!({"asset": PERMIT2.to_string()})), OfferError::Field("asset", _)));
        assert!(matches!(refused(json!({"amount": U256::MAX.to_string()})), OfferError::Field("amount", _)));
        assert!(matches!(refused(json!({"from": TOKEN.to_string()})), OfferError::Field("from", _)));
        assert_eq!(check_offer(&json!([]), &t), Err(OfferError::Malformed));
        assert_eq!(check_offer(&json!({"info": "x"}), &t), Err(OfferError::Malformed));
    }
}
