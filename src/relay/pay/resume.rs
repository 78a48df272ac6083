//! Picking up a recorded intent of this request: a takeover after a crash, or the same request
//! re-sent under a key that expired. The chain decides first (landed ⇒ never pay again).

use reqwest::header::{HeaderName, HeaderValue};
use serde_json::Value;

use super::call::PaidCall;
use super::scheme::{Fate, Landed, Parts, Recorded, RowRef, Scheme};
use super::{Resume, declined, not_resumable, refused};
use crate::codes::Code;
use crate::faults::Point;
use crate::payments::sealed::Opened;
use crate::payments::store::PaymentRow;
use crate::payments::{PaymentStatus, RecoveryKind, RecoveryNote, RecoveryStep};
use crate::relay::{Error, Failure, Outcome};
use crate::upstream::UpstreamResponse;

impl PaidCall<'_> {
    /// Resumes the recorded intent of this request with its scheme.
    ///
    /// # Errors
    /// [`Error`] (503) when the chain cannot be read: nothing is decided or paid, the key stays
    /// in flight for a later retry.
    pub async fn resume(&self, row: PaymentRow, mode: Resume) -> Result<Outcome, Error> {
        super::registry::resume(self, row, mode).await
    }

    /// Resumes `row` with `s`. The chain decides first: landed ⇒ never pay again; still valid
    /// ⇒ resend the same signed payload; can never land ⇒ sign again with the same nonce. Before
    /// anything is sent or signed, the agent (enabled), its current cap and the configured
    /// networks and assets are checked again.
    ///
    /// # Errors
    /// As [`Self::resume`].
    pub(super) async fn resume_with<S: Scheme>(&self, s: &S, row: PaymentRow, mode: Resume) -> Result<Outcome, Error> {
        let recorded = s.decode(RowRef::of(&row)).map_err(|e| Error::invariant(e.to_string()))?;
        self.fault(Point::ResumeStart).await;
        let fate = s.fate(self, &recorded).await?;
        // The request as sent and the exact terms, opened once (sealed in the ledger).
        let opened = crate::secrets::intent::open(&self.state.config.secrets.keyring, &row);
        match fate {
            Fate::Landed(landed) => self.paid_before(s, (&row, &opened), &recorded, landed, mode).await,
            fate => self.send_again(s, (&row, &opened), &recorded, fate).await,
        }
    }

    /// The recorded payment is unused: resend it while it stays valid, or sign it again with
    /// the same nonce once it can never land, after checking the agent and the configuration
    /// still allow it.
    async fn send_again<S: Scheme>(
        &self,
        s: &S,
        (row, opened): (&PaymentRow, &Opened),
        recorded: &Recorded<S::Signed>,
        fate: Fate,
    ) -> Result<Outcome, Error> {
        // The exact copies that were signed (sealed; the JSONB columns are redacted copies).
        let exact = match opened.exact() {
            Ok(exact) => exact,
            Err(why) => return Ok(not_resumable(&why)),
        };
        let accepts = || Value::Array(vec![exact.requirement().unwrap_or_else(|_| row.requirement.clone())]);
        let spend = match self.live_agent().await? {
            Ok(spend) => spend,
            Err((code, why)) => return Ok(declined(self.state, code, None, &why, accepts())),
        };
        if let Some((code, why)) = s.still_payable(self, recorded, exact, &spend)? {
            return Ok(declined(self.state, code, None, &why, accepts()));
        }
        // A payTo blocked (or taken off the allowlist) since: nothing more is sent or signed to it.
        if let Some(why) = crate::payments::limits::pay_to_refusal(&spend, &row.pay_to) {
            return Ok(declined(self.state, Code::PaymentNotAllowed, None, &why, accepts()));
        }
        let attempt = match fate {
            Fate::Landed(_) => return Err(Error::invariant("a landed payment is never sent again")),
            Fate::Wait(why) => {
                tracing::info!(agent_id = %self.own.agent_id, "an earlier payment may still land; deferring");
                return Err(Error::PaymentNetworkUnavailable(why));
            }
            Fate::Live => {
                let name = HeaderName::from_bytes(row.header_name.as_bytes()).map_err(|e| Error::Internal(e.into()))?;
                let value = HeaderValue::from_str(&exact.header_value).map_err(|e| Error::Internal(e.into()))?;
                tracing::info!(agent_id = %self.own.agent_id,
                    "resending the unused, still valid payment of an abandoned attempt (it moves money at most once)");
                recorded.attempt((name, value))
            }
            Fate::Dead => {
                let resigned = s.sign_again(self, recorded, exact).await?;
                if let Some(refusal) = self.resign((row, exact), &resigned).await? {
                    // An intent that can never land and released its budget, which a limit
                    // refuses now (or payments are paused). Nothing was sent in this attempt.
                    return refused(self.state, refusal, None, accepts());
                }
                tracing::info!(agent_id = %self.own.agent_id, "re-signed an unused payment that can never land, with the same nonce");
                resigned.attempt
            }
        };
        self.exchange(s, &attempt).await
    }

    /// The recorded payment landed: never pay again. A reused key points at the earlier receipt
    /// (or re-accesses an answer never served); a takeover tries to get the lost answer back
    /// (recovery, then sign-in re-access) and is otherwise settled, response lost.
    async fn paid_before<S: Scheme>(
        &self,
        s: &S,
        (row, opened): (&PaymentRow, &Opened),
        recorded: &Recorded<S::Signed>,
        landed: Landed,
        mode: Resume,
    ) -> Result<Outcome, Error> {
        let tx_hash = landed.tx.or(row.tx_hash.clone());
        let attempt = |status| (status, tx_hash.clone(), landed.charged);
        if mode == Resume::KeyReused {
            return self.key_reused(s, (row, opened), recorded, attempt(row.status)).await;
        }
        // Paid, and the answer was lost: try to get it back without paying again
        // (crate::recovery cannot sign; it re-sends the stored bytes or nothing).
        let chains = super::scheme::Chains::of(self.state);
        let recovery = match s.proof(&chains, &recorded.signed) {
            Some(proof) if self.state.config.recover_lost_answers => {
                crate::recovery::recover(&self.state.upstream, proof, (row, opened), self.deadline).await
            }
            Some(_) => crate::recovery::Recovery::skipped("recovery is disabled (RECOVER_LOST_ANSWERS=false)"),
            None => crate::recovery::Recovery::skipped("no RPC URL for the payment's network"),
        };
        let kind = recovery.kind();
        let note = RecoveryNote { kind, log: recovery.log };
        let a = recorded.parts();
        if let crate::recovery::Ending::Recovered { resp, tx_hash } = recovery.ending {
            self.state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
            self.count("recovered");
            tracing::info!(agent_id = %self.own.agent_id, upstream.status = resp.status, sends = recovery.sends,
                "the upstream's answer to a settled payment was recovered by a byte-identical re-send");
            self.count_paid(s, a.signed, PaymentStatus::Settled, landed.charged);
            let payment = self.note(s, a, (PaymentStatus::Settled, Some(tx_hash), landed.charged), (None, Some(note)));
            return Ok(Outcome::Answered { resp, payment: Some(payment) });
        }
        // Nothing came back: for a GET/HEAD whose 402 advertised sign-in-with-x, sign in as the
        // payer and run the request again (a new execution, never a payment).
        let mut log = note.log;
        if s.reaccesses() {
            let again = crate::relay::reaccess::reaccess(self.state, self.own, (row, opened), self.deadline).await?;
            log.extend(again.log);
            if let Some(resp) = again.answer {
                return Ok(self.reaccessed(s, a, tx_hash, resp, log));
            }
        }
        self.state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
        self.count("settled_response_lost");
        self.count_paid(s, a.signed, PaymentStatus::SettledResponseLost, landed.charged);
        tracing::warn!(agent_id = %self.own.agent_id, sends = recovery.sends,
            "resumed key was already paid on-chain and its answer could not be recovered: settled, response lost");
        let note = RecoveryNote { kind, log };
        let payment = self.note(s, a, attempt(PaymentStatus::SettledResponseLost), (None, Some(note)));
        let msg = "payment settled on-chain but the upstream's response was lost; the router will not pay again";
        Ok(Outcome::Failed(Failure::new(Code::SettledResponseLost, msg).payment(Some(payment))))
    }

    /// Paid before the key expired. If that call was never served (its answer lost), a sign-in
    /// may still re-access what was paid for; a served one is never re-run.
    async fn key_reused<S: Scheme>(
        &self,
        s: &S,
        (row, opened): (&PaymentRow, &Opened),
        recorded: &Recorded<S::Signed>,
        (status, tx_hash, charged): (PaymentStatus, Option<String>, Option<alloy::primitives::U256>),
    ) -> Result<Outcome, Error> {
        let unserved = matches!(
            row.status,
            PaymentStatus::SettledResponseLost
                | PaymentStatus::Signed
                | PaymentStatus::Unknown
                | PaymentStatus::Rejected
        );
        let a = recorded.parts();
        if unserved && s.reaccesses() {
            let mut log = RecoveryStep::stored(row.recovery.as_ref());
            let again = crate::relay::reaccess::reaccess(self.state, self.own, (row, opened), self.deadline).await?;
            log.extend(again.log);
            if let Some(resp) = again.answer {
                return Ok(self.reaccessed(s, a, tx_hash, resp, log));
            }
        }
        self.count("already_paid");
        let previous_receipt = {
            let own = self.own;
            crate::receipts::store::latest_for_request(
                &mut *self.db().await?,
                own.agent_id,
                own.key.as_str(),
                &own.request_hash,
            )
            .await?
        };
        let payment = s.view(a.version, a.nonce, a.signed, (status, tx_hash.as_deref(), charged));
        Ok(Outcome::AlreadyPaid { previous_receipt, payment })
    }

    /// A settled payment whose answer was lost, served again by signing in as the payer: a new
    /// execution, recorded as a completed call whose payment says `recovery: "reaccessed"`.
    fn reaccessed<S: Scheme>(
        &self,
        s: &S,
        a: Parts<'_, S::Signed>,
        tx_hash: Option<String>,
        resp: UpstreamResponse,
        log: Vec<RecoveryStep>,
    ) -> Outcome {
        let kind = RecoveryKind::Reaccessed;
        self.state.metrics.recoveries.with_label_values(&[kind.as_str()]).inc();
        self.count(kind.as_str());
        self.count_paid(s, a.signed, PaymentStatus::Settled, None);
        tracing::info!(agent_id = %self.own.agent_id, upstream.status = resp.status,
            "the answer to a settled payment was lost; the resource was re-accessed by signing in as the payer");
        let note = RecoveryNote { kind, log };
        let payment = self.note(s, a, (PaymentStatus::Settled, tx_hash, None), (None, Some(note)));
        Outcome::Answered { resp, payment: Some(payment) }
    }
}
