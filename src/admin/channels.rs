//! The operators' batch-settlement channels (`/admin/channels*`): every lane with what the
//! chain showed of it, and closing one (docs/DESIGN.md, "Closing a channel"). A close call
//! does the next step that is due and says which: mark the lane closing (no voucher is signed
//! on it again), ask its server for a cooperative refund, else start the wallet's timed
//! withdrawal, and finalize that once the delay has passed (a later call). Each step writes an
//! `operator_events` row (`channel.*`).

use alloy::primitives::U256;
use diesel_async::AsyncPgConnection;
use serde::Serialize;
use uuid::Uuid;

use super::AdminError;
use crate::money::Amount;
use crate::operators::{Actor, events};
use crate::payments::channels::{self, ChannelRow, LaneState};
use crate::relay::pay::registry::channels::{self as channel, ChannelError, Closer, Reading, Withdraw};

/// One channel (a lane) as operators see it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ChannelView {
    /// The lane's id (what `POST /admin/channels/{id}/close` takes).
    pub id: Uuid,
    /// CAIP-2.
    pub network: String,
    pub asset: String,
    pub pay_to: String,
    pub receiver_authorizer: String,
    /// Seconds between the wallet's `initiateWithdraw` and `finalizeWithdraw`.
    pub withdraw_delay: i64,
    /// The channel's id on-chain (0x…).
    pub channel_id: String,
    /// What the router's wallet deposited into it (atomic units).
    #[schema(value_type = String)]
    pub deposited: Amount,
    /// The highest voucher ceiling the router signed on it.
    #[schema(value_type = String)]
    pub signed_ceiling: Amount,
    /// What the server was seen to charge (its answers, checked; what it claimed on-chain).
    #[schema(value_type = String)]
    pub charged: Amount,
    /// The channel's `totalClaimed` on-chain at the last reconcile or close; null: never read.
    #[schema(value_type = Option<String>)]
    pub claimed: Option<Amount>,
    /// The channel's balance on-chain then.
    #[schema(value_type = Option<String>)]
    pub balance: Option<Amount>,
    /// What came back to the wallet from it (cooperative refund or withdrawal).
    #[schema(value_type = String)]
    pub refunded: Amount,
    pub state: LaneState,
    /// Why the router stopped signing on it (its server contradicted the router's records or
    /// claimed more than charged); null: not stopped.
    pub stopped: Option<String>,
    /// A call's voucher is out on it now.
    pub in_flight: bool,
    /// When the wallet's pending withdrawal may be finalized (unix seconds, the chain's time).
    pub withdraw_after: Option<i64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl ChannelView {
    fn of(r: &ChannelRow) -> Self {
        let amount = |s: &str| Amount::parse(s).unwrap_or(Amount::ZERO);
        Self {
            id: r.id,
            network: r.network.clone(),
            asset: r.asset.clone(),
            pay_to: r.pay_to.clone(),
            receiver_authorizer: r.receiver_authorizer.clone(),
            withdraw_delay: r.withdraw_delay,
            channel_id: r.channel_id.clone(),
            deposited: amount(&r.deposited),
            signed_ceiling: amount(&r.signed_ceiling),
            charged: amount(&r.charged),
            claimed: r.claimed.as_deref().map(amount),
            balance: r.balance.as_deref().map(amount),
            refunded: amount(&r.refunded),
            state: r.lane_state(),
            stopped: r.stopped.clone(),
            in_flight: r.in_flight,
            withdraw_after: r.withdraw_after,
            created_at: r.created_at,
        }
    }
}

/// Every channel, oldest first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection) -> Result<Vec<ChannelView>, AdminError> {
    Ok(channels::list(conn).await?.iter().map(ChannelView::of).collect())
}

/// What one close call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CloseStep {
    /// A call's voucher is out on the lane: it is closing (nothing new is signed on it); call
    /// again once the call has ended.
    Busy,
    /// The server refunded everything unclaimed.
    Refunded,
    /// The server did not refund: the wallet sent `initiateWithdraw`; call again after
    /// `withdraw_after`.
    WithdrawInitiated,
    /// The wallet's withdrawal waits for its delay (`withdraw_after`).
    WithdrawPending,
    /// The wallet sent `finalizeWithdraw`: the unclaimed rest came back.
    WithdrawFinalized,
    /// Nothing unclaimed is left in it: closed.
    Closed,
}

/// The answer of `POST /admin/channels/{id}/close`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct CloseReport {
    pub step: CloseStep,
    /// Why, in words (e.g. why the server did not refund).
    pub note: String,
    /// A transaction the wallet sent in this step (0x…).
    pub tx_hash: Option<String>,
    pub channel: ChannelView,
}

/// Does the next step of closing lane `id` (module doc).
///
/// # Errors
/// [`AdminError::NotFound`]; [`AdminError::Channel`] when the chain cannot be read or a
/// transaction fails (the lane stays closing; call again); database errors.
pub async fn close(
    conn: &mut AsyncPgConnection,
    (chain, closer): (&crate::x402::Chain, &Closer<'_>),
    actor: &Actor,
    id: Uuid,
) -> Result<CloseReport, AdminError> {
    let row = channels::get(conn, id).await?.ok_or(AdminError::NotFound)?;
    let target = row.channel_id.clone();
    if row.lane_state() == LaneState::Open && channels::begin_closing(conn, id).await? {
        record(conn, actor, "channel.closing", &target, None).await?;
    }
    let row = channels::get(conn, id).await?.ok_or(AdminError::NotFound)?;
    if row.lane_state() == LaneState::Closed {
        return finish(conn, id, CloseStep::Closed, "the channel is closed".into(), None).await;
    }
    if row.in_flight {
        let note = "a call's voucher is out on this channel; nothing new is signed on it; close again once it ended";
        return finish(conn, id, CloseStep::Busy, note.into(), None).await;
    }
    let seen = channel::read(chain, &row).await?;
    channels::record_chain(conn, id, seen.on_chain()).await?;
    if let Some((_, after)) = seen.withdrawal {
        return finalize(conn, (chain, closer), actor, &row, after).await;
    }
    if seen.unclaimed().is_zero() {
        settle_closed(conn, actor, &row, &seen).await?;
        return finish(conn, id, CloseStep::Closed, "nothing unclaimed is left in the channel".into(), None).await;
    }
    match channel::refund(closer, &row).await {
        Ok(()) => {
            let seen = channel::read(chain, &row).await?;
            channels::record_chain(conn, id, seen.on_chain()).await?;
            record(conn, actor, "channel.refunded", &target, Some(&seen)).await?;
            settle_closed(conn, actor, &row, &seen).await?;
            finish(conn, id, CloseStep::Refunded, "the server refunded what was unclaimed".into(), None).await
        }
        Err(no) => {
            tracing::warn!(channel_id = %target, reason = %no.0, "a batch-settlement server did not refund; withdrawing");
            let tx = channel::withdraw(closer, &row, Withdraw::Initiate(seen.unclaimed())).await?;
            let Some(tx) = tx else {
                let note = format!("the server did not refund ({}); the contract refused the withdrawal now", no.0);
                return Err(AdminError::Channel(ChannelError::Transaction(note)));
            };
            let seen = channel::read(chain, &row).await?;
            channels::record_chain(conn, id, seen.on_chain()).await?;
            record(conn, actor, "channel.withdraw_initiated", &target, Some(&seen)).await?;
            let note = format!("the server did not refund ({}); the wallet started its withdrawal", no.0);
            finish(conn, id, CloseStep::WithdrawInitiated, note, Some(tx.to_string())).await
        }
    }
}

/// Finalizes the wallet's pending withdrawal once its delay has passed.
async fn finalize(
    conn: &mut AsyncPgConnection,
    (chain, closer): (&crate::x402::Chain, &Closer<'_>),
    actor: &Actor,
    row: &ChannelRow,
    after: u64,
) -> Result<CloseReport, AdminError> {
    let Some(tx) = channel::withdraw(closer, row, Withdraw::Finalize).await? else {
        let note = format!("the wallet's withdrawal may be finalized from {after} (unix time, the chain's)");
        return finish(conn, row.id, CloseStep::WithdrawPending, note, None).await;
    };
    let seen = channel::read(chain, row).await?;
    channels::record_chain(conn, row.id, seen.on_chain()).await?;
    record(conn, actor, "channel.withdraw_finalized", &row.channel_id, Some(&seen)).await?;
    settle_closed(conn, actor, row, &seen).await?;
    let note = "the wallet withdrew what was unclaimed".to_owned();
    finish(conn, row.id, CloseStep::WithdrawFinalized, note, Some(tx.to_string())).await
}

/// Records what came back (deposited less what the channel still holds) and closes the lane
/// when nothing unclaimed is left in it.
async fn settle_closed(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    row: &ChannelRow,
    seen: &Reading,
) -> Result<(), AdminError> {
    let deposited = Amount::parse(&row.deposited).map_err(|_| ChannelError::Stored("deposited amount"))?;
    let back = deposited.as_u256().saturating_sub(seen.balance);
    let closed = seen.unclaimed().is_zero() && seen.withdrawal.is_none();
    channels::record_refunded(conn, row.id, Amount::from_u256(back), closed).await?;
    if closed {
        record(conn, actor, "channel.closed", &row.channel_id, Some(seen)).await?;
    }
    Ok(())
}

async fn finish(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    step: CloseStep,
    note: String,
    tx_hash: Option<String>,
) -> Result<CloseReport, AdminError> {
    let row = channels::get(conn, id).await?.ok_or(AdminError::NotFound)?;
    Ok(CloseReport { step, note, tx_hash, channel: ChannelView::of(&row) })
}

async fn record(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    action: &str,
    channel_id: &str,
    seen: Option<&Reading>,
) -> Result<(), AdminError> {
    let after = seen.map(|s| {
        let u = |v: U256| v.to_string();
        serde_json::json!({"balance": u(s.balance), "claimed": u(s.claimed),
            "withdraw_after": s.withdrawal.map(|(_, at)| at)})
    });
    events::record(conn, actor, action, Some(channel_id), None, after.as_ref()).await?;
    tracing::info!(event = action, channel_id = %channel_id, "batch-settlement channel close step");
    Ok(())
}
