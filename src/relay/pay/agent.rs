//! What the agent may pay now, as the walk checks it before it signs or re-sends (the ledger
//! checks it again, under the agent's lock, when it reserves): the agent still exists and is
//! enabled, and an amount fits its per-call cap.

use super::Declined;
use super::call::PaidCall;
use crate::codes::Code;
use crate::payments::limits::Refusal;
use crate::payments::store::{self, Spend};
use crate::relay::Error;

impl PaidCall<'_> {
    /// The agent's limits and usage for this call's upstream host, read now (no lock: the
    /// reservation re-checks).
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn spend(&self) -> Result<Option<Spend>, Error> {
        let host = self.call.upstream_host();
        let spend = store::agent_spend_at(&mut *self.db().await?, self.own.agent_id, Some(&host), false).await?;
        if let Some(s) = &spend {
            self.seen.note_threshold(s.approval_above.as_deref());
        }
        Ok(spend)
    }

    /// The agent's limits, when it still exists and is enabled; else why a recorded payment
    /// may no longer be sent for it.
    ///
    /// # Errors
    /// [`Error`] when the agent cannot be read from the database.
    pub(super) async fn live_agent(&self) -> Result<Result<Spend, Declined>, Error> {
        Ok(match self.spend().await? {
            None => Err((Code::PaymentNotMade, "the agent no longer exists".into())),
            Some(spend) if spend.disabled => Err((Code::PaymentNotMade, "the agent is disabled".into())),
            Some(spend) => Ok(spend),
        })
    }
}

/// A disabled agent's call stops before anything is signed (the reservation, under the
/// agent's lock, refuses it anyway: this only spares the chain reads and the signing).
///
/// # Errors
/// [`Error::Refused`] when the agent is disabled.
pub(super) fn refuse_disabled(spend: Option<&Spend>) -> Result<(), Error> {
    match spend {
        Some(s) if s.disabled => Err(Error::Refused(Refusal::Disabled)),
        _ => Ok(()),
    }
}

/// Why `amount` may not be paid under the agent's current per-call cap, if it may not (an
/// unreadable cap refuses).
pub(super) fn over_cap(spend: &Spend, amount: crate::money::Amount) -> Option<Declined> {
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
