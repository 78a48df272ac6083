//! One SVM `exact` payment option, typed: what an upstream's `accepts` entry asks for on a
//! Solana network. Parsed strictly; nothing in it is trusted beyond what it names: the mint's
//! decimals and token program, the blockhash and its lifetime come from the router's own RPC,
//! never from the entry (`extra.decimals`, `extra.recentBlockhash`, `extra.lastValidBlockHeight`
//! are ignored).

use std::str::FromStr;

use serde_json::{Map, Value};
use solana_address::Address;

use super::network::{SvmNetwork, SvmNetworkError};
use crate::money::Amount;
use crate::wire::X402Version;

/// The longest memo an upstream may ask for (`extra.memo`, bytes of UTF-8), as `@x402/svm`.
pub const MAX_MEMO_BYTES: usize = 256;

/// Why an entry is not a payable SVM `exact` option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TermsError {
    #[error("entry is not a JSON object")]
    NotObject,
    #[error("scheme is not exact")]
    NotExact,
    #[error("network: {0}")]
    Network(#[from] SvmNetworkError),
    #[error("{0} is missing or not a string")]
    Missing(&'static str),
    #[error("{0} is not an amount of atomic units that fits an SPL token (u64)")]
    BadAmount(&'static str),
    #[error("{0} is not a base58 Solana address")]
    BadAddress(&'static str),
    #[error("maxTimeoutSeconds is missing or not a non-negative integer")]
    BadTimeout,
    #[error("extra.feePayer is missing: the scheme needs the facilitator's fee payer")]
    NoFeePayer,
    #[error("extra.memo is not a string of at most {MAX_MEMO_BYTES} bytes")]
    BadMemo,
}

/// A parsed SVM `exact` option.
#[derive(Debug, Clone, PartialEq)]
pub struct SvmTerms {
    version: X402Version,
    network: SvmNetwork,
    network_raw: String,
    amount: u64,
    mint: Address,
    pay_to: Address,
    fee_payer: Address,
    memo: Option<String>,
    max_timeout_seconds: u64,
    raw: Map<String, Value>,
}

impl SvmTerms {
    /// Parses one `accepts` entry of a message of `version`.
    ///
    /// # Errors
    /// [`TermsError`].
    pub fn from_json(version: X402Version, entry: &Value) -> Result<Self, TermsError> {
        let obj = entry.as_object().ok_or(TermsError::NotObject)?;
        if str_field(obj, "scheme")? != "exact" {
            return Err(TermsError::NotExact);
        }
        let network_raw = str_field(obj, "network")?;
        let network = SvmNetwork::parse(network_raw)?;
        let amount_field = match version {
            X402Version::V1 => "maxAmountRequired",
            X402Version::V2 => "amount",
        };
        let amount = Amount::parse(str_field(obj, amount_field)?)
            .ok()
            .and_then(|a| u64::try_from(a.as_u256()).ok())
            .ok_or(TermsError::BadAmount(amount_field))?;
        let mint = address(str_field(obj, "asset")?, "asset")?;
        let pay_to = address(str_field(obj, "payTo")?, "payTo")?;
        let max_timeout_seconds = obj.get("maxTimeoutSeconds").and_then(Value::as_u64).ok_or(TermsError::BadTimeout)?;
        let extra = obj.get("extra").and_then(Value::as_object);
        let fee_payer = match extra.and_then(|e| e.get("feePayer")) {
            Some(Value::String(s)) => address(s, "extra.feePayer")?,
            Some(_) => return Err(TermsError::BadAddress("extra.feePayer")),
            None => return Err(TermsError::NoFeePayer),
        };
        let memo = match extra.and_then(|e| e.get("memo")) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if !s.is_empty() && s.len() <= MAX_MEMO_BYTES => Some(s.clone()),
            Some(_) => return Err(TermsError::BadMemo),
        };
        Ok(Self {
            version,
            network,
            network_raw: network_raw.to_owned(),
            amount,
            mint,
            pay_to,
            fee_payer,
            memo,
            max_timeout_seconds,
            raw: obj.clone(),
        })
    }

    /// The protocol version of the message the entry came from.
    pub fn version(&self) -> X402Version {
        self.version
    }
    /// The network, parsed.
    pub fn network(&self) -> &SvmNetwork {
        &self.network
    }
    /// The network string exactly as the upstream sent it (a v1 payment echoes it).
    pub fn network_raw(&self) -> &str {
        &self.network_raw
    }
    /// The price in the mint's atomic units.
    pub fn amount(&self) -> u64 {
        self.amount
    }
    /// The SPL token mint (`asset`).
    pub fn mint(&self) -> Address {
        self.mint
    }
    /// The recipient (the owner of the destination token account).
    pub fn pay_to(&self) -> Address {
        self.pay_to
    }
    /// The facilitator's fee payer (`extra.feePayer`).
    pub fn fee_payer(&self) -> Address {
        self.fee_payer
    }
    /// The memo the upstream asks for (`extra.memo`), if any.
    pub fn memo(&self) -> Option<&str> {
        self.memo.as_deref()
    }
    /// `maxTimeoutSeconds` as sent (informational: a Solana payment's lifetime is its blockhash's).
    pub fn max_timeout_seconds(&self) -> u64 {
        self.max_timeout_seconds
    }
    /// The entry as the upstream sent it.
    pub fn raw(&self) -> &Map<String, Value> {
        &self.raw
    }
}

/// The JSON payment payload of the paid retry for `terms` ([`crate::wire::payment_message`]),
/// its scheme payload `{transaction}` (the base64 transaction of [`super::SignedSvmTransfer`]);
/// v2 `extensions` echoed when given (e.g. `payment-identifier`).
pub fn payment_payload(
    terms: &SvmTerms,
    resource: Option<&Value>,
    transaction: &str,
    extensions: Option<&Value>,
) -> Value {
    let payload = serde_json::json!({ "transaction": transaction });
    crate::wire::payment_message(
        terms.version,
        &terms.raw,
        ("exact", &terms.network_raw),
        resource,
        payload,
        extensions,
    )
}

fn str_field<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a str, TermsError> {
    obj.get(name).and_then(Value::as_str).ok_or(TermsError::Missing(name))
}

fn address(s: &str, field: &'static str) -> Result<Address, TermsError> {
    if s.len() > 44 {
        return Err(TermsError::BadAddress(field));
    }
    Address::from_str(s).map_err(|_| TermsError::BadAddress(field))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const MINT: &str = "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU";
    const PAY_TO: &str = "2wKupLR9q6wXYppw8Gr2NvWxKBUqm4PPJKkQfoxHDBg4";
    const FEE_PAYER: &str = "EwWqGE4ZFKLofuestmU4LDdK7XM1N4ALgdZccwYugwGd";

    fn v2_entry() -> Value {
        json!({"scheme": "exact", "network": "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "amount": "10000",
            "asset": MINT, "payTo": PAY_TO, "maxTimeoutSeconds": 60, "extra": {"feePayer": FEE_PAYER}})
    }

    #[test]
    fn parses_a_v2_and_a_v1_entry() {
        let t = SvmTerms::from_json(X402Version::V2, &v2_entry()).unwrap();
        assert_eq!(t.amount(), 10_000);
        assert_eq!(t.mint().to_string(), MINT);
        assert_eq!(t.fee_payer().to_string(), FEE_PAYER);
        assert_eq!(t.memo(), None);
        let mut v1 = v2_entry();
        v1["network"] = json!("solana-devnet");
        v1["maxAmountRequired"] = v1["amount"].take();
        let t1 = SvmTerms::from_json(X402Version::V1, &v1).unwrap();
        assert_eq!(t1.network(), t.network());
        assert_eq!(t1.network_raw(), "solana-devnet");
    }

    #[test]
    fn hostile_entries_are_refused() {
        let cases: [(&str, Value, TermsError); 8] = [
            ("amount", json!("18446744073709551616"), TermsError::BadAmount("amount")),
            ("amount", json!(10000), TermsError::Missing("amount")),
            ("amount", json!("1e4"), TermsError::BadAmount("amount")),
            ("asset", json!("0x036CbD53842c5426634e7929541eC2318f3dCF7e"), TermsError::BadAddress("asset")),
            ("payTo", json!("x".repeat(100_000)), TermsError::BadAddress("payTo")),
            ("extra", json!({}), TermsError::NoFeePayer),
            ("extra", json!({"feePayer": FEE_PAYER, "memo": "m".repeat(257)}), TermsError::BadMemo),
            ("network", json!("solana:bad\u{0}"), TermsError::Network(SvmNetworkError::Malformed)),
        ];
        for (field, value, want) in cases {
            let mut e = v2_entry();
            e[field] = value;
            assert_eq!(SvmTerms::from_json(X402Version::V2, &e), Err(want), "{field}");
        }
        let mut e = v2_entry();
        e["scheme"] = json!("upto");
        assert_eq!(SvmTerms::from_json(X402Version::V2, &e), Err(TermsError::NotExact));
    }
}
