//! Reconcile's pass over the batch-settlement channels (issue 40, item 4), before the intents:
//! each lane's channel is read on-chain and recorded (balance, `totalClaimed`, a pending
//! withdrawal). A channel claimed beyond the
//! router's records is flagged: above the highest voucher signed (impossible on an honest
//! contract), or above what the router counts as charged (the lane's charged total, and every
//! voucher still counted as charged that its server has not said it refused). A flagged lane
//! is stopped (never signed on again) and logged as `batch_channel_overclaimed`; the gauge
//! `x402_router_batch_channels_stopped` counts stopped lanes (an alert in deploy/prometheus/).
//!
//! What each lane's channel shows ([`Seen`]) then decides the batch-settlement intents
//! (`relay::pay::batch::channel::voucher_verdict`): a voucher whose ceiling was claimed was
//! charged; one whose increment lies above a claimed total that is final can never be claimed
//! and is released (`expired`); anything else stays counted as charged.

use std::collections::HashMap;

use alloy::primitives::U256;
use diesel::QueryResult;
use diesel_async::AsyncPgConnection;
use uuid::Uuid;

use super::Report;
use crate::money::Amount;
use crate::payments::channels::{self, ChannelRow, LaneState};
use crate::relay::pay::registry::channels as onchain;
use crate::x402::Chain;

/// What the chain showed of one lane's channel this run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    pub claimed: U256,
    /// Nothing can be claimed on it any more (`relay::pay::batch::channel::is_final`).
    pub is_final: bool,
}

/// Reads and records every lane that may still change (all but the closed ones whose reading
/// was final), flags the over-claimed; answers what each showed.
///
/// # Errors
/// Database errors (a chain that cannot be read counts in [`Report::errors`]).
pub(super) async fn pass(
    conn: &mut AsyncPgConnection,
    chain: &Chain,
    report: &mut Report,
) -> QueryResult<HashMap<Uuid, Seen>> {
    let mut seen = HashMap::new();
    for row in channels::list(conn).await? {
        report.channels_checked += 1;
        let reading = match onchain::read(chain, &row).await {
            Ok(r) => r,
            Err(e) => {
                report.errors += 1;
                tracing::warn!(channel_id = %row.channel_id, error = %e, "cannot read a batch-settlement channel; left as it was");
                continue;
            }
        };
        if let Some(why) = overclaim(conn, &row, reading.claimed).await? {
            flag(conn, &row, &why, report).await?;
        }
        channels::record_chain(conn, row.id, reading.on_chain()).await?;
        let deposits = channels::deposits(conn, row.id).await?;
        let is_final = onchain::is_final(chain, &row, &reading, &deposits).await;
        if is_final && row.lane_state() == LaneState::Closing && reading.withdrawal.is_none() {
            // Nothing unclaimed left (a refund or withdrawal done outside a close call).
            let back =
                Amount::parse(&row.deposited).map_or(U256::ZERO, |d| d.as_u256().saturating_sub(reading.balance));
            channels::record_refunded(conn, row.id, Amount::from_u256(back), true).await?;
        }
        seen.insert(row.id, Seen { claimed: reading.claimed, is_final });
    }
    Ok(seen)
}

/// Why `claimed` on the lane's channel is more than the router let its server claim, if it is.
async fn overclaim(conn: &mut AsyncPgConnection, row: &ChannelRow, claimed: U256) -> QueryResult<Option<String>> {
    let signed = Amount::parse(&row.signed_ceiling).map_or(U256::ZERO, Amount::as_u256);
    if claimed > signed {
        return Ok(Some(format!(
            "it claimed {claimed} on-chain, above the highest voucher the router signed ({signed})"
        )));
    }
    let accounted = channels::accounted(conn, row.id).await?.as_u256();
    Ok((claimed > accounted)
        .then(|| format!("it claimed {claimed} on-chain, above what the router counts as charged on it ({accounted})")))
}

async fn flag(conn: &mut AsyncPgConnection, row: &ChannelRow, why: &str, report: &mut Report) -> QueryResult<()> {
    report.channels_flagged += 1;
    if channels::flag(conn, row.id, why).await? {
        tracing::error!(
            event = "batch_channel_overclaimed", channel_id = %row.channel_id, pay_to = %row.pay_to,
            network = %row.network, reason = %why,
            "a batch-settlement server claimed more than the router counts as charged; signing stopped on its channel"
        );
    }
    Ok(())
}
