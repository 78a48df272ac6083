//! Amounts of money: one type, one parser, for the API, the x402 wire and the ledger.
//!
//! An [`Amount`] is a count of an asset's atomic units (e.g. 10 000 = 0.01 USDC with 6
//! decimals). It is never a float and carries no asset: comparing two amounts only makes
//! sense for the same asset, which callers guarantee.
//!
//! The only text form is the canonical decimal string: `0` or `[1-9][0-9]*`, at most
//! 2^256 − 1. No sign, no leading zeros, no exponent, no fraction, no whitespace, so one
//! amount has exactly one spelling wherever it travels.

use std::fmt;

use alloy::primitives::U256;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest decimal amount: 2^256 − 1 has 78 digits.
const MAX_DECIMAL_DIGITS: usize = 78;

/// A non-negative count of an asset's atomic units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Amount(U256);

/// Text that is not a canonical decimal amount.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a decimal string of atomic units without sign, leading zeros or fraction (e.g. \"50000\")")]
pub struct BadAmount;

impl Amount {
    pub const ZERO: Self = Self(U256::ZERO);

    /// Parses the canonical decimal form.
    ///
    /// # Errors
    /// [`BadAmount`] for anything else.
    pub fn parse(s: &str) -> Result<Self, BadAmount> {
        let canonical = !s.is_empty()
            && s.len() <= MAX_DECIMAL_DIGITS
            && s.bytes().all(|b| b.is_ascii_digit())
            && (s == "0" || !s.starts_with('0'));
        if !canonical {
            return Err(BadAmount);
        }
        U256::from_str_radix(s, 10).map(Self).map_err(|_| BadAmount)
    }

    pub const fn from_u256(v: U256) -> Self {
        Self(v)
    }

    pub const fn as_u256(self) -> U256 {
        self.0
    }

    pub fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<u64> for Amount {
    fn from(v: u64) -> Self {
        Self(U256::from(v))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl std::str::FromStr for Amount {
    type Err = BadAmount;
    fn from_str(s: &str) -> Result<Self, BadAmount> {
        Self::parse(s)
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_decimals_only() {
        for good in ["0", "1", "50000", &U256::MAX.to_string()] {
            assert_eq!(Amount::parse(good).map(|a| a.to_string()).as_deref(), Ok(good), "{good}");
        }
        let too_big = format!("{}0", U256::MAX);
        let over_max = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        for bad in ["", "00", "01", "+1", "-1", "1.0", "1e3", " 1", "1 ", "0x10", "１", &too_big, over_max] {
            assert_eq!(Amount::parse(bad), Err(BadAmount), "{bad:?}");
        }
    }

    #[test]
    fn serde_is_the_decimal_string() {
        let a: Amount = serde_json::from_str("\"12345\"").unwrap();
        assert_eq!(a, Amount::from(12345));
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"12345\"");
        assert!(serde_json::from_str::<Amount>("12345").is_err());
    }
}
