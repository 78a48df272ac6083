//! How long an intent's secrets are kept, and the rows written before they were sealed
//! (docs/DESIGN.md §10): the ledger side of `crate::secrets` (which seals and redacts; this
//! module only reads and writes rows, each write guarded by what was read).
//!
//! - [`drop_secrets`] (`gc`): the sealed parts of `settled` payments and of payments older
//!   than the retention bound are set NULL, with any clear copy a row of an older version
//!   still holds.
//! - [`plaintext_batch`] / [`seal_plaintext`] (`secrets::sweep`): rows of an older version
//!   keep the request as sent and the exact 402 parts in clear columns; they are sealed (or,
//!   when nothing can need them any more, dropped) and their shown copies redacted.
//! - [`shown_batch`] / [`reshow`] (`secrets::sweep`): the shown copies (URL, terms, context,
//!   extensions) of rows redacted again, when `REDACT_QUERY_PARAMS` changed.

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bytea, Integer, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use super::PaymentStatus;
use super::sealed::{Sealed, Shown};
use crate::db::storable;

/// A row that still holds clear copies of its secrets (written before they were sealed). The
/// migration's partial index `payments_plaintext` has the same condition.
pub const PLAINTEXT: &str = "(request_headers IS NOT NULL OR request_body IS NOT NULL OR header_value IS NOT NULL \
                             OR requirement_json IS NOT NULL OR context_json IS NOT NULL)";

/// Drops, `batch` rows per statement, the secrets of every payment that can no longer need
/// them: `settled` ones (their answer was served or recovered: nothing is re-sent or
/// re-signed any more), and every one created more than `retention_hours` ago. Returns how
/// many rows were cleared.
///
/// # Errors
/// Database errors (rows cleared by earlier batches stay cleared).
pub async fn drop_secrets(conn: &mut AsyncPgConnection, retention_hours: i32, batch: i64) -> diesel::QueryResult<u64> {
    let mut total = 0u64;
    loop {
        let n = diesel::sql_query(format!(
            "UPDATE payments SET sealed = NULL, sealed_key_id = NULL, request_headers = NULL, request_body = NULL, \
                    header_value = NULL, requirement_json = NULL, context_json = NULL \
              WHERE (agent_id, id) IN ( \
                    SELECT agent_id, id FROM payments \
                     WHERE (sealed IS NOT NULL OR {PLAINTEXT}) \
                       AND (status = $1 OR created_at < now() - make_interval(hours => $2)) \
                     LIMIT $3 FOR UPDATE SKIP LOCKED)"
        ))
        .bind::<Text, _>(PaymentStatus::Settled)
        .bind::<Integer, _>(retention_hours)
        .bind::<BigInt, _>(batch)
        .execute(conn)
        .await?;
        total += n as u64;
        if (n as i64) < batch {
            return Ok(total);
        }
    }
}

/// A row with clear copies of its secrets, as read for sealing.
#[derive(Debug, QueryableByName)]
pub struct Plaintext {
    #[diesel(sql_type = SqlUuid)]
    pub agent_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub status: PaymentStatus,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    /// Older than the retention bound: dropped rather than sealed.
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub expired: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub request_method: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub request_url: Option<String>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub request_headers: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub request_body: Option<Vec<u8>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub header_value: Option<String>,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub requirement_json: Option<Vec<u8>>,
    #[diesel(sql_type = Jsonb)]
    pub requirement: Value,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub context_json: Option<Vec<u8>>,
    #[diesel(sql_type = Jsonb)]
    pub context: Value,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub advertised_extensions: Option<Vec<u8>>,
}

/// One batch of rows with clear copies of their secrets, after `after` in `(created_at, id)`.
///
/// # Errors
/// Database errors.
pub async fn plaintext_batch(
    conn: &mut AsyncPgConnection,
    retention_hours: i32,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> diesel::QueryResult<Vec<Plaintext>> {
    diesel::sql_query(format!(
        "SELECT agent_id, id, status, created_at, updated_at, \
                created_at < now() - make_interval(hours => $1) AS expired, request_method, request_url, \
                request_headers, request_body, header_value, requirement_json, requirement, context_json, context, \
                advertised_extensions \
           FROM payments \
          WHERE {PLAINTEXT} AND ($2::timestamptz IS NULL OR (created_at, id) > ($2, $3::uuid)) \
          ORDER BY created_at, id LIMIT $4"
    ))
    .bind::<Integer, _>(retention_hours)
    .bind::<Nullable<Timestamptz>, _>(after.map(|a| a.0))
    .bind::<Nullable<SqlUuid>, _>(after.map(|a| a.1))
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// Replaces `row`'s clear copies by `sealed` (`None`: dropped) and its shown copies by
/// `shown`, if the row was not written since it was read and still holds clear copies.
/// `false`: it was (left for the next sweep), or another sweep sealed it first.
///
/// # Errors
/// Database errors.
pub async fn seal_plaintext(
    conn: &mut AsyncPgConnection,
    row: &Plaintext,
    sealed: Option<&Sealed>,
    shown: &Shown,
) -> diesel::QueryResult<bool> {
    let n = diesel::sql_query(format!(
        "UPDATE payments SET sealed = $3, sealed_key_id = $4, request_url = $5, requirement = $6, context = $7, \
                advertised_extensions = $8, request_headers = NULL, request_body = NULL, header_value = NULL, \
                requirement_json = NULL, context_json = NULL \
          WHERE agent_id = $1 AND id = $2 AND updated_at = $9 AND {PLAINTEXT}"
    ))
    .bind::<SqlUuid, _>(row.agent_id)
    .bind::<SqlUuid, _>(row.id)
    .bind::<Nullable<Bytea>, _>(sealed.map(|s| &s.bytes[..]))
    .bind::<Nullable<Text>, _>(sealed.map(|s| s.key_id.as_str()))
    .bind::<Nullable<Text>, _>(shown.request_url.as_deref())
    .bind::<Jsonb, _>(storable::json(&shown.requirement).as_ref())
    .bind::<Jsonb, _>(storable::json(&shown.context).as_ref())
    .bind::<Nullable<Bytea>, _>(shown.advertised_extensions.as_deref())
    .bind::<Timestamptz, _>(row.updated_at)
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// What a row shows of its request and terms.
#[derive(Debug, QueryableByName)]
pub struct ShownRow {
    #[diesel(sql_type = SqlUuid)]
    pub agent_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Text>)]
    pub request_url: Option<String>,
    #[diesel(sql_type = Jsonb)]
    pub requirement: Value,
    #[diesel(sql_type = Jsonb)]
    pub context: Value,
    #[diesel(sql_type = Nullable<Bytea>)]
    pub advertised_extensions: Option<Vec<u8>>,
}

/// One batch of the rows whose shown copies may hold a URL's parameters (a `?` or `#` in
/// them), after `after` in `(created_at, id)` order.
///
/// # Errors
/// Database errors.
pub async fn shown_batch(
    conn: &mut AsyncPgConnection,
    after: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> diesel::QueryResult<Vec<ShownRow>> {
    diesel::sql_query(
        "SELECT agent_id, id, created_at, updated_at, request_url, requirement, context, advertised_extensions \
           FROM payments \
          WHERE (request_url ~ '[?#]' OR requirement::text ~ '[?#]' OR context::text ~ '[?#]' \
                 OR position('?'::bytea in coalesce(advertised_extensions, '')) > 0 \
                 OR position('#'::bytea in coalesce(advertised_extensions, '')) > 0) \
            AND ($1::timestamptz IS NULL OR (created_at, id) > ($1, $2::uuid)) \
          ORDER BY created_at, id LIMIT $3",
    )
    .bind::<Nullable<Timestamptz>, _>(after.map(|a| a.0))
    .bind::<Nullable<SqlUuid>, _>(after.map(|a| a.1))
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}

/// Writes `row`'s shown copies again, if it was not written since it was read.
///
/// # Errors
/// Database errors.
pub async fn reshow(conn: &mut AsyncPgConnection, row: &ShownRow, shown: &Shown) -> diesel::QueryResult<bool> {
    let n = diesel::sql_query(
        "UPDATE payments SET request_url = $3, requirement = $4, context = $5, advertised_extensions = $6 \
          WHERE agent_id = $1 AND id = $2 AND updated_at = $7",
    )
    .bind::<SqlUuid, _>(row.agent_id)
    .bind::<SqlUuid, _>(row.id)
    .bind::<Nullable<Text>, _>(shown.request_url.as_deref())
    .bind::<Jsonb, _>(storable::json(&shown.requirement).as_ref())
    .bind::<Jsonb, _>(storable::json(&shown.context).as_ref())
    .bind::<Nullable<Bytea>, _>(shown.advertised_extensions.as_deref())
    .bind::<Timestamptz, _>(row.updated_at)
    .execute(conn)
    .await?;
    Ok(n == 1)
}
