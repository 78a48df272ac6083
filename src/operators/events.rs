//! The operator audit trail: `operator_events`, append-only (a trigger refuses UPDATE,
//! DELETE and TRUNCATE). [`record`] is called inside the transaction of each change, so a
//! change that rolls back leaves no event and an event never names a change that did not
//! happen. [`list`] serves `GET /audit/operator-events`.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{QueryResult, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use super::Actor;
use crate::audit::{BadQuery, Params, time, uuid};

/// Appends one event. Call it on the connection (and inside the transaction) of the change
/// it records.
///
/// # Errors
/// Database errors (the caller's transaction then rolls back, change included).
pub async fn record(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    action: &str,
    target: Option<&str>,
    before: Option<&Value>,
    after: Option<&Value>,
) -> QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO operator_events (operator_id, operator_name, action, target, before, after, remote_addr) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind::<Nullable<SqlUuid>, _>(actor.operator_id)
    .bind::<Text, _>(&actor.name)
    .bind::<Text, _>(action)
    .bind::<Nullable<Text>, _>(target)
    .bind::<Nullable<Jsonb>, _>(before)
    .bind::<Nullable<Jsonb>, _>(after)
    .bind::<Nullable<Text>, _>(actor.remote_addr.as_deref())
    .execute(conn)
    .await
    .map(|_| ())
}

/// One event as served.
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct OperatorEvent {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = Timestamptz)]
    pub at: DateTime<Utc>,
    /// null: the bootstrap `OPERATOR_TOKEN` or the command line.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    #[schema(required = true)]
    pub operator_id: Option<Uuid>,
    /// The operator's name, `bootstrap`, or `cli`.
    #[diesel(sql_type = Text)]
    pub operator_name: String,
    #[diesel(sql_type = Text)]
    pub action: String,
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true)]
    pub target: Option<String>,
    /// The changed thing before the change (JSON), when it existed.
    #[diesel(sql_type = Nullable<Jsonb>)]
    #[schema(required = true, value_type = Value)]
    pub before: Option<Value>,
    /// The changed thing after the change (JSON).
    #[diesel(sql_type = Nullable<Jsonb>)]
    #[schema(required = true, value_type = Value)]
    pub after: Option<Value>,
    /// The TCP peer's IP address (never a forwarded header).
    #[diesel(sql_type = Nullable<Text>)]
    #[schema(required = true)]
    pub remote_addr: Option<String>,
}

/// `GET /audit/operator-events` filters: `operator_id`, `action`, `from` (inclusive), `to`
/// (exclusive) on `at`, `cursor`, `limit`. Oldest first, keyset-paginated on `id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    pub operator_id: Option<Uuid>,
    pub action: Option<String>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// The id of the last event served.
    pub after: Option<i64>,
    pub limit: i64,
}

/// The opaque cursor text of an event id.
pub fn encode_cursor(id: i64) -> String {
    URL_SAFE_NO_PAD.encode(format!("ev:{id}"))
}

fn decode_cursor(text: &str) -> Option<i64> {
    if text.len() > 64 {
        return None;
    }
    let bytes = URL_SAFE_NO_PAD.decode(text.trim()).ok()?;
    String::from_utf8(bytes).ok()?.strip_prefix("ev:")?.parse().ok().filter(|id: &i64| *id >= 0)
}

impl EventQuery {
    /// Parses the query string (strict: unknown or repeated parameters are refused).
    ///
    /// # Errors
    /// [`BadQuery`] naming the offending parameter.
    pub fn parse(query: &str) -> Result<Self, BadQuery> {
        let mut p = Params::parse(query, &["operator_id", "action", "from", "to", "cursor", "limit"])?;
        let from = p.take("from").map(|v| time("from", &v)).transpose()?;
        let to = p.take("to").map(|v| time("to", &v)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f > t
        {
            return Err(BadQuery("`from` must not be after `to`".into()));
        }
        let action = match p.take("action") {
            None => None,
            Some(a) if !a.trim().is_empty() && a.len() <= 100 => Some(a.trim().to_owned()),
            Some(_) => return Err(BadQuery("`action` must be 1 to 100 characters".into())),
        };
        let limit = p.limit()?;
        let after = p
            .take("cursor")
            .map(|c| decode_cursor(&c).ok_or_else(|| BadQuery("`cursor` is not valid".into())))
            .transpose()?;
        Ok(Self {
            operator_id: p.take("operator_id").map(|v| uuid("operator_id", &v)).transpose()?,
            action,
            from,
            to,
            after,
            limit,
        })
    }
}

/// One page of events, oldest first, and the cursor of the next page (`None`: the last).
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection, q: &EventQuery) -> QueryResult<(Vec<OperatorEvent>, Option<String>)> {
    let mut rows: Vec<OperatorEvent> = diesel::sql_query(
        "SELECT id, at, operator_id, operator_name, action, target, before, after, remote_addr \
           FROM operator_events \
          WHERE ($1::uuid IS NULL OR operator_id = $1) \
            AND ($2::text IS NULL OR action = $2) \
            AND ($3::timestamptz IS NULL OR at >= $3) \
            AND ($4::timestamptz IS NULL OR at < $4) \
            AND ($5::bigint IS NULL OR id > $5) \
          ORDER BY id \
          LIMIT $6",
    )
    .bind::<Nullable<SqlUuid>, _>(q.operator_id)
    .bind::<Nullable<Text>, _>(q.action.as_deref())
    .bind::<Nullable<Timestamptz>, _>(q.from)
    .bind::<Nullable<Timestamptz>, _>(q.to)
    .bind::<Nullable<BigInt>, _>(q.after)
    .bind::<BigInt, _>(q.limit + 1)
    .load(conn)
    .await?;
    let limit = usize::try_from(q.limit).unwrap_or(usize::MAX);
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|e| encode_cursor(e.id))
    } else {
        None
    };
    Ok((rows, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_queries_parse_and_refuse_with_the_parameter_named() {
        let id = Uuid::new_v4();
        let q = EventQuery::parse(&format!(
            "operator_id={id}&action=agents.update&from=2026-01-01T00:00:00Z&limit=3&cursor={}",
            encode_cursor(41)
        ))
        .unwrap();
        assert_eq!(
            (q.operator_id, q.action.as_deref(), q.after, q.limit),
            (Some(id), Some("agents.update"), Some(41), 3)
        );
        for (bad, name) in [
            ("operator_id=x", "operator_id"),
            ("limit=0", "limit"),
            ("cursor=zz", "cursor"),
            ("actor=x", "actor"),
            ("action=", "action"),
        ] {
            assert!(EventQuery::parse(bad).unwrap_err().0.contains(name), "{bad}");
        }
    }
}
