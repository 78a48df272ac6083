//! Solana network identifiers: CAIP-2 ids (`solana:<the first 32 characters of the genesis
//! hash>`) and the x402 v1 names (`solana`, `solana-devnet`, `solana-testnet`).
//!
//! Invariants: a [`SvmNetwork`] is a `solana:` id whose reference is 1–32 base58 characters;
//! its canonical text is `solana:<reference>`. The v1 names map onto the CAIP-2 ids that the
//! official `@x402/svm` package gives them. An RPC endpoint serves this network only when
//! its genesis hash starts with the reference ([`SvmNetwork::matches_genesis`]).

use std::fmt;

/// The CAIP-2 namespace of Solana networks.
pub const SOLANA: &str = "solana";

/// The x402 v1 names and their CAIP-2 references (genesis hash prefixes).
const V1_NAMES: &[(&str, &str)] = &[
    ("solana", "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp"),
    ("solana-devnet", "EtWTRABZaYq6iMfeYKouRu166VU2xqa1"),
    ("solana-testnet", "4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z"),
];

/// Why a string is not a Solana network.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SvmNetworkError {
    /// Not a `solana:` id nor a Solana v1 name (it may be another family's network).
    #[error("not a Solana network")]
    NotSolana,
    /// `solana:` followed by something that is not 1–32 base58 characters.
    #[error("malformed Solana network reference")]
    Malformed,
}

/// A Solana network (cluster), named by its genesis hash prefix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SvmNetwork {
    reference: String,
}

impl SvmNetwork {
    /// Parses `solana:<reference>` or a v1 name (case-insensitive).
    ///
    /// # Errors
    /// [`SvmNetworkError`].
    pub fn parse(s: &str) -> Result<Self, SvmNetworkError> {
        if let Some((namespace, reference)) = s.split_once(':') {
            if namespace != SOLANA {
                return Err(SvmNetworkError::NotSolana);
            }
            let base58 = reference.bytes().all(|b| b.is_ascii_alphanumeric() && !b"0OIl".contains(&b));
            if !(1..=32).contains(&reference.len()) || !base58 {
                return Err(SvmNetworkError::Malformed);
            }
            return Ok(Self { reference: reference.to_owned() });
        }
        V1_NAMES
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(s))
            .map(|&(_, reference)| Self { reference: reference.to_owned() })
            .ok_or(SvmNetworkError::NotSolana)
    }

    /// The network of a chain whose genesis hash (base58) is `genesis_hash`.
    ///
    /// # Errors
    /// [`SvmNetworkError::Malformed`] for a hash that is not base58.
    pub fn from_genesis_hash(genesis_hash: &str) -> Result<Self, SvmNetworkError> {
        let reference: String = genesis_hash.chars().take(32).collect();
        Self::parse(&format!("{SOLANA}:{reference}")).map_err(|_| SvmNetworkError::Malformed)
    }

    /// The CAIP-2 reference (the genesis hash's first 32 characters).
    pub fn reference(&self) -> &str {
        &self.reference
    }

    /// The CAIP-2 id, e.g. `solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1`.
    pub fn caip2(&self) -> String {
        self.to_string()
    }

    /// The x402 v1 name of this network, if it has one.
    pub fn v1_name(&self) -> Option<&'static str> {
        V1_NAMES.iter().find(|(_, reference)| *reference == self.reference).map(|&(name, _)| name)
    }

    /// True when a chain with this genesis hash is this network.
    pub fn matches_genesis(&self, genesis_hash: &str) -> bool {
        Self::from_genesis_hash(genesis_hash).is_ok_and(|n| n == *self)
    }
}

impl fmt::Display for SvmNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SOLANA}:{}", self.reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caip2_ids_and_v1_names() {
        let devnet = SvmNetwork::parse("solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1").unwrap();
        assert_eq!(SvmNetwork::parse("solana-devnet").unwrap(), devnet);
        assert_eq!(SvmNetwork::parse("Solana-Devnet").unwrap(), devnet);
        assert_eq!(devnet.v1_name(), Some("solana-devnet"));
        assert_eq!(devnet.caip2(), "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1");
        assert_eq!(SvmNetwork::parse("solana").unwrap().reference(), "5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp");
        assert!(devnet.matches_genesis("EtWTRABZaYq6iMfeYKouRu166VU2xqa1wcaWoxPkrZBG"));
        assert!(!devnet.matches_genesis("5eykt4UsFv8P8NJdTREpY1vzqKqZKvdpKuc147dw2N9d"));
        assert!(SvmNetwork::parse("solana:TestnetXY2").unwrap().v1_name().is_none());
    }

    #[test]
    fn other_families_and_garbage_are_refused() {
        assert_eq!(SvmNetwork::parse("eip155:8453"), Err(SvmNetworkError::NotSolana));
        assert_eq!(SvmNetwork::parse("base"), Err(SvmNetworkError::NotSolana));
        for bad in ["solana:", "solana:0abc", "solana:a b", "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1X", "solana:é"] {
            assert_eq!(SvmNetwork::parse(bad), Err(SvmNetworkError::Malformed), "{bad}");
        }
    }
}
