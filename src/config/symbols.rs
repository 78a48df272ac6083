//! The symbols amounts are shown in (`/.well-known/x402-router`, the console): `USDC` for
//! Circle's built-in USDC, else the token's own `symbol()` read before serving
//! (`startup::preflight`). A symbol is only ever shown, never used to decide a payment: an
//! asset without one (unreadable, or not a plain short word) is shown by its address.

use std::collections::BTreeMap;

use alloy::primitives::Address;

use crate::x402::Network;

/// The symbol of Circle's USDC (the built-in assets, EVM and Solana).
pub const USDC: &str = "USDC";

/// Longest symbol shown.
pub const MAX_SYMBOL_LEN: usize = 16;

/// `raw` (a token's `symbol()`, hostile input) as a symbol to show: 1 to 16 ASCII letters,
/// digits, `.`, `_`, `-` or `$`; anything else is `None`.
pub fn shown_symbol(raw: &str) -> Option<String> {
    let ok = !raw.is_empty()
        && raw.len() <= MAX_SYMBOL_LEN
        && raw.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'$'));
    ok.then(|| raw.to_owned())
}

/// `USDC` for each asset of `assets` that is its network's built-in USDC.
pub fn built_in_symbols(assets: &BTreeMap<Network, Vec<Address>>) -> BTreeMap<(Network, Address), String> {
    assets
        .iter()
        .flat_map(|(n, list)| list.iter().map(|a| (*n, *a)))
        .filter(|(n, a)| super::built_in_usdc(*n) == Some(*a))
        .map(|key| (key, USDC.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symbol_is_shown_only_when_it_is_a_short_plain_word() {
        for good in ["USDC", "USDC.e", "EURC", "x-1_$"] {
            assert_eq!(shown_symbol(good).as_deref(), Some(good));
        }
        for bad in ["", "US DC", "<script>", "USDC\u{202e}", "ÜSDC", "A234567890123456X", "a\nb"] {
            assert_eq!(shown_symbol(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_built_in_usdc_is_usdc_and_another_token_has_no_symbol_yet() {
        let usdc = super::super::built_in_usdc(Network::BASE_SEPOLIA).unwrap();
        let other = Address::repeat_byte(0x11);
        let assets = BTreeMap::from([(Network::BASE_SEPOLIA, vec![usdc, other])]);
        let symbols = built_in_symbols(&assets);
        assert_eq!(symbols.get(&(Network::BASE_SEPOLIA, usdc)).map(String::as_str), Some(USDC));
        assert_eq!(symbols.get(&(Network::BASE_SEPOLIA, other)), None);
    }
}
