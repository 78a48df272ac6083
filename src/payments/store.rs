//! The `payments` ledger table.
//!
//! Writes are fenced like the idempotency row: the intent is inserted, and later
//! re-signed, only while the caller still holds the key's lease.

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bytea, Jsonb, Nullable, SmallInt, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use super::PaymentStatus;
pub use super::Spend;
use super::limits::{Refusal, WalletDraw};
pub use super::sealed::SentRequest;
use super::sealed::{Kept, Sealed};
pub use super::spend::{agent_spend, agent_spend_at, lock_for_reservation};
use crate::db::schema::payments;
use crate::db::{PrepareExt, storable};
use crate::money::{Amount, Rate};

/// A payment intent as stored.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = payments)]
pub struct PaymentRow {
    pub id: Uuid,
    pub agent_id: Uuid,
    pub idempotency_key: String,
    pub request_hash: String,
    pub x402_version: i16,
    pub scheme: String,
    pub network: String,
    pub asset: String,
    pub pay_to: String,
    pub payer: String,
    pub nonce: String,
    pub valid_after: i64,
    pub valid_before: i64,
    /// The chosen requirement, secret query parameters redacted (the exact copy is sealed).
    pub requirement: Value,
    /// The 402's context `{version, resource, extensions}`, redacted likewise.
    pub context: Value,
    pub signed_authorization: Value,
    pub header_name: String,
    pub status: PaymentStatus,
    pub tx_hash: Option<String>,
    pub error: Option<String>,
    pub attempts: i32,
    /// The paid request's method and URL as shown (secret query parameters redacted; NULL for
    /// intents older than these columns). The request as sent is sealed.
    pub request_method: Option<String>,
    pub request_url: Option<String>,
    /// The extensions the 402 advertised, as JSON bytes, redacted (NULL: none).
    pub advertised_extensions: Option<Vec<u8>>,
    /// What recovery of a lost answer came to: `{"outcome": "recovered" | "reaccessed" |
    /// "lost", "attempts": [...]}`.
    pub recovery: Option<Value>,
    /// The intent's last write (a claim by `reconcile`'s recovery guards its record with it).
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The exact parts ([`super::sealed::Exact`]), sealed; NULL once dropped.
    pub sealed: Option<Vec<u8>>,
    /// The id of the key that sealed them.
    pub sealed_key_id: Option<String>,
}

/// A new intent (status `signed`).
pub struct NewPayment<'a> {
    pub id: Uuid,
    pub agent_id: Uuid,
    /// The sha256 of the key the reserving call authenticated with ([`lock_for_reservation`]).
    pub credential: &'a str,
    pub idempotency_key: &'a str,
    pub request_hash: &'a str,
    pub lease: Uuid,
    pub x402_version: i16,
    pub scheme: &'a str,
    pub network: &'a str,
    pub asset: &'a str,
    pub amount: Amount,
    /// With a budget currency: budget units per atomic unit of the asset (recorded with the
    /// intent, what every budget counts it at); `None`: one budget unit each, as without.
    pub rate: Option<Rate>,
    pub pay_to: &'a str,
    pub payer: &'a str,
    /// The upstream host of the paid call (`hosts::key`): what its host budgets count.
    pub upstream_host: &'a str,
    pub nonce: &'a str,
    pub valid_after: i64,
    pub valid_before: i64,
    pub authorization: &'a Value,
    pub header_name: &'a str,
    /// The request as it will be sent, the terms, the context and the payment header:
    /// sealed, and shown redacted ([`super::sealed`]).
    pub kept: &'a Kept,
    /// A batch-settlement voucher's lane write (`super::lanes::apply`), in the same transaction.
    pub lane: Option<&'a super::lanes::LaneStep>,
}

/// Inserts the intent if, and only if, `lease` still owns the in-flight key (its row locked
/// by the same statement, so a concurrent takeover waits for this transaction) and no intent
/// exists for it yet. `false`: fenced or already present.
///
/// The requirement and the context come from the upstream's 402 and may hold NUL, which
/// JSONB refuses: their exact bytes are sealed, their shown JSONB copies made NUL-free.
///
/// # Errors
/// Database errors.
pub async fn insert_signed(conn: &mut AsyncPgConnection, p: &NewPayment<'_>) -> QueryResult<bool> {
    let shown = &p.kept.shown;
    let n = diesel::sql_query(
        "WITH owner AS ( \
              SELECT 1 FROM idempotency_keys \
               WHERE agent_id = $2 AND key = $3 AND lease = $4 AND status = 'in_flight' AND request_hash = $20 \
                 FOR NO KEY UPDATE) \
         INSERT INTO payments (id, agent_id, idempotency_key, x402_version, scheme, network, asset, amount, \
                               pay_to, payer, nonce, valid_after, valid_before, requirement, context, \
                               signed_authorization, header_name, status, request_hash, request_method, \
                               request_url, advertised_extensions, sealed, sealed_key_id, charge_proven, \
                               upstream_host, budget_num, budget_den) \
         SELECT $1, $2, $3, $5, $6, $7, $8, $9::numeric, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, \
                $20, $21, $22, $23, $24, $25, $6 <> 'upto', $26, $27::numeric, $28::numeric \
          WHERE EXISTS (SELECT 1 FROM owner) \
         ON CONFLICT DO NOTHING",
    )
    .bind::<SqlUuid, _>(p.id)
    .bind::<SqlUuid, _>(p.agent_id)
    .bind::<Text, _>(p.idempotency_key)
    .bind::<SqlUuid, _>(p.lease)
    .bind::<SmallInt, _>(p.x402_version)
    .bind::<Text, _>(p.scheme)
    .bind::<Text, _>(p.network)
    .bind::<Text, _>(p.asset)
    .bind::<Text, _>(p.amount.to_string())
    .bind::<Text, _>(p.pay_to)
    .bind::<Text, _>(p.payer)
    .bind::<Text, _>(p.nonce)
    .bind::<BigInt, _>(p.valid_after)
    .bind::<BigInt, _>(p.valid_before)
    .bind::<Jsonb, _>(storable::json(&shown.requirement).as_ref())
    .bind::<Jsonb, _>(storable::json(&shown.context).as_ref())
    .bind::<Jsonb, _>(p.authorization)
    .bind::<Text, _>(p.header_name)
    .bind::<Text, _>(PaymentStatus::Signed)
    .bind::<Text, _>(p.request_hash)
    .bind::<Nullable<Text>, _>(shown.request_method.as_deref())
    .bind::<Nullable<Text>, _>(shown.request_url.as_deref())
    .bind::<Nullable<Bytea>, _>(shown.advertised_extensions.as_deref())
    .bind::<Bytea, _>(&p.kept.sealed.bytes)
    .bind::<Text, _>(&p.kept.sealed.key_id)
    .bind::<Text, _>(p.upstream_host)
    .bind::<Nullable<Text>, _>(p.rate.map(|r| r.num().to_string()))
    .bind::<Nullable<Text>, _>(p.rate.map(|r| r.den().to_string()))
    .prepared()
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Replaces the signature of an intent whose authorization expired unused (same nonce; the
/// caller has just read the chain), fenced by `lease`. Whatever its recorded status (an
/// upstream may have called it rejected), it becomes `signed` again; an intent that
/// `reconcile` marked `expired` had released its budget reservation, so it must fit the
/// agent's limits again (checked under the agent lock, like [`reserve`]).
///
/// # Errors
/// Database errors.
pub async fn resign(conn: &mut AsyncPgConnection, r: &Resign<'_>) -> QueryResult<Reservation> {
    use diesel_async::AsyncConnection;
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        let spend = match lock_for_reservation(c, r.agent_id, r.credential, Some(r.upstream_host)).await? {
            Ok(spend) => spend,
            Err(refusal) => return Ok(Reservation::Refused(refusal)),
        };
        let current: Option<PaymentRow> = payments::table
            .find((r.agent_id, r.id))
            .select(PaymentRow::as_select())
            .for_update()
            .first(c)
            .await
            .optional()?;
        // A new authorization is a new payment: never while paused. One that replaces an
        // `expired` intent (which released its reservation) must fit every limit again.
        if current.as_ref().is_some_and(|p| p.status == PaymentStatus::Expired) {
            let Some(charge) = super::charge(stored_rate(c, r.agent_id, r.id).await?, r.amount) else {
                return Ok(Reservation::Refused(uncountable(r.amount)));
            };
            if let Some(refusal) = super::limits::check_reservation(c, &spend, charge, r.pay_to, WalletDraw::Price).await? {
                return Ok(Reservation::Refused(refusal));
            }
        } else if super::limits::settings(c, false).await?.paused {
            return Ok(Reservation::Refused(Refusal::Paused));
        } else if let Some(why) = super::limits::pay_to_refusal(&spend, r.pay_to) {
            // Blocked (or off the allowlist) since it was first signed: never signed again.
            return Ok(Reservation::Refused(Refusal::PayToNotAllowed(why)));
        }
        let n = diesel::sql_query(
            "WITH owner AS ( \
                  SELECT 1 FROM idempotency_keys k, payments q \
                   WHERE q.agent_id = $7 AND q.id = $1 AND k.agent_id = $7 AND k.key = q.idempotency_key \
                     AND k.request_hash = q.request_hash AND k.lease = $2 AND k.status = 'in_flight' \
                     FOR NO KEY UPDATE OF k) \
             UPDATE payments p SET valid_after = $3, valid_before = GREATEST(p.valid_before, $4), signed_authorization = $5, \
                                   sealed = $6, sealed_key_id = $11, header_value = NULL, \
                                   status = $8, attempts = attempts + 1, updated_at = now(), \
                                   signed_at = now() \
              WHERE p.agent_id = $7 AND p.id = $1 AND p.status NOT IN ($9, $10) AND EXISTS (SELECT 1 FROM owner)",
        )
        .bind::<SqlUuid, _>(r.id)
        .bind::<SqlUuid, _>(r.lease)
        .bind::<BigInt, _>(r.valid_after)
        .bind::<BigInt, _>(r.valid_before)
        .bind::<Jsonb, _>(r.authorization)
        .bind::<Bytea, _>(&r.sealed.bytes)
        .bind::<SqlUuid, _>(r.agent_id)
        .bind::<Text, _>(PaymentStatus::Signed)
        .bind::<Text, _>(PaymentStatus::Settled)
        .bind::<Text, _>(PaymentStatus::SettledResponseLost)
        .bind::<Text, _>(&r.sealed.key_id)
        .prepared()
        .execute(c)
        .await?;
        Ok(if n == 1 { Reservation::Reserved } else { Reservation::Fenced })
    })
    .await
}

/// The refusal of an amount too large to be counted in budget units.
pub(super) fn uncountable(amount: Amount) -> Refusal {
    Refusal::OverBudget(format!("the price {amount} is too large to be counted against the agent's budgets"))
}

/// The budget rate recorded with the intent `id` (`None`: none, it counts its amount).
///
/// # Errors
/// Database errors; a stored rate that cannot be read (the CHECK constraints forbid it).
pub async fn stored_rate(conn: &mut AsyncPgConnection, agent_id: Uuid, id: Uuid) -> QueryResult<Option<Rate>> {
    #[derive(QueryableByName)]
    struct Stored {
        #[diesel(sql_type = Nullable<Text>)]
        num: Option<String>,
        #[diesel(sql_type = Nullable<Text>)]
        den: Option<String>,
    }
    let row: Option<Stored> = diesel::sql_query(
        "SELECT budget_num::text AS num, budget_den::text AS den FROM payments WHERE agent_id = $1 AND id = $2",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<SqlUuid, _>(id)
    .prepared()
    .get_result(conn)
    .await
    .optional()?;
    let Some(Stored { num: Some(num), den: Some(den) }) = row else { return Ok(None) };
    let part = |v: &str| Amount::parse(v).map(Amount::as_u256);
    match (part(&num), part(&den)) {
        (Ok(n), Ok(d)) => Rate::new(n, d).map(Some).map_err(|e| diesel::result::Error::DeserializationError(e.into())),
        _ => Err(diesel::result::Error::DeserializationError("an unreadable budget rate".into())),
    }
}

/// A new signature for an existing intent.
pub struct Resign<'a> {
    pub id: Uuid,
    pub agent_id: Uuid,
    /// The sha256 of the key the re-signing call authenticated with.
    pub credential: &'a str,
    pub lease: Uuid,
    pub amount: Amount,
    pub pay_to: &'a str,
    /// The upstream host of the call (`hosts::key`).
    pub upstream_host: &'a str,
    pub valid_after: i64,
    pub valid_before: i64,
    pub authorization: &'a Value,
    /// The intent's exact parts with the new payment header, sealed.
    pub sealed: &'a Sealed,
}

/// The intent of this request under (agent, key), if one was signed. Intents of other
/// requests under the same key (reused after it expired) are never returned: their
/// authorizations must not reach another request's upstream.
///
/// # Errors
/// Database errors.
pub async fn find(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    key: &str,
    request_hash: &str,
) -> QueryResult<Option<PaymentRow>> {
    payments::table
        .filter(payments::agent_id.eq(agent_id))
        .filter(payments::idempotency_key.eq(key))
        .filter(payments::request_hash.eq(request_hash))
        .select(PaymentRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// Records the final state (inside the recording transaction). `error` may quote an
/// upstream's reason: NUL characters in it are replaced (TEXT cannot hold them). A payment
/// `settled` (its answer served) will never be re-sent or re-signed: its sealed parts are
/// dropped in the same statement.
///
/// # Errors
/// Database errors.
pub async fn finalize(conn: &mut AsyncPgConnection, agent_id: Uuid, fin: &super::Final) -> QueryResult<()> {
    let row = payments::table.find((agent_id, fin.id));
    let state = (
        payments::status.eq(fin.status),
        payments::tx_hash.eq(fin.tx_hash.as_deref()),
        payments::error.eq(fin.error.as_deref().map(storable::text)),
        payments::updated_at.eq(diesel::dsl::now),
    );
    if fin.status == PaymentStatus::Settled {
        let dropped = (payments::sealed.eq(None::<Vec<u8>>), payments::sealed_key_id.eq(None::<String>));
        diesel::update(row).set((state, dropped)).prepared().execute(conn).await?;
    } else {
        diesel::update(row).set(state).prepared().execute(conn).await?;
    }
    if let Some(r) = &fin.recovery {
        diesel::update(payments::table.find((agent_id, fin.id)))
            .set(payments::recovery.eq(storable::json(&r.to_json()).as_ref()))
            .prepared()
            .execute(conn)
            .await?;
    }
    Ok(())
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// The intent is committed and counts against the budget.
    Reserved,
    /// Refused by an operator's limit (caps, budgets, allowlist, pause, rate).
    Refused(super::limits::Refusal),
    /// The caller no longer owns the key (or an intent exists already).
    Fenced,
    /// A voucher's lane moved (an operator closed or stopped its channel): nothing written,
    /// the voucher never leaves.
    LaneMoved,
}

/// Atomically checks the agent's limits and commits the signed intent: the agent row is
/// locked, so concurrent payments of one agent can never overspend together.
///
/// # Errors
/// Database errors.
pub async fn reserve(conn: &mut AsyncPgConnection, p: &NewPayment<'_>) -> QueryResult<Reservation> {
    use diesel_async::AsyncConnection;
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        let spend = match lock_for_reservation(c, p.agent_id, p.credential, Some(p.upstream_host)).await? {
            Ok(spend) => spend,
            Err(refusal) => return Ok(Reservation::Refused(refusal)),
        };
        // A voucher draws on its channel's deposit: only a deposit signed with it leaves the wallet.
        let draw = p
            .lane
            .map_or(WalletDraw::Price, |l| WalletDraw::Deposit(l.deposit.as_ref().map_or(Amount::ZERO, |(d, _)| *d)));
        let Some(charge) = super::charge(p.rate, p.amount) else {
            return Ok(Reservation::Refused(uncountable(p.amount)));
        };
        if let Some(refusal) = super::limits::check_reservation(c, &spend, charge, p.pay_to, draw).await? {
            return Ok(Reservation::Refused(refusal));
        }
        if !insert_signed(c, p).await? {
            return Ok(Reservation::Fenced);
        }
        // The voucher's ceiling is recorded with the intent, or neither is (its lane moved).
        if let Some(step) = p.lane
            && !super::lanes::apply(c, p.id, step).await?
        {
            return Err(diesel::result::Error::RollbackTransaction);
        }
        Ok(Reservation::Reserved)
    })
    .await
    .or_else(|e| match e {
        diesel::result::Error::RollbackTransaction => Ok(Reservation::Fenced),
        e => Err(e),
    })
}

/// Lowers an intent's `amount` (what it reserves, or once spent, what it charged) to
/// `charged`, the amount the chain shows an `upto` authorization moved, and marks the charge
/// proven. Only ever lowers: the signed maximum stays in `signed_authorization`. The caller
/// has proven on-chain that the authorization's nonce is used, so nothing more can move under
/// it; the write is a fact of the chain and needs no lease.
///
/// # Errors
/// Database errors.
pub async fn record_charged(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    id: Uuid,
    charged: Amount,
) -> QueryResult<()> {
    diesel::sql_query(
        "UPDATE payments SET amount = LEAST(amount, $3::numeric), charge_proven = true, updated_at = now() \
          WHERE agent_id = $1 AND id = $2 AND (amount > $3::numeric OR NOT charge_proven)",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(charged.to_string())
    .prepared()
    .execute(conn)
    .await?;
    Ok(())
}

/// What `reconcile` read of an intent and decided on. Its write applies only while the
/// intent is still exactly this: same status, same signature count, same validity. A
/// re-signing that lands between the read and the write (a takeover, or the key reused after
/// GC, may re-sign with the same nonce and a new `validBefore`, and end in the same status)
/// makes the write a no-op, so a live authorization's reservation is never released on the
/// strength of an older signature's expiry.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    pub agent_id: Uuid,
    pub id: Uuid,
    pub idempotency_key: &'a str,
    pub status: PaymentStatus,
    pub valid_before: i64,
    pub attempts: i32,
}

/// Moves an intent that no live request owns to `new`, the chain's verdict on what was
/// `seen`; with `charged` (an `upto` authorization the chain shows used), also lowers the
/// amount to what its settling transaction moved. Guarded by everything `seen` holds, and by
/// "no live owner" re-checked under a share lock on the key's idempotency row (a takeover
/// that starts meanwhile waits for this statement, or makes it a no-op). `false`: changed
/// meanwhile, nothing written.
///
/// # Errors
/// Database errors.
pub async fn reconcile_fate(
    conn: &mut AsyncPgConnection,
    seen: &Seen<'_>,
    new: PaymentStatus,
    charged: Option<Amount>,
    abandon_after_ms: i64,
) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "WITH owner AS ( \
              SELECT status, created_at FROM idempotency_keys \
               WHERE agent_id = $2 AND key = $3 FOR SHARE) \
         UPDATE payments p SET status = $5, updated_at = now(), \
                sealed = CASE WHEN $5 = 'settled' THEN NULL ELSE p.sealed END, \
                sealed_key_id = CASE WHEN $5 = 'settled' THEN NULL ELSE p.sealed_key_id END, \
                amount = CASE WHEN $9::numeric IS NULL THEN p.amount ELSE LEAST(p.amount, $9::numeric) END, \
                charge_proven = p.charge_proven OR $9::numeric IS NOT NULL \
          WHERE p.agent_id = $2 AND p.id = $1 AND p.status = $4 AND p.valid_before = $7 AND p.attempts = $8 \
            AND NOT EXISTS (SELECT 1 FROM owner o WHERE o.status = 'in_flight' \
                   AND o.created_at >= now() - make_interval(secs => $6::float8 / 1000))",
    )
    .bind::<SqlUuid, _>(seen.id)
    .bind::<SqlUuid, _>(seen.agent_id)
    .bind::<Text, _>(seen.idempotency_key)
    .bind::<Text, _>(seen.status)
    .bind::<Text, _>(new)
    .bind::<BigInt, _>(abandon_after_ms)
    .bind::<BigInt, _>(seen.valid_before)
    .bind::<diesel::sql_types::Integer, _>(seen.attempts)
    .bind::<Nullable<Text>, _>(charged.map(|a| a.to_string()))
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Leases a `settled_response_lost` intent for one recovery attempt by `reconcile`: if it is
/// still as read (`updated_at` = `seen_at`) and no other run holds it, sets `updated_at`
/// `lease_ms` into the future. A row whose `updated_at` lies ahead is leased: no other run
/// claims it until then. The returned value guards [`record_recovery`]. `None`: taken (or
/// leased) meanwhile.
///
/// # Errors
/// Database errors.
pub async fn lease_lost_answer(
    conn: &mut AsyncPgConnection,
    agent_id: Uuid,
    id: Uuid,
    seen_at: chrono::DateTime<chrono::Utc>,
    lease_ms: i64,
) -> QueryResult<Option<chrono::DateTime<chrono::Utc>>> {
    #[derive(QueryableByName)]
    struct Claimed {
        #[diesel(sql_type = diesel::sql_types::Timestamptz)]
        updated_at: chrono::DateTime<chrono::Utc>,
    }
    let claimed: Option<Claimed> = diesel::sql_query(
        "UPDATE payments SET updated_at = clock_timestamp() + make_interval(secs => $4::float8 / 1000) \
          WHERE agent_id = $1 AND id = $2 AND status = 'settled_response_lost' AND updated_at = $3 \
            AND updated_at <= clock_timestamp() \
          RETURNING updated_at",
    )
    .bind::<SqlUuid, _>(agent_id)
    .bind::<SqlUuid, _>(id)
    .bind::<diesel::sql_types::Timestamptz, _>(seen_at)
    .bind::<BigInt, _>(lease_ms)
    .get_result(conn)
    .await
    .optional()?;
    Ok(claimed.map(|c| c.updated_at))
}

/// Records what a recovery by `reconcile` came to on a leased `settled_response_lost` intent:
/// `status` (`settled` for a recovered answer), the proven transaction, the recovery record.
/// Guarded by the lease (`updated_at` = `claimed`) and by a share lock on the key's
/// idempotency row (none in flight). `false`: changed meanwhile, nothing written.
///
/// # Errors
/// Database errors.
pub async fn record_recovery(
    conn: &mut AsyncPgConnection,
    leased: &PaymentRow,
    claimed: chrono::DateTime<chrono::Utc>,
    status: PaymentStatus,
    tx_hash: Option<&str>,
    recovery: &Value,
) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "WITH owner AS ( \
              SELECT status FROM idempotency_keys WHERE agent_id = $1 AND key = $3 FOR SHARE) \
         UPDATE payments p SET status = $4, tx_hash = COALESCE($5, p.tx_hash), recovery = $6, \
                updated_at = now(), \
                sealed = CASE WHEN $4 = 'settled' THEN NULL ELSE p.sealed END, \
                sealed_key_id = CASE WHEN $4 = 'settled' THEN NULL ELSE p.sealed_key_id END \
          WHERE p.agent_id = $1 AND p.id = $2 AND p.status = 'settled_response_lost' \
            AND p.updated_at = $7 \
            AND NOT EXISTS (SELECT 1 FROM owner o WHERE o.status = 'in_flight')",
    )
    .bind::<SqlUuid, _>(leased.agent_id)
    .bind::<SqlUuid, _>(leased.id)
    .bind::<Text, _>(&leased.idempotency_key)
    .bind::<Text, _>(status)
    .bind::<Nullable<Text>, _>(tx_hash)
    .bind::<Jsonb, _>(storable::json(recovery).as_ref())
    .bind::<diesel::sql_types::Timestamptz, _>(claimed)
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// A spent `upto` intent whose charge the chain has not been read for yet.
#[derive(Debug, QueryableByName)]
pub struct Unproven {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub agent_id: Uuid,
    #[diesel(sql_type = Text)]
    pub network: String,
    #[diesel(sql_type = Text)]
    pub asset: String,
    #[diesel(sql_type = Text)]
    pub pay_to: String,
    #[diesel(sql_type = Text)]
    pub payer: String,
    #[diesel(sql_type = Text)]
    pub nonce: String,
    #[diesel(sql_type = SmallInt)]
    pub x402_version: i16,
    /// The stored signed record (Permit2).
    #[diesel(sql_type = Jsonb)]
    pub signed_authorization: Value,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// One batch of spent intents whose charge is unproven (an `upto` ending that could not read
/// its settling transaction), after `after` in `(created_at, id)` order.
///
/// # Errors
/// Database errors.
pub async fn unproven_charges(
    conn: &mut AsyncPgConnection,
    after: Option<(chrono::DateTime<chrono::Utc>, Uuid)>,
    limit: i64,
) -> QueryResult<Vec<Unproven>> {
    let spent = super::sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent()));
    diesel::sql_query(format!(
        "SELECT id, agent_id, network, asset, pay_to, payer, nonce, x402_version, signed_authorization, created_at \
           FROM payments \
          WHERE NOT charge_proven AND status IN {spent} \
            AND ($1::timestamptz IS NULL OR (created_at, id) > ($1, $2::uuid)) \
          ORDER BY created_at, id LIMIT $3"
    ))
    .bind::<Nullable<diesel::sql_types::Timestamptz>, _>(after.map(|a| a.0))
    .bind::<Nullable<SqlUuid>, _>(after.map(|a| a.1))
    .bind::<BigInt, _>(limit)
    .load(conn)
    .await
}
