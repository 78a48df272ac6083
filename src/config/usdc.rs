//! Circle's USDC on EVM networks, built in: the default `X402_ASSETS`, and the asset whose
//! decimals are known without asking the chain.

use std::str::FromStr;

use alloy::primitives::Address;

use crate::x402::Network;

/// USDC as deployed by Circle: the default `X402_ASSETS`.
pub const DEFAULT_ASSETS: &str = "eip155:8453=0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913,\
eip155:84532=0x036CbD53842c5426634e7929541eC2318f3dCF7e";

/// Circle's USDC (EIP-3009, 6 decimals) by chain id: the asset paid on a network of
/// `X402_RPC_URLS` for which `X402_ASSETS` names none, and assets whose decimals are known
/// without asking the chain. From `DEFAULT_ASSETS` of the official `@x402/evm` 2.27.0 (OP
/// Mainnet, which that table lacks: Circle's list of USDC contract addresses).
pub const BUILT_IN_USDC: [(u64, &str); 8] = [
    (8453, "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"),    // Base
    (84_532, "0x036CbD53842c5426634e7929541eC2318f3dCF7e"),  // Base Sepolia
    (1, "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"),       // Ethereum
    (137, "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359"),     // Polygon PoS
    (42_161, "0xaf88d065e77c8cC2239327C5EDb3A432268e5831"),  // Arbitrum One
    (421_614, "0x75faf114eafb1BDbe2F0316DF893fd58CE46AA4d"), // Arbitrum Sepolia
    (10, "0x0b2C639c533813f4Aa9D7837CAf62653d097Ff85"),      // OP Mainnet
    (43_114, "0xB97EF9Ef8734C71904D8002F8b6Bc66Dd9c48a6E"),  // Avalanche C-Chain
];
/// Decimals of every built-in USDC.
pub const USDC_DECIMALS: u8 = 6;

/// The built-in USDC of `network`, if it has one.
pub fn built_in_usdc(network: Network) -> Option<Address> {
    BUILT_IN_USDC.iter().find(|(id, _)| *id == network.chain_id()).and_then(|(_, a)| Address::from_str(a).ok())
}
