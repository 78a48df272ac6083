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
//! - No payment is signed: reconcile reads the chain, writes statuses (for a used `upto`
//!   authorization it lowers the reserved maximum to the amount the settling transaction's
//!   `Transfer` logs show moved; when that transaction cannot be found, the maximum stays
//!   charged) and, with [`Recovering`], re-sends stored bytes (below).
//! - "Older than the grace period" is measured from `updated_at` (the intent's last write,
//!   e.g. a re-signing), not from its creation.
//!
//! ## Recovering lost answers (issue 16)
//!
//! With [`Recovering`] (the command is given the router's key for receipts), a second pass
//! looks at `settled_response_lost` payments of the last [`RECOVERY_WINDOW_HOURS`] whose key
//! has already been answered (or was removed by GC) and asks [`crate::recovery::recover`] for
//! the upstream's original answer: a byte-identical re-send of the stored request and payment
//! to an upstream that advertised `payment-identifier`; nothing is sent otherwise. It never
//! signs a payment and never makes a new nonce (the recovery module cannot). A recovered
//! answer is recorded in one transaction: the payment becomes `settled` with its recovery
//! record, a signed receipt whose payment says `"recovery": "recovered"`, and the answer
//! itself (`recovered_answers`), which the agent reads at `GET /payments?idempotency_key=`.
//! The key's first final answer is **not** rewritten: replays of a key stay byte-identical
//! (docs/DESIGN.md §5), and the agent learns of the recovery from the payment, as it learns of
//! every later fact of the ledger.
//!
//! - Never twice: only a payment still `settled_response_lost` whose recovery record is
//!   absent, or `lost` after an attempt cut short (503 "in flight", transport error,
//!   deadline; [`crate::recovery::worth_retrying`]) and fewer than [`MAX_ROUNDS`] runs, is
//!   tried; a 409, a 402 or a wrong answer is final. A run first leases the payment
//!   (`updated_at` set [`LEASE`] ahead, claimed only if not ahead already), so two runs at
//!   once never re-send it both; the final write is guarded by the claimed value, and the
//!   answer's primary key is the payment.
//! - Never beside a takeover: a payment whose key is in flight (even abandoned) is left to
//!   the takeover (which recovers by itself); the final write re-checks that under a share
//!   lock on the idempotency row.
//! - Bounded: at most `max_payments` payments re-sent and `budget` of time per run (a payment
//!   with nothing to re-send is only recorded, once); each payment's re-sends are bounded by
//!   [`crate::recovery::MAX_SENDS`] and [`PER_PAYMENT`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use alloy::signers::local::PrivateKeySigner;
use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::Cursor;
use crate::db::schema::payments as payments_table;
use crate::faults::{self, Point};
use crate::payments::store::PaymentRow;
use crate::payments::{self, PaymentStatus, PaymentStatus::*, RecoveryKind, RecoveryStep};
use crate::recovery::{self, Ending};
use crate::relay::pay::registry;
use crate::relay::pay::registry::channels as batch_channel;
use crate::relay::pay::scheme::{Chains, RowRef, Verdict};
use crate::upstream::{UpstreamClient, UpstreamResponse};
use crate::x402::Chain;

/// A stored intent whose fields cannot be read back (left as it was, counted as an error).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unreadable(pub String);

impl From<String> for Unreadable {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for Unreadable {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

mod channels;
/// Intents read per batch.
mod lost;

const BATCH: i64 = 200;
/// Every status whose fate the chain can still change: all but the spent and the expired.
/// `rejected` and `not_settled` are an upstream's word only; it may still hold the
/// authorization and submit it, so they are watched until the chain settles them.
const RECONCILED: [PaymentStatus; 5] = [Signed, Unknown, Unconfirmed, Rejected, NotSettled];

/// An unused authorization is called expired only this long after its `validBefore`, so
/// that a clock of this host running ahead of the chain's cannot expire one that a block
/// could still carry.
pub const EXPIRY_MARGIN_SECS: i64 = 60;

/// Lost answers older than this are not tried any more (an upstream's answer cache is not
/// expected to keep them longer; it also bounds the pass).
pub const RECOVERY_WINDOW_HOURS: i64 = 24;
/// Most reconcile runs that try to recover one payment.
pub const MAX_ROUNDS: usize = 3;
/// The longest one payment's recovery may take in a run.
pub const PER_PAYMENT: Duration = Duration::from_secs(30);

/// How long a run holds a payment it recovers (longer than [`PER_PAYMENT`] plus the write).
pub const LEASE: Duration = Duration::from_secs(90);

/// What recovery of lost answers may do in one run.
pub struct Recovering<'a> {
    pub upstream: &'a UpstreamClient,
    /// Signs the receipt of a recovered answer (the router's receipt key; never a payment).
    pub receipt_signer: &'a PrivateKeySigner,
    /// Opens the request as sent, sealed in the ledger (`SECRETS_KEY_FILE`, the routers' keys).
    pub keyring: &'a crate::secrets::Keyring,
    /// Most payments one run re-sends (payments with nothing to re-send are only recorded).
    pub max_payments: u64,
    /// How long one run may spend recovering, all payments together.
    pub budget: Duration,
}

/// What reconcile looks at.
#[derive(Clone)]
pub struct Settings {
    /// Intents written more recently than this are left alone.
    pub older_than: Duration,
    /// An in-flight key whose heartbeat is older than this has no live owner
    /// (`IDEMPOTENCY_ABANDON_AFTER_MS` of the routers).
    pub abandon_after: Duration,
    /// Tests only: a hook called at [`Point::ReconcileDecided`] (between reading an intent and
    /// writing the chain's verdict). Production sets none.
    pub faults: Option<faults::Hook>,
    /// Only this payment (an operator's `POST /admin/reconcile` for one payment); None: all.
    pub only: Option<Uuid>,
    /// The Solana networks' endpoints (`None`: Solana intents are left as they are, counted
    /// as errors).
    pub solana: Option<std::sync::Arc<crate::chains::solana::SolanaRpcs>>,
    /// The `reconcile` command's progress: each batch of intents checked is a step
    /// (`telemetry::progress`); `None` elsewhere.
    pub progress: Option<std::sync::Arc<crate::telemetry::progress::Progress>>,
}

/// What one run did; printed as one JSON line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[schema(as = ReconcileReport)]
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
    /// Lost answers recovered this run: the upstream's original answer, recorded with its
    /// receipt for the agent.
    pub recovered: u64,
    /// Lost answers re-accessed this run (a new execution, SIWX; not done by reconcile yet).
    pub reaccessed: u64,
    /// Lost answers that recovery tried (or found nothing to try for) and did not get back.
    pub recovery_lost: u64,
    /// Requests re-sent to upstreams by recovery (byte-identical; never a new payment).
    pub resends: u64,
    /// Payments that could be tried but were left for a later run (the run's bounds).
    pub recovery_deferred: u64,
    /// Spent `upto` payments whose charge was read from their settling transaction this run
    /// (an ending that could not read it had left the signed maximum charged).
    pub charges_proven: u64,
    /// Batch-settlement channels read on-chain this run.
    pub channels_checked: u64,
    /// Channels found claimed beyond the router's records this run (stopped, alerted).
    pub channels_flagged: u64,
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
    pay_to: String,
    #[diesel(sql_type = Text)]
    scheme: String,
    #[diesel(sql_type = diesel::sql_types::SmallInt)]
    x402_version: i16,
    #[diesel(sql_type = Text)]
    nonce: String,
    /// The stored signed record (its scheme's).
    #[diesel(sql_type = diesel::sql_types::Jsonb)]
    signed_authorization: serde_json::Value,
    #[diesel(sql_type = BigInt)]
    valid_before: i64,
    /// Signatures made for the intent: with `status` and `valid_before`, what the write is
    /// guarded by (a re-signing changes it).
    #[diesel(sql_type = Integer)]
    attempts: i32,
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

/// The intents a run checks, as a condition on a `payments p` row: a status `reconcile`
/// decides, untouched for `$1` ms, and no live owner (`$2`: the abandon threshold in ms).
fn candidate_condition() -> String {
    format!(
        "p.status IN {} \
            AND p.updated_at < now() - make_interval(secs => $1::float8 / 1000) \
            AND {}",
        payments::sql_list(RECONCILED),
        NO_LIVE_OWNER.replace("$ABANDON", "$2")
    )
}

/// How many intents a run of all (`only: None`) would check now (the `reconcile` command's
/// total, for its time left).
///
/// # Errors
/// Database errors.
pub async fn count_candidates(conn: &mut AsyncPgConnection, settings: &Settings) -> QueryResult<u64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let c: Count = diesel::sql_query(format!("SELECT count(*) AS n FROM payments p WHERE {}", candidate_condition()))
        .bind::<BigInt, _>(millis(settings.older_than))
        .bind::<BigInt, _>(millis(settings.abandon_after))
        .get_result(conn)
        .await?;
    Ok(u64::try_from(c.n).unwrap_or(0))
}

/// One batch of intents to check, after `after` in `(created_at, id)` order.
async fn candidates(
    conn: &mut AsyncPgConnection,
    settings: &Settings,
    after: Option<Cursor>,
) -> QueryResult<Vec<Candidate>> {
    diesel::sql_query(format!(
        "SELECT p.id, p.agent_id, p.idempotency_key, p.network, p.asset, p.payer, p.pay_to, p.scheme, p.x402_version, p.nonce, \
                p.signed_authorization, \
                p.valid_before, p.attempts, p.status, p.created_at, \
                EXISTS (SELECT 1 FROM receipts r WHERE r.agent_id = p.agent_id AND r.idempotency_key = p.idempotency_key \
                           AND r.request_hash = p.request_hash AND r.outcome = 'completed') AS served \
           FROM payments p \
          WHERE {} \
            AND ($3::timestamptz IS NULL OR (p.created_at, p.id) > ($3, $4::uuid)) \
            AND ($6::uuid IS NULL OR p.id = $6) \
          ORDER BY p.created_at, p.id \
          LIMIT $5",
        candidate_condition()
    ))
    .bind::<BigInt, _>(millis(settings.older_than))
    .bind::<BigInt, _>(millis(settings.abandon_after))
    .bind::<Nullable<Timestamptz>, _>(after.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(after.map(|c| c.id))
    .bind::<BigInt, _>(BATCH)
    .bind::<Nullable<SqlUuid>, _>(settings.only)
    .load(conn)
    .await
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn now_unix() -> i64 {
    i64::try_from(crate::clock::now_unix()).unwrap_or(i64::MAX)
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
pub async fn run(
    conn: &mut AsyncPgConnection,
    chain: &Chain,
    settings: &Settings,
    recovering: Option<&Recovering<'_>>,
) -> QueryResult<Report> {
    let mut report = Report::default();
    let chains = Chains { evm: chain, solana: settings.solana.as_deref() };
    // Every channel when reconciling everything; one payment's run reads only its own.
    let lanes = if settings.only.is_none() { channels::pass(conn, chain, &mut report).await? } else { HashMap::new() };
    decide_all(conn, (&chains, &lanes), settings, &mut report).await?;
    prove_charges(conn, &chains, &mut report).await?;
    if let Some(r) = recovering {
        lost::recover_lost(conn, &chains, r, &mut report).await?;
    }
    Ok(report)
}

/// The first pass: every eligible intent's status, from the chain.
async fn decide_all(
    conn: &mut AsyncPgConnection,
    (chains, lanes): (&Chains<'_>, &Lanes),
    settings: &Settings,
    report: &mut Report,
) -> QueryResult<()> {
    let mut after = None;
    loop {
        let batch = candidates(conn, settings, after).await?;
        let Some(last) = batch.last() else {
            return Ok(());
        };
        after = Some(Cursor { created_at: last.created_at, id: last.id });
        for c in &batch {
            report.checked += 1;
            decide_one(conn, (chains, lanes), settings, c, report).await?;
        }
        if let Some(p) = &settings.progress {
            p.step(batch.len() as u64);
        }
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

/// Reads the chain's verdict on one intent and writes the status it moves to, if any.
async fn decide_one(
    conn: &mut AsyncPgConnection,
    (chains, lanes): (&Chains<'_>, &Lanes),
    settings: &Settings,
    c: &Candidate,
    report: &mut Report,
) -> QueryResult<()> {
    let verdict = match registry::verdict(chains, c.row()).await.and_then(|v| channel_verdict(v, c, lanes)) {
        Ok(v) => v,
        Err(e) => {
            report.errors += 1;
            tracing::warn!(payment.id = %c.id, agent_id = %c.agent_id, payment.network = %c.network, error = %e,
                "cannot check a payment intent on-chain; left as it was");
            return Ok(());
        }
    };
    let used = verdict == Verdict::Used;
    let new = match verdict {
        Verdict::Used | Verdict::Unused => decide(c.status, used, c.served, c.valid_before, now_unix()),
        Verdict::NeverLands => Some(Expired),
        Verdict::MayLand => None,
    };
    let Some(new) = new else {
        report.pending += 1;
        return Ok(());
    };
    // An `upto` authorization used on-chain: what its settling transaction moved is charged
    // (unknown ⇒ the maximum stays charged until a later run finds it).
    let charged =
        if used && c.scheme == "upto" { registry::proven_charge(chains, c.row()).await.ok().flatten() } else { None };
    faults::at(settings.faults.as_ref(), Point::ReconcileDecided).await;
    let seen = payments::store::Seen {
        agent_id: c.agent_id,
        id: c.id,
        idempotency_key: &c.idempotency_key,
        status: c.status,
        valid_before: c.valid_before,
        attempts: c.attempts,
    };
    if !payments::store::reconcile_fate(conn, &seen, new, charged, millis(settings.abandon_after)).await? {
        report.pending += 1;
        tracing::info!(payment.id = %c.id, "payment intent changed meanwhile (re-signed, or taken by an owner); left as it is");
        return Ok(());
    }
    tracing::info!(payment.id = %c.id, agent_id = %c.agent_id, payment.status.old = %c.status,
        payment.status.new = %new, "payment intent reconciled");
    match new {
        Settled => report.settled += 1,
        SettledResponseLost => report.settled_response_lost += 1,
        _ => report.expired += 1,
    }
    Ok(())
}

/// A pass over spent payments whose charge is unproven (`upto`, and intents signed again for
/// changed terms): the settling transaction is looked up again and the amount lowered to what
/// it moved. Not found (yet): left for the next run, the maximum charged meanwhile (never
/// less).
async fn prove_charges(conn: &mut AsyncPgConnection, chains: &Chains<'_>, report: &mut Report) -> QueryResult<()> {
    let mut after = None;
    loop {
        let batch = payments::store::unproven_charges(conn, after, BATCH).await?;
        let Some(last) = batch.last() else {
            return Ok(());
        };
        after = Some((last.created_at, last.id));
        for p in &batch {
            let row = RowRef {
                id: p.id,
                network: &p.network,
                asset: &p.asset,
                pay_to: &p.pay_to,
                payer: &p.payer,
                nonce: &p.nonce,
                x402_version: p.x402_version,
                authorization: &p.signed_authorization,
            };
            match registry::proven_charge(chains, row).await {
                Err(e) => {
                    report.errors += 1;
                    tracing::warn!(payment.id = %p.id, error = %e, "stored authorization unreadable; charge left unproven");
                }
                Ok(Some(charged)) => {
                    payments::store::record_charged(conn, p.agent_id, p.id, charged).await?;
                    report.charges_proven += 1;
                    tracing::info!(payment.id = %p.id, payment.amount = %charged, "upto charge proven from the chain");
                }
                Ok(None) => {}
            }
        }
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

/// What each lane's channel showed this run.
type Lanes = HashMap<Uuid, channels::Seen>;

/// A batch-settlement voucher's verdict from its channel's reading (`channels`); other
/// schemes' verdicts pass through.
fn channel_verdict(v: Verdict, c: &Candidate, lanes: &Lanes) -> Result<Verdict, crate::relay::pay::scheme::Unread> {
    let seen = batch_channel::lane_of(&c.signed_authorization).and_then(|l| lanes.get(&l));
    match (v, seen) {
        (Verdict::MayLand, Some(seen)) if c.scheme == crate::x402::batch::SCHEME => {
            batch_channel::voucher_verdict(&c.signed_authorization, seen.claimed, seen.is_final)
        }
        (v, _) => Ok(v),
    }
}

impl Candidate {
    /// The columns a scheme decodes its record from.
    fn row(&self) -> RowRef<'_> {
        RowRef {
            id: self.id,
            network: &self.network,
            asset: &self.asset,
            pay_to: &self.pay_to,
            payer: &self.payer,
            nonce: &self.nonce,
            x402_version: self.x402_version,
            authorization: &self.signed_authorization,
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
