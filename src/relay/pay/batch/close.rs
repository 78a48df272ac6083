//! Closing a lane's channel: the cooperative refund over HTTP (as the scheme's official client
//! asks it: a `type: "refund"` payload whose voucher sits at the server's charged total, sent
//! to a route that takes batch-settlement), else the router wallet's timed withdrawal
//! (`initiateWithdraw`, then `finalizeWithdraw` once the channel's withdraw delay has passed),
//! the one kind of transaction the router's wallet sends to the settlement contract.
//!
//! The refund voucher is never above a ceiling already signed on the lane: at the lane's
//! charged total, or at the charged total the server states in a corrective 402 once that
//! state is checked (our signature on its voucher, charged ≤ its voucher ≤ our highest).

use std::time::{Duration, Instant};

use alloy::network::EthereumWallet;
use alloy::primitives::{B256, U256};
use alloy::providers::{Provider, ProviderBuilder};
use alloy::signers::local::PrivateKeySigner;
use reqwest::header::{HeaderMap, HeaderName};
use serde_json::Value;

use super::channel::{self, ChannelError};
use crate::money::Amount;
use crate::payments::channels::ChannelRow;
use crate::upstream::{UpstreamClient, UpstreamRequest};
use crate::x402::batch::{self, IBatchSettlement};
use crate::x402::{Network, X402Version};

/// How long a transaction of the wallet is awaited.
const MINE_WAIT: Duration = Duration::from_secs(60);
const RECEIPT_POLL: Duration = Duration::from_millis(250);

/// What the router needs to ask a server for a refund or to send the wallet's transactions.
pub struct Closer<'a> {
    pub upstream: &'a UpstreamClient,
    pub signer: &'a PrivateKeySigner,
    pub rpc_urls: &'a [url::Url],
    pub timeout: Duration,
}

/// Why a server did not refund (the withdrawal is the way then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NoRefund(pub String);

/// Asks the lane's server for a cooperative refund of everything unclaimed. `Ok(())`: it says
/// it refunded (the chain is read again by the caller).
pub(crate) async fn refund(closer: &Closer<'_>, row: &ChannelRow) -> Result<(), NoRefund> {
    let no = |why: String| NoRefund(why);
    let url = row.url.as_deref().ok_or_else(|| no("no HTTP route of the server is known for this channel".into()))?;
    let url = url::Url::parse(url).map_err(|e| no(format!("the recorded route does not read: {e}")))?;
    let (network, channel_id) = channel::ids(row).map_err(|e| no(e.to_string()))?;
    let config = channel::config(row).map_err(|e| no(e.to_string()))?;
    let get = UpstreamRequest::http(reqwest::Method::GET, url, HeaderMap::new(), None);
    let probe =
        closer.upstream.send(&get, &[], closer.timeout).await.map_err(|e| no(format!("the server's route: {e}")))?;
    let required = parse_402(&probe).ok_or_else(|| no(format!("the route answered {} without a 402", probe.status)))?;
    let accepted = required
        .raw_accepts
        .iter()
        .find(|a| same_channel(a, row, network))
        .cloned()
        .ok_or_else(|| no("the route no longer offers batch-settlement to this channel's payee".into()))?;
    let signed = Amount::parse(&row.signed_ceiling).map_err(|_| no("the lane's ceiling does not read".into()))?;
    let mut charged = Amount::parse(&row.charged).map_err(|_| no("the lane's charged total does not read".into()))?;
    for _ in 0..2 {
        let voucher = batch::sign_voucher(closer.signer, network.chain_id(), channel_id, charged.as_u256())
            .map_err(|e| no(format!("cannot sign the refund voucher: {e}")))?;
        let payload = batch::refund_payload_json(&config, &voucher);
        let obj = accepted.as_object().ok_or_else(|| no("the offer is not an object".into()))?;
        let message = crate::x402::wire::payment_message(
            X402Version::V2,
            obj,
            (batch::SCHEME, &network.caip2()),
            required.resource.as_ref(),
            payload,
            required.extensions.as_ref(),
        );
        let (name, value) = crate::x402::wire::encode_payment_header(X402Version::V2, &message)
            .map_err(|e| no(format!("cannot encode the refund: {e}")))?;
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| no(e.to_string()))?;
        let resp = closer
            .upstream
            .send(&get, &[(name, value)], closer.timeout)
            .await
            .map_err(|e| no(format!("the refund request: {e}")))?;
        if resp.status != 402 {
            return match crate::x402::wire::parse_settlement(&resp.headers) {
                Ok(Some(s)) if s.success => Ok(()),
                Ok(Some(s)) => Err(no(format!("the server's refund failed: {}", s.error_reason.unwrap_or_default()))),
                _ => Err(no(format!("the server answered {} without a refund", resp.status))),
            };
        }
        // A corrective 402: the server's charged total, believed only when it agrees with ours.
        let st = corrective(&resp, channel_id).ok_or_else(|| no("the server refused the refund".into()))?;
        if st.charged > st.signed || st.signed > signed.as_u256() || st.charged <= charged.as_u256() {
            return Err(no("the server's state of the channel contradicts the router's".into()));
        }
        match batch::voucher_signer(network.chain_id(), channel_id, st.signed, &st.signature) {
            Ok(a) if a == closer.signer.address() => {}
            _ => return Err(no("the voucher the server says it holds is not the router's".into())),
        }
        charged = Amount::from_u256(st.charged);
    }
    Err(no("the server refused the refund twice".into()))
}

fn parse_402(resp: &crate::upstream::UpstreamResponse) -> Option<crate::x402::PaymentRequired> {
    crate::x402::wire::parse_payment_required(reqwest::StatusCode::PAYMENT_REQUIRED, &resp.headers, &resp.body)
        .ok()
        .filter(|_| resp.status == 402)
}

fn same_channel(a: &Value, row: &ChannelRow, network: Network) -> bool {
    let s = |k: &str| a.get(k).and_then(Value::as_str).unwrap_or_default().to_lowercase();
    let x = |k: &str| a.get("extra").and_then(|e| e.get(k)).and_then(Value::as_str).unwrap_or_default().to_lowercase();
    s("scheme") == batch::SCHEME
        && s("network") == network.caip2()
        && s("payTo") == row.pay_to.to_lowercase()
        && s("asset") == row.asset.to_lowercase()
        && x("receiverAuthorizer") == row.receiver_authorizer.to_lowercase()
}

/// A corrective 402's state of the channel.
struct Stated {
    charged: U256,
    signed: U256,
    signature: String,
}

fn corrective(resp: &crate::upstream::UpstreamResponse, channel_id: B256) -> Option<Stated> {
    let required = parse_402(resp)?;
    let error = required.error.clone().unwrap_or_default();
    if error != batch::ERR_CUMULATIVE_MISMATCH {
        return None;
    }
    let a = required.raw_accepts.iter().find(|a| a.get("scheme").and_then(Value::as_str) == Some(batch::SCHEME))?;
    let x = a.get("extra")?;
    let num = |v: Option<&Value>| v.and_then(Value::as_str).and_then(|s| Amount::parse(s).ok()).map(Amount::as_u256);
    let cs = x.get("channelState")?;
    let vs = x.get("voucherState")?;
    let same = cs.get("channelId").and_then(Value::as_str).and_then(|c| c.parse::<B256>().ok());
    if same != Some(channel_id) {
        return None;
    }
    Some(Stated {
        charged: num(cs.get("chargedCumulativeAmount"))?,
        signed: num(vs.get("signedMaxClaimable"))?,
        signature: vs.get("signature")?.as_str()?.to_owned(),
    })
}

/// One of the wallet's two withdrawal transactions.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Withdraw {
    /// `initiateWithdraw(config, amount)`: the channel's unclaimed rest.
    Initiate(U256),
    /// `finalizeWithdraw(config)`, once the delay has passed.
    Finalize,
}

/// Sends `step` from the router's wallet and waits for its receipt. `Ok(None)`: the contract
/// would refuse it now (checked by a call first: e.g. the delay has not passed); nothing sent.
///
/// # Errors
/// [`ChannelError`] when no RPC URL serves the chain, or the transaction fails or reverts.
pub(crate) async fn withdraw(
    closer: &Closer<'_>,
    row: &ChannelRow,
    step: Withdraw,
) -> Result<Option<B256>, ChannelError> {
    let (network, _) = channel::ids(row)?;
    let config = channel::config(row)?;
    let provider = provider(closer, network).await?;
    let settlement = IBatchSettlement::new(batch::SETTLEMENT, &provider);
    let tx = |e: &dyn std::fmt::Display| ChannelError::Transaction(scrub(closer, e));
    let call = match step {
        Withdraw::Initiate(amount) => {
            let amount = u128::try_from(amount).map_err(|_| ChannelError::Stored("unclaimed amount"))?;
            settlement.initiateWithdraw(config, amount).into_transaction_request()
        }
        Withdraw::Finalize => settlement.finalizeWithdraw(config).into_transaction_request(),
    };
    let call = call.from(closer.signer.address());
    let bounded = |what: &'static str| move |_| ChannelError::Transaction(format!("{what} timed out"));
    if tokio::time::timeout(closer.timeout, provider.call(call.clone())).await.map_err(bounded("the check"))?.is_err() {
        return Ok(None);
    }
    let pending = tokio::time::timeout(closer.timeout, provider.send_transaction(call))
        .await
        .map_err(bounded("sending"))?
        .map_err(|e| tx(&e))?;
    let hash = *pending.tx_hash();
    let started = Instant::now();
    loop {
        let r = tokio::time::timeout(closer.timeout, provider.get_transaction_receipt(hash))
            .await
            .map_err(bounded("the receipt"))?
            .map_err(|e| tx(&e))?;
        if let Some(r) = r {
            return if r.status() {
                Ok(Some(hash))
            } else {
                Err(ChannelError::Transaction(format!("{hash} reverted")))
            };
        }
        if started.elapsed() > MINE_WAIT {
            return Err(ChannelError::Transaction(format!("{hash} was not mined within {MINE_WAIT:?}")));
        }
        tokio::time::sleep(RECEIPT_POLL).await;
    }
}

/// A provider with the router's wallet on the first URL that serves `network`'s chain.
async fn provider(closer: &Closer<'_>, network: Network) -> Result<impl Provider + use<>, ChannelError> {
    let wallet = EthereumWallet::from(closer.signer.clone());
    for url in closer.rpc_urls {
        let p = ProviderBuilder::new().wallet(wallet.clone()).connect_http(url.clone());
        if let Ok(Ok(id)) = tokio::time::timeout(closer.timeout, p.get_chain_id()).await
            && id == network.chain_id()
        {
            return Ok(p);
        }
    }
    Err(ChannelError::Transaction(format!("no RPC URL of {network} serves its chain")))
}

/// A message without the RPC URLs (they may carry an API key).
fn scrub(closer: &Closer<'_>, e: &dyn std::fmt::Display) -> String {
    let mut msg = e.to_string();
    for u in closer.rpc_urls {
        msg = msg.replace(u.as_str(), "<rpc url>").replace(u.as_str().trim_end_matches('/'), "<rpc url>");
    }
    msg
}
