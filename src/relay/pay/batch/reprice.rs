//! A voucher paid ahead on known terms that the server refused because its price changed: the
//! server's corrective 402 carries its state of the channel, and, when that state is ours
//! (checked as in `answer.rs`: our signature on the voucher it holds, claimed on-chain ≤
//! charged ≤ signed) and says it took nothing of this voucher, the live price is paid with a
//! new voucher on the same lane, over the same intent, at the server's charged total plus the
//! new price. Only above the refused voucher's ceiling: the server can then claim at most the
//! new ceiling (vouchers are cumulative), which the intent reserves; never two vouchers at one
//! ceiling, never one below a ceiling signed. A lower price, a deposit to top up, or any other
//! disagreement is not paid again here: the 402 is answered as on the ordinary path.

use super::answer::{contradiction, server_state};
use super::sign::{Parts, config_of, lane_key, signing};
use super::terms::{BatchTerms, SignedBatch};
use crate::payments::lanes;
use crate::relay::Error;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Signing};
use crate::x402::PaymentRequired;
use crate::x402::batch;

/// The new voucher for the terms `asked` after the voucher `first` was refused, signed and not
/// yet recorded; `None` when they may not be paid over the same intent (nothing signed).
///
/// # Errors
/// [`Error`] for the database or a broken invariant.
pub(super) async fn sign_changed_terms(
    pc: &PaidCall<'_>,
    (first_terms, first): (&BatchTerms, &Attempt<SignedBatch>),
    (asked, (t, raw)): (&PaymentRequired, &(BatchTerms, serde_json::Value)),
) -> Result<Option<Signing<SignedBatch>>, Error> {
    let s = &first.signed;
    if s.deposit.is_some() || lane_key(pc, t) != lane_key(pc, first_terms) || t.amount <= first_terms.amount {
        return Ok(None);
    }
    let Some(st) = server_state(&asked.raw_accepts, s.channel_id) else {
        return Ok(None);
    };
    let lane = match lanes::by_channel(&mut *pc.db().await?, &s.channel_id.to_string()).await? {
        Some(l) if l.id == s.lane => l,
        _ => return Ok(None),
    };
    let Ok((signed, charged, deposited)) = lane.amounts() else {
        return Ok(None);
    };
    // The server says it took nothing of this voucher and agrees with our account of the lane.
    let agrees = st.charged == charged.as_u256() && signed.as_u256() == s.ceiling();
    if !agrees || contradiction(pc, s, signed.as_u256(), &st).await.is_some() {
        return Ok(None);
    }
    let ceiling = st.charged.saturating_add(t.amount.as_u256());
    if ceiling <= signed.as_u256() || ceiling > deposited.as_u256() {
        return Ok(None);
    }
    let salt = lane.salt.parse().map_err(|_| Error::invariant("a batch lane's salt does not read"))?;
    let config = config_of(pc, t, salt);
    let chain_id = t.network.chain_id();
    if batch::channel_id(&config, chain_id) != s.channel_id {
        return Ok(None);
    }
    let Ok(voucher) = batch::sign_voucher(&pc.state.config.signer, chain_id, s.channel_id, ceiling) else {
        return Ok(None);
    };
    let parts = Parts { config, channel_id: s.channel_id, voucher, deposit: None, expected_ceiling: signed };
    signing(pc, asked, (t, raw), (first.id, &lane), parts).map(Some)
}
