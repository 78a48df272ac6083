//! The compiled contracts, embedded at build time from the committed fixtures that
//! `scripts/compile-contracts` writes (and checks with `--check`).

use alloy::primitives::{Address, Bytes, address};
use serde::Deserialize;

/// Where Multicall3 lives on every chain that has it; the official x402 facilitator calls it there.
pub const MULTICALL3: Address = address!("0xcA11bde05977b3631167028862bE2a173976CA11");

const TEST_TOKEN_JSON: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/TestToken.json"));
const TEST_TOKEN18_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/TestToken18.json"));
const PLAIN_TOKEN_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/PlainToken.json"));
const PERMIT_TOKEN_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/PermitToken.json"));
const MULTICALL_JSON: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/Multicall.json"));
const PERMIT2_JSON: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/Permit2.json"));
const EXACT_PROXY_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/X402ExactPermit2Proxy.json"));
const UPTO_PROXY_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/X402UptoPermit2Proxy.json"));
const BATCH_SETTLEMENT_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/X402BatchSettlement.json"));
const ERC3009_COLLECTOR_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/ERC3009DepositCollector.json"));
const PERMIT2_COLLECTOR_JSON: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/Permit2DepositCollector.json"));

/// Where the x402 `batch-settlement` scheme's contracts live (the addresses the official
/// `@x402/evm` packages call): the channel contract and its two deposit collectors.
pub const BATCH_SETTLEMENT: Address = address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");
pub const ERC3009_DEPOSIT_COLLECTOR: Address = address!("0x4020806089470a89826cB9fB1f4059150b550004");
pub const PERMIT2_DEPOSIT_COLLECTOR: Address = address!("0x4020425FAf3B746C082C2f942b4E5159887B0005");

#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error("fixture {name} is not valid JSON of the expected shape")]
    Json {
        name: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("fixture {name} has empty {field}")]
    Empty { name: &'static str, field: &'static str },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Artifact {
    bytecode: Bytes,
    deployed_bytecode: Bytes,
}

fn artifact(name: &'static str, json: &str) -> Result<Artifact, FixtureError> {
    let artifact: Artifact = serde_json::from_str(json).map_err(|source| FixtureError::Json { name, source })?;
    if artifact.bytecode.is_empty() {
        return Err(FixtureError::Empty { name, field: "bytecode" });
    }
    if artifact.deployed_bytecode.is_empty() {
        return Err(FixtureError::Empty { name, field: "deployedBytecode" });
    }
    Ok(artifact)
}

/// Creation code of TestToken (its constructor takes no arguments).
pub fn test_token_creation_code() -> Result<Bytes, FixtureError> {
    artifact("TestToken.json", TEST_TOKEN_JSON).map(|a| a.bytecode)
}

/// Creation code of TestToken18, TestToken with 18 decimals (no constructor arguments).
///
/// # Errors
/// A fixture that does not parse.
pub fn test_token18_creation_code() -> Result<Bytes, FixtureError> {
    artifact("TestToken18.json", TEST_TOKEN18_JSON).map(|a| a.bytecode)
}

/// Creation code of PermitToken, an ERC-20 with EIP-2612 `permit` and without EIP-3009 (no
/// constructor arguments).
///
/// # Errors
/// A fixture that does not parse.
pub fn permit_token_creation_code() -> Result<Bytes, FixtureError> {
    artifact("PermitToken.json", PERMIT_TOKEN_JSON).map(|a| a.bytecode)
}

/// Creation code of PlainToken, an ERC-20 without EIP-3009 (no constructor arguments).
pub fn plain_token_creation_code() -> Result<Bytes, FixtureError> {
    artifact("PlainToken.json", PLAIN_TOKEN_JSON).map(|a| a.bytecode)
}

/// Runtime code of the Multicall fixture, for `anvil_setCode` (it has no constructor state).
pub fn multicall_runtime_code() -> Result<Bytes, FixtureError> {
    artifact("Multicall.json", MULTICALL_JSON).map(|a| a.deployed_bytecode)
}

/// Runtime code of our Permit2, the exact proxy and the upto proxy, with the canonical
/// address of each, for `anvil_setCode` (none has constructor state).
pub fn permit2_runtime_codes() -> Result<[(Address, Bytes); 3], FixtureError> {
    Ok([
        (crate::permit2::PERMIT2, artifact("Permit2.json", PERMIT2_JSON)?.deployed_bytecode),
        (crate::permit2::EXACT_PROXY, artifact("X402ExactPermit2Proxy.json", EXACT_PROXY_JSON)?.deployed_bytecode),
        (crate::permit2::UPTO_PROXY, artifact("X402UptoPermit2Proxy.json", UPTO_PROXY_JSON)?.deployed_bytecode),
    ])
}

/// Runtime code of our batch-settlement channel contract and its EIP-3009 and Permit2 deposit
/// collectors, with the canonical address of each, for `anvil_setCode` (none has constructor
/// state; the collectors name the channel contract and Permit2 by those addresses).
pub fn batch_settlement_runtime_codes() -> Result<[(Address, Bytes); 3], FixtureError> {
    Ok([
        (BATCH_SETTLEMENT, artifact("X402BatchSettlement.json", BATCH_SETTLEMENT_JSON)?.deployed_bytecode),
        (
            ERC3009_DEPOSIT_COLLECTOR,
            artifact("ERC3009DepositCollector.json", ERC3009_COLLECTOR_JSON)?.deployed_bytecode,
        ),
        (
            PERMIT2_DEPOSIT_COLLECTOR,
            artifact("Permit2DepositCollector.json", PERMIT2_COLLECTOR_JSON)?.deployed_bytecode,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_fixtures_parse() {
        assert!(test_token_creation_code().unwrap().len() > 100);
        assert!(test_token18_creation_code().unwrap().len() > 100);
        assert!(plain_token_creation_code().unwrap().len() > 100);
        assert!(multicall_runtime_code().unwrap().len() > 100);
        assert!(permit2_runtime_codes().unwrap().iter().all(|(_, code)| code.len() > 100));
        assert!(batch_settlement_runtime_codes().unwrap().iter().all(|(_, code)| code.len() > 100));
    }
}
