//! Committing an intent before its payment leaves, fenced by the caller's lease: a new
//! intent ([`reserve`]) or an expired one signed again with the same nonce ([`resign`]). The
//! ledger re-checks the agent's limits under its lock.

use uuid::Uuid;

use super::sign::Signing;
use super::{Attempt, to_i64};
use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::limits::Refusal;
use crate::payments::sealed::{Exact, Kept, Sealed};
use crate::payments::store::{self, PaymentRow, Reservation};
use crate::relay::Error;
use crate::state::AppState;
use crate::x402::{PaymentRequired, Requirement};

/// The exact parts of a new intent: the request as it will be sent, the payment header, the
/// terms and context as signed, the 402's extensions as advertised.
pub(super) fn exact_of(signing: &Signing, requirement: &serde_json::Value) -> Result<Exact, Error> {
    let header_value = signing.attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
    let json = |v: &serde_json::Value| serde_json::to_vec(v).map_err(|e| Error::Internal(e.into()));
    Ok(Exact {
        request: Some(signing.sent.clone()),
        header_value: header_value.to_owned(),
        requirement_json: json(requirement)?,
        context_json: json(&signing.context)?,
        advertised_extensions: signing.advertised.clone(),
    })
}

/// `exact` as the intent `id` of `own`'s agent keeps it: sealed under the current key, and
/// shown redacted (`crate::secrets`).
///
/// # Errors
/// [`Error::Internal`] when nothing could be sealed (no random nonce): nothing is recorded
/// or sent.
pub(super) fn keep(state: &AppState, agent_id: Uuid, id: Uuid, exact: &Exact) -> Result<Kept, Error> {
    let s = &state.config.secrets;
    crate::secrets::intent::keep((&s.keyring, &s.redaction), agent_id, id, exact).map_err(|e| Error::Internal(e.into()))
}

/// `exact` sealed for the intent `id` (a re-signing: the shown copies do not change).
///
/// # Errors
/// As [`keep`].
pub(super) fn seal(state: &AppState, agent_id: Uuid, id: Uuid, exact: &Exact) -> Result<Sealed, Error> {
    crate::secrets::intent::seal(&state.config.secrets.keyring, agent_id, id, exact)
        .map_err(|e| Error::Internal(e.into()))
}

/// Commits the new intent; a refusal by an operator's limit, if any.
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost; database errors.
pub(super) async fn reserve(
    state: &AppState,
    own: &Ownership,
    required: &PaymentRequired,
    chosen: &Requirement,
    signing: &Signing,
) -> Result<Option<Refusal>, Error> {
    let attempt = &signing.attempt;
    let authorization = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
    let kept = keep(state, own.agent_id, attempt.id, &exact_of(signing, &chosen.raw_json())?)?;
    let row = store::NewPayment {
        id: attempt.id,
        agent_id: own.agent_id,
        credential: &own.credential,
        idempotency_key: own.key.as_str(),
        request_hash: &own.request_hash,
        lease: own.lease,
        x402_version: i16::from(required.version.number()),
        scheme: chosen.scheme(),
        network: &chosen.network().caip2(),
        asset: &chosen.asset().to_checksum(None),
        amount: chosen.amount(),
        pay_to: &chosen.pay_to().to_checksum(None),
        payer: &state.config.signer.address().to_checksum(None),
        nonce: &signing.nonce.to_string(),
        valid_after: to_i64(attempt.signed.valid_after()),
        valid_before: to_i64(attempt.signed.valid_before()),
        authorization: &authorization,
        header_name: attempt.header.0.as_str(),
        kept: &kept,
    };
    faults::at(state.faults.as_ref(), Point::BeforeIntent).await;
    let mut conn = crate::relay::error::conn(&state.pool).await?;
    fenced(store::reserve(&mut conn, &row).await?)
}

/// Records `attempt`, signed again for the expired intent `intent` (its exact parts
/// `exact`) with its nonce; a refusal by an operator's limit, if any (the expired intent
/// released its budget).
///
/// # Errors
/// [`Error::Superseded`] when the lease was lost; database errors.
pub(super) async fn resign(
    state: &AppState,
    own: &Ownership,
    (intent, exact): (&PaymentRow, &Exact),
    requirement: &Requirement,
    attempt: &Attempt,
) -> Result<Option<Refusal>, Error> {
    let auth = serde_json::to_value(&attempt.signed).map_err(|e| Error::Internal(e.into()))?;
    let header = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
    let exact = Exact { header_value: header.to_owned(), ..exact.clone() };
    let sealed = seal(state, own.agent_id, intent.id, &exact)?;
    let a = &attempt.signed;
    let resign = store::Resign {
        id: intent.id,
        agent_id: own.agent_id,
        credential: &own.credential,
        lease: own.lease,
        amount: requirement.amount(),
        pay_to: &intent.pay_to,
        valid_after: to_i64(a.valid_after()),
        valid_before: to_i64(a.valid_before()),
        authorization: &auth,
        sealed: &sealed,
    };
    faults::at(state.faults.as_ref(), Point::BeforeResign).await;
    let mut conn = crate::relay::error::conn(&state.pool).await?;
    fenced(store::resign(&mut conn, &resign).await?)
}

pub(super) fn fenced(reservation: Reservation) -> Result<Option<Refusal>, Error> {
    match reservation {
        Reservation::Reserved => Ok(None),
        Reservation::Fenced => Err(Error::Superseded),
        Reservation::Refused(refusal) => Ok(Some(refusal)),
    }
}
