//! `x402-router wallet approve-permit2`: lets Uniswap Permit2 move one configured token from
//! the router's wallet (ERC-20 `approve(Permit2, amount)`), for upstreams whose facilitator
//! answers 412 `permit2_allowance_required`. The only transaction the router's wallet sends
//! itself; payments are authorizations that others submit.
//!
//! Invariants:
//! - Only a network of `X402_RPC_URLS` and a token the router pays with there (`X402_ASSETS`
//!   or the built-in USDC): the command refuses anything else before touching a chain.
//! - The RPC URL answers the network's chain id before anything is signed.
//! - Every RPC call is bounded; the receipt is awaited at most `wait`; a reverted approval
//!   is an error. Messages never carry the RPC URL (it may hold an API key) or the key.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use alloy::network::EthereumWallet;
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{Provider, ProviderBuilder};
use alloy::signers::local::PrivateKeySigner;
use alloy::sol;
use serde::Serialize;
use url::Url;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::config::{self, KeyArgs};
use crate::x402::Network;

pub use crate::x402::chain::PERMIT2;

#[derive(Debug, Args)]
pub struct WalletArgs {
    #[command(subcommand)]
    pub command: WalletCommand,
}

#[derive(Debug, Subcommand)]
pub enum WalletCommand {
    /// Let Uniswap Permit2 move a configured token from the router's wallet (ERC-20
    /// `approve`), for upstreams that answer 412 `permit2_allowance_required`; waits for the
    /// receipt and prints one JSON line with the transaction hash and the new allowance.
    ApprovePermit2(ApprovePermit2Args),
}

#[derive(Debug, Args)]
pub struct ApprovePermit2Args {
    /// The network (CAIP-2 id or v1 name); it must have an RPC URL in X402_RPC_URLS.
    #[arg(long)]
    pub network: String,
    /// The token: one the router pays with on that network (X402_ASSETS, or the built-in USDC).
    #[arg(long)]
    pub asset: String,
    /// The allowance, in the token's atomic units, or `max` (2^256-1, never decremented).
    #[arg(long, default_value = "max")]
    pub amount: String,
    #[command(flatten)]
    pub key: KeyArgs,
    /// Networks and their RPC URLs: `eip155:84532=http://…,…` (the routers' setting).
    #[arg(long, env = "X402_RPC_URLS", default_value = "")]
    pub x402_rpc_urls: String,
    /// Token contracts per network (the routers' setting).
    #[arg(long, env = "X402_ASSETS", default_value = "")]
    pub x402_assets: String,
    /// Timeout of each chain RPC call, in ms.
    #[arg(long, env = "X402_RPC_TIMEOUT_MS", default_value = "5000")]
    pub x402_rpc_timeout_ms: String,
    /// How long to wait for the approval to be mined, in seconds.
    #[arg(long, default_value = "120")]
    pub wait_secs: String,
}

/// `wallet approve-permit2`: one ERC-20 `approve(Permit2, amount)` from the router's
/// wallet for a configured network and asset; prints one JSON line once it is mined.
///
/// # Errors
/// A missing or malformed setting, a network or asset the router does not pay with, or the
/// transaction failing (the RPC URL and the key are never printed).
pub async fn run(args: &WalletArgs) -> anyhow::Result<()> {
    let WalletCommand::ApprovePermit2(a) = &args.command;
    let rpc_urls = config::parse_rpc_urls(&a.x402_rpc_urls)?;
    let (assets, _, _) = config::configured_assets(&a.x402_assets, &rpc_urls)?;
    let signer = config::load_signer(&a.key)?.context("ROUTER_PRIVATE_KEY (or ROUTER_PRIVATE_KEY_FILE) is required")?;
    let timeout = config::parse_ms("X402_RPC_TIMEOUT_MS", &a.x402_rpc_timeout_ms)?;
    let wait: u64 = a.wait_secs.trim().parse().ok().filter(|w| *w > 0).context("--wait-secs: expected seconds > 0")?;
    let request = Request::parse(&a.network, &a.asset, &a.amount, &rpc_urls, &assets)?;
    crate::telemetry::init(false);
    let done = approve_permit2(&request, signer, timeout, std::time::Duration::from_secs(wait)).await?;
    println!("{}", serde_json::to_string(&done)?);
    Ok(())
}

sol! {
    #[sol(rpc)]
    interface IErc20Allowance {
        function approve(address spender, uint256 value) external returns (bool);
        function allowance(address owner, address spender) external view returns (uint256);
    }
}

/// What to approve, checked against the router's settings.
#[derive(Debug, Clone)]
pub struct Request {
    pub network: Network,
    pub asset: Address,
    pub amount: U256,
    /// The network's RPC URLs, in order of preference.
    pub urls: Vec<Url>,
}

impl Request {
    /// Parses the command's arguments and refuses a network without an RPC URL or a token the
    /// router does not pay with on it.
    ///
    /// # Errors
    /// The argument at fault, named.
    pub fn parse(
        network: &str,
        asset: &str,
        amount: &str,
        rpc_urls: &BTreeMap<Network, Vec<Url>>,
        assets: &BTreeMap<Network, Vec<Address>>,
    ) -> anyhow::Result<Self> {
        let network = Network::parse(network.trim()).map_err(|e| anyhow::anyhow!("--network: {e}"))?;
        let asset = Address::from_str(asset.trim()).map_err(|_| anyhow::anyhow!("--asset: not a 0x address"))?;
        let amount = match amount.trim() {
            "max" => U256::MAX,
            a if !a.is_empty() && a.len() <= 78 && a.bytes().all(|b| b.is_ascii_digit()) => {
                U256::from_str_radix(a, 10).map_err(|_| anyhow::anyhow!("--amount: larger than 2^256-1"))?
            }
            _ => anyhow::bail!("--amount: a decimal number of atomic units, or `max`"),
        };
        let urls = rpc_urls.get(&network).cloned().unwrap_or_default();
        anyhow::ensure!(
            !urls.is_empty(),
            "{network} has no RPC URL in X402_RPC_URLS: the router does not pay on it; refusing"
        );
        anyhow::ensure!(
            assets.get(&network).is_some_and(|list| list.contains(&asset)),
            "{} is not a token the router pays with on {network} (X402_ASSETS); refusing",
            asset.to_checksum(None)
        );
        Ok(Self { network, asset, amount, urls })
    }
}

/// What was done, printed as one JSON line.
#[derive(Debug, Clone, Serialize)]
pub struct Approved {
    pub network: String,
    pub asset: String,
    pub owner: String,
    pub spender: String,
    pub previous_allowance: String,
    pub allowance: String,
    pub tx_hash: String,
}

/// Sends `approve(Permit2, amount)` from `signer` on the first URL that serves the network,
/// waits for the receipt, and reads the allowance back.
///
/// # Errors
/// No URL serving the network's chain, an RPC failure or timeout, the approval not mined
/// within `wait`, or reverted.
pub async fn approve_permit2(
    request: &Request,
    signer: PrivateKeySigner,
    timeout: Duration,
    wait: Duration,
) -> anyhow::Result<Approved> {
    let owner = signer.address();
    let wallet = EthereumWallet::from(signer);
    let scrub = |e: &dyn std::fmt::Display| {
        let mut msg = e.to_string();
        for u in &request.urls {
            msg = msg.replace(u.as_str(), "<rpc url>").replace(u.as_str().trim_end_matches('/'), "<rpc url>");
        }
        anyhow::anyhow!("{msg}")
    };
    let mut chosen = None;
    for (i, url) in request.urls.iter().enumerate() {
        let provider = ProviderBuilder::new().wallet(wallet.clone()).connect_http(url.clone());
        match tokio::time::timeout(timeout, provider.get_chain_id()).await {
            Ok(Ok(id)) if id == request.network.chain_id() => {
                chosen = Some(provider);
                break;
            }
            Ok(Ok(id)) => tracing::warn!(endpoint = i, chain_id = id, "RPC URL serves another chain; skipped"),
            Ok(Err(e)) => tracing::warn!(endpoint = i, error = %scrub(&e), "RPC URL unreachable; skipped"),
            Err(_) => tracing::warn!(endpoint = i, "RPC URL timed out; skipped"),
        }
    }
    let provider = chosen.ok_or_else(|| anyhow::anyhow!("no RPC URL of {} serves its chain", request.network))?;
    let token = IErc20Allowance::new(request.asset, &provider);
    let allowance = async || -> anyhow::Result<U256> {
        tokio::time::timeout(timeout, token.allowance(owner, PERMIT2).call())
            .await
            .map_err(|_| anyhow::anyhow!("reading the allowance timed out"))?
            .map_err(|e| scrub(&e))
    };
    let previous = allowance().await?;
    let pending = tokio::time::timeout(timeout, token.approve(PERMIT2, request.amount).send())
        .await
        .map_err(|_| anyhow::anyhow!("sending the approval timed out"))?
        .map_err(|e| scrub(&e))?;
    let hash: B256 = *pending.tx_hash();
    let started = Instant::now();
    let receipt = loop {
        let r = tokio::time::timeout(timeout, provider.get_transaction_receipt(hash))
            .await
            .map_err(|_| anyhow::anyhow!("reading the receipt of {hash} timed out"))?
            .map_err(|e| scrub(&e))?;
        if let Some(r) = r {
            break r;
        }
        anyhow::ensure!(started.elapsed() < wait, "the approval {hash} was not mined within {wait:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    anyhow::ensure!(receipt.status(), "the approval {hash} reverted");
    let now = allowance().await?;
    tracing::info!(payment.network = %request.network, payment.asset = %request.asset, tx = %hash, "Permit2 approved");
    Ok(Approved {
        network: request.network.caip2(),
        asset: request.asset.to_checksum(None),
        owner: owner.to_checksum(None),
        spender: PERMIT2.to_checksum(None),
        previous_allowance: previous.to_string(),
        allowance: now.to_string(),
        tx_hash: hash.to_string(),
    })
}
