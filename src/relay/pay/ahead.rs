//! Paying ahead on known terms ([`crate::terms`]): the call's first request already
//! carries the payment, saving the unpaid probe. A `402` to it with other terms is paid once
//! more with the **same nonce**, only in the same nonce domain (network, token, method), so
//! the chain lets at most one of the two authorizations move money; the intent reserves the
//! larger amount until the chain shows which one did.
//!
//! Anything that stops a payment ahead before it is sent (terms the agent may not pay now,
//! a refusal by a limit, an unreadable chain) falls back to the ordinary path: probe unpaid,
//! then pay what the live `402` asks.

use std::time::Instant;

use reqwest::StatusCode;

use super::exchange;
use super::sign::{self, Signing};
use super::{Attempt, Resume, resume, select, to_i64};
use crate::idempotency::Ownership;
use crate::payments::Final;
use crate::payments::reprice::{Repriced, reprice};
use crate::payments::store::Reservation;
use crate::relay::request::RouteCall;
use crate::relay::{Error, Outcome};
use crate::state::AppState;
use crate::terms::TermsKey;
use crate::upstream::UpstreamResponse;
use crate::x402::{self, PaymentRequired, Requirement};

/// Pays `required` (known terms) with the first request. `None`: nothing was signed or sent;
/// the caller probes unpaid instead.
///
/// # Errors
/// [`Error`] when nothing may be recorded (database gone, lease lost).
pub async fn pay_ahead(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    key: &TermsKey,
    required: &PaymentRequired,
    deadline: Instant,
) -> Result<Option<Outcome>, Error> {
    let (chosen, existing, nonces) = tokio::join!(
        select::choose(state, own.agent_id, call, required),
        super::earlier_intent(state, own),
        sign::check_nonces(state, own)
    );
    let Ok(chosen) = chosen? else {
        return Ok(None);
    };
    if let Some(intent) = existing? {
        crate::relay::make_durable(state, own).await?;
        return resume(state, own, call, intent, deadline, Resume::KeyReused).await.map(Some);
    }
    let Ok(signing) = sign::sign_new(state, own, call, (required, &chosen), nonces)? else {
        return Ok(None);
    };
    if super::reserve::reserve(state, own, required, &chosen, &signing).await?.is_some() {
        // Refused by a limit: this signature was never stored nor sent; the live 402 decides.
        return Ok(None);
    }
    state.metrics.payments.with_label_values(&["paid_ahead"]).inc();
    tracing::info!(agent_id = %own.agent_id, payment.network = %chosen.network(), payment.amount = %chosen.amount(),
        "payment signed on known terms and recorded; sending it with the first request");
    let first = &signing.attempt;
    let sent = exchange::send(state, own, call, &first.header, deadline).await?;
    Ok(Some(match sent {
        Ok(resp) if resp.status == 402 && exchange::refuses(&resp) => {
            let paid = Paid { required, chosen: &chosen, signing: &signing };
            match repriced(state, own, call, key, paid, &resp).await? {
                Some((second, unproven)) => {
                    let outcome = exchange::exchange(state, own, call, &second, deadline).await?;
                    if unproven {
                        prove_charge(state, own, &second, &outcome).await;
                    }
                    outcome
                }
                None => exchange::finish(state, own, first, Ok(resp), deadline).await,
            }
        }
        sent => {
            // An answer without any settlement claim: the upstream may have stopped charging
            // (it now holds an authorization it did not ask for, reserved until the chain
            // decides); the next call probes first. So does one after a failure.
            let claims = matches!(&sent, Ok(r) if r.status < 500 && x402::wire::parse_settlement(&r.headers).ok().flatten().is_some());
            if !claims {
                state.terms.forget(key);
            }
            exchange::finish(state, own, first, sent, deadline).await
        }
    }))
}

/// What was paid ahead.
struct Paid<'a> {
    required: &'a PaymentRequired,
    chosen: &'a Requirement,
    signing: &'a Signing,
}

/// The upstream's `402` to a payment ahead: the terms it asks now, signed with the same
/// nonce and recorded, when they differ from what was paid, lie in the same nonce domain,
/// fit the agent's limits and the first authorization is not used; with whether the amounts
/// differ (the charge is then unproven until the chain shows it). `None`: it is a refusal
/// of the payment (answered as such, the first authorization kept reserved).
async fn repriced(
    state: &AppState,
    own: &Ownership,
    call: &RouteCall,
    key: &TermsKey,
    paid: Paid<'_>,
    resp: &UpstreamResponse,
) -> Result<Option<(Attempt, bool)>, Error> {
    let Ok(asked) = x402::wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &resp.headers, &resp.body) else {
        state.terms.forget(key);
        return Ok(None);
    };
    state.terms.put(key.clone(), &asked, &resp.headers);
    let Ok(chosen) = select::choose(state, own.agent_id, call, &asked).await? else {
        return Ok(None);
    };
    let first = &paid.signing.attempt;
    if asked.version != paid.required.version
        || chosen.raw_json() == paid.chosen.raw_json()
        || !same_nonce_domain(paid.chosen, &chosen)
    {
        return Ok(None);
    }
    // Used already (or unreadable): the refusal path asks the chain again and says so.
    if !matches!(super::confirm::chain_used(state, &first.signed).await, Ok(false)) {
        return Ok(None);
    }
    let context = sign::context_of(state, own, &asked)?;
    let Ok(second) = sign::sign(state, asked.version, &chosen, &context, paid.signing.nonce) else {
        return Ok(None);
    };
    let second = Attempt { id: first.id, ..second };
    let authorization = serde_json::to_value(&second.signed).map_err(|e| Error::Internal(e.into()))?;
    let advertised = match asked.extensions.as_ref() {
        Some(e) => Some(serde_json::to_vec(e).map_err(|e| Error::Internal(e.into()))?),
        None => None,
    };
    // The same request as sent, with the new terms, context and payment header.
    let resigned =
        Signing { attempt: second, nonce: paid.signing.nonce, context, sent: paid.signing.sent.clone(), advertised };
    let kept =
        super::reserve::keep(state, own.agent_id, first.id, &super::reserve::exact_of(&resigned, &chosen.raw_json())?)?;
    let second = resigned.attempt;
    let row = Repriced {
        id: first.id,
        agent_id: own.agent_id,
        credential: &own.credential,
        lease: own.lease,
        first_amount: paid.chosen.amount(),
        amount: chosen.amount(),
        pay_to: &chosen.pay_to().to_checksum(None),
        valid_after: to_i64(second.signed.valid_after()),
        valid_before: to_i64(second.signed.valid_before()),
        authorization: &authorization,
        kept: &kept,
    };
    let mut conn = crate::relay::error::conn(&state.pool).await?;
    match reprice(&mut conn, &row).await? {
        Reservation::Reserved => {}
        Reservation::Fenced => return Err(Error::Superseded),
        Reservation::Refused(_) => return Ok(None),
    }
    state.metrics.payments.with_label_values(&["repriced"]).inc();
    tracing::info!(agent_id = %own.agent_id, payment.amount = %chosen.amount(), first.amount = %paid.chosen.amount(),
        "the upstream asked other terms than known: signed again with the same nonce");
    Ok(Some((second, chosen.amount() != paid.chosen.amount())))
}

/// Whether an authorization of `b` would share `a`'s nonce space: the same network, token,
/// scheme and transfer method (EIP-3009 nonces live in the token, Permit2's in Permit2).
fn same_nonce_domain(a: &Requirement, b: &Requirement) -> bool {
    a.network() == b.network()
        && a.asset() == b.asset()
        && a.scheme() == b.scheme()
        && x402::permit2::scheme_of(a).is_some() == x402::permit2::scheme_of(b).is_some()
}

/// After a repriced payment was found spent: lowers the reservation of the larger amount to
/// what the settling transaction moved out of the wallet (left to `reconcile` when it cannot
/// be read now; the larger amount stays charged meanwhile, never less).
async fn prove_charge(state: &AppState, own: &Ownership, second: &Attempt, outcome: &Outcome) {
    let Some(Final { status, tx_hash: Some(tx), .. }) = outcome.payment().and_then(|p| p.ledger.as_ref()) else {
        return;
    };
    let Ok(tx) = tx.parse() else { return };
    if !status.is_spent() {
        return;
    }
    let s = &second.signed;
    let moved = state.chain.transferred_from(s.network(), s.asset(), s.payer(), tx).await;
    let Ok(Some(moved)) = moved else { return };
    crate::relay::settled::record_charge(state, own.agent_id, second.id, moved).await;
}
