//! Postgres side of the idempotency ledger: the source of truth and the lock.
//!
//! Every statement that changes ownership or state is guarded, so concurrent routers
//! race on Postgres row locks, not on reads: the claim is an `INSERT … ON CONFLICT DO
//! NOTHING`, the takeover an `UPDATE … WHERE created_at < now() - threshold`, and every
//! write of the owner carries `WHERE lease = $mine` (fencing). Ages use the database
//! clock only, so router clocks never matter.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::PrepareExt;
use crate::db::schema::idempotency_keys;

/// The lifecycle state of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InFlight,
    Completed,
    Errored,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::Errored => "errored",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "in_flight" => Some(Self::InFlight),
            "completed" => Some(Self::Completed),
            "errored" => Some(Self::Errored),
            _ => None,
        }
    }
}

/// What a lookup finds.
#[derive(Debug, Clone)]
pub struct Row {
    pub status: Status,
    pub request_hash: String,
    pub response_status_code: Option<i32>,
    /// The response exactly as first sent (see [`finish`]).
    pub response_body: Option<Vec<u8>>,
    pub receipt_id: Option<Uuid>,
    /// Milliseconds since the last claim, takeover or heartbeat (database clock).
    pub age_ms: i64,
    /// When the row may be garbage-collected (Unix seconds): a cached copy expires with it.
    pub expires_unix: i64,
}

/// The columns of a [`Row`], as [`claim`] and [`find`] select them.
macro_rules! row_columns {
    () => {
        "status, request_hash, response_status_code, response_body, receipt_id, \
         (EXTRACT(EPOCH FROM (now() - created_at)) * 1000)::bigint AS age_ms, \
         EXTRACT(EPOCH FROM expires_at)::bigint AS expires_unix"
    };
}

/// [`row_columns`] as read. Nullable throughout: the claim reads them through a `LEFT JOIN`,
/// which gives NULLs when there is no row.
#[derive(QueryableByName)]
struct RawRow {
    #[diesel(sql_type = Nullable<Text>)]
    status: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    request_hash: Option<String>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Int4>)]
    response_status_code: Option<i32>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Bytea>)]
    response_body: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    receipt_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<BigInt>)]
    age_ms: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    expires_unix: Option<i64>,
}

impl RawRow {
    /// The row, or `None` when there was none (its NOT NULL columns read as NULL).
    fn into_row(self) -> QueryResult<Option<Row>> {
        let (Some(status), Some(request_hash), Some(age_ms), Some(expires_unix)) =
            (self.status, self.request_hash, self.age_ms, self.expires_unix)
        else {
            return Ok(None);
        };
        let status = Status::parse(&status)
            .ok_or_else(|| diesel::result::Error::DeserializationError(format!("unknown status {status:?}").into()))?;
        Ok(Some(Row {
            status,
            request_hash,
            response_status_code: self.response_status_code,
            response_body: self.response_body,
            receipt_id: self.receipt_id,
            age_ms,
            expires_unix,
        }))
    }
}

/// What one claim attempt found.
#[derive(Debug)]
pub enum Claim {
    /// This call inserted the in-flight row (expiring at the given Unix second): it owns
    /// the key.
    Claimed { expires_unix: i64 },
    /// The key exists: its row as of the statement's snapshot. `gate_pending`: the agent has a
    /// call gate that the caller has not checked ([`Gate::Unchecked`]), so the row may not be
    /// taken over before it is.
    Existing { row: Row, gate_pending: bool },
    /// The insert conflicted with a row that the statement's snapshot does not show: another
    /// claim committed it while this statement waited on it (or the row has been deleted
    /// since). A new statement ([`find`]) sees it.
    Unseen,
    /// No row, and nothing inserted: the agent has a call gate that the caller must check
    /// first ([`Gate::Unchecked`]).
    Gated,
}

#[derive(QueryableByName)]
struct ClaimRow {
    /// The inserted row's expiry; NULL when nothing was inserted.
    #[diesel(sql_type = Nullable<BigInt>)]
    claimed_expires: Option<i64>,
    /// The agent has a call gate (`payments::limits::call_gate_sql`).
    #[diesel(sql_type = diesel::sql_types::Bool)]
    gated: bool,
    #[diesel(embed)]
    row: RawRow,
}

/// Reads the row of the key or, if there is none, claims the key, in one statement (one
/// round trip: a replay that misses Redis costs a single Postgres statement, and the insert
/// is not even attempted for an existing key: about a quarter less work for Postgres per replay).
/// With [`Gate::Unchecked`] the same statement reads whether the agent has an operator's call
/// gate, and inserts only if it has none: a call of an agent without one is admitted and
/// claimed in one round trip; otherwise nothing is written ([`Claim::Gated`], or the
/// existing row with `gate_pending`) and the caller checks the gate, then claims with
/// [`Gate::Checked`].
///
/// With [`Commit::Deferred`] the insert's commit does not wait for the WAL flush (see there).
///
/// The insert is `ON CONFLICT DO NOTHING`; the read shares the statement's snapshot, so a
/// row committed by a concurrent claim while the insert waited on it is not shown:
/// [`Claim::Unseen`], and the caller reads it with a new statement.
///
/// # Errors
/// Database errors, or a status value outside the CHECK constraint.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    request_hash: &str,
    lease: Uuid,
    gate: Gate,
    commit: Commit,
) -> QueryResult<Claim> {
    let row: ClaimRow = diesel::sql_query(concat!(
        "WITH k AS (SELECT ",
        row_columns!(),
        " FROM idempotency_keys WHERE agent_id = $1 AND key = $2), \
         g AS (SELECT ",
        crate::payments::limits::call_gate_sql!(),
        " AS gated), \
         ins AS ( \
             INSERT INTO idempotency_keys (agent_id, key, request_hash, status, lease) \
             SELECT $1, $2, $3, 'in_flight', $4 WHERE NOT EXISTS (SELECT 1 FROM k) \
                AND ($5 OR NOT (SELECT gated FROM g)) \
             ON CONFLICT (agent_id, key) DO NOTHING \
             RETURNING EXTRACT(EPOCH FROM expires_at)::bigint AS e) \
         SELECT (SELECT e FROM ins) AS claimed_expires, (SELECT gated FROM g) AS gated, k.* \
           FROM (SELECT) AS one LEFT JOIN k ON true \
          WHERE CASE WHEN $6 THEN set_config('synchronous_commit', 'off', true) = 'off' ELSE true END",
    ))
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<Text, _>(request_hash)
    .bind::<SqlUuid, _>(lease)
    .bind::<diesel::sql_types::Bool, _>(gate == Gate::Checked)
    .bind::<diesel::sql_types::Bool, _>(commit == Commit::Deferred)
    .prepared()
    .get_result(conn)
    .await?;
    if let Some(expires_unix) = row.claimed_expires {
        return Ok(Claim::Claimed { expires_unix });
    }
    let gate_pending = row.gated && gate == Gate::Unchecked;
    Ok(match row.row.into_row()? {
        Some(row) => Claim::Existing { row, gate_pending },
        // No row, and nothing inserted because the gate is still to be checked.
        None if gate_pending => Claim::Gated,
        None => Claim::Unseen,
    })
}

/// Whether the caller has checked the operator's call gate (`payments::limits::admit`)
/// before claiming.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Checked (and passed): claim.
    Checked,
    /// Not checked: claim only if the agent has no gate (the statement reads it); otherwise
    /// insert nothing and say so.
    Unchecked,
}

/// When a new claim becomes durable. The claim must be on disk before the upstream hears of
/// the call (a claim lost in a crash would let a retry call it again); it need not be on disk
/// at its own commit when a later synchronous commit comes first: one WAL flush writes every
/// record before it, this claim's included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// At its own commit.
    Now,
    /// By a later synchronous commit of the same call before it contacts the upstream: the
    /// payment intent of a call paid ahead on known terms, or a synchronous [`heartbeat`]
    /// (`relay::make_durable`) on any other path. One WAL flush (2–4 ms on a disk that honours `fsync`) fewer per call paid ahead.
    Deferred,
}

/// Gives up a claim that recorded nothing (a pause or a rate limit refused the call before
/// any payment was signed): deletes the in-flight row if `lease` still owns it and no payment
/// intent exists for its request, so the same key can be retried from scratch. `false`: the
/// row was taken over, or an intent exists (then the key stays in flight and a retry takes it
/// over and resumes the intent, as after a crash).
///
/// # Errors
/// Database errors.
pub async fn release(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str, lease: Uuid) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "DELETE FROM idempotency_keys k \
          WHERE k.agent_id = $1 AND k.key = $2 AND k.lease = $3 AND k.status = 'in_flight' \
            AND NOT EXISTS (SELECT 1 FROM payments p \
                             WHERE p.agent_id = k.agent_id AND p.idempotency_key = k.key \
                               AND p.request_hash = k.request_hash)",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<SqlUuid, _>(lease)
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Reads the row for (agent, key), if any.
///
/// # Errors
/// Database errors, or a status value outside the CHECK constraint.
pub async fn find(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str) -> QueryResult<Option<Row>> {
    let raw: Option<RawRow> = diesel::sql_query(concat!(
        "SELECT ",
        row_columns!(),
        " FROM idempotency_keys WHERE agent_id = $1 AND key = $2"
    ))
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    Ok(raw.map(RawRow::into_row).transpose()?.flatten())
}

/// Takes over an abandoned in-flight row (DESIGN Fix 1). One guarded statement: of
/// several concurrent retries exactly one matches and becomes the owner with `new_lease`;
/// it gets the row's new expiry (Unix seconds), the others `None`.
///
/// The takeover also moves `expires_at` to at least 24 h from now, like a fresh claim: the
/// row is live again, and its result must stay replayable (and safe from the GC) as long
/// as a fresh call's would.
///
/// # Errors
/// Database errors.
pub async fn take_over(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    request_hash: &str,
    new_lease: Uuid,
    abandon_after: Duration,
) -> QueryResult<Option<i64>> {
    #[derive(QueryableByName)]
    struct Taken {
        #[diesel(sql_type = BigInt)]
        expires_unix: i64,
    }
    let abandon_ms = i64::try_from(abandon_after.as_millis()).unwrap_or(i64::MAX);
    let taken: Option<Taken> = diesel::sql_query(
        "UPDATE idempotency_keys \
            SET created_at = now(), lease = $3, takeovers = takeovers + 1, \
                expires_at = GREATEST(expires_at, now() + interval '24 hours') \
          WHERE agent_id = $1 AND key = $2 AND request_hash = $4 AND status = 'in_flight' \
            AND created_at < now() - make_interval(secs => $5::float8 / 1000) \
          RETURNING EXTRACT(EPOCH FROM expires_at)::bigint AS expires_unix",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<SqlUuid, _>(new_lease)
    .bind::<Text, _>(request_hash)
    .bind::<BigInt, _>(abandon_ms)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    Ok(taken.map(|t| t.expires_unix))
}

/// Refreshes the abandonment clock of a row we still own. `false`: we lost the lease.
///
/// # Errors
/// Database errors.
pub async fn heartbeat(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str, lease: Uuid) -> QueryResult<bool> {
    let n = diesel::update(
        idempotency_keys::table
            .filter(idempotency_keys::agent_id.eq(agent_id))
            .filter(idempotency_keys::key.eq(key))
            .filter(idempotency_keys::lease.eq(lease))
            .filter(idempotency_keys::status.eq(Status::InFlight.as_str())),
    )
    .set(idempotency_keys::created_at.eq(diesel::dsl::now))
    .prepared()
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Whether the key was finished by `lease` with `receipt_id` and this exact response: what
/// the owner re-reads after a commit whose acknowledgement was lost.
///
/// # Errors
/// Database errors.
pub async fn finished_by(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    lease: Uuid,
    response_body: &[u8],
) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "SELECT 1 FROM idempotency_keys \
          WHERE agent_id = $1 AND key = $2 AND lease = $3 AND status <> 'in_flight' AND response_body = $4",
    )
    .bind::<diesel::sql_types::Uuid, _>(agent_id)
    .bind::<diesel::sql_types::Text, _>(key)
    .bind::<diesel::sql_types::Uuid, _>(lease)
    .bind::<diesel::sql_types::Bytea, _>(response_body)
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// The owner's final transition (DESIGN Fix 2): applies only while `lease` is still the
/// row's lease and the row is in flight. `false` means we were fenced off.
///
/// `response_body` is the response as sent to the agent, byte for byte (BYTEA): whatever the
/// upstream put in it (NUL characters, huge numbers), a replay is the same bytes.
///
/// # Errors
/// Database errors.
#[expect(clippy::too_many_arguments, reason = "one column each; a struct would only rename them")]
pub async fn finish(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    lease: Uuid,
    status: Status,
    response_status_code: i32,
    response_body: &[u8],
    receipt_id: Option<Uuid>,
) -> QueryResult<bool> {
    let n = diesel::update(
        idempotency_keys::table
            .filter(idempotency_keys::agent_id.eq(agent_id))
            .filter(idempotency_keys::key.eq(key))
            .filter(idempotency_keys::lease.eq(lease))
            .filter(idempotency_keys::status.eq(Status::InFlight.as_str())),
    )
    .set((
        idempotency_keys::status.eq(status.as_str()),
        idempotency_keys::response_status_code.eq(response_status_code),
        idempotency_keys::response_body.eq(response_body),
        idempotency_keys::receipt_id.eq(receipt_id),
        idempotency_keys::completed_at.eq(diesel::dsl::now),
    ))
    .prepared()
    .execute(conn)
    .await?;
    Ok(n == 1)
}
