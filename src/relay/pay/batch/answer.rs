//! What a batch-settlement server's answer says of a voucher: a served call charged it; a
//! corrective 402 carries the server's state of the channel, believed only when it agrees with
//! ours (our signature, claimed on-chain ≤ charged ≤ signed); anything else leaves the voucher
//! counted as charged. The lane is freed (or stopped) here, with what the server was seen to
//! charge.

use alloy::primitives::{Address, B256, U256};
use serde_json::Value;

use super::terms::SignedBatch;
use crate::codes::Code;
use crate::money::Amount;
use crate::payments::PaymentStatus;
use crate::payments::lanes;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Confirmed};
use crate::relay::{Failure, Outcome};
use crate::upstream::UpstreamResponse;
use crate::x402::batch;
use crate::x402::{self, Network, SettlementResponse};

/// Frees the lane of `attempt` (what the server charged, if known).
async fn release(pc: &PaidCall<'_>, attempt: &Attempt<SignedBatch>, charged: Option<U256>) {
    let written = match pc.db().await {
        Ok(mut conn) => lanes::release(&mut conn, attempt.signed.lane, attempt.id, charged.map(Amount::from_u256))
            .await
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = written {
        tracing::warn!(error = %e, "could not free a batch-settlement lane; it is freed by its payment's takeover");
    }
}

/// A served answer: the server charged the voucher (its claim), or, without a claim, the
/// voucher stays counted as charged (`unconfirmed`).
pub(super) async fn confirm(
    pc: &PaidCall<'_>,
    attempt: &Attempt<SignedBatch>,
    claim: Option<&SettlementResponse>,
) -> Confirmed {
    let s = &attempt.signed;
    if claim.is_some_and(|c| c.success) {
        release(pc, attempt, Some(s.ceiling())).await;
        // A deposit's transaction, when the server names one (a voucher has none).
        let tx = claim.and_then(|c| c.tx_hash).map(|h| h.to_string());
        return Confirmed { status: PaymentStatus::Settled, tx, note: None, charged: None, claimed_amount: None };
    }
    release(pc, attempt, None).await;
    let note = "the upstream served the call without saying it charged the voucher; it stays counted as charged";
    Confirmed {
        status: PaymentStatus::Unconfirmed,
        tx: None,
        note: Some(note.into()),
        charged: None,
        claimed_amount: None,
    }
}

/// The server's state of our channel, from a corrective 402.
#[derive(Debug)]
pub(super) struct ServerState {
    pub charged: U256,
    signed: U256,
    signature: String,
}

/// A corrective 402's reason and its state of the channel `channel_id`, if it reads.
fn read_402(resp: &UpstreamResponse, channel_id: B256) -> Option<(String, Option<ServerState>)> {
    let required =
        x402::wire::parse_payment_required(reqwest::StatusCode::PAYMENT_REQUIRED, &resp.headers, &resp.body).ok()?;
    let error = required.error.clone().unwrap_or_default();
    Some((error, server_state(&required.raw_accepts, channel_id)))
}

/// The state of the channel `channel_id` that a 402's batch-settlement option carries, if any.
pub(super) fn server_state(accepts: &[Value], channel_id: B256) -> Option<ServerState> {
    let accept = accepts.iter().find(|a| a.get("scheme").and_then(Value::as_str) == Some(batch::SCHEME));
    let extra = accept.and_then(|a| a.get("extra"));
    let num = |v: Option<&Value>| v.and_then(Value::as_str).and_then(|s| Amount::parse(s).ok()).map(Amount::as_u256);
    extra.and_then(|x| {
        let cs = x.get("channelState")?;
        let vs = x.get("voucherState")?;
        let same = cs.get("channelId").and_then(Value::as_str).and_then(|c| c.parse::<B256>().ok());
        if same.is_some_and(|c| c != channel_id) {
            return None;
        }
        Some(ServerState {
            charged: num(cs.get("chargedCumulativeAmount"))?,
            signed: num(vs.get("signedMaxClaimable"))?,
            signature: vs.get("signature")?.as_str()?.to_owned(),
        })
    })
}

/// Why the server's state contradicts ours, if it does.
pub(super) async fn contradiction(
    pc: &PaidCall<'_>,
    s: &SignedBatch,
    lane_signed: U256,
    st: &ServerState,
) -> Option<String> {
    let network = Network::parse_caip2(&s.network).ok()?;
    let payer: Address = s.payer.parse().ok()?;
    if st.charged > st.signed {
        return Some(format!("it says it charged {} above the voucher it holds ({})", st.charged, st.signed));
    }
    if st.signed > lane_signed {
        return Some(format!("it holds a voucher of {} above the highest we signed ({lane_signed})", st.signed));
    }
    match batch::voucher_signer(network.chain_id(), s.channel_id, st.signed, &st.signature) {
        Ok(a) if a == payer => {}
        _ => return Some("the voucher it holds is not signed by the router's wallet".into()),
    }
    match pc.state.chain.batch_channel(network, s.channel_id).await {
        Ok((_, claimed)) if claimed > st.charged => {
            Some(format!("it claimed {claimed} on-chain, above what it says it charged ({})", st.charged))
        }
        _ => None,
    }
}

/// A 402 to a voucher: corrective (the server's state, checked, says whether this voucher was
/// charged before) or a refusal (the voucher stays counted as charged: the server holds it).
pub(super) async fn refused(pc: &PaidCall<'_>, attempt: &Attempt<SignedBatch>, resp: UpstreamResponse) -> Outcome {
    let s = &attempt.signed;
    let read = read_402(&resp, s.channel_id);
    let corrective = read
        .as_ref()
        .is_some_and(|(e, _)| e == batch::ERR_CUMULATIVE_MISMATCH || e == batch::ERR_CUMULATIVE_BELOW_CLAIMED);
    let lane = match pc.db().await {
        Ok(mut conn) => lanes::by_channel(&mut conn, &s.channel_id.to_string()).await.ok().flatten(),
        Err(_) => None,
    };
    let lane_signed = lane.as_ref().and_then(|l| l.amounts().ok()).map(|a| a.0.as_u256());
    let (status, code, msg) = match (corrective, read.as_ref().and_then(|r| r.1.as_ref()), lane_signed) {
        (true, Some(st), Some(lane_signed)) => match contradiction(pc, s, lane_signed, st).await {
            Some(why) => {
                stop_lane(pc, s, &why).await;
                let msg = format!(
                    "the batch-settlement server's state of the channel contradicts the router's ({why}); the router \
                     stopped signing on that channel; the payment stays counted as charged"
                );
                (PaymentStatus::Unknown, Code::PaymentUnknown, msg)
            }
            None if st.charged >= s.ceiling() => {
                // The server charged this very voucher before (its answer was lost).
                release(pc, attempt, Some(st.charged.min(s.ceiling()))).await;
                let msg = "the server had charged this voucher already (an earlier answer was lost)".to_owned();
                (PaymentStatus::SettledResponseLost, Code::SettledResponseLost, msg)
            }
            None => {
                release(pc, attempt, Some(st.charged)).await;
                let msg = format!(
                    "the server did not take the voucher: its charged total is {} (the next voucher starts there)",
                    st.charged
                );
                (PaymentStatus::Rejected, Code::PaymentRejected, msg)
            }
        },
        _ => {
            forget_unused_deposit(pc, s).await;
            release(pc, attempt, None).await;
            let why = read.map(|r| r.0).filter(|e| !e.is_empty()).unwrap_or_else(|| "no reason given".into());
            let msg = format!(
                "upstream rejected the payment: {why}; the voucher it was sent stays counted as charged until the \
                 channel is reconciled"
            );
            (PaymentStatus::Unknown, Code::PaymentRejected, msg)
        }
    };
    pc.count(status.as_str());
    pc.count_paid(&super::Batch, s, status, None);
    let payment = pc.note(&super::Batch, attempt.parts(), (status, None, None), (Some(msg.clone()), None));
    Outcome::Failed(Failure::new(code, msg).upstream(resp).payment(Some(payment)))
}

/// Stops signing on the lane of `s`: an operator event.
async fn stop_lane(pc: &PaidCall<'_>, s: &SignedBatch, why: &str) {
    tracing::error!(
        event = "batch_channel_contradicted", channel_id = %s.channel_id, pay_to = %s.pay_to, network = %s.network,
        reason = %why, "a batch-settlement server contradicts the router's record of a channel; signing stopped on it"
    );
    pc.state.metrics.payments.with_label_values(&["batch_channel_stopped"]).inc();
    if let Ok(mut conn) = pc.db().await
        && let Err(e) = lanes::stop(&mut conn, s.lane, why).await
    {
        tracing::warn!(error = %e, "could not stop a batch-settlement lane");
    }
}

/// A refused payload's deposit that the chain shows unused no longer counts as deposited on its
/// lane, so that the lane's next payment deposits again (its authorization can still move the
/// wallet's money only into the wallet's own channel).
async fn forget_unused_deposit(pc: &PaidCall<'_>, s: &SignedBatch) {
    let Some(d) = &s.deposit else { return };
    let (Ok(network), Ok(asset), Ok(payer)) =
        (Network::parse_caip2(&s.network), s.asset.parse::<Address>(), s.payer.parse::<Address>())
    else {
        return;
    };
    match pc.state.chain.authorization_state(network, asset, payer, d.nonce).await {
        Ok(false) => {
            if let Ok(mut conn) = pc.db().await
                && let Err(e) = lanes::forget_deposit(&mut conn, s.lane, Amount::from_u256(d.amount)).await
            {
                tracing::warn!(error = %e, "could not forget a refused deposit");
            }
        }
        Ok(true) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read whether a refused deposit moved; it stays counted"),
    }
}
