//! What a payment looks like to its readers: the `payment` object of the `/route` envelope,
//! of a receipt, of an answer `reconcile` recovered and of the MCP `fetch` result.
//!
//! [`PaymentView`] is built from a payment's scheme (`relay::pay::scheme::Scheme::view`) and
//! is the only place that decides its fields; nothing patches the JSON afterwards. A stored
//! record is decoded here, once, where a scheme reads it from the ledger
//! ([`decode_authorization`], [`decode_svm_transfer`], [`stored_version`]): nothing downstream
//! re-parses the authorization or re-derives the x402 version from its number.

use alloy::primitives::{Address, B256, U256};
use serde::Serialize;

use crate::payments::{PaymentStatus, RecoveryKind};
use crate::x402::{Network, SignedPayment, X402Version};

/// A stored intent that cannot be read back (a corrupted or foreign row).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("stored authorization unreadable: {0}")]
    Authorization(String),
    #[error("stored x402 version {0}")]
    Version(i16),
}

/// A stored `signed_authorization` (the ledger's JSONB), decoded: the one place it is parsed.
///
/// # Errors
/// [`DecodeError::Authorization`] when it is not a signed payment.
pub fn decode_authorization(stored: &serde_json::Value) -> Result<SignedPayment, DecodeError> {
    serde_json::from_value(stored.clone()).map_err(|e| DecodeError::Authorization(e.to_string()))
}

/// A stored Solana transfer (the `signed_authorization` of a `solana:` intent), decoded, and
/// checked against the row's `network`, `asset` (the mint) and `payer`: a record that disagrees
/// with the row it is stored in is not trusted.
///
/// # Errors
/// [`DecodeError::Authorization`] when it is not a Solana transfer or disagrees with the row.
pub fn decode_svm_transfer(
    stored: &serde_json::Value,
    (network, asset, payer): (&str, &str, &str),
) -> Result<crate::x402::svm::SignedSvmTransfer, DecodeError> {
    let signed: crate::x402::svm::SignedSvmTransfer =
        serde_json::from_value(stored.clone()).map_err(|e| DecodeError::Authorization(e.to_string()))?;
    if (signed.network.as_str(), signed.mint.as_str(), signed.payer.as_str()) != (network, asset, payer) {
        return Err(DecodeError::Authorization("the stored Solana transfer disagrees with its row".into()));
    }
    Ok(signed)
}

/// The x402 version a ledger row's payment was made for (its stored number).
///
/// # Errors
/// [`DecodeError::Version`] for a number no version has.
pub(crate) fn stored_version(number: i16) -> Result<X402Version, DecodeError> {
    u64::try_from(number).ok().and_then(X402Version::from_number).ok_or(DecodeError::Version(number))
}

/// The `payment` object shown for a call. Members are declared in name order: the
/// serialized object is the same, byte for byte, as the sorted JSON object it replaced
/// (stored envelopes are replayed as stored, and new ones must read the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = Payment, description = "The payment made for a call.")]
pub struct PaymentView {
    /// What was (or, until the chain shows it, may be) charged, in the asset's base units;
    /// for `upto`, the amount the chain shows moved once known. Absent when this attempt
    /// signed nothing (an earlier payment was found on-chain).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = doc::amount)]
    amount: Option<String>,
    /// The token contract (checksummed).
    #[schema(schema_with = doc::address)]
    asset: String,
    /// `permit2` for a Permit2 payment; absent for EIP-3009.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = doc::permit2)]
    asset_transfer_method: Option<&'static str>,
    /// `upto`: the amount the upstream said it charged, beside what the chain shows.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = doc::claimed_amount)]
    claimed_amount: Option<String>,
    /// Present only when the upstream answered with a settlement claim instead of its answer
    /// (`settlement_pending`): the transaction it named. A hint, never proof: `tx_hash` is set
    /// only from the chain.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    claimed_tx_hash: Option<String>,
    /// `upto`: the signed maximum.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = doc::max_amount)]
    max_amount: Option<String>,
    /// CAIP-2 network id.
    #[schema(example = "eip155:84532")]
    network: String,
    /// The authorization's nonce (EIP-3009 or Permit2), derived from (agent, key): the chain
    /// accepts it once.
    #[schema(pattern = "^0x[0-9a-f]{64}$")]
    nonce: String,
    /// The recipient (checksummed); absent when this attempt signed nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = doc::address)]
    pay_to: Option<String>,
    /// The router's wallet (checksummed).
    #[schema(schema_with = doc::address)]
    payer: String,
    /// How a lost answer was got back (`recovered`, `reaccessed`, `lost`), when recovery ran.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "kind_str")]
    #[schema(schema_with = doc::recovery)]
    recovery: Option<RecoveryKind>,
    /// `exact` or `upto`.
    #[schema(schema_with = doc::scheme)]
    scheme: String,
    /// The ledger state shown with the answer.
    #[serde(serialize_with = "status_str")]
    #[schema(schema_with = doc::status)]
    status: PaymentStatus,
    /// The settling transaction the chain proves (`null` until proven); absent when this
    /// attempt signed nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    tx_hash: Option<Option<String>>,
    /// The x402 protocol version of the payment.
    #[schema(schema_with = doc::version)]
    x402_version: u8,
}

/// The schemas of [`PaymentView`]'s members that are stricter than their Rust types or
/// refer to other schemas of the document (`Amount`, `Address`).
mod doc {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

    pub use crate::schema_doc::address;
    use crate::schema_doc::amount as amount_ref;

    fn strings(values: &[&str], description: &str) -> RefOr<Schema> {
        let described = (!description.is_empty()).then_some(description);
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(values.iter().copied()))
            .description(described)
            .into()
    }

    pub fn amount() -> RefOr<Schema> {
        amount_ref(
            "What was (or may be) charged; for `upto`, what the chain shows moved once settled (the signed maximum until then). Absent when this attempt signed nothing (an earlier payment was found on-chain).",
        )
    }

    pub fn max_amount() -> RefOr<Schema> {
        amount_ref("`upto` only: the signed maximum.")
    }

    pub fn claimed_amount() -> RefOr<Schema> {
        amount_ref("`upto` only: what the upstream said it charged (its word; `amount` is the chain's).")
    }

    pub fn permit2() -> RefOr<Schema> {
        strings(&["permit2"], "Present only when paid through Permit2 (absent for EIP-3009).")
    }

    pub fn recovery() -> RefOr<Schema> {
        strings(
            &["recovered", "reaccessed", "lost"],
            "Present only when a retry took over a key whose payment the chain showed used while its answer was lost: `recovered` (the upstream's original answer, got back with a byte-identical re-send of the request and payment; `status` is then `settled`), `reaccessed` (a GET/HEAD run again by signing in as the payer with Sign-In-With-X, no payment: a new execution, not the lost answer; `status` is then `settled`) or `lost` (`settled_response_lost`).",
        )
    }

    pub fn scheme() -> RefOr<Schema> {
        strings(
            &["exact", "upto", "batch-settlement"],
            "`exact` (EIP-3009 or Permit2), `upto` (Permit2: signs a maximum, charged what moved on-chain) or `batch-settlement` (a voucher on a deposited channel; `amount` is what it adds to the channel's cumulative ceiling).",
        )
    }

    pub fn status() -> RefOr<Schema> {
        strings(
            &["settled", "unconfirmed", "not_settled", "rejected", "settled_response_lost", "unknown"],
            "`settled`: seen consumed on-chain; `unconfirmed`: claimed by the upstream, not seen on-chain; `settled_response_lost`: paid, the answer never arrived; `unknown`: the chain could not be read.",
        )
    }

    pub fn version() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Integer).enum_values(Some([1, 2])).into()
    }
}

fn status_str<S: serde::Serializer>(s: &PaymentStatus, out: S) -> Result<S::Ok, S::Error> {
    out.serialize_str(s.as_str())
}

fn kind_str<S: serde::Serializer>(k: &Option<RecoveryKind>, out: S) -> Result<S::Ok, S::Error> {
    match k {
        Some(k) => out.serialize_str(k.as_str()),
        None => out.serialize_none(),
    }
}

impl PaymentView {
    /// A signed payment in `status` (upto: `amount` is the signed maximum until
    /// [`Self::charged`] says what moved).
    pub fn of(version: X402Version, signed: &SignedPayment, status: PaymentStatus, tx_hash: Option<&str>) -> Self {
        let amount = signed.amount().to_string();
        Self {
            max_amount: signed.is_upto().then(|| amount.clone()),
            amount: Some(amount),
            asset: signed.asset().to_checksum(None),
            asset_transfer_method: matches!(signed, SignedPayment::Permit2(_)).then(|| signed.transfer_method()),
            claimed_amount: None,
            claimed_tx_hash: None,
            network: signed.network().caip2(),
            nonce: signed.nonce().to_string(),
            pay_to: Some(signed.pay_to().to_checksum(None)),
            payer: signed.payer().to_checksum(None),
            recovery: None,
            scheme: signed.scheme().to_owned(),
            status,
            tx_hash: Some(tx_hash.map(str::to_owned)),
            x402_version: version.number(),
        }
    }

    /// A Solana payment in `status`: `nonce` is the request's deterministic nonce (the ledger's,
    /// stable across re-signings), `tx_hash` the id of the transaction the chain shows carrying
    /// the payer's signature.
    pub fn svm(
        version: X402Version,
        signed: &crate::x402::svm::SignedSvmTransfer,
        nonce: &str,
        status: PaymentStatus,
        tx_hash: Option<&str>,
    ) -> Self {
        Self {
            amount: Some(signed.amount.clone()),
            asset: signed.mint.clone(),
            asset_transfer_method: None,
            claimed_amount: None,
            claimed_tx_hash: None,
            max_amount: None,
            network: signed.network.clone(),
            nonce: nonce.to_owned(),
            pay_to: Some(signed.pay_to.clone()),
            payer: signed.payer.clone(),
            recovery: None,
            scheme: "exact".to_owned(),
            status,
            tx_hash: Some(tx_hash.map(str::to_owned)),
            x402_version: version.number(),
        }
    }

    /// A batch-settlement payment in `status`: `amount` is what the voucher adds to the
    /// channel's cumulative ceiling (the price), `nonce` the request's.
    pub fn batch(
        version: X402Version,
        (network, asset, pay_to, payer): (&str, &str, &str, &str),
        (amount, nonce): (&str, &str),
        status: PaymentStatus,
        tx_hash: Option<&str>,
    ) -> Self {
        Self {
            amount: Some(amount.to_owned()),
            asset: asset.to_owned(),
            asset_transfer_method: None,
            claimed_amount: None,
            claimed_tx_hash: None,
            max_amount: None,
            network: network.to_owned(),
            nonce: nonce.to_owned(),
            pay_to: Some(pay_to.to_owned()),
            payer: payer.to_owned(),
            recovery: None,
            scheme: crate::x402::batch::SCHEME.to_owned(),
            status,
            tx_hash: Some(tx_hash.map(str::to_owned)),
            x402_version: version.number(),
        }
    }

    /// A payment this attempt did not make: the request's nonce was found used on-chain
    /// before anything was signed (no amount, recipient or transaction is known).
    pub fn found_on_chain(
        version: X402Version,
        scheme: &str,
        (network, asset): (Network, Address),
        payer: Address,
        nonce: B256,
    ) -> Self {
        Self {
            amount: None,
            asset: asset.to_checksum(None),
            asset_transfer_method: None,
            claimed_amount: None,
            claimed_tx_hash: None,
            max_amount: None,
            network: network.caip2(),
            nonce: nonce.to_string(),
            pay_to: None,
            payer: payer.to_checksum(None),
            recovery: None,
            scheme: scheme.to_owned(),
            status: PaymentStatus::SettledResponseLost,
            tx_hash: None,
            x402_version: version.number(),
        }
    }

    /// `upto`: `amount` becomes what the chain shows moved (`max_amount` stays the signed
    /// maximum). Nothing changes for `exact` or when nothing is known.
    #[must_use]
    pub fn charged(mut self, charged: Option<U256>) -> Self {
        if let Some(c) = charged.filter(|_| self.max_amount.is_some()) {
            self.amount = Some(c.to_string());
        }
        self
    }

    /// How recovery of a lost answer ended.
    #[must_use]
    pub fn recovery(mut self, kind: Option<RecoveryKind>) -> Self {
        self.recovery = kind;
        self
    }

    /// `upto`: what the upstream said it charged.
    #[must_use]
    pub fn claimed_amount(mut self, said: Option<String>) -> Self {
        self.claimed_amount = said.filter(|_| self.max_amount.is_some());
        self
    }

    /// The transaction an upstream named in a settlement claim.
    #[must_use]
    pub fn claimed_tx_hash(mut self, hash: Option<B256>) -> Self {
        self.claimed_tx_hash = hash.map(|h| h.to_string());
        self
    }

    /// The view as a JSON value (what a receipt stores and signs).
    pub fn to_value(&self) -> serde_json::Value {
        // A struct of strings and integers always serializes.
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PaymentView {
        PaymentView {
            amount: Some("1".into()),
            asset: "0xA".into(),
            asset_transfer_method: Some("permit2"),
            claimed_amount: Some("2".into()),
            claimed_tx_hash: Some("0xc".into()),
            max_amount: Some("3".into()),
            network: "eip155:1".into(),
            nonce: "0x1".into(),
            pay_to: Some("0xB".into()),
            payer: "0xC".into(),
            recovery: Some(RecoveryKind::Lost),
            scheme: "upto".into(),
            status: PaymentStatus::Settled,
            tx_hash: Some(None),
            x402_version: 2,
        }
    }

    /// The struct serializes in the same member order as the sorted JSON object it replaced.
    #[test]
    fn members_serialize_in_name_order() {
        let direct = serde_json::to_string(&sample()).unwrap();
        let sorted = serde_json::to_string(&sample().to_value()).unwrap();
        assert_eq!(direct, sorted);
        assert!(direct.contains(r#""tx_hash":null"#), "{direct}");
        let none = PaymentView { tx_hash: None, claimed_tx_hash: None, recovery: None, amount: None, ..sample() };
        let text = serde_json::to_string(&none).unwrap();
        assert!(!text.contains("tx_hash") && !text.contains("recovery") && !text.contains("\"amount\""), "{text}");
    }
}
