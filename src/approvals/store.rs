//! The `approvals` table (raw SQL; the database's clock decides expiry).

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{Approval, ApprovalState, CallRef, Terms};
use crate::money::Amount;

/// The columns of an approval as served, `state` with expiry applied.
pub(crate) const COLUMNS: &str = "ap.id, ap.agent_id, ap.idempotency_key, ap.request_hash, \
     CASE WHEN ap.state = 'pending' AND ap.expires_at <= now() THEN 'expired' ELSE ap.state END AS state, \
     ap.network, ap.asset, ap.amount::text AS amount, ap.pay_to, ap.upstream_url, ap.created_at, ap.expires_at, \
     ap.decided_at, ap.decided_by";

#[derive(QueryableByName)]
pub(crate) struct Row {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    agent_id: Uuid,
    #[diesel(sql_type = Text)]
    idempotency_key: String,
    #[diesel(sql_type = Text)]
    request_hash: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Text)]
    network: String,
    #[diesel(sql_type = Text)]
    asset: String,
    #[diesel(sql_type = Text)]
    amount: String,
    #[diesel(sql_type = Text)]
    pay_to: String,
    #[diesel(sql_type = Text)]
    upstream_url: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    expires_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    decided_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    decided_by: Option<String>,
}

impl Row {
    /// The approval and the request fingerprint it was asked for.
    pub(crate) fn into_approval(self) -> QueryResult<(Approval, String)> {
        let broken = |what: &str| diesel::result::Error::DeserializationError(format!("approvals.{what}").into());
        let state = ApprovalState::parse(&self.state).ok_or_else(|| broken("state"))?;
        let amount = Amount::parse(&self.amount).map_err(|_| broken("amount"))?;
        let approval = Approval {
            id: self.id,
            agent_id: self.agent_id,
            idempotency_key: self.idempotency_key,
            state,
            network: self.network,
            asset: self.asset,
            amount,
            pay_to: self.pay_to,
            upstream_url: self.upstream_url,
            created_at: self.created_at,
            expires_at: self.expires_at,
            decided_at: self.decided_at,
            decided_by: self.decided_by,
        };
        Ok((approval, self.request_hash))
    }
}

/// The agent's `approval_above`.
pub(super) async fn threshold(conn: &mut AsyncPgConnection, agent_id: Uuid) -> QueryResult<Option<Amount>> {
    #[derive(QueryableByName)]
    struct T {
        #[diesel(sql_type = Nullable<Text>)]
        above: Option<String>,
    }
    let row: Option<T> = diesel::sql_query("SELECT approval_above::text AS above FROM agents WHERE id = $1")
        .bind::<SqlUuid, _>(agent_id)
        .get_result(conn)
        .await
        .optional()?;
    // An unreadable threshold holds every payment (fail closed): zero.
    Ok(row.and_then(|r| r.above).map(|a| Amount::parse(&a).unwrap_or(Amount::from(0))))
}

/// The latest approval of (agent, key), with its request fingerprint.
pub(super) async fn latest(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
) -> QueryResult<Option<(Approval, String)>> {
    let row: Option<Row> = diesel::sql_query(format!(
        "SELECT {COLUMNS} FROM approvals ap WHERE ap.agent_id = $1 AND ap.idempotency_key = $2 \
          ORDER BY ap.created_at DESC, ap.id DESC LIMIT 1"
    ))
    .bind::<SqlUuid, _>(agent_id)
    .bind::<Text, _>(key)
    .get_result(conn)
    .await
    .optional()?;
    row.map(Row::into_approval).transpose()
}

/// Opens a pending approval of `terms` for `call` (or returns the one already open for the
/// key: one statement, so two attempts never open two).
pub(super) async fn open(
    conn: &mut AsyncPgConnection,
    call: CallRef<'_>,
    terms: &Terms,
    ttl: std::time::Duration,
) -> QueryResult<Approval> {
    let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    let inserted: Option<Row> = diesel::sql_query(format!(
        "INSERT INTO approvals AS ap (id, agent_id, idempotency_key, request_hash, network, asset, amount, pay_to, \
                                      upstream_url, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7::numeric, $8, $9, now() + $10 * interval '1 second') \
         ON CONFLICT (agent_id, idempotency_key) WHERE state = 'pending' DO NOTHING \
         RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(Uuid::new_v4())
    .bind::<SqlUuid, _>(call.agent_id)
    .bind::<Text, _>(call.key)
    .bind::<Text, _>(call.request_hash)
    .bind::<Text, _>(&terms.network)
    .bind::<Text, _>(&terms.asset)
    .bind::<Text, _>(terms.amount.to_string())
    .bind::<Text, _>(&terms.pay_to)
    .bind::<Text, _>(call.shown_url)
    .bind::<BigInt, _>(secs)
    .get_result(conn)
    .await
    .optional()?;
    let row = match inserted {
        Some(row) => row,
        None => {
            diesel::sql_query(format!(
                "SELECT {COLUMNS} FROM approvals ap \
                  WHERE ap.agent_id = $1 AND ap.idempotency_key = $2 AND ap.state = 'pending'"
            ))
            .bind::<SqlUuid, _>(call.agent_id)
            .bind::<Text, _>(call.key)
            .get_result(conn)
            .await?
        }
    };
    Ok(row.into_approval()?.0)
}
