//! Sending the paid request, once the operator's stop and the lease are checked, and turning
//! its answer (or its absence) into an outcome on the chain's word: confirmed, refused, a
//! settlement claim, or lost in transit (then recovered while the deadline allows).

use std::time::Instant;

use alloy::primitives::U256;
use reqwest::header::{HeaderName, HeaderValue};

use super::MIN_RECOVERY_TIME;
use super::call::PaidCall;
use super::scheme::{Answer, Attempt, Chains, Landed, Parts, Scheme};
use crate::codes::Code;
use crate::faults::Point;
use crate::payments::{Final, PaymentStatus, RecoveryNote};
use crate::relay::{Error, Failure, Outcome, PaymentNote};
use crate::upstream::{UpstreamError, UpstreamResponse};
use crate::x402;

/// What the upstream said to a paid request (or why it said nothing).
pub(super) type Sent = Result<UpstreamResponse, UpstreamError>;

impl PaidCall<'_> {
    /// Sends the paid request and turns the answer (or its absence) into an outcome.
    ///
    /// # Errors
    /// [`Error::Superseded`] when the lease was lost before the payment left, [`Error::Refused`]
    /// when an operator stopped it (nothing sent).
    pub(super) async fn exchange<S: Scheme>(&self, s: &S, attempt: &Attempt<S::Signed>) -> Result<Outcome, Error> {
        let sent = self.send(&attempt.header).await?;
        Ok(self.finish(s, attempt, sent).await)
    }

    /// Sends the paid request, once [`crate::relay::may_leave`] allows it.
    ///
    /// # Errors
    /// [`Error::Superseded`] when the lease was lost before the payment left, [`Error::Refused`]
    /// when an operator stopped it (paused, agent disabled): nothing sent.
    pub(super) async fn send(&self, header: &(HeaderName, HeaderValue)) -> Result<Sent, Error> {
        self.fault(Point::BeforePaidSend).await;
        crate::relay::may_leave(self.state, self.own).await?;
        self.fault(Point::PaymentLeaving).await;
        let started = Instant::now();
        let upstream = &self.state.upstream;
        let sent = upstream
            .send(&self.call.upstream, std::slice::from_ref(header), self.remaining().min(upstream.timeout()))
            .await;
        self.state.metrics.upstream_seconds.with_label_values(&["paid"]).observe(started.elapsed().as_secs_f64());
        self.fault(Point::PaidAnswered).await;
        Ok(sent)
    }

    /// Turns the answer to a paid request (or its absence) into an outcome.
    pub(super) async fn finish<S: Scheme>(&self, s: &S, attempt: &Attempt<S::Signed>, sent: Sent) -> Outcome {
        match sent {
            Err(e) => self.lost_answer(s, attempt, &e).await,
            Ok(resp) => match s.classify(&resp) {
                Answer::Refused => self.refused_after_paying(s, attempt, resp).await,
                Answer::SettlementClaim => s.settlement_claim(self, attempt, resp).await,
                Answer::Served => self.answered(s, attempt, resp).await,
            },
        }
    }

    /// Adds a payment that just became spent (`settled`, `settled_response_lost`) to
    /// `x402_router_paid_amount_total{network, asset}`: what the chain shows was charged, else
    /// the signed amount. Other statuses add nothing.
    pub(super) fn count_paid<S: Scheme>(
        &self,
        s: &S,
        signed: &S::Signed,
        status: PaymentStatus,
        charged: Option<U256>,
    ) {
        if status.is_spent() {
            let (network, asset, amount) = s.paid(signed, charged);
            self.state.metrics.count_paid(&network, &asset, amount);
        }
    }

    /// The envelope's `payment` object and the intent's final state for `attempt`.
    pub(super) fn note<S: Scheme>(
        &self,
        s: &S,
        p: Parts<'_, S::Signed>,
        (status, tx, charged): (PaymentStatus, Option<String>, Option<U256>),
        (error, recovery): (Option<String>, Option<RecoveryNote>),
    ) -> PaymentNote {
        let shown = s
            .view(p.version, p.nonce, p.signed, (status, tx.as_deref(), charged))
            .recovery(recovery.as_ref().map(|r| r.kind));
        PaymentNote { shown, ledger: Some(Final { id: p.id, status, tx_hash: tx, error, recovery }) }
    }

    /// The upstream refused the paid request. Paid and refused anyway: the money moved and
    /// the call was not served, so it is `settled_response_lost` (visible to recovery), charged
    /// what the chain shows moved.
    async fn refused_after_paying<S: Scheme>(
        &self,
        s: &S,
        attempt: &Attempt<S::Signed>,
        resp: UpstreamResponse,
    ) -> Outcome {
        let reasons = x402::wire::refusal_reasons(&resp.headers, &resp.body);
        let (status, landed) = match s.landed(self, attempt).await {
            Ok(Some(landed)) => (PaymentStatus::SettledResponseLost, landed),
            Ok(None) => (PaymentStatus::Rejected, Landed::default()),
            Err(_) => (PaymentStatus::Unknown, Landed::default()),
        };
        self.count(status.as_str());
        self.count_paid(s, &attempt.signed, status, landed.charged);
        let reason = reasons.error.clone().or(reasons.invalid_reason.clone()).or(reasons.error_reason.clone());
        let own_refusal = s.refusal(&attempt.signed, &reasons).filter(|_| status == PaymentStatus::Rejected);
        let code = match (status, &own_refusal) {
            (PaymentStatus::Rejected, Some((code, _))) => *code,
            (PaymentStatus::Rejected, None) => Code::PaymentRejected,
            (PaymentStatus::SettledResponseLost, _) => Code::SettledResponseLost,
            _ => Code::PaymentUnknown,
        };
        let msg = own_refusal.map_or_else(
            || format!("upstream rejected the payment: {}", reason.as_deref().unwrap_or("no reason given")),
            |(_, msg)| msg,
        );
        let payment = self.note(s, attempt.parts(), (status, landed.tx, landed.charged), (reason, None));
        // The facilitator's reasons, unchanged, beside our own message.
        Outcome::Failed(
            Failure::new(code, msg)
                .upstream(resp)
                .payment(Some(payment))
                .reason("invalidReason", reasons.invalid_reason)
                .reason("errorReason", reasons.error_reason),
        )
    }

    /// The paid request was answered: the chain confirms the settlement (or says it did not).
    async fn answered<S: Scheme>(&self, s: &S, attempt: &Attempt<S::Signed>, resp: UpstreamResponse) -> Outcome {
        let claim = x402::wire::parse_settlement(&resp.headers).ok().flatten();
        let claimed = claim.as_ref().is_some_and(|c| c.success);
        self.fault(Point::BeforeConfirm).await;
        // The answer has arrived: it is recorded whatever the clock says; a settlement that
        // cannot be confirmed by the deadline is recorded `unknown` for `reconcile`.
        let c = s.confirm(self, attempt, claim.as_ref()).await;
        self.count(c.status.as_str());
        self.count_paid(s, &attempt.signed, c.status, c.charged);
        tracing::info!(agent_id = %self.own.agent_id, payment.status = c.status.as_str(), upstream.status = resp.status,
            "paid request answered");
        let error = c.note.or_else(|| claim.as_ref().filter(|_| !claimed).and_then(|c| c.error_reason.clone()));
        let mut payment = self.note(s, attempt.parts(), (c.status, c.tx, c.charged), (error, None));
        payment.shown = payment.shown.claimed_amount(c.claimed_amount);
        Outcome::Answered { resp, payment: Some(payment) }
    }

    /// The paid request got no answer: whether money moved is the chain's to say. Landed: the
    /// answer was lost in transit (a dropped connection, a timeout), and, while the route
    /// deadline allows, recovery asks an upstream that advertised `payment-identifier` for it
    /// again (byte-identical re-send; it cannot sign).
    async fn lost_answer<S: Scheme>(&self, s: &S, attempt: &Attempt<S::Signed>, e: &UpstreamError) -> Outcome {
        let (status, landed) = match s.landed(self, attempt).await {
            Ok(Some(landed)) => (PaymentStatus::SettledResponseLost, landed),
            // Not (yet) seen: the upstream may still make it move, until it expires.
            _ => (PaymentStatus::Unknown, Landed::default()),
        };
        let mut recorded = None;
        // A call cut by the route deadline itself has no time left: `reconcile` tries later.
        let time_left = self.remaining() >= MIN_RECOVERY_TIME;
        if status == PaymentStatus::SettledResponseLost && self.state.config.recover_lost_answers && time_left {
            match self.recover_within(s, attempt, &landed).await {
                Ok(answered) => return answered,
                Err(tried) => recorded = tried,
            }
        }
        self.count(status.as_str());
        self.count_paid(s, &attempt.signed, status, landed.charged);
        let msg = match status {
            PaymentStatus::SettledResponseLost => {
                format!("{e}; the payment settled on-chain but the response was lost")
            }
            _ => format!("{e}; the payment was not seen on-chain ({})", s.unseen()),
        };
        let code =
            if status == PaymentStatus::SettledResponseLost { Code::SettledResponseLost } else { Code::PaymentUnknown };
        let payment =
            self.note(s, attempt.parts(), (status, landed.tx, landed.charged), (Some(e.to_string()), recorded));
        Outcome::Failed(Failure::new(code, msg).timeout(matches!(e, UpstreamError::Timeout)).payment(Some(payment)))
    }

    /// Recovers, within the call, the answer to a payment that landed while its answer was
    /// lost: the answered outcome, or what was tried (None: nothing could be).
    async fn recover_within<S: Scheme>(
        &self,
        s: &S,
        attempt: &Attempt<S::Signed>,
        landed: &Landed,
    ) -> Result<Outcome, Option<RecoveryNote>> {
        let intent = self.earlier_intent().await.ok().flatten().filter(crate::recovery::can_resend).ok_or(None)?;
        let chains = Chains::of(self.state);
        let proof = s.proof(&chains, &attempt.signed).ok_or(None)?;
        let opened = crate::secrets::intent::open(&self.state.config.secrets.keyring, &intent);
        let recovery = crate::recovery::recover(&self.state.upstream, proof, (&intent, &opened), self.deadline).await;
        let kind = recovery.kind();
        self.state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
        let note = RecoveryNote { kind, log: recovery.log };
        let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending else {
            return Err(Some(note));
        };
        self.count("recovered");
        self.count_paid(s, &attempt.signed, PaymentStatus::Settled, landed.charged);
        tracing::info!(agent_id = %self.own.agent_id, upstream.status = resp.status, sends = recovery.sends,
            "the answer to a settled payment, lost in transit, was recovered by a byte-identical re-send");
        let payment =
            self.note(s, attempt.parts(), (PaymentStatus::Settled, Some(tx_hash), landed.charged), (None, Some(note)));
        Ok(Outcome::Answered { resp, payment: Some(payment) })
    }
}
