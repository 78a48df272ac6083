//! The operator's audit API (`/audit/*`, bearer `OPERATOR_TOKEN`). Parsing and SQL live in
//! `audit/`; this only extracts, calls and shapes the JSON.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::audit::store::KeyReport as IdempotencyReport;
use crate::audit::{KeyQuery, Page, PaymentQuery, ReceiptQuery, store};
use crate::auth::Viewer;
use crate::error::{ApiError, PoolConn};
use crate::operators::Role;
use crate::payments::Spend;
use crate::receipts::Receipt;
use crate::routes::inline::{Limit, OlderThanSecs, PaymentStatusFilter};
use crate::routes::pages::{OperatorEventPage, PaymentPage, ReceiptPage};
use crate::routes::responses::{AuditDisabledOrNotFound, BadQuery, ForbiddenAgentKey, Unauthorized, Unavailable};
use crate::state::AppState;

/// GET /audit/receipts — every agent's receipts, filtered, oldest first, keyset-paginated:
/// `{"receipts": [...], "next_cursor": "…" | null}`.
#[utoipa::path(get, path = "/audit/receipts", tag = "audit", operation_id = "auditReceipts",
    summary = "Every agent's receipts, filtered, oldest first (keyset pagination)",
    description = "Ordered by (`created_at`, `id`) ascending. Pass `next_cursor` back as `cursor` for the next page; `null` means this was the last page. Pages never repeat or skip a row, whatever is inserted meanwhile. Unknown or repeated parameters are 400.",
    security(("operatorToken" = [])),
    params(
        ("agent_id" = Option<Uuid>, Query, description = "Only this agent's receipts."),
        ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at >= from`."),
        ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at < to`."),
        ("paid" = Option<bool>, Query, description = "`true`: only receipts with a payment; `false`: only unpaid ones."),
        ("network" = Option<String>, Query, example = "eip155:84532",
            description = "The payment's network: CAIP-2 id or x402 v1 name (`base-sepolia`)."),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (opaque)."),
        ("limit" = inline(Option<Limit<100>>), Query, description = "Rows per page; outside 1–500 is 400."),
    ),
    responses(
        (status = 200, description = "A page of receipts.", body = ReceiptPage),
        (status = 400, response = BadQuery),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn receipts(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = ReceiptQuery::parse(req.query_string())?;
    let mut conn = state.conn().await?;
    let page = store::receipts(&mut conn, &q).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(ReceiptPage { next_cursor: page.next.map(|c| c.encode()), receipts: page.rows }))
}

/// GET /audit/receipts/{id} — any agent's receipt (404 when absent or not a uuid).
#[utoipa::path(get, path = "/audit/receipts/{id}", tag = "audit", operation_id = "auditReceipt",
    summary = "Any agent's receipt",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The receipt id (a non-uuid is 404).")),
    responses(
        (status = 200, description = "The signed receipt.", body = Receipt),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn receipt(state: web::Data<AppState>, _: Viewer, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    store::receipt(&mut conn, id)
        .await
        .map_err(ApiError::database)?
        .map(|r| HttpResponse::Ok().json(r))
        .ok_or(ApiError::NotFound)
}

/// GET /audit/idempotency?agent_id=&key= — one key's idempotency row and its payment intent.
#[utoipa::path(get, path = "/audit/idempotency", tag = "audit", operation_id = "auditIdempotency",
    summary = "One idempotency key: its state, timing, receipt and payment intent",
    description = "404 when the key was never seen or GC removed its row (24 h after creation). Percent-encode the key (`+` means a space in a query string).",
    security(("operatorToken" = [])),
    params(
        ("agent_id" = Uuid, Query),
        ("key" = String, Query, min_length = 1, description = "The Idempotency-Key as the agent sent it."),
    ),
    responses(
        (status = 200, description = "The key.", body = IdempotencyReport),
        (status = 400, response = BadQuery),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn idempotency(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = KeyQuery::parse(req.query_string())?;
    let mut conn = state.conn().await?;
    store::idempotency(&mut conn, &q)
        .await
        .map_err(ApiError::database)?
        .map(|r| HttpResponse::Ok().json(r))
        .ok_or(ApiError::NotFound)
}

/// GET /audit/payments?status= — the payment ledger (any status, `paid_not_served`,
/// `stuck`), oldest first, keyset-paginated: `{"payments": [...], "next_cursor": …}`.
#[utoipa::path(get, path = "/audit/payments", tag = "audit", operation_id = "auditPayments",
    summary = "The payment intent ledger, oldest first (keyset pagination)",
    description = "Never includes the signed authorization or the payment header: they are bearer instruments until `valid_before`.\n\n`status` is a ledger status, or `paid_not_served` (money moved — `settled` or `settled_response_lost` — and neither a `completed` receipt nor a `completed` idempotency row exists for the key), or `stuck` (`signed` intents last written more than `older_than_secs` ago; `x402-router reconcile` resolves them). Absent: every intent.",
    security(("operatorToken" = [])),
    params(
        ("status" = inline(Option<PaymentStatusFilter>), Query),
        ("older_than_secs" = inline(Option<OlderThanSecs>), Query, description = "Only with `status=stuck`."),
        ("agent_id" = Option<Uuid>, Query, description = "Only this agent's intents."),
        ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at >= from`."),
        ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at < to`."),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (opaque)."),
        ("limit" = inline(Option<Limit<100>>), Query, description = "Rows per page; outside 1–500 is 400."),
    ),
    responses(
        (status = 200, description = "A page of payment intents.", body = PaymentPage),
        (status = 400, response = BadQuery),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn payments(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    let q = PaymentQuery::parse(req.query_string())?;
    let mut conn = state.conn().await?;
    let page = store::payments(&mut conn, &q).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(PaymentPage { next_cursor: page.next.map(|c| c.encode()), payments: page.rows }))
}

/// GET /audit/agents/{id}/spend — an agent's limits and rolling 24 h spend (404 if unknown).
#[utoipa::path(get, path = "/audit/agents/{id}/spend", tag = "audit", operation_id = "auditAgentSpend",
    summary = "An agent's spend limits and rolling 24 h spend",
    security(("operatorToken" = [])),
    params(("id" = Uuid, Path, description = "The agent's id (a non-uuid is 404).")),
    responses(
        (status = 200, description = "The agent's spend.", body = Spend),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn spend(state: web::Data<AppState>, _: Viewer, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::NotFound)?;
    let mut conn = state.conn().await?;
    crate::payments::store::agent_spend(&mut conn, id, false)
        .await
        .map_err(ApiError::database)?
        .map(|s| HttpResponse::Ok().json(s))
        .ok_or(ApiError::NotFound)
}

/// GET /audit/upto — per upstream, its settled `upto` payments and how many took the whole
/// signed maximum: `{"upstreams": [{"upstream", "settled", "at_max", "charged", "maximum"}]}`.
#[utoipa::path(get, path = "/audit/upto", tag = "audit", operation_id = "auditUptoUpstreams",
    summary = "Per upstream: settled upto payments and how many took the whole signed maximum",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "One entry per upstream origin with settled upto payments, most at the maximum first.",
            body = UptoReport),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn upto(state: web::Data<AppState>, _: Viewer) -> Result<HttpResponse, ApiError> {
    let mut conn = state.conn().await?;
    let upstreams = crate::audit::upto::upto_upstreams(&mut conn).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(super::in_name_order(&UptoReport { upstreams })))
}

/// The body of `GET /audit/upto`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UptoReport {
    /// Every upstream with settled `upto` payments, most settlements at the maximum first.
    pub upstreams: Vec<crate::audit::upto::UptoUpstream>,
}

/// GET /audit/payments.csv — the filters of `/audit/payments`, as CSV streamed to the end of
/// the ledger (`limit` is the size of each page read; `cursor` starts after a row). Each page
/// is read on a pooled connection returned before the next: a slow reader holds none.
#[utoipa::path(get, path = "/audit/payments.csv", tag = "audit", operation_id = "auditPaymentsCsv",
    summary = "The payment intent ledger as CSV, streamed to the end",
    description = "The filters of `GET /audit/payments`; every matching row, oldest first, read page by page (`limit` is the size of each page read, `cursor` starts after a row). RFC 4180: a header row, CRLF line ends, cells quoted when they hold a comma, a quote or a line break. A cell starting with `=`, `+`, `-`, `@`, a tab or a carriage return is prefixed with `'` so that spreadsheets never evaluate it. Never the signed authorization or the payment header. A database failure after the first page ends the body early (the file is cut short).",
    security(("operatorToken" = [])),
    params(
        ("status" = inline(Option<PaymentStatusFilter>), Query),
        ("older_than_secs" = inline(Option<OlderThanSecs>), Query, description = "Only with `status=stuck`."),
        ("agent_id" = Option<Uuid>, Query, description = "Only this agent's intents."),
        ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at >= from`."),
        ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339; `created_at < to`."),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (opaque)."),
        ("limit" = inline(Option<Limit<100>>), Query, description = "Rows per page; outside 1–500 is 400."),
    ),
    responses(
        (status = 200, description = "The CSV (`Content-Disposition: attachment; filename=\"payments.csv\"`). Columns: id, agent_id, idempotency_key, x402_version, scheme, network, asset, amount, pay_to, payer, nonce, valid_after, valid_before, resource, status, tx_hash, error, attempts, created_at, updated_at, signed_at, receipt_id, receipt_outcome, idempotency_status, recovery.",
            body = String, content_type = "text/csv"),
        (status = 400, response = BadQuery),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn payments_csv(state: web::Data<AppState>, _: Viewer, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    use crate::audit::csv;
    let q = PaymentQuery::parse(req.query_string())?;
    // The first page before answering, so that an error before any row is a proper status.
    let first = {
        let mut conn = state.conn().await?;
        store::payments(&mut conn, &q).await.map_err(ApiError::database)?
    };
    let mut body = csv::header();
    body.extend(first.rows.iter().map(csv::row));
    let next = first.next.map(|c| PaymentQuery { page: Page { after: Some(c), ..q.page }, ..q.clone() });
    let rest = futures_util::stream::unfold((state, next), |(state, next)| async move {
        let q = next?;
        let page = match state.pool.get().await {
            Ok(mut conn) => store::payments(&mut conn, &q).await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match page {
            Ok(page) => {
                let chunk: String = page.rows.iter().map(csv::row).collect();
                let next = page.next.map(|c| PaymentQuery { page: Page { after: Some(c), ..q.page }, ..q });
                Some((Ok(web::Bytes::from(chunk)), (state, next)))
            }
            Err(e) => {
                // The status line is sent: end the body abruptly so the reader sees a cut file.
                tracing::warn!(error = %e, "payments export stopped");
                Some((Err(ApiError::Unavailable("database unavailable")), (state, None)))
            }
        }
    });
    let head = futures_util::stream::once(async move { Ok::<_, ApiError>(web::Bytes::from(body)) });
    Ok(HttpResponse::Ok()
        .content_type("text/csv; charset=utf-8")
        .insert_header(("Content-Disposition", "attachment; filename=\"payments.csv\""))
        .streaming(futures_util::StreamExt::chain(head, rest)))
}

/// GET /audit/operator-events — the operator audit trail, oldest first, keyset-paginated:
/// `{"events": [...], "next_cursor": "…" | null}`.
#[utoipa::path(get, path = "/audit/operator-events", tag = "audit", operation_id = "auditOperatorEvents",
    summary = "The operator audit trail, oldest first (keyset pagination)",
    description = "Every change made by an operator (admin endpoints) or by `x402-router operators create|revoke` (actor `cli`), written in the change's own transaction. Append-only: the database refuses UPDATE, DELETE and TRUNCATE of these rows.",
    security(("operatorToken" = [])),
    params(
        ("operator_id" = Option<Uuid>, Query, description = "Only this operator's events."),
        ("action" = Option<String>, Query, min_length = 1, max_length = 100, description = "Only this action, e.g. `operator.create`."),
        ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339; `at >= from`."),
        ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339; `at < to`."),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page (opaque)."),
        ("limit" = inline(Option<Limit<100>>), Query, description = "Rows per page; outside 1–500 is 400."),
    ),
    responses(
        (status = 200, description = "A page of events.", body = OperatorEventPage),
        (status = 400, response = BadQuery),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 503, response = Unavailable),
    ))]
pub async fn operator_events(
    state: web::Data<AppState>,
    _: Viewer,
    req: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    use crate::operators::events;
    let q = events::EventQuery::parse(req.query_string())?;
    let mut conn = state.conn().await?;
    let (rows, next) = events::list(&mut conn, &q).await.map_err(ApiError::database)?;
    Ok(HttpResponse::Ok().json(OperatorEventPage { events: rows, next_cursor: next }))
}

/// GET /audit/whoami — the operator the token belongs to: `{"operator_id", "name", "role"}`
/// (`operator_id` null for the bootstrap `OPERATOR_TOKEN`). The console shows its change
/// controls to an admin only.
#[utoipa::path(get, path = "/audit/whoami", tag = "audit", operation_id = "auditWhoami",
    summary = "The operator the bearer token belongs to (the console shows change controls to an admin only)",
    security(("operatorToken" = [])),
    responses(
        (status = 200, description = "The operator.", body = Whoami),
        (status = 401, response = Unauthorized),
        (status = 403, response = ForbiddenAgentKey),
        (status = 404, response = AuditDisabledOrNotFound),
        (status = 503, response = Unavailable),
    ))]
pub async fn whoami(op: Viewer) -> HttpResponse {
    HttpResponse::Ok().json(super::in_name_order(&Whoami {
        operator_id: op.actor.operator_id,
        name: op.actor.name,
        role: op.actor.role,
    }))
}

/// The body of `GET /audit/whoami`: the operator a token belongs to.
#[derive(Debug, Serialize, ToSchema)]
pub struct Whoami {
    /// null for the bootstrap OPERATOR_TOKEN.
    pub operator_id: Option<Uuid>,
    /// The operator's name.
    pub name: String,
    /// What the operator may do.
    pub role: Role,
}
