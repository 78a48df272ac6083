//! Committing an intent before its payment leaves, fenced by the caller's lease: a new intent
//! ([`PaidCall::reserve`]), one signed again with the same nonce ([`PaidCall::resign`]) or
//! for terms that changed ([`PaidCall::record_repriced`]). The ledger re-checks the agent's
//! limits and the operator's stops under the agent's lock; the exact parts are sealed
//! (`crate::secrets`).

use uuid::Uuid;

use super::call::PaidCall;
use super::scheme::{Resigned, Signing, stored};
use crate::faults::Point;
use crate::money::{Amount, Rate};
use crate::payments::limits::Refusal;
use crate::payments::reprice::{Repriced, reprice};
use crate::payments::sealed::{Exact, Kept, Sealed};
use crate::payments::store::{self, PaymentRow, Reservation};
use crate::relay::Error;

impl PaidCall<'_> {
    /// `exact` as the intent `id` keeps it: sealed under the current key, and shown redacted.
    ///
    /// # Errors
    /// [`Error::Internal`] when nothing could be sealed (no random nonce): nothing is recorded
    /// or sent.
    fn keep(&self, id: Uuid, exact: &Exact) -> Result<Kept, Error> {
        let s = &self.state.config.secrets;
        crate::secrets::intent::keep((&s.keyring, &s.redaction), self.own.agent_id, id, exact)
            .map_err(|e| Error::Internal(e.into()))
    }

    /// `exact` sealed for the intent `id` (a re-signing: the shown copies do not change).
    fn seal(&self, id: Uuid, exact: &Exact) -> Result<Sealed, Error> {
        crate::secrets::intent::seal(&self.state.config.secrets.keyring, self.own.agent_id, id, exact)
            .map_err(|e| Error::Internal(e.into()))
    }

    /// Commits a new intent; a refusal by an operator's limit, if any.
    ///
    /// # Errors
    /// [`Error::Superseded`] when the lease was lost; database errors.
    pub(super) async fn reserve<S: serde::Serialize>(&self, signing: &Signing<S>) -> Result<Option<Refusal>, Error> {
        let (own, attempt, c) = (self.own, &signing.attempt, &signing.columns);
        let rate = match budget_rate(&self.state.supported, &c.network, &c.asset) {
            Ok(rate) => rate,
            Err(refusal) => return Ok(Some(refusal)),
        };
        let authorization = stored(&attempt.signed)?;
        let kept = self.keep(attempt.id, &signing.exact)?;
        let row = store::NewPayment {
            id: attempt.id,
            agent_id: own.agent_id,
            credential: &own.credential,
            idempotency_key: own.key.as_str(),
            request_hash: &own.request_hash,
            lease: own.lease,
            x402_version: i16::from(attempt.version.number()),
            scheme: &c.scheme,
            network: &c.network,
            asset: &c.asset,
            amount: c.amount,
            rate,
            pay_to: &c.pay_to,
            payer: &c.payer,
            upstream_host: &self.call.upstream_host(),
            nonce: &attempt.nonce,
            valid_after: c.valid_after,
            valid_before: c.valid_before,
            authorization: &authorization,
            header_name: attempt.header.0.as_str(),
            kept: &kept,
            lane: signing.lane.as_ref(),
        };
        self.fault(Point::BeforeIntent).await;
        fenced(store::reserve(&mut *self.db().await?, &row).await?)
    }

    /// Records `resigned`, signed again for the intent `intent` (its exact parts `exact`) with
    /// its nonce; a refusal by an operator's limit, if any (an expired intent released its
    /// budget).
    ///
    /// # Errors
    /// [`Error::Superseded`] when the lease was lost; database errors.
    pub(super) async fn resign<S: serde::Serialize>(
        &self,
        (intent, exact): (&PaymentRow, &Exact),
        resigned: &Resigned<S>,
    ) -> Result<Option<Refusal>, Error> {
        let attempt = &resigned.attempt;
        let auth = stored(&attempt.signed)?;
        let header = attempt.header.1.to_str().map_err(|e| Error::Internal(e.into()))?;
        let sealed = self.seal(intent.id, &Exact { header_value: header.to_owned(), ..exact.clone() })?;
        let resign = store::Resign {
            id: intent.id,
            agent_id: self.own.agent_id,
            credential: &self.own.credential,
            lease: self.own.lease,
            amount: resigned.amount,
            pay_to: &intent.pay_to,
            upstream_host: &self.call.upstream_host(),
            valid_after: resigned.valid_after,
            valid_before: resigned.valid_before,
            authorization: &auth,
            sealed: &sealed,
        };
        self.fault(Point::BeforeResign).await;
        fenced(store::resign(&mut *self.db().await?, &resign).await?)
    }

    /// Records `second`, the terms an upstream asked instead of those paid ahead for `first_amount`,
    /// signed with the same nonce (or, a voucher, on the same lane) over the same intent.
    /// `false`: a limit refuses the larger amount, or the voucher's lane moved (nothing
    /// recorded; the 402 is then a refusal).
    ///
    /// # Errors
    /// [`Error::Superseded`] when the lease was lost; database errors.
    pub(super) async fn record_repriced<S: serde::Serialize>(
        &self,
        second: &Signing<S>,
        first_amount: Amount,
    ) -> Result<bool, Error> {
        let (attempt, c) = (&second.attempt, &second.columns);
        let authorization = stored(&attempt.signed)?;
        let kept = self.keep(attempt.id, &second.exact)?;
        let row = Repriced {
            id: attempt.id,
            agent_id: self.own.agent_id,
            credential: &self.own.credential,
            lease: self.own.lease,
            first_amount,
            amount: c.amount,
            pay_to: &c.pay_to,
            upstream_host: &self.call.upstream_host(),
            valid_after: c.valid_after,
            valid_before: c.valid_before,
            authorization: &authorization,
            kept: &kept,
            lane: second.lane.as_ref(),
        };
        match reprice(&mut *self.db().await?, &row).await? {
            Reservation::Reserved => Ok(true),
            Reservation::Fenced => Err(Error::Superseded),
            Reservation::Refused(_) | Reservation::LaneMoved => Ok(false),
        }
    }
}

/// Lowers an intent's reserved amount to `charged`, what the chain shows moved, and marks its
/// charge proven. A failure leaves the larger amount charged (never less) until `reconcile`
/// proves it.
pub(in crate::relay::pay) async fn record_charge(
    state: &crate::state::AppState,
    agent_id: Uuid,
    id: Uuid,
    charged: alloy::primitives::U256,
) {
    let written = match crate::relay::error::conn(&state.pool).await {
        Ok(mut conn) => {
            store::record_charged(&mut conn, agent_id, id, Amount::from_u256(charged)).await.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = written {
        tracing::warn!(agent_id = %agent_id, error = %e, "could not lower a reservation to what moved");
    }
}

/// The budget rate an intent of `asset` on `network` (as the ledger writes them) is recorded
/// with: `None` without a budget currency (it counts its amount); with one, the asset's rate,
/// or a refusal when it has none (fail closed: a payment that cannot be counted is not made).
fn budget_rate(supported: &crate::x402::Supported, network: &str, asset: &str) -> Result<Option<Rate>, Refusal> {
    use std::str::FromStr;
    if supported.budget_decimals().is_none() {
        return Ok(None);
    }
    let parsed = (crate::x402::Network::from_str(network).ok(), alloy::primitives::Address::from_str(asset).ok());
    match parsed {
        (Some(n), Some(a)) => supported.rate(n, a).map(Some),
        _ => None,
    }
    .ok_or_else(|| Refusal::OverBudget(format!("the asset {asset} on {network} has no value in the budget currency")))
}

fn fenced(reservation: Reservation) -> Result<Option<Refusal>, Error> {
    match reservation {
        Reservation::Reserved => Ok(None),
        Reservation::Fenced | Reservation::LaneMoved => Err(Error::Superseded),
        Reservation::Refused(refusal) => Ok(Some(refusal)),
    }
}
