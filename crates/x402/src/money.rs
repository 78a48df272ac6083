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

/// How many budget units one atomic unit of an asset is worth: an exact fraction `num / den`
/// (never a float), reduced. A budget spanning assets of different decimals counts every
/// payment of an asset as [`Rate::charge`] of its amount: rounded up, against the spender, so
/// that no payment however small is counted as less than it moved (docs/DESIGN.md §6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    num: U256,
    den: U256,
}

/// A rate that cannot be: a zero numerator or denominator, or one too large for 256 bits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected a positive value, a whole number or a fraction like \"123/100\"")]
pub struct BadRate;

fn gcd(mut a: U256, mut b: U256) -> U256 {
    while !b.is_zero() {
        let r = a % b;
        a = b;
        b = r;
    }
    a
}

impl Rate {
    /// One atomic unit is one budget unit (assets of the budget's own decimals at value 1).
    pub const ONE: Self = Self { num: U256::from_limbs([1, 0, 0, 0]), den: U256::from_limbs([1, 0, 0, 0]) };

    /// `num / den`, reduced.
    ///
    /// # Errors
    /// [`BadRate`] when either is zero.
    pub fn new(num: U256, den: U256) -> Result<Self, BadRate> {
        if num.is_zero() || den.is_zero() {
            return Err(BadRate);
        }
        let g = gcd(num, den);
        Ok(Self { num: num / g, den: den / g })
    }

    /// The rate of an asset of `asset_decimals` worth `value` budget currency per whole token,
    /// counted in budget units of `budget_decimals`: `value · 10^budget / 10^asset`.
    ///
    /// # Errors
    /// [`BadRate`] when it does not fit in 256 bits (decimals are at most 36 each).
    pub fn of_asset(value: Self, asset_decimals: u8, budget_decimals: u8) -> Result<Self, BadRate> {
        let ten = |d: u8| U256::from(10u8).checked_pow(U256::from(d)).ok_or(BadRate);
        let num = value.num.checked_mul(ten(budget_decimals)?).ok_or(BadRate)?;
        let den = value.den.checked_mul(ten(asset_decimals)?).ok_or(BadRate)?;
        Self::new(num, den)
    }

    /// Parses a value: `1`, `3`, or a fraction `123/100` (decimal digits only, no sign, no
    /// exponent, no decimal point: never a float).
    ///
    /// # Errors
    /// [`BadRate`] for anything else, and for zero.
    pub fn parse(s: &str) -> Result<Self, BadRate> {
        let (num, den) = s.split_once('/').unwrap_or((s, "1"));
        let part = |p: &str| Amount::parse(p.trim()).map(Amount::as_u256).map_err(|_| BadRate);
        Self::new(part(num)?, part(den)?)
    }

    pub const fn num(self) -> U256 {
        self.num
    }

    pub const fn den(self) -> U256 {
        self.den
    }

    /// What `amount` atomic units count in budget units: `⌈amount · num / den⌉`. `None` when
    /// it does not fit in 256 bits (callers refuse the payment).
    pub fn charge(self, amount: Amount) -> Option<Amount> {
        let product = amount.as_u256().checked_mul(self.num)?;
        let (q, r) = product.div_rem(self.den);
        if r.is_zero() { Some(Amount(q)) } else { q.checked_add(U256::from(1u8)).map(Amount) }
    }

    /// The most atomic units whose [`Rate::charge`] is at most `budget` budget units:
    /// `⌊budget · den / num⌋` (saturating).
    pub fn most_for(self, budget: Amount) -> Amount {
        match budget.as_u256().checked_mul(self.den) {
            Some(p) => Amount(p / self.num),
            None => Amount(U256::MAX),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == U256::from(1u8) { write!(f, "{}", self.num) } else { write!(f, "{}/{}", self.num, self.den) }
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

    #[test]
    fn rates_round_charges_up_and_never_take_a_float() {
        let usdc = Rate::of_asset(Rate::ONE, 6, 6).unwrap();
        assert_eq!(usdc, Rate::ONE);
        let eighteen = Rate::of_asset(Rate::ONE, 18, 6).unwrap();
        assert_eq!((eighteen.num(), eighteen.den()), (U256::from(1u8), U256::from(10u64.pow(12))));
        assert_eq!(eighteen.charge(Amount::from(1)), Some(Amount::from(1)), "one wei costs a whole budget unit");
        assert_eq!(eighteen.charge(Amount::from(10u64.pow(12))), Some(Amount::from(1)));
        assert_eq!(eighteen.charge(Amount::from(10u64.pow(12) + 1)), Some(Amount::from(2)));
        assert_eq!(eighteen.charge(Amount::ZERO), Some(Amount::ZERO));
        assert_eq!(eighteen.most_for(Amount::from(3)), Amount::from(3 * 10u64.pow(12)));
        let dear = Rate::of_asset(Rate::parse("123/100").unwrap(), 6, 6).unwrap();
        assert_eq!(dear.charge(Amount::from(100)), Some(Amount::from(123)));
        assert_eq!(dear.charge(Amount::from(1)), Some(Amount::from(2)));
        assert_eq!(Rate::parse("246/200"), Rate::parse("123/100"));
        assert_eq!(Rate::parse("2").unwrap().to_string(), "2");
        for bad in ["", "0", "1/0", "0/5", "1.5", "-1", "1e3", "1/", "/2", "0x10", "1/2/3"] {
            assert_eq!(Rate::parse(bad), Err(BadRate), "{bad:?}");
        }
        assert_eq!(Rate::ONE.charge(Amount::from_u256(U256::MAX)), Some(Amount::from_u256(U256::MAX)));
        assert_eq!(Rate::parse("2").unwrap().charge(Amount::from_u256(U256::MAX)), None, "overflow refuses");
    }
}
