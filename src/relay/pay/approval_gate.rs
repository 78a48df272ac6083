//! The walk's side of approvals (`crate::approvals`): a payment above the agent's
//! `approval_above` is signed only with an operator's approval of its exact terms.

use super::call::PaidCall;
use crate::approvals::{self, CallRef, Gate, Terms};
use crate::relay::Error;

impl PaidCall<'_> {
    /// Whether a payment of `terms` may be signed now.
    ///
    /// # Errors
    /// [`Error::Held`] when it waits for (or was refused by) an operator, [`Error::KeyReused`]
    /// when the key's approval was asked for another request; database errors.
    pub(super) async fn approved(&self, terms: &Terms) -> Result<(), Error> {
        let shown = self.state.config.secrets.redaction.url(&self.call.upstream.url);
        let call = CallRef {
            agent_id: self.own.agent_id,
            key: self.own.key.as_str(),
            request_hash: &self.call.request_hash,
            shown_url: &shown,
        };
        let threshold = self.threshold().await?;
        let charge = self.charge_of(&terms.network, &terms.asset, terms.amount);
        let ttl = self.state.config.approval_ttl;
        let gate = approvals::gate(&mut *self.db().await?, call, (terms, charge), threshold, ttl).await?;
        match gate {
            Gate::Clear => Ok(()),
            Gate::Held(held) => {
                tracing::info!(
                    agent_id = %self.own.agent_id, approval_id = %held.approval().id,
                    approval.state = held.approval().state.as_str(), "payment held for an operator's approval"
                );
                Err(Error::Held(held))
            }
            Gate::KeyReused => Err(Error::KeyReused),
        }
    }

    /// What `amount` of `asset` on `network` (CAIP-2, as the ledger writes them) counts against
    /// the agent's caps: the amount itself without a budget currency; with one, its budget
    /// units, rounded up (`None`: the asset has no value, or too large).
    pub(super) fn charge_of(
        &self,
        network: &str,
        asset: &str,
        amount: crate::money::Amount,
    ) -> Option<crate::money::Amount> {
        use std::str::FromStr;
        let supported = &self.state.supported;
        if supported.budget_decimals().is_none() {
            return Some(amount);
        }
        let network = crate::x402::Network::from_str(network).ok()?;
        supported.charge(network, alloy::primitives::Address::from_str(asset).ok()?, amount)
    }

    /// Whether the agent has an approval threshold (then no payment is made ahead on known
    /// terms: the live 402's terms pass the gate, and a repriced payment never skips it).
    ///
    /// # Errors
    /// Database errors.
    pub(super) async fn has_threshold(&self) -> Result<bool, Error> {
        Ok(self.threshold().await?.is_some())
    }

    /// The agent's `approval_above`, as the choice read it with the limits (else read now).
    async fn threshold(&self) -> Result<Option<crate::money::Amount>, Error> {
        if let Some(t) = self.seen.threshold() {
            return Ok(t);
        }
        let t = approvals::threshold(&mut *self.db().await?, self.own.agent_id).await?;
        Ok(t)
    }
}
