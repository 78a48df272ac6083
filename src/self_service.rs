//! What an agent may read about itself: its limits and rolling spend (`GET /agents/me`) and
//! its own receipts, newest first (`GET /receipts`). Read-only; every query is filtered by
//! the authenticated agent's id, so an agent never sees another agent's rows.
//!
//! Spend is the same arithmetic the router enforces (`payments::store::agent_spend`): an
//! intent counts from signing until the chain shows it can no longer move money (`expired`,
//! set by `reconcile`), however old; an upstream's "rejected" or "not settled" releases
//! nothing. The budget and the per-call cap apply to the sum over the agent's assets (which
//! share one unit), in atomic units; `assets` breaks that sum down.

use chrono::{DateTime, Utc};
use diesel::QueryResult;
use diesel::prelude::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

use crate::audit::Cursor;
use crate::payments::store::agent_spend;
use crate::receipts::Receipt;
use crate::receipts::store::ReceiptRow;

/// A malformed `GET /receipts` query.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPage(pub String);

impl From<String> for BadPage {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for BadPage {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// Receipts per page when `limit` is absent.
pub const DEFAULT_LIMIT: i64 = 50;
/// The largest `limit` accepted.
pub const MAX_LIMIT: i64 = 500;

/// `GET /agents/me`.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = AgentSelf,
    description = "The calling agent's limits and rolling spend. Amounts are decimal strings of atomic token units. The cap and the budget apply to the sum over the agent's assets.",
    example = json!({"agent_id": "0b7c…", "name": "my-bot", "created_at": "2026-12-01T10:00:00Z", "window_hours": 24,
        "max_per_call": "50000", "daily_budget": "1000000", "spent": "30000", "reserved": "10000", "remaining": "960000",
        "assets": [{"network": "eip155:84532", "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "spent": "30000", "reserved": "10000"}]}))]
pub struct Me {
    pub agent_id: Uuid,
    pub name: String,
    pub created_at: DateTime<Utc>,
    /// The rolling window spend is counted over.
    #[schema(schema_with = doc::window_hours)]
    pub window_hours: u32,
    /// Most one call may pay (atomic units), `null`: no cap beyond the call's `max_amount`.
    #[schema(schema_with = doc::max_per_call, required = true)]
    pub max_per_call: Option<String>,
    /// The rolling budget (atomic units), `null`: none.
    #[schema(schema_with = doc::daily_budget, required = true)]
    pub daily_budget: Option<String>,
    /// Settled (or settled with the answer lost) in the window.
    #[schema(schema_with = doc::spent)]
    pub spent: String,
    /// Signed and not known to be settled or released (`signed`, `unknown`, `unconfirmed`).
    #[schema(schema_with = doc::reserved)]
    pub reserved: String,
    /// What the budget still allows; `null` without a budget.
    #[schema(schema_with = doc::remaining, required = true)]
    pub remaining: Option<String>,
    /// The calendar-month budget (UTC), `null`: none.
    #[schema(required = true)]
    pub month_budget: Option<String>,
    /// Spent by payments signed this calendar month.
    pub spent_month: String,
    /// What the month budget still allows (reservations included); `null` without one.
    #[schema(required = true)]
    pub remaining_month: Option<String>,
    /// Upstream hosts this agent may call (`null`: any); others get 403 `upstream_not_allowed`.
    #[schema(required = true)]
    pub allowed_hosts: Option<Vec<String>>,
    /// `payTo` addresses this agent may pay (`null`: any); others get 402 `payment_not_allowed`.
    #[schema(required = true)]
    pub allowed_pay_to: Option<Vec<String>>,
    /// Calls per minute (`null`: no limit); over it, 429 `rate_limited`.
    #[schema(required = true)]
    pub calls_per_minute: Option<i32>,
    /// Payments per minute (`null`: no limit); over it, 429 `rate_limited`.
    #[schema(required = true)]
    pub payments_per_minute: Option<i32>,
    /// The rolling 7-day budget (atomic units), `null`: none.
    #[schema(required = true)]
    pub week_budget: Option<String>,
    /// Settled (or settled with the answer lost) in the last 7 days.
    pub spent_7d: String,
    /// What the week budget still allows (reservations included); `null` without one.
    #[schema(required = true)]
    pub remaining_7d: Option<String>,
    /// The lifetime budget (atomic units), `null`: none.
    #[schema(required = true)]
    pub lifetime_budget: Option<String>,
    /// Settled ever; `null` without a lifetime budget (not summed).
    #[schema(required = true)]
    pub spent_lifetime: Option<String>,
    /// What the lifetime budget still allows (reservations included); `null` without one.
    #[schema(required = true)]
    pub remaining_lifetime: Option<String>,
    /// Rolling 24 h budgets per upstream host pattern, with what each counts and has left
    /// (over one: 402 `payment_over_budget`).
    pub host_budgets: Vec<crate::payments::hosts::HostBudgetUse>,
    /// `payTo` addresses this agent may never pay (`null`: none); 402 `payment_not_allowed`.
    #[schema(required = true)]
    pub blocked_pay_to: Option<Vec<String>>,
    /// A paid call whose price is above this waits for an operator's approval (202
    /// `approval_pending`, nothing signed; `null`: never).
    #[schema(required = true)]
    pub approval_above: Option<String>,
    /// The same sums per (network, asset).
    #[schema(inline)]
    pub assets: Vec<AssetSpend>,
}

/// Spend on one asset in the window.
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct AssetSpend {
    /// CAIP-2
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub asset: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub spent: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub reserved: String,
}

/// The schemas of [`Me`]'s members as the OpenAPI document states them.
mod doc {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

    use crate::schema_doc as s;

    pub fn window_hours() -> RefOr<Schema> {
        ObjectBuilder::new().schema_type(Type::Integer).enum_values(Some([24])).into()
    }
    pub fn max_per_call() -> RefOr<Schema> {
        s::amount_or_null("Most one call may pay; null: only the call's `max_amount` limits it.")
    }
    pub fn daily_budget() -> RefOr<Schema> {
        s::amount_or_null("Rolling 24 h budget; null: none.")
    }
    pub fn spent() -> RefOr<Schema> {
        s::amount("Settled (or settled with the answer lost) in the window.")
    }
    pub fn reserved() -> RefOr<Schema> {
        s::amount("Signed and not yet known to be settled or released (`signed`, `unknown`, `unconfirmed`).")
    }
    pub fn remaining() -> RefOr<Schema> {
        s::amount_or_null("What the budget still allows; null without a budget.")
    }
}

#[derive(QueryableByName)]
struct AgentRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
}

/// The agent's limits and spend; `None` if the agent is gone.
///
/// # Errors
/// Database errors.
pub async fn me(conn: &mut AsyncPgConnection, agent_id: Uuid) -> QueryResult<Option<Me>> {
    use diesel::OptionalExtension;
    let Some(spend) = agent_spend(conn, agent_id, false).await? else {
        return Ok(None);
    };
    let Some(agent): Option<AgentRow> = diesel::sql_query("SELECT name, created_at FROM agents WHERE id = $1")
        .bind::<SqlUuid, _>(agent_id)
        .get_result(conn)
        .await
        .optional()?
    else {
        return Ok(None);
    };
    use crate::payments::usage::{in_day, reserved, spent_in_day, sum_where};
    let assets: Vec<AssetSpend> = diesel::sql_query(format!(
        "SELECT network, asset, {spent}::text AS spent, {reserved}::text AS reserved \
           FROM payments p WHERE agent_id = $1 AND {in_day} \
          GROUP BY network, asset ORDER BY network, asset",
        spent = sum_where(&spent_in_day()),
        reserved = sum_where(&reserved()),
        in_day = in_day(),
    ))
    .bind::<SqlUuid, _>(agent_id)
    .load(conn)
    .await?;
    let host_budgets = spend.host_budget_uses().unwrap_or_default();
    Ok(Some(Me {
        agent_id,
        name: agent.name,
        created_at: agent.created_at,
        window_hours: 24,
        max_per_call: spend.max_per_call,
        daily_budget: spend.daily_budget,
        spent: spend.settled_24h,
        reserved: spend.reserved_24h,
        remaining: spend.remaining_24h,
        month_budget: spend.month_budget,
        spent_month: spend.settled_month,
        remaining_month: spend.remaining_month,
        allowed_hosts: spend.allowed_hosts,
        allowed_pay_to: spend.allowed_pay_to,
        calls_per_minute: spend.calls_per_minute,
        payments_per_minute: spend.payments_per_minute,
        host_budgets,
        week_budget: spend.week_budget,
        spent_7d: spend.settled_7d,
        remaining_7d: spend.remaining_7d,
        lifetime_budget: spend.lifetime_budget,
        spent_lifetime: spend.settled_lifetime,
        remaining_lifetime: spend.remaining_lifetime,
        blocked_pay_to: spend.blocked_pay_to,
        approval_above: spend.approval_above,
        assets,
    }))
}

/// A page of `GET /receipts`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptPage {
    /// The last receipt of the previous page (newest first: the next page is older).
    pub before: Option<Cursor>,
    pub limit: i64,
}

impl ReceiptPage {
    /// Parses `limit` (1..=500) and `cursor`; anything else is refused, naming it.
    ///
    /// # Errors
    /// A sentence for the 400.
    pub fn parse(query: &str) -> Result<Self, BadPage> {
        let mut page = Self { before: None, limit: DEFAULT_LIMIT };
        let mut seen = std::collections::HashSet::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if !seen.insert(name.to_string()) {
                return Err(format!("`{name}` given more than once").into());
            }
            match name.as_ref() {
                "limit" => {
                    page.limit = value
                        .parse::<i64>()
                        .ok()
                        .filter(|l| (1..=MAX_LIMIT).contains(l))
                        .ok_or_else(|| format!("`limit` must be 1 to {MAX_LIMIT}"))?;
                }
                "cursor" => {
                    page.before = Some(Cursor::decode(&value).ok_or("`cursor` is not a cursor of this service")?);
                }
                other => return Err(format!("unknown parameter `{other}` (allowed: limit, cursor)").into()),
            }
        }
        Ok(page)
    }
}

/// The agent's receipts, newest first, `limit` long, and the cursor of the next (older)
/// page: keyset on `(created_at, id)` descending, so a page never repeats or skips one.
///
/// # Errors
/// Database errors.
pub async fn receipts(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    page: ReceiptPage,
) -> QueryResult<(Vec<Receipt>, Option<Cursor>)> {
    let mut rows: Vec<ReceiptRow> = diesel::sql_query(
        "SELECT id, agent_id, idempotency_key, request_hash, method, url, upstream_status, \
                upstream_body_sha256, payment, outcome, created_at, signer, signature, trace_id \
           FROM receipts \
          WHERE agent_id = $1 \
            AND ($2::timestamptz IS NULL OR (created_at, id) < ($2, $3::uuid)) \
          ORDER BY created_at DESC, id DESC \
          LIMIT $4",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Nullable<Timestamptz>, _>(page.before.map(|c| c.created_at))
    .bind::<Nullable<SqlUuid>, _>(page.before.map(|c| c.id))
    .bind::<BigInt, _>(page.limit + 1)
    .load(conn)
    .await?;
    let limit = usize::try_from(page.limit).unwrap_or(usize::MAX);
    let more = rows.len() > limit;
    rows.truncate(limit);
    let receipts: Vec<Receipt> = rows.into_iter().map(Receipt::from).collect();
    let next = if more { receipts.last().map(|r| Cursor { created_at: r.created_at, id: r.id }) } else { None };
    Ok((receipts, next))
}

#[derive(QueryableByName)]
struct StatusRow {
    #[diesel(sql_type = Text)]
    status: String,
}

/// The current ledger status of the payment made under (agent, key), if one was signed:
/// it may have moved on since the receipt was signed (`reconcile` sets `expired` or
/// `settled_response_lost`).
///
/// # Errors
/// Database errors.
pub async fn payment_status(conn: &mut AsyncPgConnection, agent_id: Uuid, key: &str) -> QueryResult<Option<String>> {
    use diesel::OptionalExtension;
    let row: Option<StatusRow> =
        diesel::sql_query("SELECT status FROM payments WHERE agent_id = $1 AND idempotency_key = $2")
            .bind::<SqlUuid, _>(agent_id)
            .bind::<Text, _>(key)
            .get_result(conn)
            .await
            .optional()?;
    Ok(row.map(|r| r.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_pages_parse_strictly() {
        assert_eq!(ReceiptPage::parse(""), Ok(ReceiptPage { before: None, limit: DEFAULT_LIMIT }));
        assert_eq!(ReceiptPage::parse("limit=3").map(|p| p.limit), Ok(3));
        for bad in ["limit=0", "limit=501", "limit=x", "cursor=nope", "agent_id=x", "limit=1&limit=2"] {
            assert!(ReceiptPage::parse(bad).is_err(), "{bad}");
        }
    }
}

/// The payment signed under one of the agent's idempotency keys, as the ledger has it now.
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
#[schema(as = KeyPaymentRow,
    description = "The payment signed under one of the agent's idempotency keys, as the ledger has it now (never the signed authorization).")]
pub struct KeyPayment {
    #[diesel(sql_type = Text)]
    pub idempotency_key: String,
    /// `signed`, `settled`, `unconfirmed`, `not_settled`, `rejected`, `settled_response_lost`,
    /// `unknown` or `expired`.
    #[diesel(sql_type = Text)]
    #[schema(schema_with = key_doc::status)]
    pub status: String,
    /// CAIP-2
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub asset: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub amount: String,
    #[diesel(sql_type = Text)]
    #[schema(schema_with = crate::schema_doc::address)]
    pub pay_to: String,
    #[diesel(sql_type = Text)]
    pub nonce: String,
    /// Unix seconds: unused past this, the authorization can never move money.
    #[diesel(sql_type = BigInt)]
    pub valid_before: i64,
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true)]
    pub tx_hash: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
    /// How recovery of a lost answer ended, when one was tried: `recovered`, `reaccessed`
    /// or `lost`.
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(schema_with = key_doc::recovery, required = true)]
    pub recovery: Option<String>,
    /// The answer `reconcile` got back after the key had been answered `settled_response_lost`
    /// (the key's own answer is never rewritten): see [`KeyPayment::recovered_answer`].
    #[serde(skip)]
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub recovered_receipt_id: Option<Uuid>,
    #[serde(skip)]
    #[diesel(sql_type = Nullable<Text>)]
    pub recovered_kind: Option<String>,
    #[serde(skip)]
    #[diesel(sql_type = Nullable<diesel::sql_types::Integer>)]
    pub recovered_http_status: Option<i32>,
    #[serde(skip)]
    #[diesel(sql_type = Nullable<diesel::sql_types::Bytea>)]
    pub recovered_body: Option<Vec<u8>>,
}

impl KeyPayment {
    /// `{"kind", "receipt_id", "http_status", "answer"}` of an answer recovered after the
    /// key's final answer: `answer` is the `/route` envelope the agent would have had (the
    /// upstream's original status, headers and body; `payment.recovery` says how it was got).
    pub fn recovered_answer(&self) -> Option<serde_json::Value> {
        let body = self.recovered_body.as_deref()?;
        Some(serde_json::json!({
            "kind": self.recovered_kind,
            "receipt_id": self.recovered_receipt_id,
            "http_status": self.recovered_http_status,
            "answer": crate::relay::envelope::to_value(body),
        }))
    }
}

/// `GET /payments?idempotency_key=` (and MCP `payment_status`): the key's payment, whether a
/// new key is safe, and an answer recovered after the key's final answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(as = KeyPayment)]
pub struct KeyPaymentView<'a> {
    #[serde(flatten)]
    pub payment: &'a KeyPayment,
    /// True when the status can no longer move money (`not_settled`, `rejected`, `expired`):
    /// a new key for the same call cannot pay twice.
    pub new_key_safe: bool,
    #[schema(schema_with = key_doc::recovered_answer, required = true)]
    pub recovered_answer: Option<serde_json::Value>,
}

/// The schemas of [`KeyPayment`]'s members that are stricter than their Rust types.
mod key_doc {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};

    pub fn status() -> RefOr<Schema> {
        let all = crate::payments::PaymentStatus::ALL.map(|s| s.as_str());
        ObjectBuilder::new().schema_type(Type::String).enum_values(Some(all)).into()
    }

    pub fn recovery() -> RefOr<Schema> {
        let values = ["recovered", "reaccessed", "lost"].map(|v| serde_json::json!(v));
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .enum_values(Some(values.into_iter().chain([serde_json::Value::Null])))
            .description(Some("How recovery of an answer lost after this payment settled ended, when one was tried: `recovered` (the upstream's original answer, paid once), `reaccessed` (a new execution of a GET reached by signing in as the payer), `lost` (nothing could be got back; never paid again)."))
            .into()
    }

    pub fn recovered_answer() -> RefOr<Schema> {
        let kinds = ["recovered", "reaccessed"];
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
            .description(Some("The answer `x402-router reconcile` recovered after the key had already been answered `settled_response_lost` (the key's own answer and its replays are never rewritten). `answer` is the `/route` envelope the agent would have had: the upstream's original status, headers and body, `payment.recovery` saying how it was got; `receipt_id` its signed receipt."))
            .property("kind", ObjectBuilder::new().schema_type(Type::String).enum_values(Some(kinds)))
            .property("receipt_id", ObjectBuilder::new().schema_type(Type::String).format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Uuid))))
            .property("http_status", ObjectBuilder::new().schema_type(Type::Integer))
            .property("answer", ObjectBuilder::new().schema_type(Type::Object))
            .required("kind")
            .required("receipt_id")
            .required("http_status")
            .required("answer")
            .into()
    }
}

impl<'a> KeyPaymentView<'a> {
    pub fn new(payment: &'a KeyPayment, new_key_safe: bool) -> Self {
        Self { payment, new_key_safe, recovered_answer: payment.recovered_answer() }
    }
}

/// The payment of (agent, key), if one was signed. Never the signed authorization or its
/// header (bearer instruments).
///
/// # Errors
/// Database errors.
pub async fn payment_for_key(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
) -> QueryResult<Option<KeyPayment>> {
    use diesel::OptionalExtension;
    diesel::sql_query(
        "SELECT p.idempotency_key, p.status, p.network, p.asset, p.amount::text AS amount, p.pay_to, p.nonce, \
                p.valid_before, p.tx_hash, p.updated_at, p.recovery->>'outcome' AS recovery, \
                a.receipt_id AS recovered_receipt_id, a.kind AS recovered_kind, \
                a.http_status AS recovered_http_status, a.body AS recovered_body \
           FROM payments p \
           LEFT JOIN recovered_answers a ON a.agent_id = p.agent_id AND a.payment_id = p.id \
          WHERE p.agent_id = $1 AND p.idempotency_key = $2",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .get_result(conn)
    .await
    .optional()
}
