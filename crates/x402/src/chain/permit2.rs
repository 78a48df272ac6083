//! On-chain checks of Permit2 payments: whether a Permit2 nonce is used (`nonceBitmap`), and
//! which transaction used it and how much it moved.
//!
//! Permit2 emits no event when a signature transfer consumes a nonce; the proof that a
//! transaction consumed *this* authorization is: it succeeded, it is a call to the x402 proxy
//! the authorization names as spender, and its calldata is that proxy's `settle` with this
//! owner, token, recipient and nonce (Permit2 reverts on a used nonce, so a successful call
//! used it). The amount moved is the sum of the token's `Transfer(payer → payTo)` logs of that
//! transaction — never an upstream's claim. An upstream's claimed hash is only a hint.

use alloy::primitives::{Address, B256, U256};
use alloy::providers::Provider;
use alloy::rpc::types::{Filter, TransactionTrait};
use alloy::sol;
use alloy::sol_types::{SolCall, SolEvent};

use super::{Chain, ChainError, LOG_LOOKBACK_BLOCKS};
use crate::network::Network;

/// Uniswap Permit2, at the same address on every EVM chain (CREATE2).
pub const PERMIT2: Address = alloy::primitives::address!("0x000000000022D473030F116dDEE9F6B43aC78BA3");

sol! {
    /// Permit2's unordered-nonce bitmap.
    #[sol(rpc)]
    interface IPermit2Nonces {
        function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);
    }

    /// What gas sponsoring reads of a token: the Permit2 allowance and EIP-2612's nonce and
    /// domain.
    #[sol(rpc)]
    interface IErc20Permit {
        function allowance(address owner, address spender) external view returns (uint256);
        function nonces(address owner) external view returns (uint256);
        function DOMAIN_SEPARATOR() external view returns (bytes32);
    }

    /// ERC-20 `Transfer`.
    interface IErc20Transfer {
        event Transfer(address indexed from, address indexed to, uint256 value);
    }

    /// Permit2's `PermitTransferFrom` as the proxies take it.
    struct ProxyTokenPermissions { address token; uint256 amount; }
    struct ProxyPermitTransferFrom { ProxyTokenPermissions permitted; uint256 nonce; uint256 deadline; }
    struct ExactProxyWitness { address to; uint256 validAfter; }
    struct UptoProxyWitness { address to; address facilitator; uint256 validAfter; }

    /// The x402 exact Permit2 proxy's `settle`.
    interface IExactProxySettle {
        function settle(ProxyPermitTransferFrom permit, address owner, ExactProxyWitness witness, bytes signature) external;
    }

    /// The x402 upto Permit2 proxy's `settle`.
    interface IUptoProxySettle {
        function settle(ProxyPermitTransferFrom permit, uint256 amount, address owner, UptoProxyWitness witness, bytes signature) external;
    }

    /// The EIP-2612 permit the proxies' `settleWithPermit` submits first (gas sponsoring).
    struct ProxyEip2612Permit { uint256 value; uint256 deadline; bytes32 r; bytes32 s; uint8 v; }

    /// The x402 exact Permit2 proxy's `settleWithPermit` (`eip2612GasSponsoring`).
    interface IExactProxySettleWithPermit {
        function settleWithPermit(ProxyEip2612Permit permit2612, ProxyPermitTransferFrom permit, address owner, ExactProxyWitness witness, bytes signature) external;
    }

    /// The x402 upto Permit2 proxy's `settleWithPermit`.
    interface IUptoProxySettleWithPermit {
        function settleWithPermit(ProxyEip2612Permit permit2612, ProxyPermitTransferFrom permit, uint256 amount, address owner, UptoProxyWitness witness, bytes signature) external;
    }
}

/// Most candidate transactions examined when searching the logs.
const MAX_CANDIDATES: usize = 32;

/// The transaction that used a Permit2 authorization, and what it moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit2Settlement {
    /// The settling transaction.
    pub tx_hash: B256,
    /// Sum of the token's `Transfer(payer → payTo)` logs in it.
    pub transferred: U256,
}

/// What a Permit2 authorization allows, as the chain checks need it (plain data: this module
/// names nothing that signs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit2Terms {
    /// Network.
    pub network: Network,
    /// Owner of the tokens (the payer).
    pub owner: Address,
    /// Token contract.
    pub token: Address,
    /// Recipient (the witness's `to`).
    pub pay_to: Address,
    /// The x402 proxy named as spender.
    pub spender: Address,
    /// Permit2 nonce.
    pub nonce: U256,
    /// upto: the facilitator in the witness (None: exact).
    pub facilitator: Option<Address>,
}

impl Permit2Terms {
    /// The terms of a stored Permit2 record (the ledger's `signed_authorization`:
    /// `{"network", "permit2Authorization": {from, permitted: {token}, spender, nonce,
    /// witness: {to, facilitator?}}}`), read as plain data, without its signature. `None` for
    /// any other record (an EIP-3009 one) or an unreadable field.
    pub fn from_record(record: &serde_json::Value) -> Option<Self> {
        use std::str::FromStr;
        let a = record.get("permit2Authorization")?;
        fn text(v: Option<&serde_json::Value>) -> Option<&str> {
            v.and_then(serde_json::Value::as_str)
        }
        let address = |v: Option<&serde_json::Value>| Address::from_str(text(v)?).ok();
        let witness = a.get("witness")?;
        let facilitator = match witness.get("facilitator") {
            None => None,
            some => Some(address(some)?),
        };
        Some(Self {
            network: Network::parse(text(record.get("network"))?).ok()?,
            owner: address(a.get("from"))?,
            token: address(a.get("permitted").and_then(|p| p.get("token")))?,
            pay_to: address(witness.get("to"))?,
            spender: address(a.get("spender"))?,
            nonce: U256::from_str_radix(text(a.get("nonce"))?, 10).ok()?,
            facilitator,
        })
    }
}

/// `(wordPos, bit)` of a Permit2 unordered nonce.
pub fn nonce_position(nonce: U256) -> (U256, usize) {
    let bit = usize::try_from(nonce & U256::from(0xffu8)).unwrap_or(0);
    (nonce >> 8usize, bit)
}

impl Chain {
    /// True when Permit2's nonce bitmap has `nonce` of `owner` set (used, or invalidated).
    ///
    /// # Errors
    /// As [`Chain::authorization_state`]; [`ChainError::NoContract`] when there is no Permit2
    /// on the network.
    pub async fn permit2_nonce_used(&self, network: Network, owner: Address, nonce: U256) -> Result<bool, ChainError> {
        let endpoint = self.endpoint(network)?;
        let (word, bit) = nonce_position(nonce);
        let permit2 = IPermit2Nonces::new(PERMIT2, &endpoint.provider);
        let call = permit2.nonceBitmap(owner, word);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(bitmap) => Ok(bitmap.bit(bit)),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: PERMIT2 }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The token's `allowance(owner, PERMIT2)`.
    ///
    /// # Errors
    /// As [`Chain::authorization_state`].
    pub async fn permit2_allowance(
        &self,
        network: Network,
        asset: Address,
        owner: Address,
    ) -> Result<U256, ChainError> {
        let endpoint = self.endpoint(network)?;
        let token = IErc20Permit::new(asset, &endpoint.provider);
        let call = token.allowance(owner, PERMIT2);
        match self.bounded(endpoint, network, call.call()).await? {
            Ok(v) => Ok(v),
            Err(alloy::contract::Error::ZeroData(..)) => Err(ChainError::NoContract { network, address: asset }),
            Err(e) => Err(endpoint.rpc_error(network, &e)),
        }
    }

    /// The token's EIP-2612 `nonces(owner)` and `DOMAIN_SEPARATOR()`; `None` when the token
    /// answers neither (it has no EIP-2612).
    ///
    /// # Errors
    /// As [`Chain::authorization_state`], for anything but a revert or an empty answer.
    pub async fn eip2612_state(
        &self,
        network: Network,
        asset: Address,
        owner: Address,
    ) -> Result<Option<(U256, B256)>, ChainError> {
        let endpoint = self.endpoint(network)?;
        let token = IErc20Permit::new(asset, &endpoint.provider);
        let (nonce, separator) = (token.nonces(owner), token.DOMAIN_SEPARATOR());
        let nonce = self.bounded(endpoint, network, nonce.call()).await?;
        let separator = self.bounded(endpoint, network, separator.call()).await?;
        match (nonce, separator) {
            (Ok(n), Ok(s)) => Ok(Some((n, s))),
            (Err(e), _) | (_, Err(e)) => match e {
                alloy::contract::Error::ZeroData(..) => Ok(None),
                alloy::contract::Error::TransportError(t) if t.as_error_resp().is_some() => Ok(None),
                e => Err(endpoint.rpc_error(network, &e)),
            },
        }
    }

    /// The transaction that used `signed` (see the module docs for the proof) and the amount
    /// it moved: `claimed` first, then the transactions of the recent `Transfer(payer → payTo)`
    /// logs of the token. `None`: not found.
    ///
    /// # Errors
    /// As [`Chain::authorization_state`].
    pub async fn permit2_settlement(
        &self,
        signed: &Permit2Terms,
        claimed: Option<B256>,
    ) -> Result<Option<Permit2Settlement>, ChainError> {
        let network = signed.network;
        let endpoint = self.endpoint(network)?;
        let mut candidates: Vec<B256> = claimed.into_iter().collect();
        if let Some(found) = self.permit2_check(signed, claimed).await? {
            return Ok(Some(found));
        }
        let latest = self
            .bounded(endpoint, network, endpoint.provider.get_block_number())
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        let filter = Filter::new()
            .address(signed.token)
            .event_signature(IErc20Transfer::Transfer::SIGNATURE_HASH)
            .topic1(signed.owner.into_word())
            .topic2(signed.pay_to.into_word())
            .from_block(latest.saturating_sub(LOG_LOOKBACK_BLOCKS));
        let logs = self
            .bounded(endpoint, network, endpoint.provider.get_logs(&filter))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        // Newest first: the settlement is recent, older transfers to the same payee are not it.
        for hash in logs.iter().rev().filter_map(|l| l.transaction_hash) {
            if candidates.contains(&hash) {
                continue;
            }
            if candidates.len() >= MAX_CANDIDATES {
                break;
            }
            candidates.push(hash);
            if let Some(found) = self.permit2_check(signed, Some(hash)).await? {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Whether transaction `hash` settled `signed` (module docs), and what it moved.
    ///
    /// # Errors
    /// As [`Chain::authorization_state`].
    pub async fn permit2_check(
        &self,
        signed: &Permit2Terms,
        hash: Option<B256>,
    ) -> Result<Option<Permit2Settlement>, ChainError> {
        let Some(hash) = hash else { return Ok(None) };
        let network = signed.network;
        let endpoint = self.endpoint(network)?;
        let receipt = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_receipt(hash))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        let Some(receipt) = receipt.filter(|r| r.status()) else { return Ok(None) };
        let tx = self
            .bounded(endpoint, network, endpoint.provider.get_transaction_by_hash(hash))
            .await?
            .map_err(|e| endpoint.rpc_error(network, &e))?;
        let Some(tx) = tx else { return Ok(None) };
        if tx.to() != Some(signed.spender) || !settles(signed, tx.input()) {
            return Ok(None);
        }
        let mut transferred = U256::ZERO;
        for log in receipt.inner.logs() {
            let t = log.topics();
            if log.address() == signed.token
                && t.len() == 3
                && t[0] == IErc20Transfer::Transfer::SIGNATURE_HASH
                && t[1] == signed.owner.into_word()
                && t[2] == signed.pay_to.into_word()
            {
                let value = U256::try_from_be_slice(&log.data().data).unwrap_or(U256::MAX);
                transferred = transferred.saturating_add(value);
            }
        }
        Ok(Some(Permit2Settlement { tx_hash: hash, transferred }))
    }
}

/// What a proxy call settles: owner, Permit2 permit, recipient and (upto) facilitator.
struct ProxyCall {
    owner: Address,
    permit: ProxyPermitTransferFrom,
    to: Address,
    facilitator: Option<Address>,
}

/// An x402 proxy's `settle` or `settleWithPermit` (gas sponsoring: the same Permit2 transfer
/// after an EIP-2612 permit), exact or upto, decoded from calldata `input`.
fn proxy_call(input: &[u8]) -> Option<ProxyCall> {
    if let Ok(c) = IExactProxySettle::settleCall::abi_decode(input) {
        return Some(ProxyCall { owner: c.owner, permit: c.permit, to: c.witness.to, facilitator: None });
    }
    if let Ok(c) = IExactProxySettleWithPermit::settleWithPermitCall::abi_decode(input) {
        return Some(ProxyCall { owner: c.owner, permit: c.permit, to: c.witness.to, facilitator: None });
    }
    if let Ok(c) = IUptoProxySettle::settleCall::abi_decode(input) {
        let facilitator = Some(c.witness.facilitator);
        return Some(ProxyCall { owner: c.owner, permit: c.permit, to: c.witness.to, facilitator });
    }
    IUptoProxySettleWithPermit::settleWithPermitCall::abi_decode(input).ok().map(|c| ProxyCall {
        owner: c.owner,
        permit: c.permit,
        to: c.witness.to,
        facilitator: Some(c.witness.facilitator),
    })
}

/// The Permit2 nonce an x402 proxy's `settle` (or `settleWithPermit`) calldata `input` spends
/// for `owner`, if it is one (exact or upto): what a successful transaction of it used (Permit2
/// reverts on a used nonce).
pub fn settled_permit2_nonce(input: &[u8], owner: Address) -> Option<U256> {
    proxy_call(input).filter(|c| c.owner == owner).map(|c| c.permit.nonce)
}

/// True when `input` is the proxy's `settle` or `settleWithPermit` of exactly these terms
/// (owner, token, nonce, recipient; for upto also the facilitator).
fn settles(t: &Permit2Terms, input: &[u8]) -> bool {
    proxy_call(input).is_some_and(|c| {
        c.owner == t.owner
            && c.permit.nonce == t.nonce
            && c.permit.permitted.token == t.token
            && c.to == t.pay_to
            && c.facilitator == t.facilitator
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonce_positions_split_word_and_bit() {
        assert_eq!(nonce_position(U256::ZERO), (U256::ZERO, 0));
        assert_eq!(nonce_position(U256::from(255u16)), (U256::ZERO, 255));
        assert_eq!(nonce_position(U256::from(256u16)), (U256::from(1u8), 0));
        assert_eq!(nonce_position(U256::MAX), (U256::MAX >> 8usize, 255));
    }

    #[test]
    fn a_settle_with_permit_proves_the_same_terms_as_a_settle() {
        use alloy::primitives::address;
        let (owner, token, to) = (
            address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8"),
            address!("0x5FbDB2315678afecb367f032d93F642f64180aa3"),
            address!("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"),
        );
        let permit = ProxyPermitTransferFrom {
            permitted: ProxyTokenPermissions { token, amount: U256::from(10_000u64) },
            nonce: U256::from(77u8),
            deadline: U256::from(1_800_000_000u64),
        };
        let permit2612 = ProxyEip2612Permit {
            value: U256::from(10_000u64),
            deadline: U256::from(1_800_000_000u64),
            r: B256::repeat_byte(1),
            s: B256::repeat_byte(2),
            v: 27,
        };
        let witness = ExactProxyWitness { to, validAfter: U256::ZERO };
        let input = IExactProxySettleWithPermit::settleWithPermitCall {
            permit2612,
            permit,
            owner,
            witness,
            signature: vec![0u8; 65].into(),
        }
        .abi_encode();
        let terms = Permit2Terms {
            network: Network::from_chain_id(84532).unwrap(),
            owner,
            token,
            pay_to: to,
            spender: Address::ZERO,
            nonce: U256::from(77u8),
            facilitator: None,
        };
        assert_eq!(settled_permit2_nonce(&input, owner), Some(U256::from(77u8)));
        assert_eq!(settled_permit2_nonce(&input, to), None, "another owner's transfer");
        assert!(settles(&terms, &input));
        assert!(!settles(&Permit2Terms { nonce: U256::from(78u8), ..terms }, &input));
        assert!(!settles(&Permit2Terms { pay_to: owner, ..terms }, &input));
        assert!(!settles(&Permit2Terms { facilitator: Some(to), ..terms }, &input), "not an upto settlement");
    }
}
