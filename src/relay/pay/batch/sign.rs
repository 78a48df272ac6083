//! Choosing a batch-settlement option and signing its voucher (with a deposit when the lane's
//! channel needs one), on a lane held for this payment.

use std::time::Duration;

use alloy::primitives::{B256, U256};
use reqwest::header::HeaderName;
use serde_json::Value;
use uuid::Uuid;

use super::terms::{BatchTerms, SignedBatch, offered};
use crate::clock::now_unix;
use crate::codes::Code;
use crate::config::BatchConfig;
use crate::money::Amount;
use crate::payments::lanes::{self, Lane, LaneKey, LaneStep};
use crate::payments::limits;
use crate::payments::store::Spend;
use crate::relay::Error;
use crate::relay::pay::agent::refuse_disabled;
use crate::relay::pay::call::PaidCall;
use crate::relay::pay::scheme::{Attempt, Columns, Signing, cheapest_allowed};
use crate::relay::pay::{Declined, Stop, to_i64};
use crate::x402::batch::{self, DepositTerms, SignedVoucher};
use crate::x402::{self, PaymentRequired};

/// How long a call waits for a lane of its channel when every one is held.
const LANE_WAIT: Duration = Duration::from_secs(10);
const LANE_POLL: Duration = Duration::from_millis(25);

/// The cheapest batch-settlement option the router and the agent's limits allow, or why none.
///
/// # Errors
/// [`Error`] when the agent's limits cannot be read.
pub(super) async fn choose(
    pc: &PaidCall<'_>,
    required: &PaymentRequired,
) -> Result<Result<(BatchTerms, Value), Declined>, Error> {
    let Some(cfg) = pc.state.config.payments.batch else {
        return Ok(Err((Code::PaymentUnsupported, "batch-settlement is not enabled (X402_SCHEMES)".into())));
    };
    let spend = pc.spend().await?;
    refuse_disabled(spend.as_ref())?;
    let limit = match spend.as_ref().map(Spend::limits) {
        None => None,
        Some(Ok(limits)) => limits.headroom(),
        Some(Err(_)) => return Ok(Err((Code::PaymentOverBudget, "the agent's limits cannot be read".into()))),
    };
    let options = offered(required);
    Ok(cheapest_allowed(&options, "batch-settlement", |t| t.amount, |t| refusal(pc, &cfg, t, spend.as_ref(), limit)))
}

/// Why one option may not be paid, with how far it got, if it may not.
fn refusal(
    pc: &PaidCall<'_>,
    cfg: &BatchConfig,
    t: &BatchTerms,
    spend: Option<&Spend>,
    limit: Option<Amount>,
) -> Option<(u8, Code, String)> {
    let payments = &pc.state.config.payments;
    let configured = payments.rpc_urls.contains_key(&t.network)
        && payments.assets.get(&t.network).is_some_and(|a| a.contains(&t.asset))
        && !payments.permit2_only.contains(&(t.network, t.asset));
    if !configured {
        Some((
            0,
            Code::PaymentUnsupported,
            format!("{} on {} is not configured for payments", t.asset, t.network.caip2()),
        ))
    } else if t.amount.is_zero() {
        Some((0, Code::PaymentUnsupported, "its amount is zero".into()))
    } else if t.withdraw_delay > cfg.max_withdraw_delay || t.withdraw_delay < batch::MIN_WITHDRAW_DELAY {
        let why = format!(
            "its withdrawDelay {} s is outside what the operator allows ({}..={} s)",
            t.withdraw_delay,
            batch::MIN_WITHDRAW_DELAY,
            cfg.max_withdraw_delay
        );
        Some((0, Code::PaymentNotAllowed, why))
    } else if t.pay_to == pc.state.config.signer.address() {
        Some((0, Code::PaymentUnsupported, "its payTo is the router's own wallet".into()))
    } else if let Some(why) = spend.and_then(|s| limits::pay_to_refusal(s, &t.pay_to.to_string().to_lowercase())) {
        Some((1, Code::PaymentNotAllowed, why))
    } else if t.amount > pc.call.max_amount {
        Some((
            3,
            Code::PaymentOverMaxAmount,
            format!("its amount {} exceeds max_amount {}", t.amount, pc.call.max_amount),
        ))
    } else {
        limit.filter(|l| t.amount > *l).map(|limit| {
            (2, Code::PaymentOverBudget, format!("its amount {} exceeds the agent's limits ({limit} left)", t.amount))
        })
    }
}

pub(super) fn lane_key(pc: &PaidCall<'_>, t: &BatchTerms) -> LaneKey {
    LaneKey {
        wallet: pc.state.config.signer.address().to_string().to_lowercase(),
        pay_to: t.pay_to.to_string().to_lowercase(),
        network: t.network.caip2(),
        asset: t.asset.to_string().to_lowercase(),
        receiver_authorizer: t.receiver_authorizer.to_string().to_lowercase(),
        withdraw_delay: i64::try_from(t.withdraw_delay).unwrap_or(i64::MAX),
    }
}

pub(super) fn config_of(pc: &PaidCall<'_>, t: &BatchTerms, salt: B256) -> batch::ChannelConfig {
    batch::channel_config(
        pc.state.config.signer.address(),
        (t.pay_to, t.receiver_authorizer, t.asset),
        t.withdraw_delay,
        salt,
    )
}

/// Holds a lane of the option's channel for `payment`, waiting a moment for one when every
/// lane is held. `None`: none came free.
async fn hold_lane(pc: &PaidCall<'_>, cfg: &BatchConfig, t: &BatchTerms, payment: Uuid) -> Result<Option<Lane>, Error> {
    let key = lane_key(pc, t);
    let waited = std::time::Instant::now();
    loop {
        let mut salt = B256::ZERO;
        getrandom::getrandom(salt.as_mut_slice())
            .map_err(|e| Error::Internal(anyhow::anyhow!("no randomness: {e}")))?;
        let id = batch::channel_id(&config_of(pc, t, salt), t.network.chain_id());
        let held = lanes::hold(
            &mut *pc.db().await?,
            (&key, t.amount),
            payment,
            i64::from(cfg.lanes),
            (&salt.to_string(), &id.to_string()),
        )
        .await?;
        if held.is_some() || waited.elapsed() >= LANE_WAIT.min(pc.remaining()) {
            return Ok(held);
        }
        tokio::time::sleep(LANE_POLL).await;
    }
}

/// Signs the voucher (and the deposit it needs) of `choice` on a lane held for this payment.
///
/// # Errors
/// [`Error`] for the database or a broken invariant (nothing signed leaves).
pub(super) async fn sign(
    pc: &PaidCall<'_>,
    required: &PaymentRequired,
    (t, raw): &(BatchTerms, Value),
) -> Result<Result<Signing<SignedBatch>, Stop>, Error> {
    let cfg = pc.state.config.payments.batch.ok_or_else(|| Error::invariant("batch-settlement is not enabled"))?;
    let id = Uuid::new_v4();
    let Some(lane) = hold_lane(pc, &cfg, t, id).await? else {
        let msg = "every channel lane of this upstream is busy with another call; nothing was signed; retry";
        return Ok(Err(Stop::new("lanes_busy", Code::PaymentNotMade, msg)));
    };
    let signed = signed_on(pc, (&cfg, t), &lane).await;
    let stop = match signed {
        Ok(Ok(parts)) => return signing(pc, required, (t, raw), (id, &lane), parts).map(Ok),
        Ok(Err(stop)) => Ok(stop),
        Err(e) => Err(e),
    };
    // Nothing was recorded for this payment: the lane is free again.
    if let Ok(mut conn) = pc.db().await {
        let _ = lanes::release(&mut conn, lane.id, id, None).await;
    }
    stop.map(Err)
}

/// A voucher and maybe a deposit, with the lane's ceiling they were signed over.
pub(super) struct Parts {
    pub config: batch::ChannelConfig,
    pub channel_id: B256,
    pub voucher: SignedVoucher,
    pub deposit: Option<batch::SignedDeposit>,
    pub expected_ceiling: Amount,
}

async fn signed_on(
    pc: &PaidCall<'_>,
    (cfg, t): (&BatchConfig, &BatchTerms),
    lane: &Lane,
) -> Result<Result<Parts, Stop>, Error> {
    let broken = |why: &str| Error::invariant(format!("batch lane {}: {why}", lane.id));
    let (signed, charged, deposited) = lane.amounts().map_err(|_| broken("an amount does not read"))?;
    let salt: B256 = lane.salt.parse().map_err(|_| broken("its salt does not read"))?;
    let config = config_of(pc, t, salt);
    let chain_id = t.network.chain_id();
    let channel_id = batch::channel_id(&config, chain_id);
    if channel_id.to_string() != lane.channel_id {
        return Err(broken("its channel id is not its configuration's"));
    }
    // The server takes exactly its charged total plus the price.
    let ceiling = charged.as_u256().saturating_add(t.amount.as_u256());
    let signer = &pc.state.config.signer;
    let voucher = if ceiling == signed.as_u256() && !signed.is_zero() {
        // That ceiling was signed already (its voucher refused without a charge): the same
        // voucher again, never another one at that ceiling.
        let stored: SignedVoucher = lane
            .voucher
            .clone()
            .and_then(|v| serde_json::from_value(v).ok())
            .ok_or_else(|| broken("its recorded voucher does not read"))?;
        if stored.max_claimable != ceiling || stored.channel_id != channel_id {
            return Err(broken("its recorded voucher is not at its recorded ceiling"));
        }
        stored
    } else if ceiling < signed.as_u256() {
        let msg = "this channel has a higher voucher out than the server charged at this price; nothing was signed; \
                   retry (another lane is used) or ask the operator to reconcile the channel";
        return Ok(Err(Stop::new("lane_ahead", Code::PaymentNotMade, msg)));
    } else {
        match batch::sign_voucher(signer, chain_id, channel_id, ceiling) {
            Ok(v) => v,
            Err(e) => return Ok(Err(Stop::new("sign_failed", Code::PaymentNotMade, format!("cannot sign: {e}")))),
        }
    };
    let deposit = if ceiling > deposited.as_u256() {
        match deposit_amount(pc, (cfg, t), deposited.as_u256(), ceiling).await? {
            Ok(amount) => {
                let own = pc.own;
                let nonce = x402::deterministic_nonce(
                    &pc.state.nonce_secret[..],
                    own.agent_id,
                    own.key.as_str(),
                    &own.request_hash,
                );
                let lifetime = t.max_timeout_secs.min(pc.state.config.payments.max_auth_secs);
                let terms = DepositTerms {
                    chain_id,
                    token: t.asset,
                    token_name: &t.token_name,
                    token_version: &t.token_version,
                    amount,
                    valid_before: now_unix().saturating_add(lifetime),
                };
                match batch::sign_deposit(signer, &terms, channel_id, U256::from_be_bytes(nonce.0)) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        let msg = format!("cannot sign the deposit: {e}");
                        return Ok(Err(Stop::new("sign_failed", Code::PaymentNotMade, msg)));
                    }
                }
            }
            Err(stop) => return Ok(Err(stop)),
        }
    } else {
        None
    };
    Ok(Ok(Parts { config, channel_id, voucher, deposit, expected_ceiling: signed }))
}

/// The deposit a channel holding `deposited` needs for a voucher at `ceiling`: the policy's
/// multiple of the price (or the server's announced minimum, if more), never more than the
/// operator's cap per channel nor the agent's remaining budget; a `Stop` when even what the
/// voucher needs is over either.
async fn deposit_amount(
    pc: &PaidCall<'_>,
    (cfg, t): (&BatchConfig, &BatchTerms),
    deposited: U256,
    ceiling: U256,
) -> Result<Result<U256, Stop>, Error> {
    let needed = ceiling - deposited;
    let price = t.amount.as_u256();
    let mut amount = price.saturating_mul(U256::from(cfg.deposit_multiplier)).max(needed);
    if let Some(min) = t.min_deposit {
        amount = amount.max(min.as_u256());
    }
    let cap = cfg.max_deposit.as_u256().saturating_sub(deposited);
    let budget = match pc.spend().await?.map(|s| s.limits()) {
        None => None,
        Some(Ok(l)) => l.budget_left().map(Amount::as_u256),
        Some(Err(_)) => Some(U256::ZERO),
    };
    let mut most = budget.map_or(cap, |b| b.min(cap));
    if let Some(wallet) = wallet_left(pc).await? {
        most = most.min(wallet);
    }
    amount = amount.min(most);
    if amount < needed || t.min_deposit.is_some_and(|m| amount < m.as_u256()) {
        let msg = format!(
            "the channel needs a deposit of {needed} (the server asks at least {}), over the operator's cap per \
             channel ({} left of X402_BATCH_MAX_DEPOSIT), the agent's remaining budget or what remains of the \
             wallet-wide daily cap; nothing was signed",
            t.min_deposit.map_or_else(|| needed.to_string(), |m| m.to_string()),
            cap
        );
        return Ok(Err(Stop::new("deposit_over_cap", Code::PaymentOverBudget, msg)));
    }
    Ok(Ok(amount))
}

/// What remains of the wallet-wide daily cap now (no lock: the reservation checks again), if
/// one is set: a deposit is the wallet's money locked.
async fn wallet_left(pc: &PaidCall<'_>) -> Result<Option<U256>, Error> {
    let mut conn = pc.db().await?;
    let settings = limits::settings(&mut conn, false).await?;
    let left = limits::wallet_left(&mut conn, settings.wallet_daily_cap.as_deref()).await?;
    Ok(left.map(|(left, _)| left.as_u256()))
}

/// The attempt, the intent's columns, its sealed parts and the lane's write.
pub(super) fn signing(
    pc: &PaidCall<'_>,
    required: &PaymentRequired,
    (t, raw): (&BatchTerms, &Value),
    (id, lane): (Uuid, &Lane),
    p: Parts,
) -> Result<Signing<SignedBatch>, Error> {
    let context = pc.context_of(required)?;
    let payload = batch::payload_json(&p.config, &p.voucher, p.deposit.as_ref());
    let accepted = raw.as_object().ok_or_else(|| Error::invariant("a batch option is not an object"))?;
    let resource = context.get("resource").filter(|v| !v.is_null());
    let extensions = context.get("extensions").filter(|v| !v.is_null());
    let message = x402::wire::payment_message(
        t.version,
        accepted,
        (batch::SCHEME, &t.network.caip2()),
        resource,
        payload,
        extensions,
    );
    let (name, value) =
        x402::wire::encode_payment_header(t.version, &message).map_err(|e| Error::invariant(e.to_string()))?;
    let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| Error::invariant(e.to_string()))?;
    let exact = pc.exact_of(required, (raw, &context), &value)?;
    let own = pc.own;
    let nonce =
        x402::deterministic_nonce(&pc.state.nonce_secret[..], own.agent_id, own.key.as_str(), &own.request_hash);
    let payer = pc.state.config.signer.address();
    let signed = SignedBatch {
        scheme: batch::SCHEME.to_owned(),
        network: t.network.caip2(),
        asset: t.asset.to_checksum(None),
        pay_to: t.pay_to.to_checksum(None),
        payer: payer.to_checksum(None),
        amount: t.amount,
        lane: lane.id,
        channel_id: p.channel_id,
        channel_config: batch::config_json(&p.config),
        voucher: p.voucher.clone(),
        deposit: p.deposit.clone(),
    };
    let step = LaneStep {
        lane: lane.id,
        expected_ceiling: p.expected_ceiling,
        ceiling: Amount::from_u256(p.voucher.max_claimable),
        voucher: serde_json::to_value(&p.voucher).map_err(|e| Error::Internal(e.into()))?,
        deposit: match &p.deposit {
            Some(d) => {
                Some((Amount::from_u256(d.amount), serde_json::to_value(d).map_err(|e| Error::Internal(e.into()))?))
            }
            None => None,
        },
        url: refund_url(&pc.call.upstream),
    };
    let now = now_unix();
    let columns = Columns {
        scheme: batch::SCHEME.to_owned(),
        network: signed.network.clone(),
        asset: signed.asset.clone(),
        amount: t.amount,
        pay_to: signed.pay_to.clone(),
        payer: signed.payer.clone(),
        valid_after: to_i64(now),
        valid_before: to_i64(now.saturating_add(pc.state.config.payments.max_auth_secs)),
    };
    let attempt = Attempt { id, version: t.version, nonce: nonce.to_string(), signed, header: (name, value) };
    Ok(Signing { attempt, columns, exact, lane: Some(step) })
}

/// Where a channel's server is asked for a cooperative refund: the paid URL without its query,
/// fragment or credentials (they may carry the agent's secrets); `None` for an MCP upstream.
fn refund_url(req: &crate::upstream::UpstreamRequest) -> Option<String> {
    if req.protocol != crate::upstream::Protocol::Http {
        return None;
    }
    let mut url = req.url.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.set_username("").ok()?;
    url.set_password(None).ok()?;
    Some(url.to_string())
}
