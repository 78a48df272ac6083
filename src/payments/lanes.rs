//! The batch-settlement lanes the router pays with (`batch_lanes`): one channel each, among
//! those of one (wallet, payTo, network, asset, receiverAuthorizer, withdrawDelay). A lane is
//! held by at most one payment at a time (`in_flight`), so two calls never share a voucher in
//! flight; its highest signed ceiling and voucher are written in the same transaction as the
//! intent that sends it ([`apply`], from `store::reserve`).

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use crate::money::Amount;

/// What identifies the channels a payment may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneKey {
    pub wallet: String,
    pub pay_to: String,
    pub network: String,
    pub asset: String,
    pub receiver_authorizer: String,
    pub withdraw_delay: i64,
}

/// A lane as stored.
#[derive(Debug, Clone, QueryableByName)]
pub struct Lane {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub salt: String,
    #[diesel(sql_type = Text)]
    pub channel_id: String,
    #[diesel(sql_type = Text)]
    pub signed_ceiling: String,
    #[diesel(sql_type = Nullable<Jsonb>)]
    pub voucher: Option<Value>,
    #[diesel(sql_type = Text)]
    pub charged: String,
    #[diesel(sql_type = Text)]
    pub deposited: String,
    #[diesel(sql_type = Nullable<Text>)]
    pub stopped: Option<String>,
}

impl Lane {
    /// The highest ceiling signed, what the server was seen to charge, and what was deposited.
    ///
    /// # Errors
    /// A stored amount that does not read (the lane is not used).
    pub fn amounts(&self) -> Result<(Amount, Amount, Amount), crate::money::BadAmount> {
        Ok((Amount::parse(&self.signed_ceiling)?, Amount::parse(&self.charged)?, Amount::parse(&self.deposited)?))
    }
}

const COLUMNS: &str = "id, salt, channel_id, signed_ceiling::text AS signed_ceiling, voucher, charged::text AS charged, \
                       deposited::text AS deposited, stopped";

/// What a new intent writes on its lane, in its reservation's transaction.
#[derive(Debug, Clone)]
pub struct LaneStep {
    pub lane: Uuid,
    /// The ceiling the lane had when the voucher was signed (the write applies only then).
    pub expected_ceiling: Amount,
    pub ceiling: Amount,
    pub voucher: Value,
    /// A deposit signed with the voucher: its amount and authorization.
    pub deposit: Option<(Amount, Value)>,
    /// Where the channel's server is paid (scheme, host, port, path), asked for a cooperative
    /// refund when the channel is closed; `None`: not an HTTP upstream (kept as it was).
    pub url: Option<String>,
}

/// Holds a free lane of `key` that can pay `price` for the payment `payment` (a new lane, with
/// `salt` and `channel_id`, when every one is held and fewer than `max_lanes` exist). A lane
/// whose signed ceiling is above its charged total plus `price` (a voucher the server refused
/// at a higher price is still out) cannot: its next voucher would sign below a ceiling already
/// signed. `None`: no lane can (the call waits or is answered "busy").
///
/// # Errors
/// Database errors.
pub async fn hold(
    conn: &mut AsyncPgConnection,
    (key, price): (&LaneKey, Amount),
    payment: Uuid,
    max_lanes: i64,
    new: (&str, &str),
) -> diesel::QueryResult<Option<Lane>> {
    // The common case, one statement: a free lane that can pay `price`.
    if let Some(lane) = take_free(conn, key, &price, payment).await? {
        return Ok(Some(lane));
    }
    let key = key.clone();
    let (salt, channel_id) = (new.0.to_owned(), new.1.to_owned());
    conn.transaction::<_, diesel::result::Error, _>(async move |c| {
        // One writer per channel key at a time: the count of lanes below is exact.
        diesel::sql_query("SELECT pg_advisory_xact_lock(hashtextextended($1, 40))")
            .bind::<Text, _>(format!(
                "{}|{}|{}|{}|{}|{}",
                key.wallet, key.pay_to, key.network, key.asset, key.receiver_authorizer, key.withdraw_delay
            ))
            .execute(c)
            .await?;
        if let Some(lane) = take_free(c, &key, &price, payment).await? {
            return Ok(Some(lane));
        }
        open_lane(c, &key, payment, max_lanes, (&salt, &channel_id)).await
    })
    .await
}

/// Holds the oldest free lane of `key` that can pay `price` (one whose holder died without an
/// intent a minute ago counts as free). A hold commits without waiting for its WAL flush: lost
/// in a crash of Postgres, it took nothing with it (no voucher leaves before the intent's
/// synchronous commit, which flushes the hold too, and which applies only on a lane still held).
async fn take_free(
    c: &mut AsyncPgConnection,
    key: &LaneKey,
    price: &Amount,
    payment: Uuid,
) -> diesel::QueryResult<Option<Lane>> {
    diesel::sql_query(format!(
        "UPDATE batch_lanes SET in_flight = $7, in_flight_at = now(), updated_at = now() \
          WHERE id = (SELECT l.id FROM batch_lanes l \
                       WHERE l.wallet = $1 AND l.pay_to = $2 AND l.network = $3 AND l.asset = $4 \
                         AND l.receiver_authorizer = $5 AND l.withdraw_delay = $6 AND l.stopped IS NULL AND l.state = 'open' \
                         AND l.charged + $8::numeric >= l.signed_ceiling \
                         AND (l.in_flight IS NULL OR (l.in_flight_at < now() - interval '1 minute' \
                              AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = l.in_flight))) \
                       ORDER BY l.created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
            AND set_config('synchronous_commit', 'off', true) = 'off' \
         RETURNING {COLUMNS}"
    ))
    .bind::<Text, _>(&key.wallet)
    .bind::<Text, _>(&key.pay_to)
    .bind::<Text, _>(&key.network)
    .bind::<Text, _>(&key.asset)
    .bind::<Text, _>(&key.receiver_authorizer)
    .bind::<BigInt, _>(key.withdraw_delay)
    .bind::<SqlUuid, _>(payment)
    .bind::<Text, _>(price.to_string())
    .get_result(c)
    .await
    .optional()
}

/// A new lane of `key` held for `payment`, unless `key` has `max_lanes` already.
async fn open_lane(
    c: &mut AsyncPgConnection,
    key: &LaneKey,
    payment: Uuid,
    max_lanes: i64,
    (salt, channel_id): (&str, &str),
) -> diesel::QueryResult<Option<Lane>> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let count: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM batch_lanes WHERE wallet = $1 AND pay_to = $2 AND network = $3 \
        AND asset = $4 AND receiver_authorizer = $5 AND withdraw_delay = $6 AND stopped IS NULL AND state = 'open'",
    )
    .bind::<Text, _>(&key.wallet)
    .bind::<Text, _>(&key.pay_to)
    .bind::<Text, _>(&key.network)
    .bind::<Text, _>(&key.asset)
    .bind::<Text, _>(&key.receiver_authorizer)
    .bind::<BigInt, _>(key.withdraw_delay)
    .get_result(c)
    .await?;
    if count.n >= max_lanes {
        return Ok(None);
    }
    let lane: Lane = diesel::sql_query(format!(
        "INSERT INTO batch_lanes (id, wallet, pay_to, network, asset, receiver_authorizer, withdraw_delay, \
                      salt, channel_id, in_flight, in_flight_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, now()) RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(Uuid::new_v4())
    .bind::<Text, _>(&key.wallet)
    .bind::<Text, _>(&key.pay_to)
    .bind::<Text, _>(&key.network)
    .bind::<Text, _>(&key.asset)
    .bind::<Text, _>(&key.receiver_authorizer)
    .bind::<BigInt, _>(key.withdraw_delay)
    .bind::<Text, _>(salt)
    .bind::<Text, _>(channel_id)
    .bind::<SqlUuid, _>(payment)
    .get_result(c)
    .await?;
    Ok(Some(lane))
}

/// Writes `step` on its lane, held by `payment`, if the lane's ceiling is still the one the
/// voucher was signed over and the lane is still open. `false`: it moved, or the operator is
/// closing the channel (nothing written; the caller rolls back: the voucher never leaves).
///
/// # Errors
/// Database errors.
pub async fn apply(conn: &mut AsyncPgConnection, payment: Uuid, step: &LaneStep) -> diesel::QueryResult<bool> {
    let (deposit_amount, deposit) = match &step.deposit {
        Some((a, v)) => (a.to_string(), Some(v.clone())),
        None => ("0".to_owned(), None),
    };
    let n = diesel::sql_query(
        "UPDATE batch_lanes SET signed_ceiling = $4::numeric, voucher = $5, \
                deposited = deposited + $6::numeric, deposit = COALESCE($7, deposit), url = COALESCE($8, url), \
                updated_at = now() \
          WHERE id = $1 AND in_flight = $2 AND signed_ceiling = $3::numeric AND stopped IS NULL \
            AND state = 'open' AND $4::numeric >= signed_ceiling",
    )
    .bind::<SqlUuid, _>(step.lane)
    .bind::<SqlUuid, _>(payment)
    .bind::<Text, _>(step.expected_ceiling.to_string())
    .bind::<Text, _>(step.ceiling.to_string())
    .bind::<Jsonb, _>(&step.voucher)
    .bind::<Text, _>(deposit_amount)
    .bind::<Nullable<Jsonb>, _>(deposit)
    .bind::<Nullable<Text>, _>(step.url.as_deref())
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Frees the lane held by `payment`, recording that the server charged up to `charged` (never
/// above the signed ceiling, never lowered).
///
/// # Errors
/// Database errors.
pub async fn release(
    conn: &mut AsyncPgConnection,
    lane: Uuid,
    payment: Uuid,
    charged: Option<Amount>,
) -> diesel::QueryResult<()> {
    // Without waiting for its WAL flush: the call's record, committed synchronously next,
    // flushes it; lost in a crash of Postgres before that, the lane stays held by a payment
    // whose takeover re-sends its recorded voucher, as after a crash before the release.
    diesel::sql_query(
        "UPDATE batch_lanes SET in_flight = NULL, in_flight_at = NULL, updated_at = now(), \
                charged = LEAST(signed_ceiling, GREATEST(charged, COALESCE($3::numeric, charged))) \
          WHERE id = $1 AND in_flight = $2 AND set_config('synchronous_commit', 'off', true) = 'off'",
    )
    .bind::<SqlUuid, _>(lane)
    .bind::<SqlUuid, _>(payment)
    .bind::<Nullable<Text>, _>(charged.map(|c| c.to_string()))
    .execute(conn)
    .await?;
    Ok(())
}

/// Withdraws a deposit whose authorization is proven never to move (refused before it left
/// the server): the lane's `deposited` no longer counts it.
///
/// # Errors
/// Database errors.
pub async fn forget_deposit(conn: &mut AsyncPgConnection, lane: Uuid, amount: Amount) -> diesel::QueryResult<()> {
    diesel::sql_query(
        "UPDATE batch_lanes SET deposited = GREATEST(0, deposited - $2::numeric), updated_at = now() WHERE id = $1",
    )
    .bind::<SqlUuid, _>(lane)
    .bind::<Text, _>(amount.to_string())
    .execute(conn)
    .await?;
    Ok(())
}

/// Stops signing on a lane whose server contradicts the router's records.
///
/// # Errors
/// Database errors.
pub async fn stop(conn: &mut AsyncPgConnection, lane: Uuid, why: &str) -> diesel::QueryResult<()> {
    diesel::sql_query("UPDATE batch_lanes SET stopped = $2, in_flight = NULL, updated_at = now() WHERE id = $1")
        .bind::<SqlUuid, _>(lane)
        .bind::<Text, _>(why)
        .execute(conn)
        .await?;
    Ok(())
}

/// The lane of `channel_id`.
///
/// # Errors
/// Database errors.
pub async fn by_channel(conn: &mut AsyncPgConnection, channel_id: &str) -> diesel::QueryResult<Option<Lane>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM batch_lanes WHERE channel_id = $1"))
        .bind::<Text, _>(channel_id)
        .get_result(conn)
        .await
        .optional()
}

/// The wallet's money locked in channels: what every lane holds deposited and the server has
/// not charged, less what came back (refunded or withdrawn); a closed lane locks nothing. A
/// voucher in flight counts there and as its payment's reservation until its answer records
/// the charge: counted twice for that moment, never missed (fail closed).
pub(crate) const LOCKED_SQL: &str = "SELECT COALESCE(sum(GREATEST(deposited - refunded - charged, 0)), 0) AS locked \
                                       FROM batch_lanes WHERE state <> 'closed'";

/// [`LOCKED_SQL`]: what the wallet-wide cap counts beside the rolling 24 h of payments.
///
/// # Errors
/// Database errors.
pub async fn locked(conn: &mut AsyncPgConnection) -> diesel::QueryResult<Amount> {
    #[derive(QueryableByName)]
    struct Sum {
        #[diesel(sql_type = Text)]
        locked: String,
    }
    let s: Sum =
        diesel::sql_query(format!("SELECT locked::text AS locked FROM ({LOCKED_SQL}) l")).get_result(conn).await?;
    Amount::parse(&s.locked).map_err(|e| diesel::result::Error::DeserializationError(Box::new(e)))
}

use diesel::OptionalExtension;
