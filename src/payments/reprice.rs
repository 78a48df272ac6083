//! An intent paid ahead on known terms, signed again for the terms the upstream's `402`
//! asked instead (src/upstream/known_terms.rs): same nonce, same network, token and method, so the token
//! (or Permit2) lets at most one of the two authorizations move money. Until the chain shows
//! which one did, the intent reserves the larger amount and its charge is unproven.

use diesel::sql_types::{BigInt, Bytea, Jsonb, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use super::PaymentStatus;
use super::sealed::Kept;
use super::store::{Reservation, lock_for_reservation};
use crate::db::{PrepareExt, storable};
use crate::money::Amount;

/// The new signature of an intent and what it was signed for.
pub struct Repriced<'a> {
    pub id: Uuid,
    pub agent_id: Uuid,
    /// The sha256 of the key the call authenticated with (`store::lock_for_reservation`).
    pub credential: &'a str,
    pub lease: Uuid,
    /// The intent's amount now (what the first authorization signed).
    pub first_amount: Amount,
    /// What the new authorization signs.
    pub amount: Amount,
    pub pay_to: &'a str,
    /// The upstream host of the call (`hosts::key`).
    pub upstream_host: &'a str,
    pub valid_after: i64,
    pub valid_before: i64,
    pub authorization: &'a Value,
    /// The new terms, context, extensions and payment header with the request as sent:
    /// sealed, and shown redacted.
    pub kept: &'a Kept,
    /// A batch-settlement voucher's lane write (`super::lanes::apply`), in the same transaction.
    pub lane: Option<&'a super::lanes::LaneStep>,
}

/// Records `r`, fenced by the caller's lease, while the intent is still `signed`: the amount
/// becomes the larger of the two (an increase must fit the agent's and the wallet's limits,
/// checked under the agent's lock), `valid_before` the later one (the first authorization
/// is live until then), the charge unproven when the amounts differ.
///
/// # Errors
/// Database errors.
pub async fn reprice(conn: &mut AsyncPgConnection, r: &Repriced<'_>) -> diesel::QueryResult<Reservation> {
    let shown = &r.kept.shown;
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        let spend = match lock_for_reservation(c, r.agent_id, r.credential, Some(r.upstream_host)).await? {
            Ok(spend) => spend,
            Err(refusal) => return Ok(Reservation::Refused(refusal)),
        };
        // What the larger amount counts more than the first, at the intent's recorded rate.
        let rate = super::store::stored_rate(c, r.agent_id, r.id).await?;
        let (Some(now), Some(first)) = (super::charge(rate, r.amount), super::charge(rate, r.first_amount)) else {
            return Ok(Reservation::Refused(super::store::uncountable(r.amount)));
        };
        let more = Amount::from_u256(now.as_u256().saturating_sub(first.as_u256()));
        if let Some(refusal) =
            super::limits::check_reservation(c, &spend, more, r.pay_to, super::limits::WalletDraw::Price).await?
        {
            return Ok(Reservation::Refused(refusal));
        }
        let n = diesel::sql_query(
            "WITH owner AS ( \
                  SELECT 1 FROM idempotency_keys k, payments q \
                   WHERE q.agent_id = $2 AND q.id = $1 AND k.agent_id = $2 AND k.key = q.idempotency_key \
                     AND k.request_hash = q.request_hash AND k.lease = $3 AND k.status = 'in_flight' \
                     FOR NO KEY UPDATE OF k) \
             UPDATE payments p SET amount = GREATEST(p.amount, $4::numeric), \
                                   charge_proven = p.charge_proven AND p.amount = $4::numeric, \
                                   pay_to = $5, valid_after = $6, valid_before = GREATEST(p.valid_before, $7), \
                                   requirement = $8, context = $9, sealed = $10, sealed_key_id = $11, \
                                   signed_authorization = $12, advertised_extensions = $13, \
                                   requirement_json = NULL, context_json = NULL, header_value = NULL, \
                                   attempts = attempts + 1, updated_at = now(), signed_at = now() \
              WHERE p.agent_id = $2 AND p.id = $1 AND p.status = $14 AND p.amount = $15::numeric \
                AND EXISTS (SELECT 1 FROM owner)",
        )
        .bind::<SqlUuid, _>(r.id)
        .bind::<SqlUuid, _>(r.agent_id)
        .bind::<SqlUuid, _>(r.lease)
        .bind::<Text, _>(r.amount.to_string())
        .bind::<Text, _>(r.pay_to)
        .bind::<BigInt, _>(r.valid_after)
        .bind::<BigInt, _>(r.valid_before)
        .bind::<Jsonb, _>(storable::json(&shown.requirement).as_ref())
        .bind::<Jsonb, _>(storable::json(&shown.context).as_ref())
        .bind::<Bytea, _>(&r.kept.sealed.bytes)
        .bind::<Text, _>(&r.kept.sealed.key_id)
        .bind::<Jsonb, _>(r.authorization)
        .bind::<Nullable<Bytea>, _>(shown.advertised_extensions.as_deref())
        .bind::<Text, _>(PaymentStatus::Signed)
        .bind::<Text, _>(r.first_amount.to_string())
        .prepared()
        .execute(c)
        .await?;
        if n != 1 {
            return Ok(Reservation::Fenced);
        }
        // The new voucher's ceiling is recorded with it, or neither is (its lane moved).
        if let Some(step) = r.lane
            && !super::lanes::apply(c, r.id, step).await?
        {
            return Err(diesel::result::Error::RollbackTransaction);
        }
        Ok(Reservation::Reserved)
    })
    .await
    .or_else(|e| match e {
        diesel::result::Error::RollbackTransaction => Ok(Reservation::LaneMoved),
        e => Err(e),
    })
}
