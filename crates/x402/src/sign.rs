//! EIP-3009 `TransferWithAuthorization` signing (EIP-712, with alloy) for the `exact` EVM scheme,
//! and the [`SignedAuthorization`] record that is stored in the payments ledger and sent.
//!
//! Invariants:
//! - The EIP-712 domain is `{name: extra.name, version: extra.version, chainId: <network>,
//!   verifyingContract: asset}`; the message is `{from: signer, to: payTo, value: amount,
//!   validAfter: now − 600, validBefore: now + maxTimeoutSeconds, nonce}` — `value` is exactly
//!   the required amount, never more.
//! - The signature is 65 bytes `r ‖ s ‖ v` with `v` = 27/28, as 0x-hex on the wire.
//! - A [`SignedAuthorization`] serializes to JSON with decimal strings for amounts and times,
//!   so it can be stored and re-sent verbatim; it carries its EIP-712 domain so it can be
//!   re-verified ([`SignedAuthorization::recover_signer`]) and checked on-chain
//!   (`authorizationState(from, nonce)` on `asset`).
//! - Its `Debug` output shortens the signature; nothing here logs keys or signatures.

use std::fmt;

use alloy::primitives::{Address, B256, Signature, U256, hex};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol;
use alloy::sol_types::{Eip712Domain, SolStruct};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

use super::network::Network;
use super::wire::Requirement;
use crate::money::Amount;

/// Seconds subtracted from "now" for `validAfter`, to tolerate clock skew between the router,
/// the facilitator and the chain (DESIGN §6).
pub const VALID_AFTER_SKEW_SECS: u64 = 600;

sol! {
    /// EIP-3009 `TransferWithAuthorization`; the field order is part of its EIP-712 type hash.
    #[derive(Debug, PartialEq, Eq)]
    struct TransferWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }
}

/// Why a payment could not be signed or a stored one not verified.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The requirement lacks `extra.name` / `extra.version` (the token's EIP-712 domain).
    #[error("requirement has no EIP-712 domain (extra.name and extra.version are required)")]
    MissingDomain,
    /// `now + maxTimeoutSeconds` does not fit in 64 bits.
    #[error("validity window overflows (maxTimeoutSeconds {0})")]
    ValidityOverflow(u64),
    /// The signer failed.
    #[error("signing failed: {0}")]
    Signer(#[from] alloy::signers::Error),
    /// The stored signature does not recover to an address.
    #[error("signature does not recover: {0}")]
    Recover(#[from] alloy::primitives::SignatureError),
    /// Asked to sign a Permit2 authorization for a requirement that is not a Permit2 one.
    #[error("requirement is not a Permit2 requirement")]
    NotPermit2,
    /// An `upto` requirement without a valid `extra.facilitatorAddress`.
    #[error("upto requirement has no extra.facilitatorAddress")]
    MissingFacilitator,
}

/// The EIP-3009 authorization fields, with their wire names and wire encodings
/// (addresses checksummed, `value`/`validAfter`/`validBefore` decimal strings, `nonce` 0x-hex).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authorization {
    /// Payer (the router's wallet).
    #[serde(with = "checksummed")]
    pub from: Address,
    /// Recipient (`payTo`).
    #[serde(with = "checksummed")]
    pub to: Address,
    /// Amount in atomic units.
    #[serde(with = "decimal_u256")]
    pub value: U256,
    /// Unix time from which the authorization is valid.
    #[serde(with = "decimal_u64")]
    pub valid_after: u64,
    /// Unix time before which the authorization must be used.
    #[serde(with = "decimal_u64")]
    pub valid_before: u64,
    /// EIP-3009 nonce (here: the deterministic nonce of the idempotency key).
    pub nonce: B256,
}

impl Authorization {
    fn to_message(&self) -> TransferWithAuthorization {
        TransferWithAuthorization {
            from: self.from,
            to: self.to,
            value: self.value,
            validAfter: U256::from(self.valid_after),
            validBefore: U256::from(self.valid_before),
            nonce: self.nonce,
        }
    }
}

/// A signed EIP-3009 authorization plus the EIP-712 domain it was signed for.
///
/// Built by [`sign_authorization`] or deserialized from the ledger; fields are read-only.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignedAuthorization {
    network: Network,
    #[serde(with = "checksummed")]
    asset: Address,
    domain_name: String,
    domain_version: String,
    authorization: Authorization,
    #[serde(with = "signature_hex")]
    signature: Signature,
}

impl SignedAuthorization {
    /// Network (its chain id is the domain's `chainId`).
    pub fn network(&self) -> Network {
        self.network
    }
    /// Token contract (the domain's `verifyingContract`).
    pub fn asset(&self) -> Address {
        self.asset
    }
    /// Domain name (`extra.name`).
    pub fn domain_name(&self) -> &str {
        &self.domain_name
    }
    /// Domain version (`extra.version`).
    pub fn domain_version(&self) -> &str {
        &self.domain_version
    }
    /// The signed fields.
    pub fn authorization(&self) -> &Authorization {
        &self.authorization
    }
    /// Payer address (`authorization.from`).
    pub fn payer(&self) -> Address {
        self.authorization.from
    }
    /// The nonce (`authorization.nonce`).
    pub fn nonce(&self) -> B256 {
        self.authorization.nonce
    }
    /// The 65-byte signature `r ‖ s ‖ v` (v = 27/28) as 0x-hex. Do not log it.
    pub fn signature_hex(&self) -> String {
        hex::encode_prefixed(self.signature.as_bytes())
    }

    /// The scheme payload of the wire message: `{"authorization": {…}, "signature": "0x…"}`.
    pub fn payload_json(&self) -> Value {
        json!({
            "authorization": &self.authorization,
            "signature": self.signature_hex(),
        })
    }

    /// The EIP-712 hash that was signed.
    pub fn signing_hash(&self) -> B256 {
        let domain = eip712_domain(&self.domain_name, &self.domain_version, self.network, self.asset);
        self.authorization.to_message().eip712_signing_hash(&domain)
    }

    /// The address the signature recovers to; equals [`Self::payer`] for an intact record.
    ///
    /// # Errors
    /// [`SignError::Recover`] for a signature that recovers to no key.
    pub fn recover_signer(&self) -> Result<Address, SignError> {
        Ok(self.signature.recover_address_from_prehash(&self.signing_hash())?)
    }

    /// True when the authorization can still be submitted at `now_unix` with at least
    /// `min_remaining_secs` left before `validBefore` (the reference facilitator wants ≥ 6 s).
    pub fn is_valid_at(&self, now_unix: u64, min_remaining_secs: u64) -> bool {
        self.authorization.valid_after <= now_unix
            && now_unix.saturating_add(min_remaining_secs) < self.authorization.valid_before
    }
}

impl fmt::Debug for SignedAuthorization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sig = self.signature_hex();
        f.debug_struct("SignedAuthorization")
            .field("network", &self.network)
            .field("asset", &self.asset)
            .field("domain_name", &self.domain_name)
            .field("domain_version", &self.domain_version)
            .field("authorization", &self.authorization)
            .field("signature", &format_args!("{}…", sig.get(..10).unwrap_or("")))
            .finish()
    }
}

/// Signs the EIP-3009 authorization that pays `requirement` exactly, from `signer`'s address.
///
/// `validAfter = now − 600`, `validBefore = now + min(maxTimeoutSeconds, max_auth_secs)`: the
/// upstream never decides how long a bearer authorization lives. The caller has already
/// selected the requirement ([`crate::select()`]) and derived the nonce
/// ([`crate::nonce::deterministic_nonce`]). Re-signing with the same nonce after expiry
/// is safe: the token contract accepts only one authorization per `(from, nonce)`.
///
/// # Errors
/// [`SignError::MissingDomain`] without `extra.name`/`extra.version`,
/// [`SignError::ValidityOverflow`] for an absurd timeout, [`SignError::Signer`].
pub fn sign_authorization(
    signer: &PrivateKeySigner,
    requirement: &Requirement,
    nonce: B256,
    now_unix: u64,
    max_auth_secs: u64,
) -> Result<SignedAuthorization, SignError> {
    let (Some(name), Some(version)) = (requirement.extra_name(), requirement.extra_version()) else {
        return Err(SignError::MissingDomain);
    };
    let timeout = requirement.max_timeout_seconds().min(max_auth_secs);
    let valid_before = now_unix.checked_add(timeout).ok_or(SignError::ValidityOverflow(timeout))?;
    let authorization = Authorization {
        from: signer.address(),
        to: requirement.pay_to(),
        value: requirement.amount().as_u256(),
        valid_after: now_unix.saturating_sub(VALID_AFTER_SKEW_SECS),
        valid_before,
        nonce,
    };
    sign_with(signer, requirement.network(), requirement.asset(), name, version, authorization)
}

fn sign_with(
    signer: &PrivateKeySigner,
    network: Network,
    asset: Address,
    domain_name: &str,
    domain_version: &str,
    authorization: Authorization,
) -> Result<SignedAuthorization, SignError> {
    let domain = eip712_domain(domain_name, domain_version, network, asset);
    let hash = authorization.to_message().eip712_signing_hash(&domain);
    let signature = signer.sign_hash_sync(&hash)?;
    Ok(SignedAuthorization {
        network,
        asset,
        domain_name: domain_name.to_owned(),
        domain_version: domain_version.to_owned(),
        authorization,
        signature,
    })
}

fn eip712_domain(name: &str, version: &str, network: Network, asset: Address) -> Eip712Domain {
    Eip712Domain::new(
        Some(name.to_owned().into()),
        Some(version.to_owned().into()),
        Some(U256::from(network.chain_id())),
        Some(asset),
        None,
    )
}

/// Address as EIP-55 checksummed hex, as the official clients send it (alloy's own serde
/// writes lowercase). Reading requires `0x` + 40 hex digits, checksum-valid when mixed-case.
pub(crate) mod checksummed {
    use super::*;
    use crate::wire::primitives::parse_address;

    pub(crate) fn serialize<S: Serializer>(a: &Address, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&a.to_checksum(None))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Address, D::Error> {
        let s = String::deserialize(d)?;
        parse_address(&s).ok_or_else(|| serde::de::Error::custom("expected a 0x-hex EVM address"))
    }
}

/// `U256` as a canonical decimal string.
pub(crate) mod decimal_u256 {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &U256, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<U256, D::Error> {
        let s = String::deserialize(d)?;
        Amount::parse(&s)
            .map(Amount::as_u256)
            .map_err(|_| serde::de::Error::custom("expected a decimal integer string"))
    }
}

/// `u64` as a canonical decimal string.
pub(crate) mod decimal_u64 {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let s = String::deserialize(d)?;
        Amount::parse(&s)
            .ok()
            .and_then(|v| u64::try_from(v.as_u256()).ok())
            .ok_or_else(|| serde::de::Error::custom("expected a decimal integer string below 2^64"))
    }
}

/// The serde helpers, shared with [`super::permit2`].
pub(crate) mod serde_helpers {
    pub(crate) use super::{checksummed, decimal_u64, decimal_u256, signature_hex};

    /// An optional address, checksummed; absent when `None`.
    pub(crate) mod checksummed_opt {
        use alloy::primitives::Address;
        use serde::{Deserialize, Deserializer, Serializer};

        pub(crate) fn serialize<S: Serializer>(a: &Option<Address>, s: S) -> Result<S::Ok, S::Error> {
            match a {
                Some(a) => super::checksummed::serialize(a, s),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Address>, D::Error> {
            let s = Option::<String>::deserialize(d)?;
            s.map(|s| {
                crate::wire::primitives::parse_address(&s)
                    .ok_or_else(|| serde::de::Error::custom("expected a 0x-hex EVM address"))
            })
            .transpose()
        }
    }
}

/// 65-byte signature as 0x-hex, `v` = 27/28.
pub(crate) mod signature_hex {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(sig: &Signature, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode_prefixed(sig.as_bytes()))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Signature, D::Error> {
        let s = String::deserialize(d)?;
        let bytes = s
            .strip_prefix("0x")
            .and_then(|h| hex::decode(h).ok())
            .filter(|b| b.len() == 65)
            .ok_or_else(|| serde::de::Error::custom("expected a 65-byte 0x-hex signature"))?;
        Signature::from_raw(&bytes).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    const MAX_AUTH: u64 = 300;

    use alloy::primitives::{address, b256};

    use super::*;
    use crate::wire::{Requirement, X402Version};

    /// anvil #0 — a public test key.
    const ANVIL0: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
    /// anvil #1 — a public test key; the payer of the captured PROTOCOL.md exchanges.
    const ANVIL1: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

    fn signer(key: &str) -> PrivateKeySigner {
        key.parse().unwrap()
    }

    #[test]
    fn type_hash_is_the_fiat_token_constant() {
        assert_eq!(
            TransferWithAuthorization::eip712_type_hash(&TransferWithAuthorization {
                from: Address::ZERO,
                to: Address::ZERO,
                value: U256::ZERO,
                validAfter: U256::ZERO,
                validBefore: U256::ZERO,
                nonce: B256::ZERO,
            }),
            b256!("7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267")
        );
    }

    #[test]
    fn signs_the_known_vector_of_stack_md() {
        let signer = signer(ANVIL0);
        let authorization = Authorization {
            from: signer.address(),
            to: address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8"),
            value: U256::from(1_000_000u64),
            valid_after: 0,
            valid_before: 1_893_456_000,
            nonce: B256::repeat_byte(0x42),
        };
        let signed = sign_with(
            &signer,
            Network::BASE_SEPOLIA,
            address!("0x036CbD53842c5426634e7929541eC2318f3dCF7e"),
            "USD Coin",
            "2",
            authorization,
        )
        .unwrap();
        assert_eq!(signed.signing_hash(), b256!("224f428a0d381393f04ca412e738a9a224e57b98ed5b2d8887c6cddd72bd9d48"));
        assert_eq!(
            signed.signature_hex(),
            "0x752634d618f93d012d494600b28f84ee21f617f446c96bc37dcda6e38722adac\
             6c4b1c453781b7a3636ddbfc83d9db53a04ec3b40d783c9f732c6cdeff0e14a21b"
        );
        assert_eq!(signed.recover_signer().unwrap(), signer.address());
    }

    /// The v2 `PAYMENT-SIGNATURE` captured from @x402/fetch (viem) in PROTOCOL.md §3:
    /// same key, same fields → byte-identical signature (RFC 6979 is deterministic).
    #[test]
    fn reproduces_the_captured_viem_signature() {
        let signer = signer(ANVIL1);
        let authorization: Authorization = serde_json::from_value(json!({
            "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
            "to": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
            "value": "10000", "validAfter": "0", "validBefore": "1796203647",
            "nonce": "0xce23c57470764d0741917717ef6db4ab6f6dd96d242891b5faaaf2992f4d78ba"
        }))
        .unwrap();
        let signed = sign_with(
            &signer,
            Network::BASE_SEPOLIA,
            address!("0x5FbDB2315678afecb367f032d93F642f64180aa3"),
            "USD Coin",
            "2",
            authorization,
        )
        .unwrap();
        assert_eq!(
            signed.signature_hex(),
            "0xead22206f2b97a3003b12784f6c3f31c8f90798d185bc18cde97b3e5ef1383bf\
             605dd90e85ddcf4893a50dba12147832586661a4e7673f4ff0e3f25ecd64d9bd1c"
        );
    }

    /// The v1 `X-PAYMENT` captured from x402-fetch 1.2.0 recovers to the captured payer.
    #[test]
    fn captured_v1_signature_recovers_to_the_payer() {
        let record: SignedAuthorization = serde_json::from_value(json!({
            "network": "eip155:84532",
            "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
            "domainName": "USD Coin", "domainVersion": "2",
            "authorization": {
                "from": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
                "to": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
                "value": "10000", "validAfter": "1796202752", "validBefore": "1796203412",
                "nonce": "0xddd91036a0a4b67eb9982925de5218b40432f1c16ec1ca705f9dfd27cb1b0f6d"
            },
            "signature": "0x80a92f40ba2f5947809f0089442cbf019a8de4443b19d781768796dec961af1d368224993a06c1cae48a831aa1cb16fff11cb4556723c088ae765f80f1f379c11c"
        }))
        .unwrap();
        assert_eq!(record.recover_signer().unwrap(), address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8"));
    }

    fn requirement(extra: Value, timeout: u64) -> Requirement {
        Requirement::from_json(
            X402Version::V2,
            0,
            &json!({"scheme": "exact", "network": "eip155:84532", "amount": "10000",
                    "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
                    "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
                    "maxTimeoutSeconds": timeout, "extra": extra}),
        )
        .unwrap()
    }

    #[test]
    fn sign_authorization_fills_the_window_and_pays_exactly_the_amount() {
        let signer = signer(ANVIL1);
        let req = requirement(json!({"name": "USD Coin", "version": "2"}), 300);
        let nonce = B256::repeat_byte(7);
        let signed = sign_authorization(&signer, &req, nonce, 1_800_000_000, MAX_AUTH).unwrap();
        let auth = signed.authorization();
        assert_eq!(auth.from, signer.address());
        assert_eq!(auth.to, req.pay_to());
        assert_eq!(auth.value, U256::from(10_000u64));
        assert_eq!(auth.valid_after, 1_800_000_000 - 600);
        assert_eq!(auth.valid_before, 1_800_000_300);
        assert_eq!(auth.nonce, nonce);
        assert_eq!(signed.asset(), req.asset());
        assert_eq!(signed.recover_signer().unwrap(), signer.address());
        assert!(signed.is_valid_at(1_800_000_000, 6));
        assert!(!signed.is_valid_at(1_800_000_295, 6));
        assert!(!signed.is_valid_at(1_799_000_000, 6));
        // Early clock: validAfter saturates at 0 instead of underflowing.
        let early = sign_authorization(&signer, &req, nonce, 100, MAX_AUTH).unwrap();
        assert_eq!(early.authorization().valid_after, 0);
    }

    #[test]
    fn refuses_without_domain_or_with_overflowing_window() {
        let signer = signer(ANVIL1);
        let no_version = requirement(json!({"name": "USD Coin"}), 300);
        assert!(matches!(
            sign_authorization(&signer, &no_version, B256::ZERO, 1, MAX_AUTH),
            Err(SignError::MissingDomain)
        ));
        let huge = requirement(json!({"name": "USD Coin", "version": "2"}), u64::MAX);
        let overflow = sign_authorization(&signer, &huge, B256::ZERO, u64::MAX - 5, u64::MAX);
        assert!(matches!(overflow, Err(SignError::ValidityOverflow(_))));
    }

    #[test]
    fn the_upstream_never_sets_the_lifetime_of_an_authorization() {
        let signer = signer(ANVIL1);
        // An upstream asking for an authorization valid for centuries gets MAX_AUTH seconds.
        let greedy = requirement(json!({"name": "USD Coin", "version": "2"}), 10_000_000_000);
        let signed = sign_authorization(&signer, &greedy, B256::ZERO, 1_800_000_000, MAX_AUTH).unwrap();
        assert_eq!(signed.authorization().valid_before, 1_800_000_000 + MAX_AUTH);
        // A shorter wish is honoured.
        let modest = requirement(json!({"name": "USD Coin", "version": "2"}), 60);
        let signed = sign_authorization(&signer, &modest, B256::ZERO, 1_800_000_000, MAX_AUTH).unwrap();
        assert_eq!(signed.authorization().valid_before, 1_800_000_060);
    }

    #[test]
    fn record_round_trips_through_json_with_decimal_strings() {
        let signer = signer(ANVIL1);
        let req = requirement(json!({"name": "USD Coin", "version": "2"}), 300);
        let signed = sign_authorization(&signer, &req, B256::repeat_byte(9), 1_800_000_000, MAX_AUTH).unwrap();
        let stored = serde_json::to_value(&signed).unwrap();
        assert_eq!(stored["authorization"]["value"], "10000");
        assert_eq!(stored["authorization"]["validAfter"], "1799999400");
        assert_eq!(stored["authorization"]["validBefore"], "1800000300");
        assert_eq!(stored["network"], "eip155:84532");
        assert_eq!(stored["signature"].as_str().unwrap().len(), 132);
        let back: SignedAuthorization = serde_json::from_value(stored).unwrap();
        assert_eq!(back, signed);
        assert_eq!(back.recover_signer().unwrap(), signer.address());
    }

    #[test]
    fn stored_records_with_bad_fields_are_rejected() {
        let signer = signer(ANVIL1);
        let req = requirement(json!({"name": "USD Coin", "version": "2"}), 300);
        let signed = sign_authorization(&signer, &req, B256::ZERO, 1_800_000_000, MAX_AUTH).unwrap();
        let good = serde_json::to_value(&signed).unwrap();
        for (path, bad) in [
            ("value", json!(10000)),
            ("value", json!("-1")),
            ("value", json!("1e4")),
            ("validBefore", json!("18446744073709551616")),
        ] {
            let mut v = good.clone();
            v["authorization"][path] = bad;
            assert!(serde_json::from_value::<SignedAuthorization>(v).is_err(), "{path}");
        }
        let mut v = good.clone();
        v["signature"] = json!("0x1234");
        assert!(serde_json::from_value::<SignedAuthorization>(v).is_err());
    }

    #[test]
    fn debug_output_does_not_contain_the_signature() {
        let signer = signer(ANVIL1);
        let req = requirement(json!({"name": "USD Coin", "version": "2"}), 300);
        let signed = sign_authorization(&signer, &req, B256::ZERO, 1_800_000_000, MAX_AUTH).unwrap();
        let debug = format!("{signed:?}");
        assert!(!debug.contains(&signed.signature_hex()[10..]));
        assert!(!debug.contains(&ANVIL1[2..]));
    }
}
