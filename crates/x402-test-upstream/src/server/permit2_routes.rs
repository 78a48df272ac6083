//! The Permit2 routes (x402 v2 only):
//!
//! - `GET /v2/permit2`: `exact` via Permit2 (`extra.assetTransferMethod: "permit2"`): verifies,
//!   settles the price through the exact proxy, answers 200 with `PAYMENT-RESPONSE`.
//! - `GET /v2/upto?used=N`: `upto`, maximum = the price, `extra.facilitatorAddress` = this
//!   server's facilitator key; settles N ≤ maximum through the upto proxy (N absent: the
//!   maximum; 0: no transaction) and claims `PAYMENT-RESPONSE.amount = N`. Hostile:
//!   `&claim=M` claims M whatever was settled.
//!
//! `/v2/permit2?token=plain` asks for the token without EIP-3009 (`serve --plain-token`);
//! `&offer=eip3009` then offers EIP-3009 `exact` in it instead (which no client can pay).
//! `/v2/permit2?token=permit` asks for the token with EIP-2612 and without EIP-3009
//! (`serve --permit-token`); `&gas=eip2612` offers the `eip2612GasSponsoring` extension: a
//! payment carrying the payer's permit is settled with the proxy's `settleWithPermit` (the
//! facilitator pays the gas of the approval). Hostile offers, which no payer should sign for:
//! `&gas=spender` names another spender than Permit2, `&gas=deadline` an absurd deadline,
//! `&gas=chain` another chain, `&gas=domain` a token name that is not the token's.
//!
//! Hostile endings after settling (money moved, no answer served): `&end=402` answers a bare
//! 402 (no settlement header), `&end=412` a 412 `permit2_allowance_required`, `&end=drop`
//! closes the connection without an answer, `&end=pending` answers 402 `settlement_pending`
//! naming the settling transaction.
//!
//! `?price=N` asks N instead of the configured price (the upto maximum too).
//!
//! Both take `?seconds=S`: answer S seconds after settling (the handler still running), and
//! `?pid=1`: advertise `payment-identifier` and answer a re-send of the same id and payment
//! from the response cache (503 while the original is still running), like `/v2/pid`.

use std::str::FromStr;
use std::time::Duration;

use actix_web::web::{self};
use actix_web::{HttpRequest, HttpResponse};
use alloy::primitives::{Address, U256};
use serde_json::{Value, json};

use crate::permit2::{self, Expected, Permit2Payment, Refused};
use crate::wire;

use super::*;

/// Path of the exact-via-Permit2 route.
pub(super) const PERMIT2_PATH: &str = "/v2/permit2";
/// Path of the upto route.
pub(super) const UPTO_PATH: &str = "/v2/upto";

/// How a paid request ends after its settlement (`&end=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// 200 with the answer and `PAYMENT-RESPONSE` (the default).
    Answer,
    /// A bare 402: the payment "refused" after it settled.
    Refused402,
    /// 412 `permit2_allowance_required` after it settled.
    Refused412,
    /// The connection closed without an answer.
    Drop,
    /// 402 `settlement_pending` naming the settling transaction.
    Pending,
}

/// The `eip2612GasSponsoring` offer of `?gas=`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gas {
    /// The extension as the spec declares it (the client fills every value).
    Eip2612,
    /// Hostile: names a spender other than Permit2.
    WrongSpender,
    /// Hostile: names a deadline centuries away.
    AbsurdDeadline,
    /// Hostile: names another chain.
    WrongChain,
    /// Hostile: the requirement's `extra.name` is not the token's EIP-712 name.
    WrongDomain,
}

/// `info.description` of the `eip2612GasSponsoring` offer; a payment must echo it, as the
/// official server checks (`extension_echo_mismatch`).
const GAS_DESCRIPTION: &str = "The facilitator accepts an EIP-2612 permit to the canonical Permit2 contract.";

/// PermitToken's EIP-712 domain (contracts/PermitToken.sol).
const PERMIT_TOKEN_NAME: &str = "Permit Dollar";
const PERMIT_TOKEN_VERSION: &str = "1";

/// The 402's extensions: `payment-identifier` (`?pid=1`) and the gas-sponsoring offer (`?gas=`).
fn extensions(query: &P2Query, token: Address) -> Option<Value> {
    let mut map = serde_json::Map::new();
    if query.pid
        && let Value::Object(pid) = wire::payment_identifier_declaration()
    {
        map.extend(pid);
    }
    if let Some(gas) = query.gas {
        let mut info = json!({ "description": GAS_DESCRIPTION, "version": "1" });
        match gas {
            Gas::Eip2612 | Gas::WrongDomain => {}
            Gas::WrongSpender => info["spender"] = json!(token.to_checksum(None)),
            Gas::AbsurdDeadline => info["deadline"] = json!("99999999999999999999"),
            Gas::WrongChain => info["chainId"] = json!(1),
        }
        map.insert("eip2612GasSponsoring".into(), json!({ "info": info, "schema": { "type": "object" } }));
    }
    (!map.is_empty()).then_some(Value::Object(map))
}

struct P2Query {
    end: End,
    used: Option<U256>,
    claim: Option<U256>,
    seconds: u64,
    pid: bool,
    plain: bool,
    /// `?token=permit`: PermitToken.
    permit_token: bool,
    /// `?gas=`: the gas-sponsoring offer, if any.
    gas: Option<Gas>,
    offer_eip3009: bool,
    /// `?price=N`: the price (the upto maximum) instead of the configured one.
    price: Option<U256>,
}

fn parse_query(raw: &str) -> Result<P2Query, String> {
    let mut q = P2Query {
        end: End::Answer,
        used: None,
        claim: None,
        seconds: 0,
        pid: false,
        plain: false,
        permit_token: false,
        gas: None,
        offer_eip3009: false,
        price: None,
    };
    let uint = |v: &str, name: &str| {
        if v.is_empty() || v.len() > 78 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{name} must be a decimal amount"));
        }
        U256::from_str_radix(v, 10).map_err(|_| format!("{name} overflows"))
    };
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        match &*key {
            "used" => q.used = Some(uint(&value, "used")?),
            "end" => {
                q.end = match &*value {
                    "402" => End::Refused402,
                    "412" => End::Refused412,
                    "drop" => End::Drop,
                    "pending" => End::Pending,
                    _ => return Err("end must be 402, 412, drop or pending".into()),
                }
            }
            "claim" => q.claim = Some(uint(&value, "claim")?),
            "pid" => q.pid = value == "1",
            "token" => {
                q.plain = value == "plain";
                q.permit_token = value == "permit";
            }
            "gas" => {
                q.gas = Some(match &*value {
                    "eip2612" => Gas::Eip2612,
                    "spender" => Gas::WrongSpender,
                    "deadline" => Gas::AbsurdDeadline,
                    "chain" => Gas::WrongChain,
                    "domain" => Gas::WrongDomain,
                    _ => return Err("gas must be eip2612, spender, deadline, chain or domain".into()),
                })
            }
            "offer" => q.offer_eip3009 = value == "eip3009",
            "price" => q.price = Some(uint(&value, "price")?).filter(|p| !p.is_zero()),
            "seconds" => {
                q.seconds = u64::from_str(&value)
                    .ok()
                    .filter(|s| *s <= MAX_SECONDS)
                    .ok_or_else(|| format!("seconds must be 0..={MAX_SECONDS}"))?;
            }
            _ => {}
        }
    }
    Ok(q)
}

/// `GET /v2/permit2` and `GET /v2/upto`.
pub(super) async fn permit2_paid(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let path: &'static str = if req.path() == UPTO_PATH { UPTO_PATH } else { PERMIT2_PATH };
    let upto = path == UPTO_PATH;
    state.stats.update(path, |s| s.requests += 1);
    let query = match parse_query(&state.query_of(&req)) {
        Ok(q) => q,
        Err(message) => return bad_request(&message),
    };
    let s = &state.settings;
    let facilitator_address = state.facilitator.chain().sender();
    let used = query.used.unwrap_or(query.price.unwrap_or(s.price));
    if !upto && query.used.is_some() {
        return bad_request("used is for /v2/upto only");
    }
    if used > query.price.unwrap_or(s.price) {
        return bad_request("used must not exceed the maximum (the price)");
    }
    if (query.plain || query.permit_token || query.offer_eip3009 || query.gas.is_some()) && upto {
        return bad_request("token, offer and gas are for /v2/permit2 only");
    }
    let token = if query.plain {
        match s.plain_token {
            Some(t) => t,
            None => return bad_request("this server has no --plain-token"),
        }
    } else if query.permit_token {
        match s.permit_token {
            Some(t) => t,
            None => return bad_request("this server has no --permit-token"),
        }
    } else {
        s.token
    };
    let requirement = requirement(s, &query, upto, token, facilitator_address);
    let url = resource_url(&req);
    let required = |error: &str| wire::PaymentRequiredV2 {
        x402_version: 2,
        error: error.to_owned(),
        resource: wire::ResourceInfo {
            url: url.clone(),
            description: if upto { "Metered answer (upto, Permit2)" } else { "Weather (exact via Permit2)" }.into(),
            mime_type: "application/json".into(),
        },
        accepts: vec![requirement.clone()],
        extensions: extensions(&query, token),
    };
    let Some(payload) =
        req.headers().get(wire::PAYMENT_SIGNATURE).and_then(|h| wire::decode_header::<Value>(h.as_bytes()))
    else {
        return payment_required_v2(&required("Payment required"), json!({}));
    };
    state.stats.update(path, |st| st.payment_attempts += 1);
    let pid = payload
        .pointer("/extensions/payment-identifier/info/id")
        .and_then(Value::as_str)
        .filter(|_| query.pid)
        .map(str::to_owned);
    if let Some(answer) = pid.as_deref().and_then(|id| cached_answer(&state, path, &req, b"", id, false)) {
        return answer;
    }
    let outcome = handle_paid(&state, path, &query, &payload, &requirement, &required).await;
    match (outcome, pid) {
        (Ok(stored), Some(id)) => {
            state.pid_cache.finish(&id, stored.clone());
            state.stats.update(path, |st| st.pid_completed += 1);
            stored.response()
        }
        (Ok(stored), None) => stored.response(),
        (Err(r), Some(id)) => {
            state.pid_cache.forget(&id);
            r
        }
        (Err(r), None) => r,
    }
}

/// The one requirement a Permit2 route offers: `exact` (Permit2, or EIP-3009 on request) or
/// `upto` (which names the facilitator that may settle it).
fn requirement(s: &Settings, query: &P2Query, upto: bool, token: Address, facilitator: Address) -> wire::RequirementV2 {
    let method = if query.offer_eip3009 { "eip3009" } else { "permit2" };
    let (name, version) = match (query.permit_token, query.gas) {
        (true, Some(Gas::WrongDomain)) => ("Not The Token", PERMIT_TOKEN_VERSION),
        (true, _) => (PERMIT_TOKEN_NAME, PERMIT_TOKEN_VERSION),
        (false, _) => (s.token_name.as_str(), s.token_version.as_str()),
    };
    let mut extra = json!({
        "name": name, "version": version, "assetTransferMethod": method,
    });
    if upto && let Some(map) = extra.as_object_mut() {
        map.insert("facilitatorAddress".into(), json!(facilitator.to_checksum(None)));
    }
    wire::RequirementV2 {
        scheme: if upto { "upto".into() } else { "exact".into() },
        network: s.network.clone(),
        amount: query.price.unwrap_or(s.price).to_string(),
        asset: token.to_checksum(None),
        pay_to: s.pay_to.to_checksum(None),
        max_timeout_seconds: s.max_timeout_seconds,
        extra,
    }
}

/// Verifies and settles a decoded payment: the answer to store, or a refusal.
async fn handle_paid(
    state: &AppState,
    path: &'static str,
    query: &P2Query,
    payload: &Value,
    requirement: &wire::RequirementV2,
    required: &dyn Fn(&str) -> wire::PaymentRequiredV2,
) -> Result<pid_cache::StoredAnswer, HttpResponse> {
    let upto = path == UPTO_PATH;
    let s = &state.settings;
    let facilitator_address = state.facilitator.chain().sender();
    let used = query.used.unwrap_or(query.price.unwrap_or(s.price));
    let refused = |r: Refused| {
        tracing::info!(route = path, reason = r.reason, error = %r.message, "payment refused");
        state.stats.update(path, |st| st.refused += 1);
        payment_required_v2(&required(r.reason), json!({}))
    };
    if payload.get("x402Version").and_then(Value::as_u64) != Some(2) {
        return Err(refused(Refused { reason: "invalid_x402_version", message: "x402Version must be 2".into() }));
    }
    if !accepted_matches(payload.get("accepted"), requirement) {
        let r = Refused { reason: "No matching payment requirements", message: "accepted differs".into() };
        return Err(refused(r));
    }
    let no_payload = || Refused { reason: "invalid_payload", message: "no payload".into() };
    let mut payment = match payload.get("payload").ok_or_else(no_payload).and_then(Permit2Payment::parse) {
        Ok(p) => p,
        Err(r) => return Err(refused(r)),
    };
    let chain_id = chain_id_of(&s.network).unwrap_or_default();
    if let Err(r) = take_permit(state, path, query.gas, payload, &mut payment, chain_id) {
        return Err(refused(r));
    }
    let expected = Expected {
        upto,
        chain_id,
        token: Address::from_str(&requirement.asset).map_err(|e| internal_error(&e))?,
        amount: query.price.unwrap_or(s.price),
        pay_to: s.pay_to,
        facilitator: facilitator_address,
    };
    if let Err(r) = permit2::verify(&state.facilitator, &payment, &expected).await {
        return Err(refused(r));
    }
    let moved = if upto { used } else { query.price.unwrap_or(s.price) };
    let transaction = if moved.is_zero() {
        None
    } else {
        match settle_in_task(state, path, payment.clone(), moved).await {
            Ok(tx) => Some(tx),
            Err(r) => return Err(refused(r)),
        }
    };
    if query.seconds > 0 {
        tokio::time::sleep(Duration::from_secs(query.seconds)).await;
    }
    if query.end != End::Answer {
        return Err(ended(state, query.end, required, transaction, payment.from));
    }
    let claimed = query.claim.unwrap_or(moved);
    if claimed != moved {
        tracing::warn!(route = path, %moved, %claimed, "claiming another amount than was settled");
    }
    let settlement = json!({
        "success": true,
        "transaction": transaction.map(|t| format!("{t:#x}")).unwrap_or_default(),
        "network": s.network,
        "payer": payment.from.to_checksum(None),
        "amount": claimed.to_string(),
    });
    let header = wire::encode_header(&settlement).map_err(|err| internal_error(&err))?;
    let body = json!({
        "route": path, "city": "Paris", "forecast": "sunny", "charged": claimed.to_string(),
        "handled_for_seconds": query.seconds,
    });
    let body = serde_json::to_vec(&body).map_err(|err| internal_error(&err))?;
    Ok(pid_cache::StoredAnswer { status: actix_web::http::StatusCode::OK, body, settlement: Some(header) })
}

/// The payer's EIP-2612 permit of `payload`, checked and attached to `payment`: used only where
/// the extension was offered (and only the honest offer is ever paid here). Each distinct
/// permit signature is counted in the route's `permits`.
fn take_permit(
    state: &AppState,
    path: &'static str,
    gas: Option<Gas>,
    payload: &Value,
    payment: &mut Permit2Payment,
    chain_id: u64,
) -> Result<(), Refused> {
    if gas != Some(Gas::Eip2612) {
        return Ok(());
    }
    let Some(permit) = permit2::Eip2612Permit::parse(payload)? else { return Ok(()) };
    if payload.pointer("/extensions/eip2612GasSponsoring/info/description") != Some(&json!(GAS_DESCRIPTION)) {
        return Err(Refused { reason: "extension_echo_mismatch", message: "the offer's info is not echoed".into() });
    }
    let sig = alloy::hex::encode_prefixed(permit.signature.as_bytes());
    state.stats.update(path, |st| {
        if !st.permits.contains(&sig) {
            st.permits.push(sig.clone());
        }
    });
    permit.check(payment, (PERMIT_TOKEN_NAME, PERMIT_TOKEN_VERSION, chain_id), crate::payment::unix_now())?;
    payment.permit = Some(permit);
    Ok(())
}

/// A hostile ending after the payment settled (`&end=`): no answer is served.
fn ended(
    state: &AppState,
    end: End,
    required: &dyn Fn(&str) -> wire::PaymentRequiredV2,
    transaction: Option<alloy::primitives::B256>,
    payer: Address,
) -> HttpResponse {
    tracing::warn!(?end, ?transaction, "settled; ending without the answer");
    match (end, transaction) {
        (End::Refused412, _) => {
            super::pending_routes::precondition_v2(&required(super::pending_routes::PERMIT2_ALLOWANCE_REQUIRED))
        }
        (End::Drop, _) => dropped_connection(),
        (End::Pending, Some(transaction)) => {
            super::pending_routes::pending_v2(state, &super::paid_routes::Settled { transaction, payer })
        }
        _ => payment_required_v2(&required("unexpected_settle_error"), json!({})),
    }
}

/// The client's `accepted` is the offer (addresses compared as addresses).
fn accepted_matches(accepted: Option<&Value>, offer: &wire::RequirementV2) -> bool {
    let Some(a) = accepted else { return false };
    let field = |k: &str| a.get(k).and_then(Value::as_str);
    let same_address = |k: &str, want: &str| {
        field(k).and_then(|v| Address::from_str(v).ok()).is_some_and(|v| Address::from_str(want).ok() == Some(v))
    };
    field("scheme") == Some(offer.scheme.as_str())
        && field("network") == Some(offer.network.as_str())
        && field("amount") == Some(offer.amount.as_str())
        && same_address("asset", &offer.asset)
        && same_address("payTo", &offer.pay_to)
}

/// Settles in a task of its own, so that a client hanging up cannot cancel it half way.
async fn settle_in_task(
    state: &AppState,
    path: &'static str,
    payment: Permit2Payment,
    amount: U256,
) -> Result<alloy::primitives::B256, Refused> {
    let facilitator = state.facilitator.clone();
    let stats = state.stats.clone();
    let task = actix_rt::spawn(async move {
        let result = permit2::settle(&facilitator, &payment, amount).await;
        match &result {
            Ok(tx) => {
                tracing::info!(route = path, payer = %payment.from, %amount, %tx, "settled through the Permit2 proxy");
                let sponsored = payment.permit.is_some();
                stats.update(path, |s| {
                    s.paid += 1;
                    s.sponsored += u64::from(sponsored);
                    s.last_paid_amount = Some(amount.to_string());
                    s.last_transaction = Some(format!("{tx:#x}"));
                });
            }
            Err(r) => tracing::warn!(route = path, reason = r.reason, error = %r.message, "settlement failed"),
        }
        result
    });
    match task.await {
        Ok(result) => result,
        Err(join) => Err(Refused { reason: "unexpected_settle_error", message: format!("settlement task: {join}") }),
    }
}
