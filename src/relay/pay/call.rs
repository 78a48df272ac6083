//! One paid call in progress: [`PaidCall`], the value whose methods are the walk's steps (the
//! owner of the key, the call, its known-terms key and its deadline), so that no step threads
//! them through as loose arguments.

use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde_json::{Value, json};

use crate::faults::{self, Point};
use crate::idempotency::Ownership;
use crate::payments::sealed::Exact;
use crate::payments::store::{self, PaymentRow};
use crate::relay::Error;
use crate::relay::request::RouteCall;
use crate::state::AppState;
use crate::upstream::known_terms::TermsKey;
use crate::x402::{self, PaymentRequired};

/// One call owned by this attempt, on its way to being paid (or resumed) and recorded.
#[derive(Clone, Copy)]
pub(crate) struct PaidCall<'a> {
    pub state: &'a AppState,
    pub own: &'a Ownership,
    pub call: &'a RouteCall,
    /// Where the terms of this request are remembered (`crate::upstream::known_terms`).
    pub terms: &'a TermsKey,
    /// The route deadline: an answer that arrived is recorded by it.
    pub deadline: Instant,
    /// What this call already read of the agent, so a later step need not ask again.
    pub seen: &'a Seen,
}

/// What one paid call read of its agent's row, once: the approval threshold comes with the
/// limits the choice reads (`PaidCall::spend`), so the approval gate asks the database only
/// when no choice read them first.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    threshold: std::sync::OnceLock<Option<crate::money::Amount>>,
}

impl Seen {
    /// Notes the agent's `approval_above` as read (unreadable: zero, every payment held).
    pub fn note_threshold(&self, above: Option<&str>) {
        let parsed = above.map(|a| crate::money::Amount::parse(a).unwrap_or(crate::money::Amount::ZERO));
        let _ = self.threshold.set(parsed);
    }

    /// The threshold read earlier in this call, if it was.
    pub fn threshold(&self) -> Option<Option<crate::money::Amount>> {
        self.threshold.get().copied()
    }
}

impl PaidCall<'_> {
    /// A pooled connection, checked out for one step (never held across the network).
    ///
    /// # Errors
    /// [`Error::Unavailable`] without one.
    pub async fn db(&self) -> Result<crate::db::PgConn<'_>, Error> {
        crate::relay::error::conn(&self.state.pool).await
    }

    /// The test hooks' point `point` (nothing in production).
    pub async fn fault(&self, point: Point) {
        faults::at(self.state.faults.as_ref(), point).await;
    }

    /// Time left until the route deadline.
    pub fn remaining(&self) -> Duration {
        crate::relay::remaining(self.deadline)
    }

    /// The intent recorded for this very request under this key by an earlier attempt, if any.
    ///
    /// # Errors
    /// Database errors.
    pub async fn earlier_intent(&self) -> Result<Option<PaymentRow>, Error> {
        let own = self.own;
        Ok(store::find(&mut *self.db().await?, own.agent_id, own.key.as_str(), &own.request_hash).await?)
    }

    /// Counts a payment's ending in `x402_router_payments_total{outcome}`.
    pub fn count(&self, outcome: &str) {
        self.state.metrics.payments.with_label_values(&[outcome]).inc();
    }

    /// The payload's context: the 402's version and resource, and the extensions echoed
    /// (`payment-identifier` with our own id when the upstream advertises it).
    ///
    /// # Errors
    /// [`Error`] when our own id cannot be echoed (nothing is signed).
    pub fn context_of(&self, required: &PaymentRequired) -> Result<Value, Error> {
        let (state, own) = (self.state, self.own);
        let extensions = if required.advertises_payment_identifier() {
            let pid =
                x402::payment_identifier_id(&state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
            match x402::wire::payment_extensions(required.extensions.as_ref(), &pid) {
                Ok(e) => e,
                // Our own id is always valid: a payment without it would be a bug (and, when the
                // upstream requires it, refused); nothing is signed.
                Err(e) => return Err(Error::invariant(format!("cannot echo payment-identifier: {e}"))),
            }
        } else {
            // A declared `bazaar` is echoed, as the x402 spec asks of payers, so that the
            // facilitator catalogues the resource (docs/DESIGN.md §11); other declarations need
            // no echo.
            required.extensions.as_ref().and_then(|e| e.get("bazaar")).map(|b| json!({ "bazaar": b }))
        };
        if required.requires_payment_identifier()
            && extensions.as_ref().and_then(|e| e.pointer("/payment-identifier/info/id")).is_none()
        {
            return Err(Error::invariant("the upstream requires payment-identifier and no id would be sent"));
        }
        Ok(json!({ "version": required.version.number(), "resource": required.resource, "extensions": extensions }))
    }

    /// The exact parts of a new intent, sealed by the ledger: the request exactly as it will be
    /// sent, the payment header, the chosen requirement and the context as signed, and the
    /// 402's extensions as advertised (recovery needs them all, committed before the payment
    /// leaves).
    ///
    /// # Errors
    /// [`Error`] when a part cannot be stored (a broken invariant: nothing is signed or sent).
    pub fn exact_of(
        &self,
        required: &PaymentRequired,
        (requirement, context): (&Value, &Value),
        header: &HeaderValue,
    ) -> Result<Exact, Error> {
        let json = |v: &Value| serde_json::to_vec(v).map_err(|e| Error::Internal(e.into()));
        let advertised = match required.extensions.as_ref() {
            Some(e) => Some(json(e)?),
            None => None,
        };
        Ok(Exact {
            request: Some(crate::recovery::as_sent(&self.call.upstream).map_err(Error::invariant)?),
            header_value: header.to_str().map_err(|e| Error::Internal(e.into()))?.to_owned(),
            requirement_json: json(requirement)?,
            context_json: json(context)?,
            advertised_extensions: advertised,
        })
    }
}
