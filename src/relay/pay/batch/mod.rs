//! The x402 `batch-settlement` scheme (EVM, EIP-3009 deposits): the router deposits into a
//! payment channel once, then pays each request with a cumulative voucher, an EIP-712
//! signature over `(channelId, maxClaimableAmount)` that the server verifies off-chain and
//! claims in batches. Off unless the operator names it in `X402_SCHEMES`.
//!
//! Channels are per (wallet, payTo, network, asset, receiverAuthorizer, withdrawDelay), with
//! lanes (distinct salts, so distinct channels) for parallel calls: a lane carries one voucher
//! in flight at a time (`crate::payments::lanes`). At most once, with vouchers: before a voucher
//! (and the deposit with it) leaves, the intent's transaction reserves the agent's increment
//! and records the lane's new ceiling and voucher ([`Signing::lane`]): never two different
//! vouchers at one ceiling, never a ceiling below one signed; a takeover re-sends the recorded
//! voucher. An answer lost after a voucher left counts as charged until the server's
//! corrective 402 says otherwise, and that 402's `voucherState` is checked (our signature,
//! claimed on-chain ≤ charged ≤ signed) before it is believed: a server that contradicts the
//! router's records stops the lane (an operator event).

mod answer;
pub mod channel;
pub mod close;
mod reprice;
mod sign;
mod terms;

use alloy::primitives::U256;

use crate::codes::Code;
use crate::money::Amount;
use crate::payments::sealed::Exact;
use crate::payments::{PaymentStatus, Spend};
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{
    Answer, Attempt, Chains, Confirmed, Fate, Landed, Recorded, Resigned, RowRef, Scheme, Signing, Unread, Verdict,
};
use crate::relay::pay::{Declined, Stop, agent};
use crate::relay::view::{DecodeError, PaymentView, stored_version};
use crate::relay::{Error, Outcome};
use crate::upstream::UpstreamResponse;
use crate::x402::{PaymentRequired, SettlementResponse, X402Version};
pub(crate) use terms::SignedBatch;
use terms::{BatchTerms, offered};

/// The batch-settlement scheme (its channels are in the ledger's `batch_lanes`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Batch;

impl Batch {
    /// Whether the stored authorization of a ledger row is this scheme's.
    pub fn owns(stored: &serde_json::Value) -> bool {
        SignedBatch::is_one(stored)
    }
}

impl Scheme for Batch {
    type Signed = SignedBatch;
    type Choice = (BatchTerms, serde_json::Value);
    type Prepared = ();

    fn offered(&self, pc: &PaidCall<'_>, required: &PaymentRequired) -> bool {
        pc.state.config.payments.batch.is_some() && !offered(required).is_empty()
    }

    async fn prepare(&self, _: &PaidCall<'_>) {}

    async fn choose(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
    ) -> Result<Result<Self::Choice, Declined>, Error> {
        sign::choose(pc, required).await
    }

    async fn sign(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
        choice: &Self::Choice,
        (): (),
    ) -> Result<Result<Signing<SignedBatch>, Stop>, Error> {
        sign::sign(pc, required, choice).await
    }

    fn pays_ahead(&self) -> bool {
        // A voucher's ceiling is the lane's charged total plus the price, both known before
        // anything is sent: the lane is held and read when it is signed, ahead or not. A server
        // whose state differs answers a corrective 402, checked as on the ordinary path.
        true
    }

    fn reprices(&self, resp: &UpstreamResponse) -> bool {
        // A corrective 402 to a voucher paid ahead may ask a new price (`reprice.rs`).
        resp.status == 402
    }

    async fn sign_changed_terms(
        &self,
        pc: &PaidCall<'_>,
        (_, (first_terms, _), first): (&PaymentRequired, &Self::Choice, &Attempt<SignedBatch>),
        asked: (&PaymentRequired, &Self::Choice),
    ) -> Result<Option<Signing<SignedBatch>>, Error> {
        reprice::sign_changed_terms(pc, (first_terms, first), asked).await
    }

    fn terms(&self, (terms, _): &Self::Choice) -> crate::approvals::Terms {
        // What the agent is charged for this call: one voucher's increment (a channel's
        // deposit is the wallet's money locked, not the agent's spend).
        crate::approvals::Terms {
            network: terms.network.caip2(),
            asset: terms.asset.to_checksum(None),
            amount: terms.amount,
            pay_to: terms.pay_to.to_checksum(None),
        }
    }

    fn amount(&self, (terms, _): &Self::Choice) -> Amount {
        terms.amount
    }

    fn decode(&self, row: RowRef<'_>) -> Result<Recorded<SignedBatch>, DecodeError> {
        let signed: SignedBatch =
            serde_json::from_value(row.authorization.clone()).map_err(|e| DecodeError::Authorization(e.to_string()))?;
        let agrees = signed.network == row.network
            && signed.asset.eq_ignore_ascii_case(row.asset)
            && signed.pay_to.eq_ignore_ascii_case(row.pay_to)
            && signed.payer.eq_ignore_ascii_case(row.payer)
            && SignedBatch::is_one(row.authorization);
        if !agrees {
            return Err(DecodeError::Authorization(
                "the stored batch-settlement voucher disagrees with its row".into(),
            ));
        }
        let version = stored_version(row.x402_version)?;
        Ok(Recorded { id: row.id, version, nonce: row.nonce.to_owned(), signed })
    }

    fn still_payable(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<SignedBatch>,
        _: &Exact,
        spend: &Spend,
    ) -> Result<Option<Declined>, Error> {
        // A recorded voucher is re-sent as recorded (never a new one): only the agent's cap and
        // the operator's opt-in are asked again.
        if pc.state.config.payments.batch.is_none() {
            let why = "batch-settlement is no longer enabled (X402_SCHEMES)".to_owned();
            return Ok(Some((Code::PaymentUnsupported, why)));
        }
        Ok(agent::over_cap(spend, recorded.signed.amount))
    }

    async fn sign_again(
        &self,
        _: &PaidCall<'_>,
        _: &Recorded<SignedBatch>,
        _: &Exact,
    ) -> Result<Resigned<SignedBatch>, Error> {
        // [`Scheme::fate`] is never `Dead`: a voucher is re-sent as recorded, never signed again.
        Err(Error::invariant("a batch-settlement voucher is never signed again"))
    }

    async fn landed(&self, _: &PaidCall<'_>, _: &Attempt<SignedBatch>) -> Result<Option<Landed>, Unread> {
        // What a voucher charged is the server's to say (a corrective 402) until it claims.
        Err(Unread("a voucher's charge is not on the chain until the server claims it".into()))
    }

    async fn fate(&self, _: &PaidCall<'_>, _: &Recorded<SignedBatch>) -> Result<Fate, Error> {
        // The recorded voucher is re-sent, byte for byte: the server charges it once (its
        // ceiling is its charged total plus the price only once), and a corrective 402 says
        // whether it already did.
        Ok(Fate::Live)
    }

    async fn confirm(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<SignedBatch>,
        claim: Option<&SettlementResponse>,
    ) -> Confirmed {
        answer::confirm(pc, attempt, claim).await
    }

    fn proof<'a>(&self, _: &Chains<'a>, _: &'a SignedBatch) -> Option<crate::recovery::Proof<'a>> {
        None
    }

    async fn verdict(&self, _: &Chains<'_>, row: RowRef<'_>) -> Result<Verdict, Unread> {
        self.decode(row).map_err(Unread::of)?;
        // Claimable up to its ceiling until the channel is claimed or closed.
        Ok(Verdict::MayLand)
    }

    fn classify(&self, resp: &UpstreamResponse) -> Answer {
        // Every 402 is read here (a corrective one carries the server's channel state).
        if resp.status == 402 { Answer::SettlementClaim } else { Answer::Served }
    }

    async fn settlement_claim(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<SignedBatch>,
        resp: UpstreamResponse,
    ) -> Outcome {
        answer::refused(pc, attempt, resp).await
    }

    fn unseen(&self) -> &'static str {
        "a voucher is claimable by the server up to its ceiling until the channel is claimed or closed"
    }

    fn reaccesses(&self) -> bool {
        false
    }

    fn view(
        &self,
        version: X402Version,
        nonce: &str,
        s: &SignedBatch,
        (status, tx, _): (PaymentStatus, Option<&str>, Option<U256>),
    ) -> PaymentView {
        let amount = s.amount.to_string();
        PaymentView::batch(version, (&s.network, &s.asset, &s.pay_to, &s.payer), (&amount, nonce), status, tx)
    }

    fn paid(&self, s: &SignedBatch, _: Option<U256>) -> (String, String, U256) {
        (s.network.clone(), s.asset.clone(), s.amount.as_u256())
    }
}
