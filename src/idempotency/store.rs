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
use serde_json::Value;
use uuid::Uuid;

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
    pub response_body: Option<Value>,
    pub receipt_id: Option<Uuid>,
    /// Milliseconds since the last claim, takeover or heartbeat (database clock).
    pub age_ms: i64,
}

#[derive(QueryableByName)]
struct RawRow {
    #[diesel(sql_type = Text)]
    status: String,
    #[diesel(sql_type = Text)]
    request_hash: String,
    #[diesel(sql_type = Nullable<diesel::sql_types::Int4>)]
    response_status_code: Option<i32>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Jsonb>)]
    response_body: Option<Value>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    receipt_id: Option<Uuid>,
    #[diesel(sql_type = BigInt)]
    age_ms: i64,
}

/// Tries to claim the key: `true` if this call inserted the in-flight row.
///
/// # Errors
/// Database errors.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    request_hash: &str,
    lease: Uuid,
) -> QueryResult<bool> {
    let inserted: Option<Uuid> = diesel::insert_into(idempotency_keys::table)
        .values((
            idempotency_keys::agent_id.eq(agent_id),
            idempotency_keys::key.eq(key),
            idempotency_keys::request_hash.eq(request_hash),
            idempotency_keys::status.eq(Status::InFlight.as_str()),
            idempotency_keys::lease.eq(lease),
        ))
        .on_conflict((idempotency_keys::agent_id, idempotency_keys::key))
        .do_nothing()
        .returning(idempotency_keys::lease)
        .get_result(conn)
        .await
        .optional()?;
    Ok(inserted.is_some())
}

/// Reads the row for (agent, key), if any.
///
/// # Errors
/// Database errors, or a status value outside the CHECK constraint.
pub async fn find(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str) -> QueryResult<Option<Row>> {
    let raw: Option<RawRow> = diesel::sql_query(
        "SELECT status, request_hash, response_status_code, response_body, receipt_id, \
                (EXTRACT(EPOCH FROM (now() - created_at)) * 1000)::bigint AS age_ms \
         FROM idempotency_keys WHERE agent_id = $1 AND key = $2",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .get_result(conn)
    .await
    .optional()?;
    raw.map(|r| {
        let status = Status::parse(&r.status).ok_or_else(|| {
            diesel::result::Error::DeserializationError(format!("unknown status {:?}", r.status).into())
        })?;
        Ok(Row {
            status,
            request_hash: r.request_hash,
            response_status_code: r.response_status_code,
            response_body: r.response_body,
            receipt_id: r.receipt_id,
            age_ms: r.age_ms,
        })
    })
    .transpose()
}

/// Takes over an abandoned in-flight row (DESIGN Fix 1). One guarded statement: of
/// several concurrent retries exactly one matches and becomes the owner with `new_lease`.
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
) -> QueryResult<bool> {
    let abandon_ms = i64::try_from(abandon_after.as_millis()).unwrap_or(i64::MAX);
    let n = diesel::sql_query(
        "UPDATE idempotency_keys \
            SET created_at = now(), lease = $3, takeovers = takeovers + 1 \
          WHERE agent_id = $1 AND key = $2 AND request_hash = $4 AND status = 'in_flight' \
            AND created_at < now() - make_interval(secs => $5::float8 / 1000)",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .bind::<SqlUuid, _>(new_lease)
    .bind::<Text, _>(request_hash)
    .bind::<BigInt, _>(abandon_ms)
    .execute(conn)
    .await?;
    Ok(n == 1)
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
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// The owner's final transition (DESIGN Fix 2): applies only while `lease` is still the
/// row's lease and the row is in flight. `false` means we were fenced off.
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
    response_body: &Value,
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
    .execute(conn)
    .await?;
    Ok(n == 1)
}
