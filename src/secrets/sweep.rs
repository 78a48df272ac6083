//! The start-up sweep (`serve`, before it listens): after an upgrade, nothing an agent
//! forwarded stays in the clear.
//!
//! 1. Ledger rows an earlier version wrote keep the request as sent, the payment header and
//!    the exact 402 parts in clear columns: each is sealed under the current key (or, when
//!    nothing can need it any more, the payment `settled` or older than
//!    `SECRETS_RETENTION_HOURS`, dropped), its clear columns emptied and its shown copies
//!    redacted. Every start does this (a partial index finds such rows at once), so rows that
//!    a router of the earlier version wrote during a rolling upgrade are sealed by the next
//!    start.
//! 2. URLs shown in the clear are redacted with `REDACT_QUERY_PARAMS`: the ledger's shown
//!    copies and every receipt's URL (a receipt is signed again by the router's key, as it
//!    now reads). `secrets_sweep` remembers the names and when the last sweep began. With
//!    other names (or none remembered: the first start after the upgrade) every row is looked
//!    at. With the same names, rows this version writes are redacted already, and a row of
//!    the earlier version in the ledger is found by step 1; only receipts created from ten
//!    minutes before to a day after the last sweep began are looked at again (those a router
//!    of the earlier version may have signed during a rolling upgrade), so a restart costs
//!    little however long the routers ran.
//!
//! Every write is guarded by what was read (a row written meanwhile is left to the next
//! sweep); routers starting together repeat each other's work harmlessly.

use alloy::signers::local::PrivateKeySigner;
use chrono::{DateTime, Utc};
use diesel::sql_types::{Text, Timestamptz};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use super::{Keyring, Redaction, SealError, intent};
use crate::payments::PaymentStatus;
use crate::payments::kept::{self, Plaintext};
use crate::payments::sealed::{Exact, Sealed};
use crate::payments::store::SentRequest;

/// Rows read per batch.
const BATCH: i64 = 200;
/// How far before the last sweep's start a sweep with the same names looks again at
/// receipts (a row is stamped when its transaction starts, and committed a little later).
const OVERLAP_MINUTES: i64 = 10;
/// How long after the last sweep's start a router of the earlier version may still have
/// written receipts (a rolling upgrade), looked at again by a sweep with the same names.
const ROLLING_HOURS: i64 = 24;

/// What a sweep works with.
pub struct Sweep<'a> {
    pub keyring: &'a Keyring,
    pub redaction: &'a Redaction,
    pub retention_hours: i32,
    /// Signs receipts again once their URL is redacted (the router's receipt key).
    pub receipt_signer: &'a PrivateKeySigner,
}

/// What a sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Swept {
    /// Rows whose clear secrets were sealed.
    pub sealed: u64,
    /// Rows whose clear secrets were dropped (nothing can need them).
    pub dropped: u64,
    /// Rows whose shown copies were redacted again.
    pub redacted_payments: u64,
    /// Receipts whose URL was redacted (and which were signed again).
    pub redacted_receipts: u64,
}

/// Why a sweep stopped (what it did so far stays done).
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Db(#[from] diesel::result::Error),
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("signing a receipt again: {0}")]
    Sign(#[from] alloy::signers::Error),
}

#[derive(QueryableByName)]
struct Marker {
    #[diesel(sql_type = Text)]
    redacted_names: String,
    #[diesel(sql_type = Timestamptz)]
    started_at: DateTime<Utc>,
}

#[derive(QueryableByName)]
struct Now {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

/// Runs the sweep (see the module).
///
/// # Errors
/// [`SweepError`]; what was written before it stays written.
pub async fn run(conn: &mut AsyncPgConnection, s: &Sweep<'_>) -> Result<Swept, SweepError> {
    let mut swept = Swept::default();
    let started = diesel::sql_query("SELECT now() AS now").get_result::<Now>(conn).await?.now;
    let names = s.redaction.names().join(",");
    let marker: Option<Marker> =
        diesel::sql_query("SELECT redacted_names, started_at FROM secrets_sweep").get_result(conn).await.optional()?;
    let rolling = marker.filter(|m| m.redacted_names == names).map(|m| {
        let from = m.started_at - chrono::Duration::minutes(OVERLAP_MINUTES);
        (from, m.started_at + chrono::Duration::hours(ROLLING_HOURS))
    });
    seal_plaintext(conn, s, &mut swept).await?;
    if rolling.is_none() {
        redact_payments(conn, s.redaction, &mut swept).await?;
    }
    redact_receipts(conn, s, rolling, &mut swept).await?;
    diesel::sql_query(
        "INSERT INTO secrets_sweep (redacted_names, started_at) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET redacted_names = $1, started_at = $2",
    )
    .bind::<Text, _>(&names)
    .bind::<Timestamptz, _>(started)
    .execute(conn)
    .await?;
    Ok(swept)
}

/// The exact parts an earlier version kept in clear columns.
fn exact_of(row: &Plaintext) -> Exact {
    let request = match (&row.request_method, &row.request_url, &row.request_headers) {
        (Some(method), Some(url), Some(headers)) => Some(SentRequest {
            method: method.clone(),
            url: url.clone(),
            headers: headers.clone(),
            body: row.request_body.clone(),
        }),
        _ => None,
    };
    // Rows older than the exact copies were signed from the JSONB columns themselves.
    let json = |exact: &Option<Vec<u8>>, copy: &serde_json::Value| {
        exact.clone().unwrap_or_else(|| serde_json::to_vec(copy).unwrap_or_default())
    };
    Exact {
        request,
        header_value: row.header_value.clone().unwrap_or_default(),
        requirement_json: json(&row.requirement_json, &row.requirement),
        context_json: json(&row.context_json, &row.context),
        advertised_extensions: row.advertised_extensions.clone(),
    }
}

async fn seal_plaintext(conn: &mut AsyncPgConnection, s: &Sweep<'_>, swept: &mut Swept) -> Result<(), SweepError> {
    let mut after = None;
    loop {
        let batch = kept::plaintext_batch(conn, s.retention_hours, after, BATCH).await?;
        for row in &batch {
            let exact = exact_of(row);
            let needed = row.status != PaymentStatus::Settled && !row.expired;
            let sealed: Option<Sealed> =
                if needed { Some(intent::seal(s.keyring, row.agent_id, row.id, &exact)?) } else { None };
            let mut shown = intent::shown(s.redaction, &exact);
            // The shown URL of a row without the request as sent is its own, redacted.
            shown.request_url =
                shown.request_url.or_else(|| row.request_url.as_deref().map(|u| s.redaction.text(u).into_owned()));
            if kept::seal_plaintext(conn, row, sealed.as_ref(), &shown).await? {
                if needed {
                    swept.sealed += 1;
                } else {
                    swept.dropped += 1;
                }
            }
        }
        let Some(last) = batch.last() else { return Ok(()) };
        after = Some((last.created_at, last.id));
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

async fn redact_payments(
    conn: &mut AsyncPgConnection,
    redaction: &Redaction,
    swept: &mut Swept,
) -> Result<(), SweepError> {
    let mut after = None;
    loop {
        let batch = kept::shown_batch(conn, after, BATCH).await?;
        for row in &batch {
            let shown = crate::payments::sealed::Shown {
                request_method: None,
                request_url: row.request_url.as_deref().map(|u| redaction.text(u).into_owned()),
                requirement: redaction.json(&row.requirement),
                context: redaction.json(&row.context),
                advertised_extensions: row.advertised_extensions.as_deref().map(|b| redaction.json_bytes(b)),
            };
            let unchanged = shown.request_url == row.request_url
                && shown.requirement == row.requirement
                && shown.context == row.context
                && shown.advertised_extensions == row.advertised_extensions;
            if !unchanged && kept::reshow(conn, row, &shown).await? {
                swept.redacted_payments += 1;
            }
        }
        let Some(last) = batch.last() else { return Ok(()) };
        after = Some((last.created_at, last.id));
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}

async fn redact_receipts(
    conn: &mut AsyncPgConnection,
    s: &Sweep<'_>,
    within: Option<(DateTime<Utc>, DateTime<Utc>)>,
    swept: &mut Swept,
) -> Result<(), SweepError> {
    let mut after = None;
    loop {
        let batch = crate::receipts::store::with_url_parameters(conn, within, after, BATCH).await?;
        for receipt in &batch {
            let shown = s.redaction.text(&receipt.url);
            if shown == receipt.url {
                continue;
            }
            let mut redacted = receipt.clone();
            redacted.url = shown.into_owned();
            redacted.sign_again(s.receipt_signer)?;
            if crate::receipts::store::replace_signed_url(conn, &redacted, &receipt.url).await? {
                swept.redacted_receipts += 1;
            }
        }
        let Some(last) = batch.last() else { return Ok(()) };
        after = Some((last.created_at, last.id));
        if (batch.len() as i64) < BATCH {
            return Ok(());
        }
    }
}
