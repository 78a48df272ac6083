//! A budget currency (`BUDGET_CURRENCY`, `BUDGET_DECIMALS`, `X402_ASSET_VALUES`; docs/DESIGN.md
//! §6): with one, agents' caps and budgets are counted in atomic units of that currency, and
//! assets of different decimals share them, each payment counted at its asset's value (an
//! exact fraction, rounded up against the spender: `money::Rate`). Without one, budgets are
//! atomic units of the one unit every asset shares, as before.

use std::collections::BTreeMap;
use std::str::FromStr;

use alloy::primitives::Address;

use super::{ConfigError, built_in_usdc};
use crate::money::Rate;
use crate::x402::Network;

/// Most decimals of a budget currency (as of an asset).
const MAX_DECIMALS: u8 = 36;

/// The budget currency and what each asset is worth in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetConfig {
    /// Its name, only ever shown (`USD`).
    pub currency: String,
    /// Decimals of its atomic unit: budgets, caps and `max_amount` are counted in it.
    pub decimals: u8,
    /// What one whole token of each asset is worth in the currency.
    pub values: BTreeMap<(Network, Address), Rate>,
}

/// The budget currency, if one is configured, with a value for every asset of `assets`
/// (Circle's USDC: 1 unless given).
///
/// # Errors
/// A malformed setting; `X402_ASSET_VALUES` without `BUDGET_CURRENCY`, or naming an asset that
/// is not configured; an asset without a value (fail closed: no value is guessed).
pub fn parse(
    currency: &str,
    decimals: &str,
    raw_values: &str,
    assets: &BTreeMap<Network, Vec<Address>>,
) -> Result<Option<BudgetConfig>, ConfigError> {
    let currency = currency.trim();
    if currency.is_empty() {
        if !raw_values.trim().is_empty() {
            return Err(ConfigError::new("X402_ASSET_VALUES", "is only read with BUDGET_CURRENCY"));
        }
        return Ok(None);
    }
    if currency.len() > 12 || !currency.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ConfigError::new("BUDGET_CURRENCY", "expected a short name of letters and digits, e.g. USD"));
    }
    let decimals = decimals
        .trim()
        .parse::<u8>()
        .ok()
        .filter(|d| *d <= MAX_DECIMALS)
        .ok_or_else(|| ConfigError::new("BUDGET_DECIMALS", format!("expected 0 to {MAX_DECIMALS}")))?;
    let mut values = parse_values(raw_values)?;
    for (network, list) in assets {
        for asset in list {
            let key = (*network, *asset);
            if values.contains_key(&key) {
                continue;
            }
            if built_in_usdc(*network) != Some(*asset) {
                return Err(ConfigError::new(
                    "X402_ASSET_VALUES",
                    format!("give the value of {network}={asset} in {currency} (e.g. `{network}={asset}=1`)"),
                ));
            }
            values.insert(key, Rate::ONE);
        }
    }
    if let Some((n, a)) = values.keys().find(|(n, a)| !assets.get(n).is_some_and(|l| l.contains(a))) {
        return Err(ConfigError::new("X402_ASSET_VALUES", format!("{n}={a} is not an asset of X402_ASSETS")));
    }
    Ok(Some(BudgetConfig { currency: currency.to_owned(), decimals, values }))
}

/// With a budget currency, only EVM `exact` and `upto` are paid: Solana and batch-settlement
/// channels (whose deposits and vouchers count raw atomic units) are refused at start-up.
///
/// # Errors
/// [`ConfigError`] naming what cannot be combined.
pub fn only_exact_on_evm(budget: Option<&BudgetConfig>, batch: bool, solana: bool) -> Result<(), ConfigError> {
    if budget.is_none() {
        Ok(())
    } else if batch {
        Err(ConfigError::new("BUDGET_CURRENCY", "cannot be combined with X402_SCHEMES=batch-settlement (not yet)"))
    } else if solana {
        Err(ConfigError::new("BUDGET_CURRENCY", "cannot be combined with Solana networks (not yet)"))
    } else {
        Ok(())
    }
}

/// `network=0xtoken=value,…`, a value being a whole number or a fraction `num/den`.
fn parse_values(raw: &str) -> Result<BTreeMap<(Network, Address), Rate>, ConfigError> {
    let bad = |entry: &str, why: &str| ConfigError::new("X402_ASSET_VALUES", format!("{entry:?}: {why}"));
    let mut out = BTreeMap::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let mut parts = entry.splitn(3, '=');
        let (Some(network), Some(asset), Some(value)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad(entry, "expected network=0xtoken=value"));
        };
        let network = Network::from_str(network.trim()).map_err(|_| bad(entry, "not an EVM network (eip155:<id>)"))?;
        let asset = Address::from_str(asset.trim()).map_err(|_| bad(entry, "not a token address"))?;
        let value = Rate::parse(value.trim())
            .map_err(|_| bad(entry, "the value must be a positive whole number or fraction, e.g. 1 or 123/100"))?;
        if out.insert((network, asset), value).is_some() {
            return Err(bad(entry, "given twice"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0x00000000000000000000000000000000000000aa";

    fn assets() -> BTreeMap<Network, Vec<Address>> {
        let usdc = built_in_usdc(Network::BASE_SEPOLIA).unwrap();
        BTreeMap::from([(Network::BASE_SEPOLIA, vec![usdc, Address::from_str(TOKEN).unwrap()])])
    }

    #[test]
    fn values_are_exact_fractions_given_for_every_asset_but_usdc() {
        assert_eq!(parse("", "6", "", &assets()).unwrap(), None);
        assert!(parse("", "6", &format!("eip155:84532={TOKEN}=1"), &assets()).is_err());
        let got = parse("USD", "6", &format!("eip155:84532={TOKEN}=123/100"), &assets()).unwrap().unwrap();
        assert_eq!(got.decimals, 6);
        let token = (Network::BASE_SEPOLIA, Address::from_str(TOKEN).unwrap());
        assert_eq!(got.values[&token], Rate::parse("123/100").unwrap());
        let usdc = (Network::BASE_SEPOLIA, built_in_usdc(Network::BASE_SEPOLIA).unwrap());
        assert_eq!(got.values[&usdc], Rate::ONE);
        let e = parse("USD", "6", "", &assets()).unwrap_err().to_string();
        assert!(e.contains("give the value"), "{e}");
        for bad in ["1.23", "-1", "0", "1/0", "abc"] {
            assert!(parse("USD", "6", &format!("eip155:84532={TOKEN}={bad}"), &assets()).is_err(), "{bad}");
        }
        let other = "0x00000000000000000000000000000000000000bb";
        assert!(parse("USD", "6", &format!("eip155:84532={TOKEN}=1,eip155:84532={other}=1"), &assets()).is_err());
        assert!(parse("USD", "37", &format!("eip155:84532={TOKEN}=1"), &assets()).is_err());
        assert!(parse("US D", "6", &format!("eip155:84532={TOKEN}=1"), &assets()).is_err());
    }
}
