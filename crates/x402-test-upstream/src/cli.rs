//! Command line: `deploy` and `serve`, with their flags parsed into types at the edge.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use alloy::primitives::{Address, U256};
use alloy::signers::local::PrivateKeySigner;
use clap::{Args, Parser, Subcommand};
use url::Url;

#[derive(Debug, Parser)]
#[command(
    name = "x402-test-upstream",
    version,
    about = "Local x402 test upstream: deploys an EIP-3009 test token and serves paid routes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Deploy TestToken, PlainToken (no EIP-3009) and PermitToken (EIP-2612, no EIP-3009),
    /// install Multicall3, Permit2, the x402 Permit2 proxies and the x402 batch-settlement
    /// contracts with anvil_setCode, mint, approve Permit2 (not for PermitToken); print
    /// {"token", "plain_token", "permit_token", "chain_id"}.
    Deploy(DeployArgs),
    /// Serve x402-protected test routes; print {"listening": "HOST:PORT"} once bound.
    Serve(Box<ServeArgs>),
    /// Serve SVM (Solana) `exact` routes over a Solana RPC, settling as their own facilitator;
    /// print {"listening": "HOST:PORT"} once bound.
    ServeSvm(crate::svm::SvmServeArgs),
}

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// JSON-RPC URL of an anvil node (anvil_setCode is used).
    #[arg(long, env = "X402_TEST_RPC_URL")]
    pub rpc_url: Url,
    /// Hex private key that deploys and pays gas (anvil's dev keys are fine).
    #[arg(long, env = "X402_TEST_DEPLOYER_KEY", hide_env_values = true, value_parser = parse_key)]
    pub deployer_key: Key,
    /// Mint AMOUNT atomic units (decimal) of each token to ADDR; repeatable.
    #[arg(long = "mint", value_name = "ADDR=AMOUNT", value_parser = parse_mint)]
    pub mints: Vec<Mint>,
    /// Hex private key of a payer that approves Permit2 for both tokens (unlimited), sending
    /// the approval itself; repeatable. A payer left out has no Permit2 allowance.
    #[arg(long = "approve-permit2", value_name = "KEY", value_parser = parse_key)]
    pub approve_permit2: Vec<Key>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (printed on stdout).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// JSON-RPC URL of the chain the token lives on.
    #[arg(long, env = "X402_TEST_RPC_URL")]
    pub rpc_url: Url,
    /// The EIP-3009 token to ask payment in.
    #[arg(long)]
    pub token: Address,
    /// A token without EIP-3009 (PlainToken), asked for by `/v2/permit2?token=plain`.
    #[arg(long)]
    pub plain_token: Option<Address>,
    /// A token with EIP-2612 and without EIP-3009 (PermitToken), asked for by
    /// `/v2/permit2?token=permit` (gas sponsoring: `&gas=eip2612`).
    #[arg(long)]
    pub permit_token: Option<Address>,
    /// Who receives the payments.
    #[arg(long)]
    pub pay_to: Address,
    /// Hex private key that submits settlements and pays their gas.
    #[arg(long, env = "X402_TEST_FACILITATOR_KEY", hide_env_values = true, value_parser = parse_key)]
    pub facilitator_key: Key,
    /// Price of the ordinary paid routes, in atomic units (decimal).
    #[arg(long, default_value = "10000")]
    pub price: Amount,
    /// Price of POST /v2/echo, in atomic units (decimal).
    #[arg(long, default_value = "20000")]
    pub echo_price: Amount,
    /// CAIP-2 network the token is on (eip155:<chain id>); checked against the RPC's chain id.
    #[arg(long, default_value = "eip155:84532")]
    pub network: String,
    /// x402 v1 name of the network; derived from the chain id when it is a known one.
    #[arg(long)]
    pub network_v1: Option<String>,
    /// maxTimeoutSeconds advertised in every requirement.
    #[arg(long, default_value_t = 300)]
    pub max_timeout_seconds: u64,
    /// Timeout of each JSON-RPC call, in seconds.
    #[arg(long, default_value_t = 10)]
    pub rpc_timeout_seconds: u64,
    /// How long a settlement may take to be mined, in seconds.
    #[arg(long, default_value_t = 60)]
    pub settle_timeout_seconds: u64,
    /// actix-web worker threads.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
}

/// A secp256k1 private key. `Debug` never shows it.
#[derive(Clone)]
pub struct Key(pub PrivateKeySigner);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.0.address())
    }
}

fn parse_key(raw: &str) -> Result<Key, String> {
    PrivateKeySigner::from_str(raw.trim())
        .map(Key)
        .map_err(|_| "not a hex secp256k1 private key (32 bytes, optional 0x)".to_owned())
}

/// An amount of token in atomic units. Parsed only from plain decimal digits: money never goes
/// through a float and never accepts signs, exponents or hex.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(pub U256);

impl FromStr for Amount {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        if raw.is_empty() || raw.len() > 78 || !raw.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{raw:?} is not a decimal amount of atomic units (digits only)"));
        }
        U256::from_str_radix(raw, 10).map(Amount).map_err(|_| format!("{raw:?} does not fit in uint256"))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Clone, Debug)]
pub struct Mint {
    pub to: Address,
    pub amount: Amount,
}

fn parse_mint(raw: &str) -> Result<Mint, String> {
    let (addr, amount) = raw.split_once('=').ok_or_else(|| format!("{raw:?} is not ADDR=AMOUNT"))?;
    let to = Address::from_str(addr.trim()).map_err(|_| format!("{addr:?} is not an address"))?;
    let amount = amount.trim().parse()?;
    Ok(Mint { to, amount })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn amounts_are_plain_decimal_digits() {
        assert_eq!("10000".parse::<Amount>(), Ok(Amount(U256::from(10_000u64))));
        for bad in ["", "-1", "1.5", "1e6", "0x10", " 1", "١"] {
            assert!(bad.parse::<Amount>().is_err(), "{bad:?} must be refused");
        }
        let max = U256::MAX.to_string();
        assert_eq!(max.parse::<Amount>(), Ok(Amount(U256::MAX)));
        assert!(format!("{max}0").parse::<Amount>().is_err());
    }

    #[test]
    fn mint_takes_address_equals_amount() {
        let m = parse_mint("0x70997970C51812dc3A010C7d01b50e0d17dc79C8=1000000000").unwrap();
        assert_eq!(m.amount, Amount(U256::from(1_000_000_000u64)));
        assert!(parse_mint("0x7099=1").is_err());
        assert!(parse_mint("0x70997970C51812dc3A010C7d01b50e0d17dc79C8").is_err());
    }

    #[test]
    fn key_debug_shows_the_address_not_the_secret() {
        let key = parse_key("0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80").unwrap();
        let shown = format!("{key:?}");
        assert!(shown.contains("0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"));
        assert!(!shown.contains("ac0974"));
    }
}
