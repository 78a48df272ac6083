//! The `receipts` table.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::Receipt;
use crate::db::PrepareExt;
use crate::db::schema::receipts;

/// A `receipts` row; also read by the audit queries (`QueryableByName`).
#[derive(Queryable, QueryableByName, Selectable, Insertable)]
#[diesel(table_name = receipts)]
pub(crate) struct ReceiptRow {
    id: Uuid,
    agent_id: Uuid,
    idempotency_key: String,
    request_hash: String,
    method: String,
    url: String,
    upstream_status: Option<i32>,
    upstream_body_sha256: String,
    payment: Option<serde_json::Value>,
    outcome: String,
    created_at: chrono::DateTime<chrono::Utc>,
    signer: String,
    signature: String,
    trace_id: Option<String>,
}

impl From<&Receipt> for ReceiptRow {
    fn from(r: &Receipt) -> Self {
        Self {
            id: r.id,
            agent_id: r.agent_id,
            idempotency_key: r.idempotency_key.clone(),
            request_hash: r.request_hash.clone(),
            method: r.method.clone(),
            url: r.url.clone(),
            upstream_status: r.upstream_status,
            upstream_body_sha256: r.upstream_body_sha256.clone(),
            payment: r.payment.clone(),
            outcome: r.outcome.clone(),
            created_at: r.created_at,
            signer: r.signer.clone(),
            signature: r.signature.clone(),
            trace_id: r.trace_id.clone(),
        }
    }
}

impl From<ReceiptRow> for Receipt {
    fn from(r: ReceiptRow) -> Self {
        Self {
            id: r.id,
            agent_id: r.agent_id,
            idempotency_key: r.idempotency_key,
            request_hash: r.request_hash,
            method: r.method,
            url: r.url,
            upstream_status: r.upstream_status,
            upstream_body_sha256: r.upstream_body_sha256,
            payment: r.payment,
            outcome: r.outcome,
            created_at: r.created_at,
            signer: r.signer,
            signature: r.signature,
            trace_id: r.trace_id,
        }
    }
}

/// Inserts a receipt (inside the caller's transaction).
///
/// # Errors
/// Database errors.
pub async fn insert(conn: &mut AsyncPgConnection, receipt: &Receipt) -> QueryResult<()> {
    diesel::insert_into(receipts::table).values(ReceiptRow::from(receipt)).prepared().execute(conn).await.map(|_| ())
}

/// One of `agent_id`'s receipts. Another agent's receipt is simply not found.
///
/// # Errors
/// Database errors.
pub async fn find_for_agent(conn: &mut AsyncPgConnection, agent_id: Uuid, id: Uuid) -> QueryResult<Option<Receipt>> {
    receipts::table
        .filter(receipts::id.eq(id))
        .filter(receipts::agent_id.eq(agent_id))
        .select(ReceiptRow::as_select())
        .first(conn)
        .await
        .optional()
        .map(|r| r.map(Receipt::from))
}

/// Number of receipts of one (agent, key): tests and audits use it to prove at-most-once.
///
/// # Errors
/// Database errors.
pub async fn count_for_key(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str) -> QueryResult<i64> {
    receipts::table
        .filter(receipts::agent_id.eq(agent_id))
        .filter(receipts::idempotency_key.eq(key))
        .count()
        .get_result(conn)
        .await
}

/// The newest receipt of one request under (agent, key) that recorded a payment: what a
/// re-sent, already paid request is pointed at.
///
/// # Errors
/// Database errors.
pub async fn latest_for_request(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    request_hash: &str,
) -> QueryResult<Option<Uuid>> {
    receipts::table
        .filter(receipts::agent_id.eq(agent_id))
        .filter(receipts::idempotency_key.eq(key))
        .filter(receipts::request_hash.eq(request_hash))
        .filter(receipts::payment.is_not_null())
        .order((receipts::created_at.desc(), receipts::id.desc()))
        .select(receipts::id)
        .first(conn)
        .await
        .optional()
}

/// One batch of receipts whose URL has a query or a fragment (where a secret parameter may
/// be), created within `within` (`None`: any time), after `after` in `(created_at, id)` order.
///
/// # Errors
/// Database errors.
pub async fn with_url_parameters(
    conn: &mut AsyncPgConnection,
    within: Option<(chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>)>,
    after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
    limit: i64,
) -> QueryResult<Vec<Receipt>> {
    let mut q = receipts::table
        .filter(receipts::url.like("%?%").or(receipts::url.like("%#%")))
        .select(ReceiptRow::as_select())
        .order((receipts::created_at, receipts::id))
        .limit(limit)
        .into_boxed();
    if let Some((from, to)) = within {
        q = q.filter(receipts::created_at.ge(from)).filter(receipts::created_at.lt(to));
    }
    if let Some((at, id)) = after {
        q = q.filter(receipts::created_at.gt(at).or(receipts::created_at.eq(at).and(receipts::id.gt(id))));
    }
    Ok(q.load::<ReceiptRow>(conn).await?.into_iter().map(Receipt::from).collect())
}

/// Replaces a receipt's URL and signature by `r`'s (signed again with its URL redacted), if
/// its URL is still `old_url`. `false`: it changed meanwhile.
///
/// # Errors
/// Database errors.
pub async fn replace_signed_url(conn: &mut AsyncPgConnection, r: &Receipt, old_url: &str) -> QueryResult<bool> {
    let n = diesel::update(receipts::table.find((r.agent_id, r.id)))
        .filter(receipts::url.eq(old_url))
        .set((receipts::url.eq(&r.url), receipts::signer.eq(&r.signer), receipts::signature.eq(&r.signature)))
        .execute(conn)
        .await?;
    Ok(n == 1)
}
