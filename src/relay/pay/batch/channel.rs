//! A lane's channel as the chain shows it: balance, claimed total, pending withdrawal, and
//! whether the claimed total is final (nothing can be claimed on it any more), which is what
//! lets `reconcile` release an unanswered voucher's reservation.
//!
//! Final, precisely: the lane is no longer open (the router signs no voucher or deposit on
//! it), nothing unclaimed is left in the channel (`balance == totalClaimed`: a claim may not
//! exceed the balance) and every deposit authorization ever signed for it is used or past its
//! `validBefore` (an unused one could still add money that a held voucher could claim).

use alloy::primitives::{Address, B256, U256};
use serde_json::Value;

use super::terms::SignedBatch;
use crate::money::Amount;
use crate::payments::channels::{ChannelRow, LaneState, OnChain};
use crate::relay::pay::scheme::{Unread, Verdict};
use crate::x402::batch::{self, SignedDeposit};
use crate::x402::{Chain, ChainError, Network};

/// Why a channel could not be read or acted on.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// A stored value of the lane does not read (the lane is left as it is).
    #[error("the lane's {0} does not read")]
    Stored(&'static str),
    /// A transaction of the router's wallet could not be sent, or failed.
    #[error("{0}")]
    Transaction(String),
}

/// An unused deposit authorization is called dead only this long after its `validBefore` (a
/// host clock ahead of the chain's).
const EXPIRY_MARGIN_SECS: u64 = 60;

/// What the chain shows of a lane's channel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    pub balance: U256,
    pub claimed: U256,
    /// A pending withdrawal: its amount and when it may be finalized (the chain's time).
    pub withdrawal: Option<(U256, u64)>,
}

impl Reading {
    /// What is left unclaimed in the channel.
    pub fn unclaimed(&self) -> U256 {
        self.balance.saturating_sub(self.claimed)
    }

    pub fn on_chain(&self) -> OnChain {
        OnChain {
            balance: Amount::from_u256(self.balance),
            claimed: Amount::from_u256(self.claimed),
            withdraw_after: self.withdrawal.map(|(_, at)| i64::try_from(at).unwrap_or(i64::MAX)),
        }
    }
}

/// The lane's network and channel id, read back.
///
/// # Errors
/// A stored value that does not read.
pub(crate) fn ids(row: &ChannelRow) -> Result<(Network, B256), ChannelError> {
    let network = Network::parse_caip2(&row.network).map_err(|_| ChannelError::Stored("network"))?;
    let id: B256 = row.channel_id.parse().map_err(|_| ChannelError::Stored("channel id"))?;
    Ok((network, id))
}

/// Reads the lane's channel.
///
/// # Errors
/// The chain could not be read.
pub(crate) async fn read(chain: &Chain, row: &ChannelRow) -> Result<Reading, ChannelError> {
    let (network, id) = ids(row)?;
    let (balance, claimed) = chain.batch_channel(network, id).await?;
    let (amount, initiated) = chain.batch_withdrawal(network, id).await?;
    let delay = u64::try_from(row.withdraw_delay).unwrap_or(u64::MAX);
    let withdrawal = (initiated != 0).then(|| (amount, initiated.saturating_add(delay)));
    Ok(Reading { balance, claimed, withdrawal })
}

/// Whether the channel's claimed total is final (module doc). Any doubt: not final.
pub(crate) async fn is_final(chain: &Chain, row: &ChannelRow, seen: &Reading, deposits: &[Value]) -> bool {
    if row.lane_state() == LaneState::Open || seen.balance != seen.claimed {
        return false;
    }
    let (Ok(network), Ok(asset), Ok(payer)) =
        (Network::parse_caip2(&row.network), row.asset.parse::<Address>(), row.wallet.parse::<Address>())
    else {
        return false;
    };
    let now = crate::clock::now_unix();
    for d in deposits {
        let Ok(d) = serde_json::from_value::<SignedDeposit>(d.clone()) else {
            return false;
        };
        if d.valid_before.saturating_add(EXPIRY_MARGIN_SECS) < now {
            continue;
        }
        match chain.authorization_state(network, asset, payer, d.nonce).await {
            Ok(true) => {}
            _ => return false,
        }
    }
    true
}

/// What the chain says of one voucher (a ledger row's record) on a channel that claimed
/// `claimed` in all: claimed at or above its ceiling ⇒ its increment was charged (`Used`);
/// `claimed` final and at or below the ceiling before it ⇒ its increment can never be claimed
/// (`NeverLands`); anything else (in between, or not final) ⇒ it may still be (`MayLand`).
///
/// # Errors
/// [`Unread`] when the record does not read.
pub(crate) fn voucher_verdict(authorization: &Value, claimed: U256, is_final: bool) -> Result<Verdict, Unread> {
    let s: SignedBatch = serde_json::from_value(authorization.clone()).map_err(Unread::of)?;
    let ceiling = s.ceiling();
    let before = ceiling.saturating_sub(s.amount.as_u256());
    Ok(if claimed >= ceiling {
        Verdict::Used
    } else if is_final && claimed <= before {
        Verdict::NeverLands
    } else {
        Verdict::MayLand
    })
}

/// The lane a ledger row's voucher was signed on.
pub(crate) fn lane_of(authorization: &Value) -> Option<uuid::Uuid> {
    authorization.get("lane").and_then(Value::as_str).and_then(|s| s.parse().ok())
}

/// The channel configuration of a lane (the router's wallet pays and authorizes its vouchers).
///
/// # Errors
/// A stored value that does not read.
pub(crate) fn config(row: &ChannelRow) -> Result<batch::ChannelConfig, ChannelError> {
    let bad = ChannelError::Stored;
    let payer: Address = row.wallet.parse().map_err(|_| bad("wallet"))?;
    let pay_to: Address = row.pay_to.parse().map_err(|_| bad("payTo"))?;
    let authorizer: Address = row.receiver_authorizer.parse().map_err(|_| bad("receiver authorizer"))?;
    let asset: Address = row.asset.parse().map_err(|_| bad("asset"))?;
    let salt: B256 = row.salt.parse().map_err(|_| bad("salt"))?;
    let delay = u64::try_from(row.withdraw_delay).map_err(|_| bad("withdraw delay"))?;
    Ok(batch::channel_config(payer, (pay_to, authorizer, asset), delay, salt))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn record(ceiling: u64, amount: u64) -> Value {
        json!({
            "scheme": "batch-settlement", "network": "eip155:84532", "asset": "0x0", "pay_to": "0x0", "payer": "0x0",
            "amount": amount.to_string(), "lane": uuid::Uuid::nil(), "channel_id": B256::ZERO,
            "channel_config": {}, "voucher": {"channelId": B256::ZERO, "maxClaimableAmount": ceiling.to_string(),
            "signature": "0x"},
        })
    }

    #[test]
    fn a_voucher_is_released_only_when_the_final_claim_stops_below_its_increment() {
        let r = record(3000, 1000);
        let v = |claimed: u64, fin: bool| voucher_verdict(&r, U256::from(claimed), fin).unwrap();
        assert_eq!(v(3000, false), Verdict::Used);
        assert_eq!(v(4000, true), Verdict::Used);
        assert_eq!(v(2000, false), Verdict::MayLand, "not final: it may still be claimed");
        assert_eq!(v(2000, true), Verdict::NeverLands);
        assert_eq!(v(0, true), Verdict::NeverLands);
        assert_eq!(v(2500, true), Verdict::MayLand, "partly claimed: stays charged");
    }
}
