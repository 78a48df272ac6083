//! `deploy`: TestToken, TestToken18 (18 decimals; minted 10^12 times each `--mint` amount, the
//! same value) and PlainToken (an ERC-20 without EIP-3009) from the embedded fixtures;
//! Multicall3, Permit2, the two x402 Permit2 proxies and the x402 batch-settlement channel
//! contract with its two deposit collectors via `anvil_setCode` at their canonical addresses; then mints both tokens, and approves Permit2 for both from each
//! `--approve-permit2` key.
//! Prints one JSON line `{"token": "0x…", "token18": "0x…", "plain_token": "0x…", "chain_id": N}`
//! on stdout.

use std::io::Write;
use std::time::Duration;

use alloy::network::TransactionBuilder;
use alloy::rpc::types::TransactionRequest;
use alloy::sol_types::SolCall;
use anyhow::{Context, bail};

use crate::chain::{Chain, ITestToken};
use crate::cli::DeployArgs;
use crate::fixtures;

/// The one line printed on stdout (field order as documented).
#[derive(serde::Serialize)]
struct Deployed {
    token: String,
    token18: String,
    plain_token: String,
    permit_token: String,
    chain_id: u64,
}

const RPC_TIMEOUT: Duration = Duration::from_secs(10);
const MINE_TIMEOUT: Duration = Duration::from_secs(60);

pub async fn run(args: DeployArgs) -> anyhow::Result<()> {
    let chain = Chain::connect(args.rpc_url.clone(), args.deployer_key.0, RPC_TIMEOUT);
    let chain_id = chain.chain_id().await.with_context(|| format!("cannot reach the chain at {}", args.rpc_url))?;

    let token = deploy(&chain, fixtures::test_token_creation_code()?, "TestToken").await?;
    tracing::info!(%token, chain_id, deployer = %chain.sender(), "TestToken deployed");
    let token18 = deploy(&chain, fixtures::test_token18_creation_code()?, "TestToken18").await?;
    tracing::info!(%token18, "TestToken18 (18 decimals) deployed");
    let plain_token = deploy(&chain, fixtures::plain_token_creation_code()?, "PlainToken").await?;
    tracing::info!(%plain_token, "PlainToken (no EIP-3009) deployed");
    let permit_token = deploy(&chain, fixtures::permit_token_creation_code()?, "PermitToken").await?;
    tracing::info!(%permit_token, "PermitToken (EIP-2612, no EIP-3009) deployed");

    chain
        .set_code(fixtures::MULTICALL3, fixtures::multicall_runtime_code()?)
        .await
        .context("installing Multicall3 (is this an anvil node?)")?;
    tracing::info!(address = %fixtures::MULTICALL3, "Multicall3 installed");

    for (address, code) in fixtures::permit2_runtime_codes()? {
        chain.set_code(address, code).await.with_context(|| format!("installing code at {address}"))?;
    }
    tracing::info!(permit2 = %crate::permit2::PERMIT2, "Permit2 and the x402 Permit2 proxies installed");

    for (address, code) in fixtures::batch_settlement_runtime_codes()? {
        chain.set_code(address, code).await.with_context(|| format!("installing code at {address}"))?;
    }
    tracing::info!(
        settlement = %fixtures::BATCH_SETTLEMENT,
        "the batch-settlement channel contract and its deposit collectors installed"
    );

    for asset in [token, plain_token] {
        for mint in &args.mints {
            let call = ITestToken::mintCall { to: mint.to, value: mint.amount.0 };
            chain
                .send_and_confirm(
                    TransactionRequest::default().with_to(asset).with_input(call.abi_encode()),
                    MINE_TIMEOUT,
                )
                .await
                .with_context(|| format!("minting {} of {asset} to {}", mint.amount, mint.to))?;
            tracing::info!(%asset, to = %mint.to, amount = %mint.amount, "minted");
        }
        for key in &args.approve_permit2 {
            let payer = Chain::connect(args.rpc_url.clone(), key.0.clone(), RPC_TIMEOUT);
            crate::permit2::approve_permit2(&payer, asset, MINE_TIMEOUT)
                .await
                .with_context(|| format!("approving Permit2 for {asset} from {}", payer.sender()))?;
            tracing::info!(%asset, payer = %payer.sender(), "Permit2 approved");
        }
    }

    mint_unapproved(&chain, &args.mints, permit_token, token18).await?;

    let line = serde_json::to_string(&Deployed {
        token: token.to_checksum(None),
        token18: token18.to_checksum(None),
        plain_token: plain_token.to_checksum(None),
        permit_token: permit_token.to_checksum(None),
        chain_id,
    })?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()?;
    Ok(())
}

/// Deploys `creation` (no constructor arguments): the contract's address.
async fn deploy(
    chain: &Chain,
    creation: alloy::primitives::Bytes,
    name: &str,
) -> anyhow::Result<alloy::primitives::Address> {
    let receipt = chain
        .send_and_confirm(TransactionRequest::default().with_deploy_code(creation), MINE_TIMEOUT)
        .await
        .with_context(|| format!("deploying {name}"))?;
    let Some(address) = receipt.contract_address else {
        bail!("the deployment receipt {} of {name} has no contract address", receipt.transaction_hash);
    };
    Ok(address)
}

/// Mints PermitToken and TestToken18 to every `--mint` recipient, approving nothing:
/// PermitToken's payers grant the allowance by an EIP-2612 permit (gas sponsoring), and
/// TestToken18 is paid with EIP-3009. TestToken18 gets the same value as TestToken.
async fn mint_unapproved(
    chain: &Chain,
    mints: &[crate::cli::Mint],
    permit_token: alloy::primitives::Address,
    token18: alloy::primitives::Address,
) -> anyhow::Result<()> {
    let scale = alloy::primitives::U256::from(10u64.pow(12));
    for (asset, factor) in [(permit_token, alloy::primitives::U256::from(1u8)), (token18, scale)] {
        for mint in mints {
            let value = mint.amount.0.saturating_mul(factor);
            let call = ITestToken::mintCall { to: mint.to, value };
            chain
                .send_and_confirm(
                    TransactionRequest::default().with_to(asset).with_input(call.abi_encode()),
                    MINE_TIMEOUT,
                )
                .await
                .with_context(|| format!("minting {value} of {asset} to {}", mint.to))?;
        }
    }
    Ok(())
}
