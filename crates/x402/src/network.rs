//! Network identifiers: CAIP-2 ids for EVM chains (`eip155:<chain id>`) and the legacy
//! x402 v1 names (`base`, `base-sepolia`, …) that map onto them.
//!
//! Invariants:
//! - A [`Network`] is always an EVM chain with a non-zero chain id; its canonical text is
//!   `eip155:<decimal chain id>` without leading zeros. Non-EVM CAIP-2 ids (`solana:…`) are
//!   recognised as *well-formed but unsupported* ([`NetworkError::NotEvm`]) so the caller can
//!   tell "an option we cannot pay" from "garbage".
//! - v1 names are matched case-insensitively. The name string an upstream actually sent is not
//!   stored here: [`crate::wire::Requirement::network_raw`] keeps it, because a v1
//!   payment must echo it byte for byte.
//!
//! The v1 name table follows `EVM_NETWORK_CHAIN_ID_MAP` of the official `@x402/evm` package
//! (v1 compatibility; checked against 2.27.0), plus three aliases that upstreams use in the wild (`mainnet`,
//! `optimism`, `arbitrum`). [`Network::v1_name`] only ever returns official names.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// CAIP-2 namespace of EVM chains.
const EIP155: &str = "eip155";

/// Longest CAIP-2 id accepted (namespace 3–8 + ':' + reference 1–32, per CAIP-2).
const MAX_CAIP2_LEN: usize = 41;

/// Official x402 v1 network names and their chain ids. The first name for a chain id is the
/// one [`Network::v1_name`] returns.
const V1_NAMES: &[(&str, u64)] = &[
    ("ethereum", 1),
    ("sepolia", 11_155_111),
    ("abstract", 2741),
    ("abstract-testnet", 11_124),
    ("base", 8453),
    ("base-sepolia", 84_532),
    ("avalanche", 43_114),
    ("avalanche-fuji", 43_113),
    ("iotex", 4689),
    ("sei", 1329),
    ("sei-testnet", 1328),
    ("polygon", 137),
    ("polygon-amoy", 80_002),
    ("peaq", 3338),
    ("story", 1514),
    ("educhain", 41_923),
    ("skale-base-sepolia", 324_705_682),
    ("megaeth", 4326),
    ("monad", 143),
    ("stable", 988),
    ("stable-testnet", 2201),
    ("celo", 42_220),
    ("flare", 14),
];

/// Names accepted when parsing but never produced: they are not in the official v1 table.
const V1_ALIASES: &[(&str, u64)] = &[("mainnet", 1), ("optimism", 10), ("arbitrum", 42_161)];

/// Why a network string is not a [`Network`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    /// Well-formed CAIP-2 id of another chain family (e.g. `solana:…`): valid, but not payable here.
    #[error("network {0:?} is not an EVM (eip155) network")]
    NotEvm(String),
    /// A plausible network name (`[A-Za-z0-9-]`, ≤ 64 chars) that is not an EVM network in the
    /// x402 v1 table (e.g. `solana-devnet`).
    #[error("unknown network {0:?}")]
    Unknown(String),
    /// Neither a CAIP-2 id nor anything that looks like a network name.
    #[error("malformed network id {0:?}")]
    Malformed(String),
    /// `eip155:` followed by something that is not a positive decimal chain id.
    #[error("invalid eip155 chain id in {0:?}")]
    InvalidChainId(String),
}

impl NetworkError {
    /// True when the input named a real network family that this router does not pay on,
    /// as opposed to an input that is simply malformed.
    pub fn is_unsupported_family(&self) -> bool {
        matches!(self, Self::NotEvm(_) | Self::Unknown(_))
    }
}

/// An EVM network, identified by its chain id; displayed as CAIP-2 (`eip155:84532`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Network {
    chain_id: u64,
}

impl Network {
    /// Base mainnet, `eip155:8453`.
    pub const BASE: Network = Network { chain_id: 8453 };
    /// Base Sepolia, `eip155:84532`.
    pub const BASE_SEPOLIA: Network = Network { chain_id: 84_532 };

    /// The network with this EVM chain id.
    ///
    /// # Errors
    /// [`NetworkError::InvalidChainId`] for chain id 0, which no EVM chain uses.
    pub fn from_chain_id(chain_id: u64) -> Result<Self, NetworkError> {
        if chain_id == 0 {
            return Err(NetworkError::InvalidChainId(format!("{EIP155}:0")));
        }
        Ok(Self { chain_id })
    }

    /// Parses a CAIP-2 id (`eip155:84532`) or an x402 v1 name (`base-sepolia`).
    ///
    /// # Errors
    /// See [`NetworkError`]; the input is quoted in the error (truncated if long).
    pub fn parse(s: &str) -> Result<Self, NetworkError> {
        if s.contains(':') { Self::parse_caip2(s) } else { Self::from_v1_name(s) }
    }

    /// Parses a CAIP-2 id. Only the `eip155` namespace yields a [`Network`].
    ///
    /// # Errors
    /// [`NetworkError::NotEvm`] for a well-formed id of another namespace,
    /// [`NetworkError::InvalidChainId`] / [`NetworkError::Unknown`] for malformed input.
    pub fn parse_caip2(s: &str) -> Result<Self, NetworkError> {
        if s.len() > MAX_CAIP2_LEN {
            return Err(NetworkError::Malformed(shorten(s)));
        }
        let Some((namespace, reference)) = s.split_once(':') else {
            return Err(NetworkError::Malformed(shorten(s)));
        };
        if namespace != EIP155 {
            return if is_caip2_namespace(namespace) && is_caip2_reference(reference) {
                Err(NetworkError::NotEvm(s.to_owned()))
            } else {
                Err(NetworkError::Malformed(shorten(s)))
            };
        }
        let canonical =
            !reference.is_empty() && reference.bytes().all(|b| b.is_ascii_digit()) && !reference.starts_with('0');
        if !canonical {
            return Err(NetworkError::InvalidChainId(shorten(s)));
        }
        let chain_id: u64 = reference.parse().map_err(|_| NetworkError::InvalidChainId(shorten(s)))?;
        Self::from_chain_id(chain_id)
    }

    /// Looks up an x402 v1 network name (case-insensitive).
    ///
    /// # Errors
    /// [`NetworkError::Unknown`] for a name that is not an EVM network in the v1 table
    /// (this includes `solana` and `solana-devnet`, which v1 also knows);
    /// [`NetworkError::Malformed`] for something that is no name at all (empty, spaces, …).
    pub fn from_v1_name(name: &str) -> Result<Self, NetworkError> {
        if let Some(&(_, chain_id)) =
            V1_NAMES.iter().chain(V1_ALIASES).find(|(known, _)| known.eq_ignore_ascii_case(name))
        {
            return Ok(Self { chain_id });
        }
        let plausible = (1..=64).contains(&name.len()) && name.bytes().all(|b| b == b'-' || b.is_ascii_alphanumeric());
        Err(if plausible { NetworkError::Unknown(name.to_owned()) } else { NetworkError::Malformed(shorten(name)) })
    }

    /// The EVM chain id (the EIP-712 domain's `chainId`).
    pub fn chain_id(&self) -> u64 {
        self.chain_id
    }

    /// The CAIP-2 id, e.g. `eip155:84532`. Same as `to_string()`.
    pub fn caip2(&self) -> String {
        self.to_string()
    }

    /// The official x402 v1 name of this network, if it has one (`eip155:84532` → `base-sepolia`).
    ///
    /// Use it only when no original name is at hand: a v1 payment must echo the exact string
    /// the upstream sent ([`crate::wire::Requirement::network_raw`]).
    pub fn v1_name(&self) -> Option<&'static str> {
        V1_NAMES.iter().find(|&&(_, chain_id)| chain_id == self.chain_id).map(|&(name, _)| name)
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{EIP155}:{}", self.chain_id)
    }
}

impl FromStr for Network {
    type Err = NetworkError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for Network {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Network {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// CAIP-2 namespace: `[-a-z0-9]{3,8}`.
fn is_caip2_namespace(s: &str) -> bool {
    (3..=8).contains(&s.len()) && s.bytes().all(|b| b == b'-' || b.is_ascii_lowercase() || b.is_ascii_digit())
}

/// CAIP-2 reference: `[-_a-zA-Z0-9]{1,32}`.
fn is_caip2_reference(s: &str) -> bool {
    (1..=32).contains(&s.len()) && s.bytes().all(|b| b == b'-' || b == b'_' || b.is_ascii_alphanumeric())
}

/// Keeps error messages bounded when an upstream sends a huge network string.
fn shorten(s: &str) -> String {
    const MAX: usize = 64;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_caip2_and_reports_chain_id() {
        let n = Network::parse("eip155:84532").unwrap();
        assert_eq!(n.chain_id(), 84_532);
        assert_eq!(n.to_string(), "eip155:84532");
        assert_eq!(n, Network::BASE_SEPOLIA);
    }

    #[test]
    fn maps_v1_names_to_caip2_and_back() {
        let cases = [
            ("base", 8453),
            ("base-sepolia", 84_532),
            ("ethereum", 1),
            ("mainnet", 1),
            ("sepolia", 11_155_111),
            ("polygon", 137),
            ("polygon-amoy", 80_002),
            ("avalanche", 43_114),
            ("avalanche-fuji", 43_113),
            ("optimism", 10),
            ("arbitrum", 42_161),
            ("iotex", 4689),
            ("sei", 1329),
            ("sei-testnet", 1328),
            ("monad", 143),
            ("stable", 988),
            ("stable-testnet", 2201),
            ("celo", 42_220),
            ("flare", 14),
        ];
        for (name, chain_id) in cases {
            let n = Network::parse(name).unwrap();
            assert_eq!(n.chain_id(), chain_id, "{name}");
            assert_eq!(n.caip2(), format!("eip155:{chain_id}"));
        }
        assert_eq!(Network::BASE_SEPOLIA.v1_name(), Some("base-sepolia"));
        assert_eq!(Network::parse("mainnet").unwrap().v1_name(), Some("ethereum"));
        assert_eq!(Network::parse("optimism").unwrap().v1_name(), None);
    }

    #[test]
    fn v1_names_are_case_insensitive() {
        assert_eq!(Network::parse("Base-Sepolia").unwrap(), Network::BASE_SEPOLIA);
    }

    #[test]
    fn non_evm_networks_are_unsupported_not_malformed() {
        let err = Network::parse("solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp").unwrap_err();
        assert!(matches!(err, NetworkError::NotEvm(_)));
        assert!(err.is_unsupported_family());
        assert!(Network::parse("solana-devnet").unwrap_err().is_unsupported_family());
    }

    #[test]
    fn rejects_malformed_ids() {
        for bad in [
            "eip155:",
            "eip155:0",
            "eip155:084532",
            "eip155:-1",
            "eip155:+1",
            "eip155: 1",
            "eip155:99999999999999999999999",
            "eip155:1:2",
            ":1",
            "",
            "EIP155:1",
        ] {
            assert!(Network::parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert!(!Network::parse("eip155:x").unwrap_err().is_unsupported_family());
        assert!(!Network::parse("").unwrap_err().is_unsupported_family());
        assert!(!Network::parse("base sepolia").unwrap_err().is_unsupported_family());
        assert!(!Network::parse("foo:bar baz").unwrap_err().is_unsupported_family());
    }

    #[test]
    fn long_inputs_give_short_errors() {
        let long = "x".repeat(10_000);
        let msg = Network::parse(&long).unwrap_err().to_string();
        assert!(msg.len() < 200);
        let long_utf8 = "é".repeat(10_000);
        assert!(Network::parse(&long_utf8).is_err());
    }

    #[test]
    fn serializes_as_caip2_string() {
        let json = serde_json::to_string(&Network::BASE).unwrap();
        assert_eq!(json, "\"eip155:8453\"");
        let back: Network = serde_json::from_str("\"base\"").unwrap();
        assert_eq!(back, Network::BASE);
    }
}
