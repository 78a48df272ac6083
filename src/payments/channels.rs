//! The batch-settlement channels as operators see and close them (`batch_lanes`, its
//! reconcile and close columns): what the chain showed at the last reading, the lane's state
//! (open → closing → closed) and what came back to the wallet. The signing side of a lane is
//! [`super::lanes`].

use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use crate::money::Amount;

/// Where a lane is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum LaneState {
    /// Vouchers are signed on it.
    Open,
    /// An operator asked to close it: no voucher or deposit is signed on it again; a
    /// cooperative refund or the wallet's timed withdrawal is under way.
    Closing,
    /// Nothing unclaimed is left in it on-chain; never used again.
    Closed,
}

impl LaneState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closing => "closing",
            Self::Closed => "closed",
        }
    }

    /// The state as stored (the database's CHECK allows only these).
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Open, Self::Closing, Self::Closed].into_iter().find(|x| x.as_str() == s)
    }
}

/// A lane with everything an operator is shown of it.
#[derive(Debug, Clone, QueryableByName)]
pub struct ChannelRow {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub wallet: String,
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    pub asset: String,
    #[diesel(sql_type = Text)]
    pub pay_to: String,
    #[diesel(sql_type = Text)]
    pub receiver_authorizer: String,
    #[diesel(sql_type = BigInt)]
    pub withdraw_delay: i64,
    #[diesel(sql_type = Text)]
    pub salt: String,
    #[diesel(sql_type = Text)]
    pub channel_id: String,
    #[diesel(sql_type = Text)]
    pub signed_ceiling: String,
    #[diesel(sql_type = Text)]
    pub charged: String,
    #[diesel(sql_type = Text)]
    pub deposited: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub claimed: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub balance: Option<String>,
    #[diesel(sql_type = Text)]
    pub refunded: String,
    #[diesel(sql_type = Text)]
    pub state: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub stopped: Option<String>,
    #[diesel(sql_type = Bool)]
    pub in_flight: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub url: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub withdraw_after: Option<i64>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub voucher: Option<Value>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl ChannelRow {
    /// The stored state; an unknown one reads as `closing` (never signed on, never released).
    pub fn lane_state(&self) -> LaneState {
        LaneState::parse(&self.state).unwrap_or(LaneState::Closing)
    }
}

const COLUMNS: &str = "id, wallet, network, asset, pay_to, receiver_authorizer, withdraw_delay, salt, channel_id, \
     signed_ceiling::text AS signed_ceiling, charged::text AS charged, deposited::text AS deposited, \
     claimed::text AS claimed, balance::text AS balance, refunded::text AS refunded, state, stopped, \
     (in_flight IS NOT NULL AND (in_flight_at >= now() - interval '1 minute' \
       OR EXISTS (SELECT 1 FROM payments p WHERE p.id = in_flight))) AS in_flight, url, withdraw_after, voucher, created_at";

/// Every lane, oldest first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Vec<ChannelRow>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM batch_lanes ORDER BY created_at, id")).load(conn).await
}

/// The lane `id`.
///
/// # Errors
/// Database errors.
pub async fn get(conn: &mut AsyncPgConnection, id: Uuid) -> diesel::QueryResult<Option<ChannelRow>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM batch_lanes WHERE id = $1"))
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()
}

/// Marks an open lane closing (no voucher is recorded on it again: `lanes::apply` requires an
/// open lane). `false`: it was not open.
///
/// # Errors
/// Database errors.
pub async fn begin_closing(conn: &mut AsyncPgConnection, id: Uuid) -> diesel::QueryResult<bool> {
    let n = diesel::sql_query(
        "UPDATE batch_lanes SET state = 'closing', updated_at = now() WHERE id = $1 AND state = 'open'",
    )
    .bind::<SqlUuid, _>(id)
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// What the chain showed of a lane's channel.
#[derive(Debug, Clone, Copy)]
pub struct OnChain {
    pub balance: Amount,
    pub claimed: Amount,
    /// When the pending withdrawal may be finalized (the chain's unix time), if one is.
    pub withdraw_after: Option<i64>,
}

/// Records what the chain showed of the lane's channel (`charged` stays the server's word,
/// checked: reconcile compares the two).
///
/// # Errors
/// Database errors.
pub async fn record_chain(conn: &mut AsyncPgConnection, id: Uuid, seen: OnChain) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE batch_lanes SET balance = $2::numeric, claimed = $3::numeric, withdraw_after = $4, updated_at = now() \
          WHERE id = $1",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(seen.balance.to_string())
    .bind::<Text, _>(seen.claimed.to_string())
    .bind::<Nullable<BigInt>, _>(seen.withdraw_after)
    .execute(conn)
    .await?;
    Ok(())
}

/// Records that `refunded` in all came back to the wallet from a closing lane, and closes it
/// when `closed`.
///
/// # Errors
/// Database errors.
pub async fn record_refunded(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    refunded: Amount,
    closed: bool,
) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE batch_lanes SET refunded = LEAST(deposited, GREATEST(refunded, $2::numeric)), \
                state = CASE WHEN $3 THEN 'closed' ELSE state END, updated_at = now() \
          WHERE id = $1 AND state <> 'open'",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(refunded.to_string())
    .bind::<Bool, _>(closed)
    .execute(conn)
    .await?;
    Ok(())
}

/// Stops signing on a lane whose channel was claimed beyond the router's records. `false`: it
/// was stopped already (no second alert).
///
/// # Errors
/// Database errors.
pub async fn flag(conn: &mut AsyncPgConnection, id: Uuid, why: &str) -> diesel::QueryResult<bool> {
    let n =
        diesel::sql_query("UPDATE batch_lanes SET stopped = $2, updated_at = now() WHERE id = $1 AND stopped IS NULL")
            .bind::<SqlUuid, _>(id)
            .bind::<Text, _>(why)
            .execute(conn)
            .await?;
    Ok(n == 1)
}

/// The most the router's records let the server of a lane claim: the charged total, or the
/// ceiling of a voucher whose payment still counts as charged without the server having said
/// it was not taken (every status but `rejected` and `expired`).
///
/// # Errors
/// Database errors.
pub async fn accounted(conn: &mut AsyncPgConnection, id: Uuid) -> diesel::QueryResult<Amount> {
    #[derive(QueryableByName)]
    struct Most {
        #[diesel(sql_type = Text)]
        most: String,
    }
    let m: Most = diesel::sql_query(
        "SELECT GREATEST(l.charged, COALESCE((SELECT max((p.signed_authorization->'voucher'->>'maxClaimableAmount')::numeric) \
                   FROM payments p \
                  WHERE p.scheme = 'batch-settlement' AND p.signed_authorization->>'lane' = l.id::text \
                    AND p.status NOT IN ('rejected', 'expired')), 0))::text AS most \
           FROM batch_lanes l WHERE l.id = $1",
    )
    .bind::<SqlUuid, _>(id)
    .get_result(conn)
    .await?;
    Ok(Amount::parse(&m.most).unwrap_or(Amount::ZERO))
}

/// The deposit authorizations ever recorded for a lane's payments (each may still move money
/// into the channel until it is used or expires).
///
/// # Errors
/// Database errors.
pub async fn deposits(conn: &mut AsyncPgConnection, id: Uuid) -> diesel::QueryResult<Vec<Value>> {
    #[derive(QueryableByName)]
    struct Dep {
        #[diesel(sql_type = Jsonb)]
        deposit: Value,
    }
    let rows: Vec<Dep> = diesel::sql_query(
        "SELECT p.signed_authorization->'deposit' AS deposit FROM payments p \
          WHERE p.scheme = 'batch-settlement' AND p.signed_authorization->>'lane' = $1 \
            AND p.signed_authorization ? 'deposit'",
    )
    .bind::<Text, _>(id.to_string())
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|d| d.deposit).collect())
}
