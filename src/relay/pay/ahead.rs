//! Paying ahead on known terms ([`crate::upstream::known_terms`]): the call's first request already carries
//! the payment, saving the unpaid probe. A `402` to it with other terms is paid once more only
//! when the scheme can sign them with the **same nonce** (`Scheme::sign_changed_terms`: the
//! same nonce domain), so the chain lets at most one of the two authorizations move money; the
//! intent reserves the larger amount until the chain shows which one did.
//!
//! Anything that stops a payment ahead before it is sent (terms the agent may not pay now, a
//! refusal by a limit, an unreadable chain) falls back to the ordinary path: probe unpaid,
//! then pay what the live `402` asks.

use reqwest::StatusCode;

use super::call::PaidCall;
use super::exchange::Sent;
use super::scheme::{Attempt, Scheme, Signing};
use super::{Resume, log_signed};
use crate::payments::Final;
use crate::payments::store::PaymentRow;
use crate::relay::{Error, Outcome};
use crate::upstream::UpstreamResponse;
use crate::x402::{self, PaymentRequired};

impl PaidCall<'_> {
    /// Pays `required` (known terms) with the first request. `None`: nothing was signed or
    /// sent; the caller probes unpaid instead.
    ///
    /// # Errors
    /// [`Error`] when nothing may be recorded (database gone, lease lost).
    pub async fn pay_ahead(&self, required: &PaymentRequired) -> Result<Option<Outcome>, Error> {
        super::registry::pay_ahead(self, required).await
    }

    /// [`Self::pay_ahead`] with scheme `s`, its choice and its prepared reads, and the intent
    /// this request recorded earlier, if any (resumed instead: never a second payment).
    ///
    /// # Errors
    /// As [`Self::pay_ahead`].
    pub(super) async fn pay_ahead_with<S: Scheme>(
        &self,
        s: &S,
        (required, choice, prepared): (&PaymentRequired, &S::Choice, S::Prepared),
        existing: Option<PaymentRow>,
    ) -> Result<Option<Outcome>, Error> {
        if let Some(intent) = existing {
            crate::relay::make_durable(self.state, self.own).await?;
            return self.resume(intent, Resume::KeyReused).await.map(Some);
        }
        if self.has_threshold().await? {
            return Ok(None);
        }
        let Ok(signing) = s.sign(self, required, choice, prepared).await? else {
            return Ok(None);
        };
        if self.reserve(&signing).await?.is_some() {
            // Refused by a limit: this signature was never stored nor sent; the live 402 decides.
            return Ok(None);
        }
        self.count("paid_ahead");
        log_signed(self, &signing, "payment signed on known terms and recorded; sending it with the first request");
        let first = &signing.attempt;
        let sent = self.send(&first.header).await?;
        Ok(Some(match sent {
            Ok(resp) if s.reprices(&resp) => match self.repriced(s, (required, choice, &signing), &resp).await? {
                Some((second, unproven)) => {
                    let outcome = self.exchange(s, &second).await?;
                    if unproven {
                        self.prove_charge(s, &second, &outcome).await;
                    }
                    outcome
                }
                None => self.finish(s, first, Ok(resp)).await,
            },
            sent => self.finish_ahead(s, first, sent).await,
        }))
    }

    /// An answer to a payment ahead that is not a refusal. Without any settlement claim the
    /// upstream may have stopped charging (it now holds an authorization it did not ask for,
    /// reserved until the chain decides): the next call probes first. So does one after a
    /// failure.
    async fn finish_ahead<S: Scheme>(&self, s: &S, first: &Attempt<S::Signed>, sent: Sent) -> Outcome {
        let claims = matches!(&sent, Ok(r) if r.status < 500 && x402::wire::parse_settlement(&r.headers).ok().flatten().is_some());
        if !claims {
            self.state.terms.forget(self.terms);
        }
        self.finish(s, first, sent).await
    }

    /// The upstream's `402` to a payment ahead: the terms it asks now, signed with the same
    /// nonce and recorded, when the scheme can and the agent's limits allow the larger amount;
    /// with whether the amounts differ (the charge is then unproven until the chain shows it).
    /// `None`: it is a refusal of the payment (answered as such, the first authorization kept
    /// reserved).
    async fn repriced<S: Scheme>(
        &self,
        s: &S,
        (required, choice, paid): (&PaymentRequired, &S::Choice, &Signing<S::Signed>),
        resp: &UpstreamResponse,
    ) -> Result<Option<(Attempt<S::Signed>, bool)>, Error> {
        let Ok(asked) = x402::wire::parse_payment_required(StatusCode::PAYMENT_REQUIRED, &resp.headers, &resp.body)
        else {
            self.state.terms.forget(self.terms);
            return Ok(None);
        };
        self.state.terms.put(self.terms.clone(), &asked, &resp.headers);
        let Ok(chosen) = s.choose(self, &asked).await? else {
            return Ok(None);
        };
        let Some(second) = s.sign_changed_terms(self, (required, choice, &paid.attempt), (&asked, &chosen)).await?
        else {
            return Ok(None);
        };
        let first_amount = s.amount(choice);
        if !self.record_repriced(&second, first_amount).await? {
            return Ok(None);
        }
        self.count("repriced");
        tracing::info!(agent_id = %self.own.agent_id, payment.amount = %second.columns.amount, first.amount = %first_amount,
            "the upstream asked other terms than known: signed again with the same nonce");
        let differ = second.columns.amount != first_amount;
        Ok(Some((second.attempt, differ)))
    }

    /// After a repriced payment was found spent: lowers the reservation of the larger amount to
    /// what the settling transaction moved out of the wallet (left to `reconcile` when it
    /// cannot be read now; the larger amount stays charged meanwhile, never less).
    async fn prove_charge<S: Scheme>(&self, s: &S, second: &Attempt<S::Signed>, outcome: &Outcome) {
        let Some(Final { status, tx_hash: Some(tx), .. }) = outcome.payment().and_then(|p| p.ledger.as_ref()) else {
            return;
        };
        if !status.is_spent() {
            return;
        }
        if let Some(moved) = s.moved_by(self, &second.signed, tx).await {
            super::reserve::record_charge(self.state, self.own.agent_id, second.id, moved).await;
        }
    }
}
