//! The Solana scheme: x402 `exact` on `solana:` networks, with the chain's own at-most-once
//! rule: a transaction lands at most once, and never after the block height
//! `lastValidBlockHeight` of its blockhash. A request is signed again only when every RPC
//! endpoint of its network, at least two, says its recorded transaction can never land
//! (`SvmEndpoints::fate`): one endpoint's lagging, pruned or lying signature index never makes
//! the router pay twice.
//!
//! The intent's row: `network` (CAIP-2), `asset` (the mint), `pay_to` and `payer` (base58),
//! `nonce` the request's deterministic nonce (stable across re-signings, so one intent per
//! request; also the transaction's memo unless the upstream asks for its own), and the signed
//! transfer ([`SignedSvmTransfer`]: the payer's signature, the blockhash and its last valid
//! height). `valid_before` only bounds the budget window; expiry is the chain's block height.
//!
//! What the chain says, never the upstream: an answer's settlement claim is believed only when
//! the transaction it names carries the payer's signature; otherwise the payer's own
//! transactions are searched (`SvmRpc::find_landed`).

mod sign;

use alloy::primitives::U256;

use crate::chains::solana::Solana;
use crate::clock::now_unix;
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::sealed::Exact;
use crate::payments::{PaymentStatus, Spend};
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{
    Answer, Attempt, Chains, Confirmed, Fate, Landed, Recorded, Resigned, RowRef, Scheme, Signing, Unread, Verdict,
};
use crate::relay::pay::{Declined, SETTLEMENT_POLL_INTERVAL, SETTLEMENT_POLLS, Stop, agent, to_i64, wrong_chain};
use crate::relay::view::{DecodeError, PaymentView, decode_svm_transfer, stored_version};
use crate::relay::{Error, Outcome};
use crate::upstream::UpstreamResponse;
use crate::x402::svm::{SignedSvmTransfer, SvmEndpoints, SvmRpc, SvmRpcError, SvmTerms, TransferState};
use crate::x402::{self, PaymentRequired, SettlementResponse, X402Version};

/// How long after signing a Solana payment counts in the 24-hour budget window at the least
/// (a blockhash lives 150 blocks, about a minute; the chain's block height decides expiry).
const WINDOW_BOUND_SECS: u64 = 300;

/// The Solana scheme (stateless: the router's Solana wallet and endpoints come with the call).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Svm;

/// The router's Solana settings and the primary endpoint of `network`.
fn endpoint<'a>(pc: &PaidCall<'a>, network: &str) -> Result<(&'a Solana, &'a SvmRpc), Error> {
    let solana =
        pc.state.solana.as_deref().ok_or_else(|| Error::invariant("Solana payment without Solana settings"))?;
    let rpc = solana
        .rpcs
        .of(network)
        .map(SvmEndpoints::primary)
        .ok_or_else(|| Error::invariant("a configured Solana network without an endpoint"))?;
    Ok((solana, rpc))
}

impl Scheme for Svm {
    type Signed = SignedSvmTransfer;
    type Choice = (SvmTerms, serde_json::Value);
    type Prepared = ();

    fn offered(&self, pc: &PaidCall<'_>, required: &PaymentRequired) -> bool {
        pc.state.solana.is_some() && !sign::offered(required).is_empty()
    }

    async fn prepare(&self, _: &PaidCall<'_>) {}

    async fn choose(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
    ) -> Result<Result<Self::Choice, Declined>, Error> {
        let solana =
            pc.state.solana.as_deref().ok_or_else(|| Error::invariant("Solana payment without Solana settings"))?;
        sign::choose(pc, solana, required).await
    }

    async fn sign(
        &self,
        pc: &PaidCall<'_>,
        required: &PaymentRequired,
        (terms, raw): &Self::Choice,
        (): (),
    ) -> Result<Result<Signing<SignedSvmTransfer>, Stop>, Error> {
        let (solana, rpc) = endpoint(pc, &terms.network().caip2())?;
        let own = pc.own;
        let nonce =
            x402::deterministic_nonce(&pc.state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
        // `{version, resource, extensions}` (payment-identifier echoed with our own id when
        // advertised, so that a lost answer can be asked for again): what the payload is built from.
        let context = pc.context_of(required)?;
        let attempt = match sign::sign(solana, rpc, terms, &context, nonce.to_string()).await? {
            Ok(attempt) => attempt,
            Err(stop) => return Ok(Err(stop)),
        };
        let exact = pc.exact_of(required, (raw, &context), &attempt.header.1)?;
        let now = now_unix();
        let s = &attempt.signed;
        let columns = crate::relay::pay::scheme::Columns {
            scheme: "exact".to_owned(),
            network: s.network.clone(),
            asset: s.mint.clone(),
            amount: Amount::from(terms.amount()),
            pay_to: s.pay_to.clone(),
            payer: s.payer.clone(),
            valid_after: to_i64(now),
            valid_before: to_i64(now.saturating_add(WINDOW_BOUND_SECS)),
        };
        Ok(Ok(Signing { attempt, columns, exact, lane: None }))
    }

    fn pays_ahead(&self) -> bool {
        // A transaction carries a blockhash that lives about a minute: known terms are probed.
        false
    }

    async fn sign_changed_terms(
        &self,
        _: &PaidCall<'_>,
        _: (&PaymentRequired, &Self::Choice, &Attempt<SignedSvmTransfer>),
        _: (&PaymentRequired, &Self::Choice),
    ) -> Result<Option<Signing<SignedSvmTransfer>>, Error> {
        Ok(None)
    }

    fn amount(&self, (terms, _): &Self::Choice) -> Amount {
        Amount::from(terms.amount())
    }

    fn terms(&self, (terms, _): &Self::Choice) -> crate::approvals::Terms {
        crate::approvals::Terms {
            network: terms.network().caip2(),
            asset: terms.mint().to_string(),
            amount: Amount::from(terms.amount()),
            pay_to: terms.pay_to().to_string(),
        }
    }

    fn decode(&self, row: RowRef<'_>) -> Result<Recorded<SignedSvmTransfer>, DecodeError> {
        let signed = decode_svm_transfer(row.authorization, (row.network, row.asset, row.payer))?;
        if signed.pay_to != row.pay_to {
            return Err(DecodeError::Authorization("the stored Solana transfer disagrees with its row".into()));
        }
        let version = stored_version(row.x402_version)?;
        Ok(Recorded { id: row.id, version, nonce: row.nonce.to_owned(), signed })
    }

    fn still_payable(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<SignedSvmTransfer>,
        _: &Exact,
        spend: &Spend,
    ) -> Result<Option<Declined>, Error> {
        let signed = &recorded.signed;
        let configured = pc.state.solana.as_deref().and_then(|solana| {
            let decimals = x402::svm::SvmNetwork::parse(&signed.network)
                .ok()
                .zip(signed.mint.parse().ok())
                .and_then(|(n, m)| solana.config.decimals(&n, &m));
            sign::in_unit(pc, solana, decimals).then_some(())
        });
        if configured.is_none() {
            let why = format!("asset {} on {} is no longer configured for payments", signed.mint, signed.network);
            return Ok(Some((Code::PaymentUnsupported, why)));
        }
        let amount = Amount::parse(&signed.amount).map_err(|e| Error::invariant(e.to_string()))?;
        Ok(agent::over_cap(spend, amount))
    }

    async fn sign_again(
        &self,
        pc: &PaidCall<'_>,
        recorded: &Recorded<SignedSvmTransfer>,
        exact: &Exact,
    ) -> Result<Resigned<SignedSvmTransfer>, Error> {
        let unreadable = |e: &dyn std::fmt::Display| Error::invariant(format!("stored requirement unreadable: {e}"));
        let (raw, context) = exact.requirement().and_then(|r| Ok((r, exact.context()?))).map_err(|e| unreadable(&e))?;
        let terms = SvmTerms::from_json(recorded.version, &raw).map_err(|e| unreadable(&e))?;
        let (solana, rpc) = endpoint(pc, &recorded.signed.network)?;
        let attempt = match sign::sign(solana, rpc, &terms, &context, recorded.nonce.clone()).await? {
            Ok(a) => Attempt { id: recorded.id, ..a },
            Err(stop) => return Err(Error::Unavailable(stop_reason(&stop))),
        };
        let now = now_unix();
        let (valid_after, valid_before) = (to_i64(now), to_i64(now.saturating_add(WINDOW_BOUND_SECS)));
        Ok(Resigned { attempt, amount: Amount::from(terms.amount()), valid_after, valid_before })
    }

    async fn landed(&self, pc: &PaidCall<'_>, attempt: &Attempt<SignedSvmTransfer>) -> Result<Option<Landed>, Unread> {
        let (_, rpc) = endpoint(pc, &attempt.signed.network).map_err(Unread::of)?;
        match rpc.transfer_state(&attempt.signed).await {
            Ok(TransferState::Settled { tx_id, .. }) => Ok(Some(Landed { tx: Some(tx_id), charged: None })),
            Ok(_) => Ok(None),
            Err(e) => Err(Unread::of(e)),
        }
    }

    async fn fate(&self, pc: &PaidCall<'_>, recorded: &Recorded<SignedSvmTransfer>) -> Result<Fate, Error> {
        let unavailable = Error::PaymentNetworkUnavailable(
            "an earlier Solana payment of this call cannot be checked (its network is not configured or cannot be \
             read); nothing was signed or paid; retry later",
        );
        let Some(endpoints) = pc.state.solana.as_deref().and_then(|s| s.rpcs.of(&recorded.signed.network)) else {
            return Err(unavailable);
        };
        let fate = match endpoints.fate(&recorded.signed).await {
            Ok(fate) => fate,
            Err(SvmRpcError::WrongChain { .. }) => return Err(wrong_chain()),
            Err(e @ (SvmRpcError::NoSecondOpinion | SvmRpcError::Disagreement | SvmRpcError::HistoryPruned { .. })) => {
                tracing::warn!(error = %e, "a resumed Solana payment may never land, but that is not confirmed; nothing is signed again");
                return Err(Error::PaymentNetworkUnavailable(
                    "an earlier Solana payment of this call may never land, but not every RPC endpoint of its network \
                     confirms it; nothing was signed or paid; retry later",
                ));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check a resumed Solana payment on-chain; deferring");
                return Err(unavailable);
            }
        };
        Ok(match fate {
            TransferState::Settled { tx_id, .. } => Fate::Landed(Landed { tx: Some(tx_id), charged: None }),
            TransferState::Failed { finalized: false, .. } => Fate::Wait(
                "an earlier Solana transaction of this call failed and is not final yet; nothing was signed; retry later",
            ),
            TransferState::Pending { .. } => Fate::Live,
            TransferState::Expired { .. } | TransferState::Failed { finalized: true, .. } => Fate::Dead,
        })
    }

    async fn confirm(
        &self,
        pc: &PaidCall<'_>,
        attempt: &Attempt<SignedSvmTransfer>,
        claim: Option<&SettlementResponse>,
    ) -> Confirmed {
        let (status, tx, note) = match endpoint(pc, &attempt.signed.network) {
            Ok((_, rpc)) => confirm(pc, rpc, &attempt.signed, claim).await,
            Err(e) => (PaymentStatus::Unknown, None, Some(format!("settlement could not be checked: {e}"))),
        };
        Confirmed { status, tx, note, charged: None, claimed_amount: None }
    }

    fn proof<'a>(&self, chains: &Chains<'a>, signed: &'a SignedSvmTransfer) -> Option<crate::recovery::Proof<'a>> {
        let rpc = chains.solana?.of(&signed.network)?.primary();
        Some(crate::recovery::Proof::Svm(rpc, signed))
    }

    async fn verdict(&self, chains: &Chains<'_>, row: RowRef<'_>) -> Result<Verdict, Unread> {
        let signed = self.decode(row).map_err(Unread::of)?.signed;
        let endpoints = chains
            .solana
            .and_then(|r| r.of(row.network))
            .ok_or_else(|| Unread(format!("no RPC URL for {}", row.network)))?;
        // Every endpoint of the network, at least two, must say it can never land (one lagging,
        // pruned or lying index is not believed): else an error, and the intent is left as it is.
        Ok(match endpoints.fate(&signed).await.map_err(Unread::of)? {
            TransferState::Settled { .. } => Verdict::Used,
            TransferState::Expired { .. } | TransferState::Failed { finalized: true, .. } => Verdict::NeverLands,
            TransferState::Pending { .. } | TransferState::Failed { finalized: false, .. } => Verdict::MayLand,
        })
    }

    fn classify(&self, resp: &UpstreamResponse) -> Answer {
        if resp.status == 402 { Answer::Refused } else { Answer::Served }
    }

    async fn settlement_claim(&self, _: &PaidCall<'_>, _: &Attempt<SignedSvmTransfer>, _: UpstreamResponse) -> Outcome {
        // Never asked: [`Scheme::classify`] calls every 402 a refusal.
        Outcome::Failed(crate::relay::Failure::new(Code::PaymentUnknown, "unreachable: a Solana settlement claim"))
    }

    fn unseen(&self) -> &'static str {
        "its transaction can land until its blockhash expires"
    }

    fn reaccesses(&self) -> bool {
        false
    }

    fn view(
        &self,
        version: X402Version,
        nonce: &str,
        signed: &SignedSvmTransfer,
        (status, tx, _): (PaymentStatus, Option<&str>, Option<U256>),
    ) -> PaymentView {
        PaymentView::svm(version, signed, nonce, status, tx)
    }

    fn paid(&self, signed: &SignedSvmTransfer, _: Option<U256>) -> (String, String, U256) {
        let amount = signed.amount.parse::<u64>().unwrap_or(0);
        (signed.network.clone(), signed.mint.clone(), U256::from(amount))
    }
}

/// A served answer: settled only when the chain shows a transaction carrying the payer's
/// signature (the claimed one first), given a moment when a settlement is claimed.
async fn confirm(
    pc: &PaidCall<'_>,
    rpc: &SvmRpc,
    signed: &SignedSvmTransfer,
    claim: Option<&SettlementResponse>,
) -> (PaymentStatus, Option<String>, Option<String>) {
    let claimed = claim.is_some_and(|c| c.success);
    let claimed_id = claim.filter(|_| claimed).and_then(|c| c.transaction.clone());
    let polls = if claimed { SETTLEMENT_POLLS } else { 1 };
    let mut found = Ok(None);
    for i in 0..polls {
        if i > 0 {
            if pc.remaining() < SETTLEMENT_POLL_INTERVAL {
                break;
            }
            tokio::time::sleep(SETTLEMENT_POLL_INTERVAL).await;
        }
        found = landed(rpc, signed, claimed_id.as_deref()).await;
        if !matches!(found, Ok(None)) {
            break;
        }
    }
    match found {
        Ok(Some(l)) if l.error.is_none() => {
            let note = claimed_id
                .filter(|c| *c != l.tx_id)
                .map(|c| format!("the claimed transaction {c} does not carry this payment"));
            (PaymentStatus::Settled, Some(l.tx_id), note)
        }
        Ok(Some(l)) => (
            PaymentStatus::NotSettled,
            None,
            Some(format!("the payment's transaction {} failed on chain; nothing moved", l.tx_id)),
        ),
        Ok(None) if claimed => (
            PaymentStatus::Unconfirmed,
            None,
            Some("the upstream claimed settlement, but the chain shows no transaction carrying this payment".into()),
        ),
        Ok(None) => (PaymentStatus::NotSettled, None, None),
        Err(e) => (PaymentStatus::Unknown, None, Some(format!("settlement could not be checked: {e}"))),
    }
}

/// The transaction carrying `signed`: the claimed one if it does, else the payer's own
/// transactions searched.
async fn landed(
    rpc: &SvmRpc,
    signed: &SignedSvmTransfer,
    claimed: Option<&str>,
) -> Result<Option<x402::svm::rpc::Landed>, SvmRpcError> {
    if let Some(id) = claimed
        && let Some(l) = rpc.landed_as(signed, id).await?
    {
        return Ok(Some(l));
    }
    rpc.find_landed(signed).await
}

/// A re-sign that could not be made: the chain or the mint could not be read.
fn stop_reason(stop: &Stop) -> &'static str {
    if stop.metric == "rpc_unavailable" {
        "the Solana network cannot be read to sign an expired payment again; nothing was signed; retry later"
    } else {
        "an expired Solana payment of this call cannot be signed again; nothing was signed"
    }
}
