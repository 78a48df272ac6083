//! Why selection ([`crate::select()`]) refused an upstream's payment options: per option, the
//! first rule it broke ([`RejectReason`]), and the whole answer ([`Rejection`]), whose
//! `Display` is the sentence the agent reads.

use std::fmt;

use alloy::primitives::Address;

use crate::money::Amount;

use super::network::Network;

/// Why one option was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// Neither `exact` nor `upto`.
    UnsupportedScheme(String),
    /// An `extra.assetTransferMethod` the router does not pay with for this scheme.
    UnsupportedTransferMethod {
        /// The scheme.
        scheme: String,
        /// The method as sent.
        method: String,
    },
    /// A Permit2 payment (`upto`, or `exact` via Permit2) offered in an x402 v1 message.
    Permit2RequiresV2,
    /// An `upto` option without a valid, non-zero `extra.facilitatorAddress`.
    MissingFacilitator,
    /// Network without RPC URL, or not an EVM network at all (the upstream's string).
    UnsupportedNetwork(String),
    /// Token not configured for that network.
    UnsupportedAsset {
        /// Network.
        network: Network,
        /// Token contract.
        asset: Address,
    },
    /// The token's decimals are unknown, or differ from the router's unit: its atomic units
    /// cannot be compared with `max_amount` and the agent's limits.
    UnknownUnit {
        /// Network.
        network: Network,
        /// Token contract.
        asset: Address,
    },
    /// An EIP-3009 `exact` option in a token configured without EIP-3009 (`+permit2`).
    NoEip3009 {
        /// Network.
        network: Network,
        /// Token contract.
        asset: Address,
    },
    /// No `extra.name` / `extra.version`.
    MissingEip712Domain,
    /// `payTo` is the zero address.
    ZeroPayTo,
    /// Amount is zero.
    ZeroAmount,
    /// `maxTimeoutSeconds` is zero.
    ZeroTimeout,
    /// More than the agent's `max_amount` for this call.
    OverMaxAmount {
        /// Asked.
        amount: Amount,
        /// Allowed.
        max_amount: Amount,
    },
    /// More than the agent's spending limit.
    OverAgentLimit {
        /// Asked.
        amount: Amount,
        /// Allowed.
        limit: Amount,
    },
    /// The entry names a network or scheme the router cannot read or pay (e.g. Solana).
    Unsupported(String),
    /// The entry is malformed (see [`crate::wire::EntryError`]).
    Unreadable(String),
}

impl RejectReason {
    /// True when the option is acceptable except for its price: the agent could pay it by
    /// raising `max_amount` or its limits.
    pub fn is_over_budget(&self) -> bool {
        matches!(self, Self::OverMaxAmount { .. } | Self::OverAgentLimit { .. })
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnsupportedScheme(s) => {
                write!(f, "scheme {s:?} is not supported (only \"exact\" and \"upto\")")
            }
            Self::UnsupportedTransferMethod { scheme, method } => write!(
                f,
                "assetTransferMethod {method:?} is not supported for scheme {scheme:?} (exact: \"eip3009\" or \
                 \"permit2\"; upto: \"permit2\")"
            ),
            Self::Permit2RequiresV2 => f.write_str("Permit2 payments are only made with x402 version 2"),
            Self::MissingFacilitator => f.write_str("upto option without a valid extra.facilitatorAddress"),
            Self::UnsupportedNetwork(n) => write!(f, "network {n:?} is not configured"),
            Self::UnsupportedAsset { network, asset } => {
                write!(f, "asset {asset} is not configured for {network}")
            }
            Self::UnknownUnit { network, asset } => write!(
                f,
                "asset {asset} on {network}: its decimals are unknown or differ from the router's unit, so its \
                 amounts cannot be compared with the agent's limits"
            ),
            Self::NoEip3009 { network, asset } => write!(
                f,
                "asset {asset} on {network} is configured without EIP-3009 (+permit2): it is paid only via Permit2"
            ),
            Self::MissingEip712Domain => f.write_str("extra.name/extra.version (token EIP-712 domain) missing"),
            Self::ZeroPayTo => f.write_str("payTo is the zero address"),
            Self::ZeroAmount => f.write_str("amount is zero"),
            Self::ZeroTimeout => f.write_str("maxTimeoutSeconds is zero"),
            Self::OverMaxAmount { amount, max_amount } => {
                write!(f, "amount {amount} exceeds max_amount {max_amount}")
            }
            Self::OverAgentLimit { amount, limit } => {
                write!(f, "amount {amount} exceeds the agent's spending limit {limit}")
            }
            Self::Unsupported(e) => f.write_str(e),
            Self::Unreadable(e) => write!(f, "malformed: {e}"),
        }
    }
}

/// One refused option: its position in `accepts` and the first rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionRejection {
    /// Position in the upstream's `accepts`.
    pub index: usize,
    /// Why.
    pub reason: RejectReason,
}

/// No option is acceptable. Its `Display` is a sentence for the agent, listing each option.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct Rejection {
    /// Every refused option, in `accepts` order.
    pub options: Vec<OptionRejection>,
}

impl Rejection {
    /// True when at least one option failed only on price.
    pub fn is_over_budget(&self) -> bool {
        self.options.iter().any(|o| o.reason.is_over_budget())
    }

    /// The cheapest price among options refused only on price: what the agent would need.
    pub fn cheapest_over_budget(&self) -> Option<Amount> {
        self.options
            .iter()
            .filter_map(|o| match o.reason {
                RejectReason::OverMaxAmount { amount, .. } | RejectReason::OverAgentLimit { amount, .. } => {
                    Some(amount)
                }
                _ => None,
            })
            .min()
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.options.is_empty() {
            return f.write_str("no acceptable payment option: the upstream offered none");
        }
        f.write_str("no acceptable payment option: ")?;
        for (i, o) in self.options.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "option #{}: {}", o.index, o.reason)?;
        }
        Ok(())
    }
}
