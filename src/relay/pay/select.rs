//! Choosing what to pay: the offered options narrowed by the agent's limits (per-call cap,
//! budgets left, `payTo` allowlist) and the router's configuration, and, for a recorded
//! intent about to be sent again, whether it is still allowed.

use crate::codes::Code;
use crate::payments::{limits, store};
use crate::relay::Error;
use crate::relay::request::RouteCall;
use crate::state::AppState;
use crate::x402::{self, PaymentRequired, Requirement};

/// Why no option may be paid: the 402's code and reason.
pub(super) type Declined = (Code, String);

/// The option to pay, or why none may be paid. The agent's limits narrow the choice up front;
/// `store::reserve` re-checks them atomically.
///
/// # Errors
/// [`Error`] when the agent's limits cannot be read from the database.
pub(super) async fn choose(
    state: &AppState,
    agent_id: uuid::Uuid,
    call: &RouteCall,
    required: &PaymentRequired,
) -> Result<Result<Requirement, Declined>, Error> {
    let spend = {
        let mut conn = crate::relay::error::conn(&state.pool).await?;
        store::agent_spend(&mut conn, agent_id, false).await?
    };
    refuse_disabled(spend.as_ref())?;
    let limits = match spend.as_ref().map(store::Spend::limits) {
        None => None,
        Some(Ok(limits)) => Some(limits),
        Some(Err(_)) => return Ok(Err((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
    };
    let (cap, left) = (limits.and_then(|l| l.per_call), limits.and_then(|l| l.budget_left()));
    let limit = limits.and_then(|l| l.headroom());
    // Only options whose payTo the agent may pay (all, without an allowlist).
    let allowed_pay_to = spend.as_ref().and_then(|s| s.allowed_pay_to.as_deref());
    let payable: Vec<Requirement> = required
        .accepts
        .iter()
        .filter(|r| {
            allowed_pay_to.is_none_or(|list| list.iter().any(|a| limits::pay_to_matches(a, &r.pay_to().to_string())))
        })
        .cloned()
        .collect();
    if payable.is_empty() && !required.accepts.is_empty() {
        let why = "no offered option pays a payTo address on the agent's allowlist";
        return Ok(Err((Code::PaymentNotAllowed, why.into())));
    }
    Ok(match x402::select(&payable, &state.supported, call.max_amount, limit) {
        Ok(r) => Ok(r.clone()),
        Err(rejection) => {
            let mut why = rejection.to_string();
            if let Some(left) = left.filter(|l| rejection.is_over_budget() && cap.is_none_or(|c| *l <= c)) {
                why.push_str(&format!(" (the agent's budgets have {left} left)"));
            }
            Err((Code::for_rejection(&rejection), why))
        }
    })
}

/// A disabled agent's call stops before anything is signed (the reservation, under the agent's
/// lock, refuses it anyway: this only spares the chain reads and the signing).
///
/// # Errors
/// [`Error::Refused`] when the agent is disabled.
pub(super) fn refuse_disabled(spend: Option<&store::Spend>) -> Result<(), Error> {
    match spend {
        Some(s) if s.disabled => Err(Error::Refused(limits::Refusal::Disabled)),
        _ => Ok(()),
    }
}

/// Why a recorded intent may no longer be sent, if it may not: the agent is disabled or
/// gone, its asset is no longer configured (or not in the router's unit), or its amount is
/// over the agent's current per-call cap (an unreadable cap refuses).
pub(super) async fn still_allowed(
    state: &AppState,
    agent_id: uuid::Uuid,
    requirement: &Requirement,
) -> Result<Option<(Code, String)>, Error> {
    let spend = match live_agent(state, agent_id).await? {
        Ok(spend) => spend,
        Err(why) => return Ok(Some(why)),
    };
    let (network, asset) = (requirement.network(), requirement.asset());
    let unit_ok =
        state.supported.unit().is_some() && state.supported.decimals(network, asset) == state.supported.unit();
    if !state.supported.allows_asset(network, asset) || !unit_ok {
        return Ok(Some((
            Code::PaymentUnsupported,
            format!("asset {asset} on {network} is no longer configured for payments"),
        )));
    }
    Ok(over_cap(&spend, requirement.amount()))
}

/// The agent's limits, when it still exists and is enabled; else why a recorded intent may no
/// longer be sent for it.
///
/// # Errors
/// [`Error`] when the agent cannot be read from the database.
pub(super) async fn live_agent(
    state: &AppState,
    agent_id: uuid::Uuid,
) -> Result<Result<store::Spend, Declined>, Error> {
    let spend = {
        let mut conn = crate::relay::error::conn(&state.pool).await?;
        store::agent_spend(&mut conn, agent_id, false).await?
    };
    Ok(match spend {
        None => Err((Code::PaymentNotMade, "the agent no longer exists".into())),
        Some(spend) if spend.disabled => Err((Code::PaymentNotMade, "the agent is disabled".into())),
        Some(spend) => Ok(spend),
    })
}

/// Why `amount` may not be paid under the agent's current per-call cap, if it may not (an
/// unreadable cap refuses).
pub(super) fn over_cap(spend: &store::Spend, amount: crate::money::Amount) -> Option<(Code, String)> {
    match spend.limits() {
        Err(_) => Some((Code::PaymentOverBudget, "the agent's limits cannot be read".into())),
        Ok(limits) => match limits.per_call {
            Some(cap) if amount > cap => {
                Some((Code::PaymentOverBudget, format!("the price {amount} exceeds the agent's per-call cap {cap}")))
            }
            _ => None,
        },
    }
}
