//! The SQL of the audit API. Read-only; every function takes the caller's connection.
//!
//! Each list is one static statement whose optional filters are `($n IS NULL OR …)`: the
//! statements are never cached as prepared (diesel `sql_query`), so Postgres plans each with
//! the actual values and the absent filters fold away. Pages are fetched one row long to
//! learn whether another page follows without a second query.

use chrono::{DateTime, Utc};
use diesel::prelude::QueryableByName;
use diesel::sql_types::{BigInt, Bool, Int2, Int4, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::{Cursor, KeyQuery, Page, PaymentQuery, PaymentSelection, ReceiptQuery};
use crate::payments::PaymentStatus;
use crate::receipts::Receipt;
use crate::receipts::store::ReceiptRow;

/// One page of rows and the cursor of the next page (`None`: this was the last).
#[derive(Debug, Clone)]
pub struct Paged<T> {
    pub rows: Vec<T>,
    pub next: Option<Cursor>,
}

/// Cuts the `limit + 1` rows fetched down to `limit` and derives the next cursor.
fn paged<T>(mut rows: Vec<T>, page: Page, key: impl Fn(&T) -> Cursor) -> Paged<T> {
    let limit = usize::try_from(page.limit).unwrap_or(usize::MAX);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(key)
    } else {
        None
    };
    Paged { rows, next }
}

const RECEIPT_COLUMNS: &str = "id, agent_id, idempotency_key, request_hash, method, url, upstream_status, \
     upstream_body_sha256, payment, outcome, created_at, signer, signature, trace_id";

/// Receipts of every agent, filtered, oldest first.
///
/// # Errors
/// Database errors.
pub async fn receipts(conn: &mut AsyncPgConnection, q: &ReceiptQuery) -> QueryResult<Paged<Receipt>> {
    let rows: Vec<ReceiptRow> = diesel::sql_query(format!(
        "SELECT {RECEIPT_COLUMNS} FROM receipts \
          WHERE ($1::uuid IS NULL OR agent_id = $1) \
            AND ($2::timestamptz IS NULL OR created_at >= $2) \
            AND ($3::timestamptz IS NULL OR created_at < $3) \
            AND ($4::boolean IS NULL OR (COALESCE(jsonb_typeof(payment), 'null') <> 'null') = $4) \
            AND ($5::text IS NULL OR payment->>'network' = $5) \
            AND ($6::timestamptz IS NULL OR (created_at, id) > ($6, $7::uuid)) \
          ORDER BY created_at, id \
          LIMIT $8"
    ))
    .bind::<Nullable<SqlUuid>, _>(q.agent_id)
    .bind::<Nullable<Timestamptz>, _>(q.from)
    .bind::<Nullable<Timestamptz>, _>(q.to)
    .bind::<Nullable<Bool>, _>(q.paid)
    .bind::<Nullable<Text>, _>(q.network.as_deref())
    .bind::<Nullable<Timestamptz>, _>(q.page.after.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(q.page.after.map(|c| c.id))
    .bind::<BigInt, _>(q.page.limit + 1)
    .load(conn)
    .await?;
    Ok(paged(rows.into_iter().map(Receipt::from).collect(), q.page, |r| Cursor { created_at: r.created_at, id: r.id }))
}

/// Any agent's receipt.
///
/// # Errors
/// Database errors.
pub async fn receipt(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<Receipt>> {
    let row: Option<ReceiptRow> = diesel::sql_query(format!("SELECT {RECEIPT_COLUMNS} FROM receipts WHERE id = $1"))
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()?;
    Ok(row.map(Receipt::from))
}

/// A payment intent as operators see it: everything but the signed authorization and the
/// payment header (bearer instruments), plus where its call ended (`PaymentIntent` in the
/// OpenAPI document).
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
#[schema(as = PaymentIntent,
    description = "A payment intent of the ledger, without its signed authorization and payment header.")]
pub struct PaymentView {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub agent_id: Uuid,
    /// The agent's name (its current name: a renamed agent's payments show the new one).
    #[diesel(sql_type = Text)]
    pub agent_name: String,
    #[diesel(sql_type = Text)]
    pub idempotency_key: String,
    #[diesel(sql_type = Int2)]
    #[schema(schema_with = doc::version)]
    pub x402_version: i16,
    #[diesel(sql_type = Text)]
    pub scheme: String,
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub asset: String,
    /// Atomic units of the asset, decimal.
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub amount: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub pay_to: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub payer: String,
    #[diesel(sql_type = Text)]
    pub nonce: String,
    /// Unix seconds.
    #[diesel(sql_type = BigInt)]
    pub valid_after: i64,
    /// Unix seconds; unused past this, the authorization can never move money.
    #[diesel(sql_type = BigInt)]
    pub valid_before: i64,
    /// The 402's `resource` (what was paid for), or null.
    #[diesel(sql_type = Nullable<Jsonb>)]
    #[schema(required = true, schema_with = doc::any)]
    pub resource: Option<Value>,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = doc::status)]
    pub status: String,
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true)]
    pub tx_hash: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true)]
    pub error: Option<String>,
    /// Signatures made (re-signing keeps the nonce).
    #[diesel(sql_type = Int4)]
    pub attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    /// When the current authorization was signed (set again by a re-signing): the rolling
    /// 24 h budget counts the payment from here until 24 h after its valid_before.
    #[diesel(sql_type = Timestamptz)]
    pub signed_at: DateTime<Utc>,
    /// The newest receipt of the same key.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    #[schema(required = true)]
    pub receipt_id: Option<Uuid>,
    /// That receipt's outcome: `completed` or `errored`.
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true, schema_with = doc::receipt_outcome)]
    pub receipt_outcome: Option<String>,
    /// `null` once GC removed the key's row.
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true, schema_with = doc::idempotency_status)]
    pub idempotency_status: Option<String>,
    /// What recovering a lost paid answer tried, when a takeover found the payment used:
    /// `{"outcome": "recovered" | "reaccessed" | "lost", "attempts": [...]}`.
    #[diesel(sql_type = Nullable<Jsonb>)]
    #[schema(required = true, schema_with = doc::recovery)]
    pub recovery: Option<Value>,
}

/// The schemas of [`PaymentView`]'s members that are stricter than their Rust types or
/// refer to other schemas of the document (`Amount`, `Address`).
mod doc {
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
    use utoipa::openapi::{Ref, RefOr};

    use crate::payments::PaymentStatus;

    /// A string of `values`, or null.
    fn nullable(values: &[&str], description: Option<&str>) -> RefOr<Schema> {
        let values = values.iter().map(|v| serde_json::json!(v)).chain([serde_json::Value::Null]);
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .enum_values(Some(values))
            .description(description)
            .into()
    }

    pub fn version() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Integer).enum_values(Some([1, 2])).into()
    }

    pub fn any() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some("The 402's `resource` (what was paid for), or null."))
            .into()
    }

    pub fn status() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(PaymentStatus::ALL.iter().map(|s| s.as_str())))
            .into()
    }

    pub fn receipt_outcome() -> RefOr<Schema> {
        nullable(&["completed", "errored"], None)
    }

    pub fn idempotency_status() -> RefOr<Schema> {
        nullable(&["in_flight", "completed", "errored"], Some("`null` once GC removed the key's row."))
    }

    pub fn key_status() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["in_flight", "completed", "errored"])).into()
    }

    pub fn intent_or_null() -> RefOr<Schema> {
        utoipa::openapi::schema::OneOfBuilder::new()
            .item(Ref::from_schema_name("PaymentIntent"))
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .into()
    }

    pub fn recovery() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
            .description(Some("What recovering a lost paid answer tried (a takeover that found the payment used on-chain): `outcome` is `recovered` (the upstream gave back the original answer), `reaccessed` (a new execution reached by signing in as the payer) or `lost`; `attempts` lists each re-send, challenge and sign-in and its answer. `null` when no recovery ran."))
            .into()
    }
}

/// The column list of [`PaymentView`]: the only way payments leave the database through
/// the audit API. `header_value` and `signed_authorization` are deliberately absent.
pub(crate) const PAYMENT_FROM: &str = "SELECT p.id, p.agent_id, ag.name AS agent_name, p.idempotency_key, \
            p.x402_version, p.scheme, p.network, p.asset, p.amount::text AS amount, p.pay_to, p.payer, p.nonce, p.valid_after, \
            p.valid_before, p.context->'resource' AS resource, p.status, p.tx_hash, p.error, \
            p.attempts, p.created_at, p.updated_at, p.signed_at, \
            r.id AS receipt_id, r.outcome AS receipt_outcome, k.status AS idempotency_status, p.recovery \
       FROM payments p \
       JOIN agents ag ON ag.id = p.agent_id \
       LEFT JOIN LATERAL ( \
            SELECT r.id, r.outcome FROM receipts r \
             WHERE r.agent_id = p.agent_id AND r.idempotency_key = p.idempotency_key \
             ORDER BY r.created_at DESC, r.id DESC LIMIT 1) r ON true \
       LEFT JOIN idempotency_keys k ON k.agent_id = p.agent_id AND k.key = p.idempotency_key";

/// "Money moved, call not served": settled (or settled with the answer lost), and neither a
/// completed receipt nor a completed idempotency row exists for the key. Receipts are kept
/// forever, so a served call stays served after GC removed its idempotency row.
// `p.status IN (…)` lists the statuses where `PaymentStatus::is_spent` (a unit test holds them equal).
pub(crate) const PAID_NOT_SERVED: &str = "p.status IN ('settled', 'settled_response_lost') \
        AND NOT EXISTS (SELECT 1 FROM receipts c WHERE c.agent_id = p.agent_id \
                           AND c.idempotency_key = p.idempotency_key AND c.outcome = 'completed') \
        AND k.status IS DISTINCT FROM 'completed'";

/// Payment intents of every agent, oldest first.
///
/// # Errors
/// Database errors.
pub async fn payments(conn: &mut AsyncPgConnection, q: &PaymentQuery) -> QueryResult<Paged<PaymentView>> {
    let (status, paid_not_served, stuck_secs) = match &q.selection {
        PaymentSelection::All => (None, false, None),
        PaymentSelection::Status(s) => (Some(s.as_str()), false, None),
        PaymentSelection::PaidNotServed => (None, true, None),
        PaymentSelection::Stuck { older_than_secs } => {
            (Some(PaymentStatus::Signed.as_str()), false, Some(*older_than_secs))
        }
    };
    let rows: Vec<PaymentView> = diesel::sql_query(format!(
        "{PAYMENT_FROM} \
          WHERE ($1::text IS NULL OR p.status = $1) \
            AND ($2::uuid IS NULL OR p.agent_id = $2) \
            AND (NOT $3 OR ({PAID_NOT_SERVED})) \
            AND ($4::bigint IS NULL OR p.updated_at < now() - make_interval(secs => $4::float8)) \
            AND ($5::timestamptz IS NULL OR (p.created_at, p.id) > ($5, $6::uuid)) \
            AND ($8::timestamptz IS NULL OR p.created_at >= $8) \
            AND ($9::timestamptz IS NULL OR p.created_at < $9) \
          ORDER BY p.created_at, p.id \
          LIMIT $7"
    ))
    .bind::<Nullable<Text>, _>(status)
    .bind::<Nullable<SqlUuid>, _>(q.agent_id)
    .bind::<Bool, _>(paid_not_served)
    .bind::<Nullable<BigInt>, _>(stuck_secs)
    .bind::<Nullable<Timestamptz>, _>(q.page.after.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(q.page.after.map(|c| c.id))
    .bind::<BigInt, _>(q.page.limit + 1)
    .bind::<Nullable<Timestamptz>, _>(q.from)
    .bind::<Nullable<Timestamptz>, _>(q.to)
    .load(conn)
    .await?;
    Ok(paged(rows, q.page, |p| Cursor { created_at: p.created_at, id: p.id }))
}

/// The payment intent of one (agent, key), if one was signed.
///
/// # Errors
/// Database errors.
pub async fn payment_for_key(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
) -> QueryResult<Option<PaymentView>> {
    diesel::sql_query(format!("{PAYMENT_FROM} WHERE p.agent_id = $1 AND p.idempotency_key = $2"))
        .bind::<SqlUuid, _>(agent_id)
        .bind::<Text, _>(key)
        .get_result(conn)
        .await
        .optional()
}

/// An idempotency row as operators see it (the cached response body is not repeated here:
/// the receipt is the record of the call).
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
#[schema(as = IdempotencyRow)]
pub struct KeyView {
    #[diesel(sql_type = SqlUuid)]
    pub agent_id: Uuid,
    #[diesel(sql_type = Text)]
    pub key: String,
    /// `in_flight`, `completed` or `errored`.
    #[diesel(sql_type = Text)]
    #[schema(schema_with = doc::key_status)]
    pub status: String,
    #[diesel(sql_type = Text)]
    pub request_hash: String,
    /// The status the router answered; `null` while in flight.
    #[diesel(sql_type = Nullable<Int4>)]
    #[schema(required = true)]
    pub response_status_code: Option<i32>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    #[schema(required = true)]
    pub receipt_id: Option<Uuid>,
    #[diesel(sql_type = Timestamptz)]
    pub first_seen_at: DateTime<Utc>,
    /// The owner's last heartbeat (or the takeover, or the claim): the abandonment clock.
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// Milliseconds since the key was first seen.
    #[diesel(sql_type = BigInt)]
    pub age_ms: i64,
    /// Milliseconds since `created_at` (an in-flight key is abandoned past the threshold).
    #[diesel(sql_type = BigInt)]
    pub heartbeat_age_ms: i64,
    #[diesel(sql_type = Int4)]
    pub takeovers: i32,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[schema(required = true)]
    pub completed_at: Option<DateTime<Utc>>,
    /// GC removes the row after this; the key is then new again.
    #[diesel(sql_type = Timestamptz)]
    pub expires_at: DateTime<Utc>,
}

/// What `GET /audit/idempotency` shows about one key.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = IdempotencyReport)]
pub struct KeyReport {
    #[serde(flatten)]
    pub row: KeyView,
    /// `/audit/receipts/{receipt_id}` when there is a receipt.
    #[schema(required = true)]
    pub receipt_url: Option<String>,
    /// The key's payment intent, when one was signed.
    #[schema(required = true, schema_with = doc::intent_or_null)]
    pub payment: Option<PaymentView>,
}

/// The idempotency row of (agent, key) and its payment intent; `None` when there is no row
/// (never seen, or removed by GC).
///
/// # Errors
/// Database errors.
pub async fn idempotency(conn: &mut AsyncPgConnection, q: &KeyQuery) -> QueryResult<Option<KeyReport>> {
    let row: Option<KeyView> = diesel::sql_query(
        "SELECT agent_id, key, status, request_hash, response_status_code, receipt_id, \
                first_seen_at, created_at, completed_at, expires_at, takeovers, \
                (extract(epoch FROM now() - first_seen_at) * 1000)::bigint AS age_ms, \
                (extract(epoch FROM now() - created_at) * 1000)::bigint AS heartbeat_age_ms \
           FROM idempotency_keys WHERE agent_id = $1 AND key = $2",
    )
    .bind::<SqlUuid, _>(q.agent_id)
    .bind::<Text, _>(&q.key)
    .get_result(conn)
    .await
    .optional()?;
    let Some(row) = row else {
        return Ok(None);
    };
    let payment = payment_for_key(conn, q.agent_id, &q.key).await?;
    Ok(Some(KeyReport { receipt_url: row.receipt_id.map(|id| format!("/audit/receipts/{id}")), row, payment }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paid_not_served_lists_exactly_the_spent_statuses() {
        let spent = crate::payments::sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent()));
        assert!(PAID_NOT_SERVED.starts_with(&format!("p.status IN {spent} ")), "{PAID_NOT_SERVED}");
    }
}
