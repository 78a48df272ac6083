//! The x402 `batch-settlement` contracts on the tests' chain (issue 40, the chain side): the
//! `Devnet` has the project's channel contract and deposit collectors at the canonical addresses
//! the official packages call, and the EIP-712 hashes alloy computes (what the router will sign)
//! are the ones the contract verifies. The contracts' behaviour is tested in
//! interop/batch-settlement.test.mjs; the official packages run against them in scripts/interop.

use alloy::primitives::{Address, B256, Bytes, address};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol;
use alloy::sol_types::{SolCall, SolStruct, eip712_domain};
use serde_json::json;

use crate::helpers::*;

const SETTLEMENT: Address = address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");
const ERC3009_DEPOSIT_COLLECTOR: Address = address!("0x4020806089470a89826cB9fB1f4059150b550004");
const PERMIT2_DEPOSIT_COLLECTOR: Address = address!("0x4020425FAf3B746C082C2f942b4E5159887B0005");
const MULTICALL3: Address = address!("0xcA11bde05977b3631167028862bE2a173976CA11");
/// anvil #3: a receiver authorizer with no other role here.
const RECEIVER_AUTHORIZER: Address = address!("0x90F79bf6EB2c4f870365E785982E1f101E93b906");

sol! {
    struct ChannelConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }
    struct Voucher { bytes32 channelId; uint128 maxClaimableAmount; }
    interface IBatchSettlement {
        function getChannelId(ChannelConfig config) external view returns (bytes32);
        function getVoucherDigest(bytes32 channelId, uint128 maxClaimableAmount) external view returns (bytes32);
    }
}

async fn call<C: SolCall>(chain: &Devnet, to: Address, call: C) -> C::Return {
    let answer = chain.rpc("eth_call", json!([{ "to": to, "data": Bytes::from(call.abi_encode()) }, "latest"])).await;
    let bytes: Bytes = serde_json::from_value(answer).unwrap();
    C::abi_decode_returns(&bytes).unwrap()
}

#[tokio::test]
async fn the_devnet_has_the_batch_settlement_contracts_and_they_verify_what_alloy_signs() {
    let chain = Devnet::start().await;
    for at in [SETTLEMENT, ERC3009_DEPOSIT_COLLECTOR, PERMIT2_DEPOSIT_COLLECTOR, MULTICALL3] {
        let code = chain.rpc("eth_getCode", json!([at, "latest"])).await;
        assert!(code.as_str().unwrap().len() > 200, "no code at {at}: {code}");
    }

    let domain = eip712_domain! {
        name: "x402 Batch Settlement",
        version: "1",
        chain_id: 84532,
        verifying_contract: SETTLEMENT,
    };
    let config = ChannelConfig {
        payer: ROUTER_ADDRESS,
        payerAuthorizer: ROUTER_ADDRESS,
        receiver: PAY_TO,
        receiverAuthorizer: RECEIVER_AUTHORIZER,
        token: chain.token,
        withdrawDelay: alloy::primitives::aliases::U40::from(900u64),
        salt: B256::repeat_byte(7),
    };
    let channel_id = call(&chain, SETTLEMENT, IBatchSettlement::getChannelIdCall { config: config.clone() }).await;
    assert_eq!(channel_id, config.eip712_signing_hash(&domain), "the channel id is the config's EIP-712 hash");
    let other_chain = eip712_domain! {
        name: "x402 Batch Settlement", version: "1", chain_id: 8453, verifying_contract: SETTLEMENT,
    };
    assert_ne!(channel_id, config.eip712_signing_hash(&other_chain), "the id is bound to the chain");

    let voucher = Voucher { channelId: channel_id, maxClaimableAmount: 30_000 };
    let digest = call(
        &chain,
        SETTLEMENT,
        IBatchSettlement::getVoucherDigestCall { channelId: channel_id, maxClaimableAmount: 30_000 },
    )
    .await;
    assert_eq!(digest, voucher.eip712_signing_hash(&domain));
    let signer: PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let signature = signer.sign_hash_sync(&digest).unwrap();
    assert_eq!(signature.recover_address_from_prehash(&digest).unwrap(), ROUTER_ADDRESS);
}
