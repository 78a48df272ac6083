//! The EVM scheme: x402 `exact` by EIP-3009 `transferWithAuthorization`, `exact` through
//! Permit2, and `upto` (Permit2), on any configured `eip155:` network.
//!
//! At most once, on the chain: the request's nonces are deterministic (agent, key, request
//! hash), so every signature ever made for a request carries the same nonce and the token (or
//! Permit2) accepts one of them; before signing, every configured token and Permit2 is asked
//! ([`sign::check_nonces`], started beside the choice). A recorded authorization is resent
//! while it is valid and signed again (same nonce) only once its `validBefore` has passed
//! unused. The upstream's settlement claim is believed only as far as the chain proves it
//! ([`confirm`], [`settled`]); a 402 carrying a claim (`settlement_pending`) is watched on the
//! chain ([`pending`]); a 412 for a Permit2 allowance names the operator's command
//! ([`allowance`]), unless the upstream offered gas sponsoring and the permit travels with the
//! payment ([`sponsor`]).

mod allowance;
mod confirm;
mod index;
mod pending;
mod reprice;
mod select;
mod settled;
mod sign;
mod sponsor;

use alloy::primitives::{Address, B256, U256};

use crate::clock::now_unix;
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::sealed::Exact;
use crate::payments::{PaymentStatus, Spend};
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{
    Answer, Attempt, Chains, Confirmed, Fate, Landed, Recorded, Resigned, RowRef, Scheme, Signing, Unread, Verdict,
};
use crate::relay::pay::{Declined, Stop, to_i64, wrong_chain};
use crate::relay::view::{DecodeError, PaymentView, stored_version};
use crate::relay::{Error, Outcome};
use crate::upstream::UpstreamResponse;
use crate::x402::{self, PaymentRequired, Requirement, SettlementResponse, SignedPayment, X402Version};

pub(crate) use self::sign::NonceCheck;

/// A stored authorization with less validity left than this is re-signed, not resent
/// (the official facilitator wants `validBefore ≥ now + 6 s`).
const MIN_VALIDITY_SECS: u64 = 30;

/// The EVM scheme (stateless: everything it reads comes with the call).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Evm;

impl Scheme for Evm {
    type Signed = SignedPayment;
    type Choice = Requirement;
    type Prepared = NonceCheck;

    fn offered(&self, _: &PaidCall<'_>, _: &PaymentRequired) -> bool {
        // The router's default scheme: it answers for every 402 (a decline names why).
        true
    }

    async fn prepare(&self, pc: &PaidCall<'_>) -> NonceCheck {
        sign::check_nonces(pc).await
    }

    async fn choose(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
    ) -> Result<Result<Requirement, Declined>, Error> {
        select::choose(pc, required).await
    }

    async fn sign(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
        choice: &Requirement,
        prepared: NonceCheck,
    ) -> Result<Result<Signing<SignedPayment>, Stop>, Error> {
        sign::sign_new(pc, (required, choice), prepared).await
    }

    fn pays_ahead(&self) -> bool {
        true
    }

    async fn sign_changed_terms(
        &self,
        pc: &PaidCall<'_>,
        first: (&PaymentRequired, &Requirement, &Attempt<SignedPayment>),
        asked: (&PaymentRequired, &Requirement),
    ) -> Result<Option<Signing<SignedPayment>>, Error> {
        reprice::sign_changed_terms(pc, first, asked).await
    }

    fn amount(&self, choice: &Requirement) -> Amount {
        choice.amount()
    }

    fn terms(&self, choice: &Requirement) -> crate::approvals::Terms {
        crate::approvals::Terms {
            network: choice.network().caip2(),
            asset: choice.asset().to_checksum(None),
            amount: choice.amount(),
            pay_to: choice.pay_to().to_checksum(None),
        }
    }

    fn decode(&self, row: RowRef<'_>) -> Result<Recorded<SignedPayment>, DecodeError> {
        let signed = crate::relay::view::decode_authorization(row.authorization)?;
        let version = stored_version(row.x402_version)?;
        Ok(Recorded { id: row.id, version, nonce: signed.nonce().to_string(), signed })
    }

    fn still_payable(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<SignedPayment>,
        exact: &Exact,
        spend: &Spend,
    ) -> Result<Option<Declined>, Error> {
        let requirement = stored_requirement(recorded.version, exact)?;
        Ok(select::still_payable(pc, &requirement, spend))
    }

    async fn sign_again(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<SignedPayment>,
        exact: &Exact,
    ) -> Result<Resigned<SignedPayment>, Error> {
        let requirement = stored_requirement(recorded.version, exact)?;
        let context = exact.context().map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
        let nonce = recorded.signed.nonce();
        // The recorded permit (if any) died with the recorded authorization (same deadline,
        // now passed): the chain is read afresh; the token's nonce is still the old permit's
        // only if that one was never used.
        let advertised: Option<serde_json::Value> =
            exact.advertised_extensions.as_deref().and_then(|b| serde_json::from_slice(b).ok());
        let sponsor = match sponsor::plan(pc.state, advertised.as_ref(), &requirement).await? {
            Ok(sponsor) => sponsor,
            Err(_) => {
                return Err(Error::PaymentNetworkUnavailable(
                    "the Permit2 allowance of an expired payment cannot be read to sign it again; nothing was signed; \
                     retry later",
                ));
            }
        };
        let attempt = sign::sign(pc.state, recorded.version, &requirement, &context, nonce, &sponsor)
            .map_err(Error::invariant)?;
        let attempt = Attempt { id: recorded.id, ..attempt };
        let (valid_after, valid_before) = (to_i64(attempt.signed.valid_after()), to_i64(attempt.signed.valid_before()));
        Ok(Resigned { attempt, amount: requirement.amount(), valid_after, valid_before })
    }

    async fn landed(&self, pc: &PaidCall<'_>, attempt: &Attempt<SignedPayment>) -> Result<Option<Landed>, Unread> {
        if let Some(landed) = indexed(pc, attempt.id, &attempt.signed).await {
            return Ok(Some(landed));
        }
        match confirm::chain_used(pc.state, &attempt.signed).await {
            Ok(true) => Ok(Some(prove(pc, attempt.id, &attempt.signed).await)),
            Ok(false) => Ok(None),
            Err(e) => Err(Unread::of(e)),
        }
    }

    async fn fate(&self, pc: &PaidCall<'_>, recorded: &Recorded<SignedPayment>) -> Result<Fate, Error> {
        if let Some(landed) = indexed(pc, recorded.id, &recorded.signed).await {
            return Ok(Fate::Landed(landed));
        }
        let used = match confirm::chain_used(pc.state, &recorded.signed).await {
            Ok(used) => used,
            Err(x402::ChainError::ChainIdMismatch { .. }) => return Err(wrong_chain()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot check a resumed payment on-chain; deferring");
                return Err(Error::Unavailable(
                    "the payment network cannot be read to check an earlier payment; retry later",
                ));
            }
        };
        if used {
            return Ok(Fate::Landed(prove(pc, recorded.id, &recorded.signed).await));
        }
        let (now, valid_before) = (now_unix(), recorded.signed.valid_before());
        Ok(if now < valid_before && now.saturating_add(MIN_VALIDITY_SECS) >= valid_before {
            // Too little validity left to resend, but the earlier authorization may still
            // settle (e.g. a `settlement_pending` transaction): nothing is signed until its
            // validBefore has passed unused (the same nonce would make a second transfer
            // impossible anyway).
            Fate::Wait(
                "an earlier authorization of this call may still settle until its validBefore; nothing was signed; \
                 retry the same key later",
            )
        } else if recorded.signed.is_valid_at(now, MIN_VALIDITY_SECS) {
            Fate::Live
        } else {
            Fate::Dead
        })
    }

    async fn confirm(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<SignedPayment>,
        claim: Option<&SettlementResponse>,
    ) -> Confirmed {
        let (status, tx, note, charged) =
            confirm::confirm(pc.state, (pc.own.agent_id, attempt.id), &attempt.signed, claim, pc.deadline).await;
        // upto: the upstream's word, beside what the chain shows (`amount`).
        let claimed_amount = claim.and_then(|c| c.amount).map(|a| a.to_string());
        Confirmed { status, tx, note, charged, claimed_amount }
    }

    fn proof<'a>(&self, chains: &Chains<'a>, _: &'a SignedPayment) -> Option<crate::recovery::Proof<'a>> {
        Some(crate::recovery::Proof::Evm(chains.evm))
    }

    async fn verdict(&self, chains: &Chains<'_>, row: RowRef<'_>) -> Result<Verdict, Unread> {
        let signed = checked_record(row)?;
        Ok(if signed.used_on(chains.evm).await.map_err(Unread::of)? { Verdict::Used } else { Verdict::Unused })
    }

    async fn proven_charge(&self, chains: &Chains<'_>, row: RowRef<'_>) -> Result<Option<Amount>, Unread> {
        let signed = crate::relay::view::decode_authorization(row.authorization).map_err(Unread::of)?;
        Ok(settled::proven_charge(chains.evm, &signed, row.id).await)
    }

    async fn moved_by(&self, pc: &PaidCall<'_>, s: &SignedPayment, tx: &str) -> Option<U256> {
        let tx: B256 = tx.parse().ok()?;
        pc.state.chain.transferred_from(s.network(), s.asset(), s.payer(), tx).await.ok().flatten()
    }

    fn classify(&self, resp: &UpstreamResponse) -> Answer {
        if (resp.status == 402 && !pending::claims_settlement(resp)) || allowance::needs_permit2(resp) {
            Answer::Refused
        } else if resp.status == 402 {
            // A 402 carrying a settlement claim is no refusal: the money may still move.
            Answer::SettlementClaim
        } else {
            Answer::Served
        }
    }

    fn refusal(&self, signed: &SignedPayment, reasons: &x402::RefusalReasons) -> Option<(Code, String)> {
        reasons
            .names(x402::wire::PERMIT2_ALLOWANCE_REQUIRED)
            .then(|| (Code::Permit2AllowanceRequired, allowance::message(signed)))
    }

    async fn settlement_claim(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<SignedPayment>,
        resp: UpstreamResponse,
    ) -> Outcome {
        pending::unanswered(pc, attempt, resp).await
    }

    fn unseen(&self) -> &'static str {
        "the signed authorization stays valid until it expires"
    }

    fn reaccesses(&self) -> bool {
        true
    }

    fn view(
        &self,
        version: X402Version,
        _: &str,
        signed: &SignedPayment,
        (status, tx, charged): (PaymentStatus, Option<&str>, Option<U256>),
    ) -> PaymentView {
        PaymentView::of(version, signed, status, tx).charged(charged)
    }

    fn paid(&self, signed: &SignedPayment, charged: Option<U256>) -> (String, String, U256) {
        let amount = charged.filter(|_| signed.is_upto()).unwrap_or_else(|| signed.amount());
        (signed.network().caip2(), signed.asset().to_checksum(None), amount)
    }
}

/// A recorded payment the chain index has seen used, with its transaction (an `upto` charge is
/// still proven from the chain, which lowers the reservation). `None`: read the chain — also
/// when the index says "unused": a payment that was recorded has left, or was about to, and its
/// log may be on its way to the index; a takeover is rare, one read is cheap beside a wrong
/// answer (docs/DESIGN.md §6, "What the chain proves, and when").
async fn indexed(pc: &PaidCall<'_>, id: uuid::Uuid, signed: &SignedPayment) -> Option<Landed> {
    match index::of(pc.state, signed) {
        x402::chain::watch::Seen::Unknown | x402::chain::watch::Seen::Unused => None,
        x402::chain::watch::Seen::Used(_) if signed.is_upto() => Some(prove(pc, id, signed).await),
        x402::chain::watch::Seen::Used(used) => Some(Landed { tx: Some(used.tx.to_string()), charged: None }),
    }
}

/// The proof of a used authorization: its transaction, and (upto) what moved, which lowers
/// the reservation.
async fn prove(pc: &PaidCall<'_>, id: uuid::Uuid, signed: &SignedPayment) -> Landed {
    let proven = settled::prove(pc.state, pc.own.agent_id, id, signed, None).await;
    Landed { tx: proven.tx_hash.map(|h| h.to_string()), charged: proven.charged }
}

/// The requirement a recorded payment was signed for (its exact copy, sealed).
fn stored_requirement(version: X402Version, exact: &Exact) -> Result<Requirement, Error> {
    let raw = exact.requirement().map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))?;
    Requirement::from_json(version, 0, &raw)
        .map_err(|e| Error::invariant(format!("stored requirement unreadable: {e}")))
}

/// The row's signed record, checked against its columns (a record that disagrees with the row
/// it is stored in is not trusted).
fn checked_record(row: RowRef<'_>) -> Result<SignedPayment, Unread> {
    use std::str::FromStr;
    let signed = crate::relay::view::decode_authorization(row.authorization).map_err(Unread::of)?;
    let field = |name: &str, e: &dyn std::fmt::Display| Unread(format!("{name}: {e}"));
    let network = x402::Network::parse(row.network).map_err(|e| field("network", &e))?;
    let asset = Address::from_str(row.asset).map_err(|e| field("asset", &e))?;
    let payer = Address::from_str(row.payer).map_err(|e| field("payer", &e))?;
    let nonce = B256::from_str(row.nonce).map_err(|e| field("nonce", &e))?;
    if (signed.network(), signed.asset(), signed.payer(), signed.nonce()) != (network, asset, payer, nonce) {
        return Err(Unread("stored authorization disagrees with its row".into()));
    }
    Ok(signed)
}
