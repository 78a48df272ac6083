//! Choosing what to pay on EVM: the offered options narrowed by the agent's limits (per-call
//! cap, budgets left, `payTo` allowlist and block lists) and the router's configuration, and, for a recorded
//! intent about to be sent again, whether its asset is still configured.

use crate::codes::Code;
use crate::payments::limits;
use crate::payments::store::Spend;
use crate::relay::Error;
use crate::relay::pay::agent::refuse_disabled;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::{Declined, agent};
use crate::x402::{self, PaymentRequired, Requirement};

/// The option to pay, or why none may be paid. The agent's limits narrow the choice up front;
/// `store::reserve` re-checks them atomically.
///
/// # Errors
/// [`Error`] when the agent's limits cannot be read from the database.
pub(super) async fn choose(
    pc: &PaidCall<'_>,
    required: &PaymentRequired,
) -> Result<Result<Requirement, Declined>, Error> {
    let spend = pc.spend().await?;
    refuse_disabled(spend.as_ref())?;
    let limits = match spend.as_ref().map(Spend::limits) {
        None => None,
        Some(Ok(limits)) => Some(limits),
        Some(Err(_)) => return Ok(Err((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
    };
    let (cap, left) = (limits.and_then(|l| l.per_call), limits.and_then(|l| l.budget_left()));
    let limit = limits.and_then(|l| l.headroom());
    // Only options whose payTo the agent may pay (not blocked; on the allowlist, if any).
    let refused = |r: &Requirement| spend.as_ref().and_then(|s| limits::pay_to_refusal(s, &r.pay_to().to_string()));
    let payable: Vec<Requirement> = required.accepts.iter().filter(|r| refused(r).is_none()).cloned().collect();
    if payable.is_empty() && !required.accepts.is_empty() {
        let why: Vec<String> = required.accepts.iter().filter_map(refused).collect();
        return Ok(Err((Code::PaymentNotAllowed, format!("no offered option may be paid: {}", why.join("; ")))));
    }
    Ok(match x402::select(&payable, &pc.state.supported, pc.call.max_amount, limit) {
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

/// Why a recorded intent of `requirement` may no longer be sent: its asset is no longer
/// configured (or not in the router's unit, or without a value in the budget currency), or
/// what it counts is over the agent's current per-call cap.
pub(super) fn still_payable(pc: &PaidCall<'_>, requirement: &Requirement, spend: &Spend) -> Option<Declined> {
    let supported = &pc.state.supported;
    let (network, asset) = (requirement.network(), requirement.asset());
    // What it counts against the cap (budget units; its amount without a budget currency).
    let charge = supported.charge(network, asset, requirement.amount());
    let Some(charge) = charge.filter(|_| supported.allows_asset(network, asset)) else {
        return Some((
            Code::PaymentUnsupported,
            format!("asset {asset} on {network} is no longer configured for payments"),
        ));
    };
    agent::over_cap(spend, charge)
}
