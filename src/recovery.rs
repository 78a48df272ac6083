//! Recovering the upstream's answer to a payment that settled while its answer was lost
//! (issue 16), **without ever paying again**.
//!
//! Used only once the chain shows the payment's nonce used. Everything needed was committed
//! with the intent before the paid request first left (`payments`: the request as sent, the
//! payment header, the extensions the 402 advertised), so recovery needs nothing but the
//! ledger row, an HTTP client and read access to the chain:
//!
//! - the upstream advertised `payment-identifier` (and the stored payment carries the id):
//!   re-send the byte-identical request with the byte-identical payment header. A 200 whose
//!   `PAYMENT-RESPONSE.transaction` is the transaction the chain shows using this nonce is
//!   the original answer (`recovered`); 503 is retried a bounded number of times, honouring
//!   `Retry-After` (the original is still in flight upstream), and so is a transport error
//!   or an answer the chain could not be read to check (after a second); 409, 402 or anything
//!   else stop.
//! - otherwise nothing is sent: settled, response lost.
//!
//! The ledger keeps the request as sent and the payment header sealed (`crate::secrets`); the
//! caller opens them ([`Opened`]) and hands them over, and they may have been dropped (the
//! payment settled, or past `SECRETS_RETENTION_HOURS`): then nothing is sent, and the log says
//! so.
//!
//! When this recovers nothing, `relay` may still re-access the resource by signing in as
//! the payer (Sign-In-With-X, `relay/reaccess.rs`): a new execution, and a signature, which is
//! why it lives there and not here.
//!
//! **This module cannot sign.** It takes no application state, configuration or key, names
//! no signing code (`x402::sign`, `x402::payload`, `x402::nonce`), and only re-sends header
//! bytes read from the ledger (opened by its caller). `tests/api/structure.rs` holds it to that.

use std::str::FromStr;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, B256};
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use serde_json::{Value, json};
use url::Url;

use crate::payments::sealed::{NotKept, Opened};
use crate::payments::store::{PaymentRow, SentRequest};
use crate::payments::{Exchange, RecoveryKind, RecoveryStep};
use crate::upstream::{Protocol, UpstreamClient, UpstreamRequest, UpstreamResponse};
use crate::x402::chain::{Chain, Permit2Terms};
use crate::x402::network::Network;
use crate::x402::svm::record::SignedSvmTransfer;
use crate::x402::svm::rpc::SvmRpc;
use crate::x402::wire::{PAYMENT_IDENTIFIER, SettlementResponse, parse_settlement};

/// Why a stored paid request cannot be sent again byte for byte.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotResendable(pub String);

impl From<String> for NotResendable {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for NotResendable {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

impl From<NotKept> for NotResendable {
    fn from(e: NotKept) -> Self {
        Self(e.0)
    }
}

/// Most re-sends of one recovery (the first plus retries after a 503 or a transport error);
/// the deadline bounds them too.
pub const MAX_SENDS: u32 = 10;
/// The pause before a re-send that follows a transport error.
const TRANSPORT_RETRY: Duration = Duration::from_secs(1);
/// The longest `Retry-After` honoured between two re-sends; a longer one is cut to this.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// The request as it is sent to the upstream, in the ledger's storable form.
///
/// # Errors
/// Header values that are not visible ASCII/UTF-8 cannot be stored (never from `/route`,
/// whose headers come from JSON strings).
pub fn as_sent(req: &UpstreamRequest) -> Result<SentRequest, NotResendable> {
    let mut pairs = Vec::with_capacity(req.headers.len());
    for (name, value) in &req.headers {
        let value = value.to_str().map_err(|e| format!("header {name} is not storable: {e}"))?;
        pairs.push(json!([name.as_str(), value]));
    }
    let headers = serde_json::to_vec(&pairs).map_err(|e| e.to_string())?;
    Ok(SentRequest { method: req.shown_method(), url: req.url.to_string(), headers, body: req.body.clone() })
}

/// The stored request, ready to be sent again.
///
/// # Errors
/// Not kept (dropped, unreadable, never recorded), or a stored part that no longer parses
/// (never for rows this version wrote).
pub fn stored_request(opened: &Opened) -> Result<UpstreamRequest, NotResendable> {
    let sent = opened.request()?;
    // A tool call is stored with the method `MCP` (docs/DESIGN.md §7, "Paid MCP tools").
    let (protocol, method) = if sent.method == crate::upstream::mcp::SHOWN_METHOD {
        (Protocol::Mcp, Method::POST)
    } else {
        (Protocol::Http, Method::from_bytes(sent.method.as_bytes()).map_err(|e| format!("stored method: {e}"))?)
    };
    let url = Url::parse(&sent.url).map_err(|e| format!("stored url: {e}"))?;
    let pairs: Vec<(String, String)> = serde_json::from_slice(&sent.headers)
        .map_err(|_| NotResendable::from("the stored headers are not a list of [name, value]"))?;
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("stored header name: {e}"))?;
        // Never quoted: a header value may be a credential.
        let value = HeaderValue::from_str(&value).map_err(|_| format!("stored header {name} is not a header value"))?;
        map.append(name, value);
    }
    Ok(UpstreamRequest { protocol, method, url, headers: map, body: sent.body.clone() })
}

/// The payment header exactly as stored.
fn stored_payment_header(row: &PaymentRow, opened: &Opened) -> Result<(HeaderName, HeaderValue), NotResendable> {
    let exact = opened.exact()?;
    let name = HeaderName::from_bytes(row.header_name.as_bytes()).map_err(|e| format!("stored header name: {e}"))?;
    let value = HeaderValue::from_str(&exact.header_value).map_err(|e| format!("stored payment header: {e}"))?;
    Ok((name, value))
}

/// True when the 402 advertised `payment-identifier` and the stored payment echoes it with
/// an id (so a re-send is one the upstream can recognise). Read from the row's shown copies:
/// redaction changes values of URL parameters only, never an extension's name or our id.
pub fn can_resend(row: &PaymentRow) -> bool {
    let advertised = row
        .advertised_extensions
        .as_deref()
        .and_then(|b| serde_json::from_slice::<Value>(b).ok())
        .is_some_and(|e| e.get(PAYMENT_IDENTIFIER).is_some());
    let sent_id = row
        .context
        .pointer(&format!("/extensions/{PAYMENT_IDENTIFIER}/info/id"))
        .and_then(Value::as_str)
        .is_some_and(|id| !id.is_empty());
    advertised && sent_id
}

/// How a recovery ended.
#[derive(Debug)]
pub enum Ending {
    /// The upstream's original answer, proven to carry the settling transaction.
    Recovered { resp: UpstreamResponse, tx_hash: String },
    /// Nothing recovered.
    Lost,
}

/// A recovery's ending and what it tried (one JSON object per attempt).
#[derive(Debug)]
pub struct Recovery {
    pub ending: Ending,
    pub log: Vec<RecoveryStep>,
    /// How many requests were sent to the upstream.
    pub sends: u32,
}

impl Recovery {
    /// Nothing tried, for the reason given.
    pub fn skipped(why: &str) -> Self {
        Self { ending: Ending::Lost, log: vec![RecoveryStep::none(why)], sends: 0 }
    }

    pub fn kind(&self) -> RecoveryKind {
        match self.ending {
            Ending::Recovered { .. } => RecoveryKind::Recovered,
            Ending::Lost => RecoveryKind::Lost,
        }
    }
}

/// The on-chain coordinates of the row's authorization.
/// A payment's network, asset, payer and nonce.
type Coordinates = (Network, Address, Address, B256);

fn coordinates(row: &PaymentRow) -> Result<Coordinates, NotResendable> {
    let network = Network::parse(&row.network).map_err(|e| format!("network: {e}"))?;
    let asset = Address::from_str(&row.asset).map_err(|e| format!("asset: {e}"))?;
    let payer = Address::from_str(&row.payer).map_err(|e| format!("payer: {e}"))?;
    let nonce = B256::from_str(&row.nonce).map_err(|e| format!("nonce: {e}"))?;
    Ok((network, asset, payer, nonce))
}

/// Who proves that a re-sent answer's settlement claim is the payment's: the chain of the row.
#[derive(Clone, Copy)]
pub enum Proof<'a> {
    /// An EVM payment: the EIP-3009 event, or the Permit2 proxy call, of the row's authorization.
    Evm(&'a Chain),
    /// A Solana payment: the claimed transaction must carry the stored transfer's signature.
    Svm(&'a SvmRpc, &'a SignedSvmTransfer),
}

/// What a re-send needs: the stored request and its payment header, when the row may be
/// re-sent at all (and, for an EVM payment, its on-chain coordinates can be read).
fn prepare(
    upstream: &UpstreamClient,
    (row, opened): (&PaymentRow, &Opened),
    proof: Proof<'_>,
) -> Result<(UpstreamRequest, (HeaderName, HeaderValue)), NotResendable> {
    if !can_resend(row) {
        return Err("the upstream did not advertise payment-identifier".into());
    }
    let request = stored_request(opened)?;
    let header = stored_payment_header(row, opened)?;
    if matches!(proof, Proof::Evm(_)) {
        coordinates(row)?;
    }
    // The same upstream policy as every call of the router (one constructor, one guard): an
    // address it refuses is never re-sent to, and that is final (a retry cannot change it).
    upstream.guard().check_url(&request.url).map_err(|e| format!("refused by the upstream policy: {e}"))?;
    Ok((request, header))
}

/// The transaction the chain shows settling this payment, when it is the one the answer
/// claims: EIP-3009's event or (Permit2) the proxy call of these terms; on Solana, a landed,
/// successful transaction carrying the payer's signature.
///
/// # Errors
/// The chain could not be read: nothing is decided (the answer may well be the original).
async fn proven(
    proof: Proof<'_>,
    row: &PaymentRow,
    claim: Option<&SettlementResponse>,
) -> Result<Option<String>, ChainUnread> {
    let Some(claim) = claim else { return Ok(None) };
    match proof {
        Proof::Evm(chain) => {
            let (Ok((network, asset, payer, nonce)), Some(c)) = (coordinates(row), claim.tx_hash) else {
                return Ok(None);
            };
            let found = match Permit2Terms::from_record(&row.signed_authorization) {
                Some(terms) => chain.permit2_settlement(&terms, Some(c)).await.map(|s| s.map(|s| s.tx_hash)),
                None => chain.authorization_tx(network, asset, payer, nonce, Some(c)).await,
            };
            let found = found.map_err(|e| ChainUnread(e.to_string()))?;
            Ok(found.filter(|p| *p == c).map(|p| p.to_string()))
        }
        Proof::Svm(rpc, transfer) => {
            let Some(c) = claim.transaction.as_deref() else { return Ok(None) };
            let landed = rpc.landed_as(transfer, c).await.map_err(|e| ChainUnread(e.to_string()))?;
            Ok(landed.filter(|l| l.error.is_none() && l.tx_id == c).map(|l| l.tx_id))
        }
    }
}

/// The chain could not be read to prove an answer (an RPC error or stall).
#[derive(Debug)]
struct ChainUnread(String);

/// Tries to get back the answer of the paid request recorded in `row` (its sealed parts
/// `opened`), whose nonce the chain shows used, by re-sending it byte for byte, within
/// `deadline`. Sends nothing unless [`can_resend`] and the request as sent is at hand. Never
/// signs.
pub async fn recover(
    upstream: &UpstreamClient,
    proof: Proof<'_>,
    (row, opened): (&PaymentRow, &Opened),
    deadline: Instant,
) -> Recovery {
    let mut log = Vec::new();
    let mut sends = 0;
    let lost = |log: Vec<RecoveryStep>, sends| Recovery { ending: Ending::Lost, log, sends };
    let (request, header) = match prepare(upstream, (row, opened), proof) {
        Ok(p) => p,
        Err(why) => return lost(vec![RecoveryStep::none(why.0)], 0),
    };
    while sends < MAX_SENDS {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            log.push(RecoveryStep::Stop { why: "route deadline".into() });
            break;
        }
        sends += 1;
        let at = chrono::Utc::now().to_rfc3339();
        let resp = match upstream.send(&request, std::slice::from_ref(&header), left.min(upstream.timeout())).await {
            Ok(r) => r,
            Err(crate::upstream::UpstreamError::Blocked(e)) => {
                log.push(RecoveryStep::none(format!("refused by the upstream policy: {e}")));
                return lost(log, sends - 1);
            }
            Err(e) => {
                // The re-send is byte-identical and the upstream keys it by its id: trying
                // again after a dropped or stalled connection can neither pay nor run twice.
                log.push(RecoveryStep::Resend(Exchange { error: Some(e.to_string()), ..Exchange::at(&at) }));
                let left = deadline.saturating_duration_since(Instant::now());
                tokio::time::sleep(TRANSPORT_RETRY.min(left)).await;
                continue;
            }
        };
        let mut entry = Exchange { status: Some(resp.status), ..Exchange::at(&at) };
        match resp.status {
            200 => {
                let (entry, checked) = check_answer(proof, row, &resp, entry).await;
                log.push(RecoveryStep::Resend(entry));
                match checked {
                    Checked::Original(p) => {
                        return Recovery { ending: Ending::Recovered { resp, tx_hash: p }, log, sends };
                    }
                    Checked::Unread => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        tokio::time::sleep(TRANSPORT_RETRY.min(left)).await;
                    }
                    Checked::NotOriginal => break,
                }
            }
            503 => {
                let wait = retry_after(&resp.headers);
                entry.result = Some("in flight upstream; retrying".into());
                entry.retry_after_ms = Some(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
                log.push(RecoveryStep::Resend(entry));
                if sends < MAX_SENDS {
                    let left = deadline.saturating_duration_since(Instant::now());
                    tokio::time::sleep(wait.min(left)).await;
                }
            }
            other => {
                let why = match other {
                    409 | 402 => "stopped: the upstream refused the re-sent payment",
                    _ => "stopped: unexpected answer",
                };
                entry.result = Some(why.into());
                log.push(RecoveryStep::Resend(entry));
                break;
            }
        }
    }
    lost(log, sends)
}

/// What the chain says of a re-sent 200.
enum Checked {
    /// The original answer: it names the transaction that settled the payment.
    Original(String),
    /// The chain could not be read: nothing decided. The re-send is byte-identical and answered
    /// from the upstream's cache, so it is asked again (within the bounds) and, if the chain
    /// stays unreadable, left worth retrying for `reconcile`.
    Unread,
    /// It does not name that transaction.
    NotOriginal,
}

/// Checks a re-sent 200 against the chain; `entry` records the verdict.
async fn check_answer(
    proof: Proof<'_>,
    row: &PaymentRow,
    resp: &UpstreamResponse,
    mut entry: Exchange,
) -> (Exchange, Checked) {
    let claim = parse_settlement(&resp.headers).ok().flatten();
    let claimed = claim.as_ref().and_then(|c| c.transaction.clone());
    let checked = match proven(proof, row, claim.as_ref()).await {
        Ok(Some(p)) => {
            entry.result = Some("recovered".into());
            entry.transaction = Some(p.clone());
            return (entry, Checked::Original(p));
        }
        Err(ChainUnread(e)) => {
            entry.result = Some("the chain could not be read to check the answer; retrying".into());
            entry.error = Some(format!("chain unreadable: {e}"));
            Checked::Unread
        }
        Ok(None) => {
            entry.result = Some(
                "refused: the answer's PAYMENT-RESPONSE does not name the transaction that used this payment".into(),
            );
            Checked::NotOriginal
        }
    };
    entry.claimed_transaction = claimed;
    (entry, checked)
}

/// Whether a recovery that ended lost with `log` may be worth trying again later: it was cut
/// short while the upstream might still answer (its last attempt was a 503 "still in
/// flight", a transport error, an answer the chain could not be read to check, or the
/// deadline). A refusal (409, 402), a wrong or
/// unexpected answer, or nothing to re-send are final.
pub fn worth_retrying(log: &[RecoveryStep]) -> bool {
    match log.last() {
        Some(RecoveryStep::Resend(e)) => e.error.is_some() || e.status == Some(503),
        Some(RecoveryStep::Stop { .. }) => true,
        _ => false,
    }
}

/// `Retry-After` in seconds (an HTTP date is not honoured: 1 s), at most [`MAX_RETRY_AFTER`].
fn retry_after(headers: &HeaderMap) -> Duration {
    headers
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(Duration::from_secs(1), Duration::from_secs)
        .min(MAX_RETRY_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_bounded_and_defaults_to_a_second() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h), Duration::from_secs(1));
        h.insert(RETRY_AFTER, HeaderValue::from_static("2"));
        assert_eq!(retry_after(&h), Duration::from_secs(2));
        h.insert(RETRY_AFTER, HeaderValue::from_static("3600"));
        assert_eq!(retry_after(&h), MAX_RETRY_AFTER);
        h.insert(RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"));
        assert_eq!(retry_after(&h), Duration::from_secs(1));
    }

    #[test]
    fn only_a_recovery_cut_short_is_worth_retrying() {
        let retry = |log: Value| worth_retrying(&serde_json::from_value::<Vec<RecoveryStep>>(log).unwrap());
        assert!(!retry(json!([])));
        assert!(!retry(json!([{"action": "none", "why": "not advertised"}])));
        assert!(!retry(json!([{"action": "resend", "status": 409}])));
        assert!(!retry(json!([{"action": "resend", "status": 402}])));
        assert!(!retry(json!([{"action": "resend", "status": 200, "result": "refused"}])));
        assert!(!retry(json!([{"action": "resend", "status": 503}, {"action": "resend", "status": 500}])));
        assert!(retry(json!([{"action": "resend", "status": 503}])));
        assert!(retry(json!([{"action": "resend", "error": "connection refused"}])));
        assert!(retry(json!([{"action": "resend", "status": 503}, {"action": "stop", "why": "route deadline"}])));
    }

    #[test]
    fn a_stored_request_reads_back_as_sent() {
        let mut headers = HeaderMap::new();
        headers.append("accept", HeaderValue::from_static("application/json"));
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("x-a", HeaderValue::from_static("2"));
        let req = UpstreamRequest {
            protocol: Protocol::Http,
            method: Method::POST,
            url: Url::parse("http://example.test/p?q=1&q=2").unwrap(),
            headers,
            body: Some(b"{\"a\":1}".to_vec()),
        };
        let sent = as_sent(&req).unwrap();
        let pairs: Vec<(String, String)> = serde_json::from_slice(&sent.headers).unwrap();
        assert_eq!(pairs.len(), 3);
        assert_eq!(sent.method, "POST");
        assert_eq!(sent.url, "http://example.test/p?q=1&q=2");
        let exact = crate::payments::sealed::Exact {
            request: Some(sent),
            header_value: String::new(),
            requirement_json: b"{}".to_vec(),
            context_json: b"{}".to_vec(),
            advertised_extensions: None,
        };
        let back = stored_request(&Opened::Exact(Box::new(exact))).unwrap();
        assert_eq!((back.method, back.url, back.headers, back.body), (req.method, req.url, req.headers, req.body));
        let dropped = stored_request(&Opened::Dropped).unwrap_err().0;
        assert!(dropped.starts_with("the request as sent was dropped"), "{dropped}");
    }

    #[test]
    fn a_stored_tool_call_reads_back_as_a_tool_call() {
        let call = crate::relay::request::RouteCall::parse(
            br#"{"mcp":{"url":"http://example.test/mcp","tool":"t","arguments":{"b":1,"a":2}}}"#,
            "/route",
            "",
        )
        .unwrap();
        let sent = as_sent(&call.upstream).unwrap();
        assert_eq!(sent.method, "MCP");
        assert_eq!(sent.body.as_deref(), Some(&br#"{"arguments":{"a":2,"b":1},"name":"t"}"#[..]));
        let exact = crate::payments::sealed::Exact {
            request: Some(sent),
            header_value: String::new(),
            requirement_json: b"{}".to_vec(),
            context_json: b"{}".to_vec(),
            advertised_extensions: None,
        };
        let back = stored_request(&Opened::Exact(Box::new(exact))).unwrap();
        assert_eq!((back.protocol, back.method, back.body), (Protocol::Mcp, Method::POST, call.upstream.body));
    }
}
