//! `x402-router reconcile`: settles the fate of payment intents that no live request owns.
//!
//! A router that dies after signing leaves an intent in `signed` (or `unknown`, when the
//! chain could not be read; or `unconfirmed`, when an upstream claimed a settlement the chain
//! did not show yet). An upstream that said "rejected" or answered without settling
//! (`rejected`, `not_settled`) may still hold the signed authorization and submit it later.
//! All of these keep the agent's budget reserved until the chain decides. Reconcile asks the
//! chain for each such intent (EIP-3009: `authorizationState(payer, nonce)` on the token;
//! Permit2, `exact` or `upto`: bit `nonce & 0xff` of Permit2's `nonceBitmap(payer, nonce >> 8)`):
//!
//! | chain says | old status | new status |
//! |---|---|---|
//! | used | `signed`, `unknown`, `rejected` | `settled_response_lost` (paid, no answer served) |
//! | used | `unconfirmed`, `not_settled` | `settled` (the agent had the answer) |
//! | unused, `validBefore` passed | any | `expired` (can never move money: releases the reservation) |
//! | unused, still valid | any | unchanged (`pending`) |
//! | no answer | any | unchanged (`errors`) |
//!
//! Invariants:
//! - Only intents whose key has no live owner are touched: the idempotency row is missing,
//!   terminal, or in flight with a heartbeat older than the abandonment threshold. A live
//!   owner decides for itself (it reads the chain before it pays, resends or re-signs).
//! - Every update is guarded by the status it read (`WHERE id = $1 AND status = $old`) and
//!   re-checks "no live owner" while holding a share lock on the idempotency row, so a
//!   takeover that starts meanwhile either waits for the update or makes it a no-op. Running
//!   reconcile twice, or from two cron hosts at once, is harmless.
//! - Nothing is signed or sent: reconcile only reads the chain and writes statuses (and, for
//!   a used `upto` authorization, lowers the reserved maximum to the amount the settling
//!   transaction's `Transfer` logs show moved; when that transaction cannot be found, the
//!   maximum stays charged).
//! - "Older than the grace period" is measured from `updated_at` (the intent's last write,
//!   e.g. a re-signing), not from its creation.

use std::str::FromStr;
use std::time::Duration;

use alloy::primitives::{Address, B256};
use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel::prelude::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

use super::Cursor;
use crate::money::Amount;
use crate::payments::{self, PaymentStatus, PaymentStatus::*};
use crate::x402::{Chain, Network, SignedPayment};

/// Intents read per batch.
const BATCH: i64 = 200;
/// Every status whose fate the chain can still change: all but the spent and the expired.
/// `rejected` and `not_settled` are an upstream's word only; it may still hold the
/// authorization and submit it, so they are watched until the chain settles them.
const RECONCILED: [PaymentStatus; 5] = [Signed, Unknown, Unconfirmed, Rejected, NotSettled];

/// An unused authorization is called expired only this long after its `validBefore`, so
/// that a clock of this host running ahead of the chain's cannot expire one that a block
/// could still carry.
pub const EXPIRY_MARGIN_SECS: i64 = 60;

/// What reconcile looks at.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Intents written more recently than this are left alone.
    pub older_than: Duration,
    /// An in-flight key whose heartbeat is older than this has no live owner
    /// (`IDEMPOTENCY_ABANDON_AFTER_MS` of the routers).
    pub abandon_after: Duration,
}

/// What one run did; printed as one JSON line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Intents examined.
    pub checked: u64,
    /// `unconfirmed` intents the chain shows used.
    pub settled: u64,
    /// `signed`/`unknown` intents the chain shows used.
    pub settled_response_lost: u64,
    /// Unused intents past their `validBefore`.
    pub expired: u64,
    /// Unused and still valid, or taken by a live owner meanwhile: left as they were.
    pub pending: u64,
    /// Intents the chain could not answer for (or with unreadable stored fields).
    pub errors: u64,
}

#[derive(Debug, QueryableByName)]
struct Candidate {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    agent_id: Uuid,
    #[diesel(sql_type = Text)]
    idempotency_key: String,
    #[diesel(sql_type = Text)]
    network: String,
    #[diesel(sql_type = Text)]
    asset: String,
    #[diesel(sql_type = Text)]
    payer: String,
    #[diesel(sql_type = Text)]
    nonce: String,
    /// The stored signed record (EIP-3009 or Permit2).
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    signed_authorization: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    valid_before: i64,
    #[diesel(sql_type = Text)]
    status: PaymentStatus,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    /// A completed receipt exists for the intent's request: the agent had the answer.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    served: bool,
}

/// "No live owner holds the key of `p`", for a `payments p` row. `$ABANDON` is replaced by
/// the placeholder of the threshold in milliseconds.
const NO_LIVE_OWNER: &str = "NOT EXISTS (SELECT 1 FROM idempotency_keys k \
        WHERE k.agent_id = p.agent_id AND k.key = p.idempotency_key AND k.status = 'in_flight' \
          AND k.created_at >= now() - make_interval(secs => $ABANDON::float8 / 1000))";

/// One batch of intents to check, after `after` in `(created_at, id)` order.
async fn candidates(
    conn: &mut AsyncPgConnection,
    settings: &Settings,
    after: Option<Cursor>,
) -> QueryResult<Vec<Candidate>> {
    diesel::sql_query(format!(
        "SELECT p.id, p.agent_id, p.idempotency_key, p.network, p.asset, p.payer, p.nonce, p.signed_authorization, \
                p.valid_before, p.status, p.created_at, \
                EXISTS (SELECT 1 FROM receipts r WHERE r.agent_id = p.agent_id AND r.idempotency_key = p.idempotency_key \
                           AND r.request_hash = p.request_hash AND r.outcome = 'completed') AS served \
           FROM payments p \
          WHERE p.status IN {} \
            AND p.updated_at < now() - make_interval(secs => $1::float8 / 1000) \
            AND {} \
            AND ($3::timestamptz IS NULL OR (p.created_at, p.id) > ($3, $4::uuid)) \
          ORDER BY p.created_at, p.id \
          LIMIT $5",
        payments::sql_list(RECONCILED),
        NO_LIVE_OWNER.replace("$ABANDON", "$2")
    ))
    .bind::<BigInt, _>(millis(settings.older_than))
    .bind::<BigInt, _>(millis(settings.abandon_after))
    .bind::<Nullable<Timestamptz>, _>(after.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(after.map(|c| c.id))
    .bind::<BigInt, _>(BATCH)
    .load(conn)
    .await
}

/// Moves one intent from `old` to `new` if it is still in `old` and its key still has no
/// live owner. The share lock on the idempotency row makes a concurrent takeover (an
/// `UPDATE` of that row) wait for this statement, or this statement see the takeover.
/// `false`: someone else moved first; nothing was written.
///
/// # Errors
/// Database errors.
async fn transition(
    conn: &mut AsyncPgConnection,
    c: &Candidate,
    new: PaymentStatus,
    abandon_after: Duration,
) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "WITH owner AS ( \
              SELECT status, created_at FROM idempotency_keys \
               WHERE agent_id = $2 AND key = $3 FOR SHARE) \
         UPDATE payments p SET status = $5, updated_at = now() \
          WHERE p.agent_id = $2 AND p.id = $1 AND p.status = $4 \
            AND NOT EXISTS (SELECT 1 FROM owner o WHERE o.status = 'in_flight' \
                   AND o.created_at >= now() - make_interval(secs => $6::float8 / 1000))",
    )
    .bind::<SqlUuid, _>(c.id)
    .bind::<SqlUuid, _>(c.agent_id)
    .bind::<Text, _>(&c.idempotency_key)
    .bind::<Text, _>(c.status)
    .bind::<Text, _>(new)
    .bind::<BigInt, _>(millis(abandon_after))
    .execute(conn)
    .await?;
    Ok(n == 1)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn now_unix() -> i64 {
    i64::try_from(crate::clock::now_unix()).unwrap_or(i64::MAX)
}

/// The intent's signed record, checked against its columns (a record that disagrees with
/// the row it is stored in is not trusted).
fn signed_record(c: &Candidate) -> Result<SignedPayment, String> {
    let signed: SignedPayment =
        serde_json::from_value(c.signed_authorization.clone()).map_err(|e| format!("stored authorization: {e}"))?;
    let (network, asset, payer, nonce) = coordinates(c)?;
    if (signed.network(), signed.asset(), signed.payer(), signed.nonce()) != (network, asset, payer, nonce) {
        return Err("stored authorization disagrees with its row".into());
    }
    Ok(signed)
}

/// The on-chain coordinates of an intent, parsed from its stored text.
fn coordinates(c: &Candidate) -> Result<(Network, Address, Address, B256), String> {
    let network = Network::parse(&c.network).map_err(|e| format!("network: {e}"))?;
    let asset = Address::from_str(&c.asset).map_err(|e| format!("asset: {e}"))?;
    let payer = Address::from_str(&c.payer).map_err(|e| format!("payer: {e}"))?;
    let nonce = B256::from_str(&c.nonce).map_err(|e| format!("nonce: {e}"))?;
    Ok((network, asset, payer, nonce))
}

/// The status the chain's answer moves an intent to; `None`: leave it.
fn decide(old: PaymentStatus, used: bool, served: bool, valid_before: i64, now: i64) -> Option<PaymentStatus> {
    if used {
        // The agent got the upstream's answer for `unconfirmed` and `not_settled`, and for any
        // intent whose request has a completed receipt (e.g. an answer recorded `unknown`
        // because the deadline cut the settlement check): served.
        return Some(if served || matches!(old, Unconfirmed | NotSettled) { Settled } else { SettledResponseLost });
    }
    (valid_before.saturating_add(EXPIRY_MARGIN_SECS) < now).then_some(Expired)
}

/// Checks every eligible intent once. Per-intent failures (an unreadable chain) are counted
/// in [`Report::errors`] and logged; the run goes on with the next intent.
///
/// # Errors
/// Database errors (the run stops; updates already made stay made).
pub async fn run(conn: &mut AsyncPgConnection, chain: &Chain, settings: &Settings) -> QueryResult<Report> {
    let mut report = Report::default();
    let mut after = None;
    loop {
        let batch = candidates(conn, settings, after).await?;
        let Some(last) = batch.last() else {
            return Ok(report);
        };
        after = Some(Cursor { created_at: last.created_at, id: last.id });
        for c in &batch {
            report.checked += 1;
            let signed = signed_record(c);
            let used = match &signed {
                Err(e) => Err(e.clone()),
                Ok(signed) => signed.used_on(chain).await.map_err(|e| e.to_string()),
            };
            let used = match used {
                Ok(used) => used,
                Err(e) => {
                    report.errors += 1;
                    tracing::warn!(payment.id = %c.id, agent_id = %c.agent_id, payment.network = %c.network, error = %e,
                        "cannot check a payment intent on-chain; left as it was");
                    continue;
                }
            };
            let Some(new) = decide(c.status, used, c.served, c.valid_before, now_unix()) else {
                report.pending += 1;
                continue;
            };
            if let (Ok(signed), true) = (&signed, used && signed.as_ref().is_ok_and(|s| s.is_upto())) {
                // What the settling transaction moved; unknown ⇒ the maximum stays charged.
                match signed.settlement_on(chain, None).await {
                    Ok(Some(p)) => {
                        if let Some(moved) = p.transferred {
                            payments::store::record_charged(conn, c.agent_id, c.id, Amount::from_u256(moved)).await?;
                        }
                    }
                    Ok(None) => tracing::warn!(payment.id = %c.id,
                        "upto authorization used on-chain, its transaction not found: the maximum stays charged"),
                    Err(e) => tracing::warn!(payment.id = %c.id, error = %e,
                        "upto authorization used on-chain, its transaction unreadable: the maximum stays charged"),
                }
            }
            if !transition(conn, c, new, settings.abandon_after).await? {
                report.pending += 1;
                tracing::info!(payment.id = %c.id, "payment intent changed meanwhile; left to its owner");
                continue;
            }
            tracing::info!(payment.id = %c.id, agent_id = %c.agent_id, payment.status.old = %c.status,
                payment.status.new = %new, "payment intent reconciled");
            match new {
                Settled => report.settled += 1,
                SettledResponseLost => report.settled_response_lost += 1,
                _ => report.expired += 1,
            }
        }
        if (batch.len() as i64) < BATCH {
            return Ok(report);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chain_decides_as_the_table_says() {
        let now = 1_000_000;
        assert_eq!(decide(Signed, true, false, now + 100, now), Some(SettledResponseLost));
        assert_eq!(decide(Unknown, true, false, 0, now), Some(SettledResponseLost));
        assert_eq!(decide(Unconfirmed, true, false, 0, now), Some(Settled));
        assert_eq!(decide(Signed, false, false, now + 100, now), None);
        assert_eq!(decide(Unconfirmed, false, false, now - 1, now), None, "within the margin");
        assert_eq!(decide(Signed, false, false, now - EXPIRY_MARGIN_SECS - 1, now), Some(Expired));
        // An upstream that said "rejected" and settled later: paid, and the agent got an error.
        assert_eq!(decide(Rejected, true, false, 0, now), Some(SettledResponseLost));
        assert_eq!(decide(NotSettled, true, false, 0, now), Some(Settled));
        assert_eq!(decide(Rejected, false, false, now - EXPIRY_MARGIN_SECS - 1, now), Some(Expired));
        assert_eq!(decide(NotSettled, false, false, now + 100, now), None);
        // Recorded with its answer but unconfirmed by the deadline: served.
        assert_eq!(decide(Unknown, true, true, 0, now), Some(Settled));
    }
}
