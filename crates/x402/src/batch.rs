//! The x402 `batch-settlement` scheme on EVM, payer side: the channel's configuration and id,
//! the cumulative voucher (EIP-712 over `(channelId, maxClaimableAmount)`), the deposit's
//! EIP-3009 `ReceiveWithAuthorization` to the deposit collector, and the payloads the
//! official server reads (`type: "deposit"` or `type: "voucher"`).
//!
//! Invariants:
//! - The channel id is the EIP-712 hash of the [`ChannelConfig`] under the settlement
//!   contract's domain (`x402 Batch Settlement`, version `1`, the network's chain id): it binds
//!   the payer, the payee, the token, the receiver authorizer, the withdraw delay and the salt.
//! - A voucher's `maxClaimableAmount` is cumulative: each one replaces the previous; the
//!   payer's exposure on a channel is the highest ceiling it ever signed.
//! - The deposit's ERC-3009 nonce is `keccak256(abi.encode(channelId, salt))`: one deposit
//!   authorization of a salt moves money at most once.
//! - Amounts travel as decimal strings; signatures as 0x-hex `r ‖ s ‖ v`.

use alloy::primitives::{Address, B256, Signature, U256, address, keccak256};
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol;
use alloy::sol_types::{Eip712Domain, SolStruct, SolValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The scheme's name in a 402's `accepts`.
pub const SCHEME: &str = "batch-settlement";
/// The settlement contract (the same address on every chain).
pub const SETTLEMENT: Address = address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");
/// The EIP-3009 deposit collector.
pub const ERC3009_DEPOSIT_COLLECTOR: Address = address!("0x4020806089470a89826cB9fB1f4059150b550004");
/// The smallest withdraw delay the contract accepts (seconds), and the default when a 402
/// names none.
pub const MIN_WITHDRAW_DELAY: u64 = 900;
/// The server's refusal of a voucher whose base is not its charged total (a corrective 402).
pub const ERR_CUMULATIVE_MISMATCH: &str = "invalid_batch_settlement_evm_cumulative_amount_mismatch";
/// The server's refusal of a voucher below what was claimed on-chain (a corrective 402).
pub const ERR_CUMULATIVE_BELOW_CLAIMED: &str = "invalid_batch_settlement_evm_cumulative_below_claimed";

sol! {
    /// A channel's immutable configuration; its EIP-712 hash is the channel id.
    #[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
    struct ChannelConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }

    /// A cumulative voucher.
    #[derive(Debug, PartialEq, Eq)]
    struct Voucher {
        bytes32 channelId;
        uint128 maxClaimableAmount;
    }

    /// EIP-3009 `ReceiveWithAuthorization` (the collector pulls the deposit).
    #[derive(Debug, PartialEq, Eq)]
    struct ReceiveWithAuthorization {
        address from;
        address to;
        uint256 value;
        uint256 validAfter;
        uint256 validBefore;
        bytes32 nonce;
    }

    /// The settlement contract's reads, and the payer's timed withdrawal (the one transaction
    /// the router's wallet sends to it).
    #[sol(rpc)]
    interface IBatchSettlement {
        function channels(bytes32 channelId) external view returns (uint128 balance, uint128 totalClaimed);
        function pendingWithdrawals(bytes32 channelId) external view returns (uint128 amount, uint40 initiatedAt);
        function initiateWithdraw(ChannelConfig config, uint128 amount) external;
        function finalizeWithdraw(ChannelConfig config) external;
    }
}

/// U256 as a decimal string.
mod dec {
    use alloy::primitives::U256;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &U256, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&v.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<U256, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(serde::de::Error::custom("not a decimal amount"));
        }
        U256::from_str_radix(&s, 10).map_err(serde::de::Error::custom)
    }
}

/// Why a batch payment could not be signed or a stored one not read.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The signer failed.
    #[error("signing failed: {0}")]
    Signer(#[from] alloy::signers::Error),
    /// An amount does not fit the contract's `uint128`.
    #[error("amount {0} does not fit in 128 bits")]
    Overflow(U256),
    /// A stored or received value does not read.
    #[error("{0}")]
    Malformed(String),
}

/// The settlement contract's EIP-712 domain on `chain_id`.
#[must_use]
pub fn domain(chain_id: u64) -> Eip712Domain {
    alloy::sol_types::eip712_domain! {
        name: "x402 Batch Settlement",
        version: "1",
        chain_id: chain_id,
        verifying_contract: SETTLEMENT,
    }
}

/// The channel configuration of a payer (its own authorizer) for one offer and one lane salt.
#[must_use]
pub fn channel_config(
    payer: Address,
    (receiver, receiver_authorizer, token): (Address, Address, Address),
    withdraw_delay: u64,
    salt: B256,
) -> ChannelConfig {
    ChannelConfig {
        payer,
        payerAuthorizer: payer,
        receiver,
        receiverAuthorizer: receiver_authorizer,
        token,
        withdrawDelay: alloy::primitives::aliases::U40::saturating_from(withdraw_delay),
        salt,
    }
}

/// The channel id of `config` on `chain_id`.
#[must_use]
pub fn channel_id(config: &ChannelConfig, chain_id: u64) -> B256 {
    config.eip712_signing_hash(&domain(chain_id))
}

/// The channel's configuration as the payload carries it (checksummed addresses, the delay as
/// a number).
#[must_use]
pub fn config_json(config: &ChannelConfig) -> Value {
    json!({
        "payer": config.payer.to_checksum(None),
        "payerAuthorizer": config.payerAuthorizer.to_checksum(None),
        "receiver": config.receiver.to_checksum(None),
        "receiverAuthorizer": config.receiverAuthorizer.to_checksum(None),
        "token": config.token.to_checksum(None),
        "withdrawDelay": config.withdrawDelay.to::<u64>(),
        "salt": config.salt.to_string(),
    })
}

fn u128_of(v: U256) -> Result<u128, BatchError> {
    u128::try_from(v).map_err(|_| BatchError::Overflow(v))
}

/// A signed voucher: the channel, its cumulative ceiling and the payer's signature.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedVoucher {
    #[serde(rename = "channelId")]
    pub channel_id: B256,
    #[serde(rename = "maxClaimableAmount", with = "dec")]
    pub max_claimable: U256,
    pub signature: String,
}

/// Signs the voucher `(channel_id, max_claimable)` on `chain_id`.
///
/// # Errors
/// [`BatchError`] when the ceiling overflows or the signer fails.
pub fn sign_voucher(
    signer: &PrivateKeySigner,
    chain_id: u64,
    channel_id: B256,
    max_claimable: U256,
) -> Result<SignedVoucher, BatchError> {
    let voucher = Voucher { channelId: channel_id, maxClaimableAmount: u128_of(max_claimable)? };
    let sig = signer.sign_hash_sync(&voucher.eip712_signing_hash(&domain(chain_id)))?;
    Ok(SignedVoucher { channel_id, max_claimable, signature: alloy::primitives::hex::encode_prefixed(sig.as_bytes()) })
}

/// The address that signed a voucher (`voucherState` in a corrective 402).
///
/// # Errors
/// [`BatchError::Malformed`] when the signature does not read or recover.
pub fn voucher_signer(
    chain_id: u64,
    channel_id: B256,
    max_claimable: U256,
    signature: &str,
) -> Result<Address, BatchError> {
    let bytes = alloy::primitives::hex::decode(signature).map_err(|e| BatchError::Malformed(e.to_string()))?;
    let sig = Signature::try_from(bytes.as_slice()).map_err(|e| BatchError::Malformed(e.to_string()))?;
    let voucher = Voucher { channelId: channel_id, maxClaimableAmount: u128_of(max_claimable)? };
    sig.recover_address_from_prehash(&voucher.eip712_signing_hash(&domain(chain_id)))
        .map_err(|e| BatchError::Malformed(e.to_string()))
}

/// The ERC-3009 nonce of a deposit into `channel_id` with `salt`.
#[must_use]
pub fn deposit_nonce(channel_id: B256, salt: U256) -> B256 {
    keccak256((channel_id, salt).abi_encode())
}

/// A signed deposit authorization (to the collector), as recorded and sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedDeposit {
    #[serde(with = "dec")]
    pub amount: U256,
    #[serde(with = "dec")]
    pub salt: U256,
    #[serde(rename = "validBefore")]
    pub valid_before: u64,
    pub nonce: B256,
    pub signature: String,
}

/// The token's EIP-712 domain and the deposit's terms.
pub struct DepositTerms<'a> {
    pub chain_id: u64,
    pub token: Address,
    pub token_name: &'a str,
    pub token_version: &'a str,
    pub amount: U256,
    pub valid_before: u64,
}

/// Signs the deposit of `terms.amount` into `channel_id` with `salt` (the request's nonce).
///
/// # Errors
/// [`BatchError`] when the signer fails.
pub fn sign_deposit(
    signer: &PrivateKeySigner,
    terms: &DepositTerms<'_>,
    channel_id: B256,
    salt: U256,
) -> Result<SignedDeposit, BatchError> {
    let nonce = deposit_nonce(channel_id, salt);
    let message = ReceiveWithAuthorization {
        from: signer.address(),
        to: ERC3009_DEPOSIT_COLLECTOR,
        value: terms.amount,
        validAfter: U256::ZERO,
        validBefore: U256::from(terms.valid_before),
        nonce,
    };
    let domain = Eip712Domain::new(
        Some(terms.token_name.to_owned().into()),
        Some(terms.token_version.to_owned().into()),
        Some(U256::from(terms.chain_id)),
        Some(terms.token),
        None,
    );
    let sig = signer.sign_hash_sync(&message.eip712_signing_hash(&domain))?;
    Ok(SignedDeposit {
        amount: terms.amount,
        salt,
        valid_before: terms.valid_before,
        nonce,
        signature: alloy::primitives::hex::encode_prefixed(sig.as_bytes()),
    })
}

/// The payload of a cooperative refund (`type: "refund"`): a voucher at the server's charged
/// total (never above a ceiling already signed) asks it to claim that and return the rest.
#[must_use]
pub fn refund_payload_json(config: &ChannelConfig, voucher: &SignedVoucher) -> Value {
    json!({
        "type": "refund",
        "channelConfig": config_json(config),
        "voucher": {
            "channelId": voucher.channel_id.to_string(),
            "maxClaimableAmount": voucher.max_claimable.to_string(),
            "signature": voucher.signature,
        },
    })
}

/// The scheme payload: a deposit with its first voucher, or a voucher alone.
#[must_use]
pub fn payload_json(config: &ChannelConfig, voucher: &SignedVoucher, deposit: Option<&SignedDeposit>) -> Value {
    let voucher = json!({
        "channelId": voucher.channel_id.to_string(),
        "maxClaimableAmount": voucher.max_claimable.to_string(),
        "signature": voucher.signature,
    });
    match deposit {
        Some(d) => json!({
            "type": "deposit",
            "channelConfig": config_json(config),
            "voucher": voucher,
            "deposit": {
                "amount": d.amount.to_string(),
                "authorization": { "erc3009Authorization": {
                    "validAfter": "0",
                    "validBefore": d.valid_before.to_string(),
                    "salt": format!("0x{:064x}", d.salt),
                    "signature": d.signature,
                } },
            },
        }),
        None => json!({ "type": "voucher", "channelConfig": config_json(config), "voucher": voucher }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_voucher_recovers_to_its_signer_and_binds_its_ceiling() {
        let signer = PrivateKeySigner::random();
        let id = B256::repeat_byte(9);
        let v = sign_voucher(&signer, 84532, id, U256::from(3000u64)).unwrap();
        assert_eq!(voucher_signer(84532, id, U256::from(3000u64), &v.signature).unwrap(), signer.address());
        assert_ne!(voucher_signer(84532, id, U256::from(3001u64), &v.signature).unwrap(), signer.address());
        assert_ne!(voucher_signer(8453, id, U256::from(3000u64), &v.signature).unwrap(), signer.address());
    }

    #[test]
    fn the_deposit_nonce_is_bound_to_channel_and_salt() {
        let a = deposit_nonce(B256::repeat_byte(1), U256::from(1u8));
        assert_ne!(a, deposit_nonce(B256::repeat_byte(2), U256::from(1u8)));
        assert_ne!(a, deposit_nonce(B256::repeat_byte(1), U256::from(2u8)));
    }
}
