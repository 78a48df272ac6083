//! Vouchers paid ahead (issue 40, item 6): once the router knows an upstream's batch-settlement
//! terms, a call's first request carries the voucher, signed on the lane the router holds for
//! it, at the lane's charged total plus the known price, and recorded before it leaves. A server
//! that changed its price in between answers a corrective 402: checked as on the ordinary path,
//! nothing is charged twice and no voucher is left above what the lane records.
//!
//! The upstream is an in-process batch-settlement server that keeps its own account of the
//! channel (what it charged, the voucher it holds) and settles a voucher only at exactly its
//! charged total plus its current price, as the official server does.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine;
use serde_json::{Value, json};

use crate::batch::{app_on, hostile, lanes};
use crate::helpers::*;

/// The server's account of one channel it is paid on.
#[derive(Default, Clone)]
struct Channel {
    charged: u64,
    /// The highest voucher it took: its ceiling and signature.
    held: Option<(u64, String)>,
}

/// The server's accounts, by channel id, and every voucher it was sent (channel, ceiling).
#[derive(Default)]
struct Account {
    channels: std::collections::HashMap<String, Channel>,
    sent: Vec<(String, u64)>,
}

impl Account {
    fn ceilings(&self) -> Vec<u64> {
        self.sent.iter().map(|(_, c)| *c).collect()
    }

    fn charged(&self) -> u64 {
        self.channels.values().map(|c| c.charged).sum()
    }
}

struct Server {
    port: u16,
    price: Arc<AtomicU64>,
    probes: Arc<AtomicUsize>,
    account: Arc<Mutex<Account>>,
    handle: actix_web::dev::ServerHandle,
}

impl Drop for Server {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

fn terms(token: &str, price: u64, extra: Value) -> Value {
    let mut t = hostile::required(token, 900, extra);
    t["accepts"][0]["amount"] = json!(price.to_string());
    t
}

/// What the server answers a paid request (`payload` is the decoded payment header).
fn answer(token: &str, price: u64, account: &Mutex<Account>, payload: &Value) -> HttpResponse {
    let voucher = &payload["payload"]["voucher"];
    let ceiling: u64 = voucher["maxClaimableAmount"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
    let id = voucher["channelId"].as_str().unwrap_or_default().to_owned();
    let mut all = account.lock().unwrap();
    all.sent.push((id.clone(), ceiling));
    let a = all.channels.entry(id).or_default();
    if ceiling == a.charged + price {
        a.charged = ceiling;
        a.held = Some((ceiling, voucher["signature"].as_str().unwrap_or_default().to_owned()));
        let settled = json!({"success": true, "network": "eip155:84532", "transaction": ""});
        let header = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&settled).unwrap());
        return HttpResponse::Ok().insert_header(("PAYMENT-RESPONSE", header)).json(json!({"served": true}));
    }
    // A corrective 402: its account of the channel, with the voucher it holds (ours).
    let (held, signature) = a.held.clone().unwrap_or_default();
    let mut body = terms(
        token,
        price,
        json!({
            "channelState": {"channelId": voucher["channelId"], "balance": "100000", "totalClaimed": "0",
                             "chargedCumulativeAmount": a.charged.to_string()},
            "voucherState": {"signedMaxClaimable": held.to_string(), "signature": signature},
        }),
    );
    body["error"] = json!(x402::batch::ERR_CUMULATIVE_MISMATCH);
    hostile::header_402(&body)
}

async fn start(token: &str, price: u64) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (price, probes, account) =
        (Arc::new(AtomicU64::new(price)), Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Account::default())));
    let (p, n, a, t) = (Arc::clone(&price), Arc::clone(&probes), Arc::clone(&account), token.to_owned());
    let server = HttpServer::new(move || {
        let (p, n, a, t) = (Arc::clone(&p), Arc::clone(&n), Arc::clone(&a), t.clone());
        App::new().default_service(web::to(move |req: HttpRequest| {
            let (p, n, a, t) = (Arc::clone(&p), Arc::clone(&n), Arc::clone(&a), t.clone());
            async move {
                let price = p.load(Ordering::SeqCst);
                let Some(sig) = req.headers().get("PAYMENT-SIGNATURE") else {
                    n.fetch_add(1, Ordering::SeqCst);
                    return hostile::header_402(&terms(&t, price, json!({})));
                };
                let bytes = base64::engine::general_purpose::STANDARD.decode(sig.as_bytes()).unwrap();
                let payload: Value = serde_json::from_slice(&bytes).unwrap();
                answer(&t, price, &a, &payload)
            }
        }))
    })
    .workers(1)
    .shutdown_timeout(0)
    .listen(listener)
    .unwrap()
    .run();
    let handle = server.handle();
    tokio::spawn(server);
    Server { port, price, probes, account, handle }
}

async fn route(app: &TestApp, body: &Value) -> (u16, Value) {
    let resp = app.route(&new_key(), body).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// The sum of what the ledger says the agent was charged (settled payments).
async fn settled_sum(app: &TestApp) -> i64 {
    count(&app.db, "SELECT COALESCE(sum(amount), 0)::bigint AS n FROM payments WHERE status = 'settled'").await
}

#[actix_web::test]
async fn a_voucher_on_known_terms_leaves_with_the_first_request_at_the_lanes_next_ceiling() {
    let chain = Devnet::start().await;
    let server = start(&chain.token.to_string(), 1000).await;
    let app = app_on(&chain, &[]).await;
    let body = json!({"url": format!("http://127.0.0.1:{}/batch", server.port), "max_amount": "1000"});
    for i in 0..3 {
        let (status, env) = route(&app, &body).await;
        assert_eq!(status, 200, "call {i}: {env}");
        assert_eq!(env["payment"]["status"], "settled", "call {i}: {env}");
    }
    // One unpaid probe learnt the terms; every later call paid with its first request.
    assert_eq!(server.probes.load(Ordering::SeqCst), 1, "the known terms were paid ahead");
    assert_eq!(server.account.lock().unwrap().ceilings(), vec![1000, 2000, 3000]);
    let l = lanes(&app).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!((l[0]["signed"].as_str(), l[0]["charged"].as_str()), (Some("3000"), Some("3000")), "{l:?}");
    assert!(l[0]["in_flight"].is_null(), "{l:?}");
    assert_eq!(settled_sum(&app).await, 3000);
}

/// The attacker's move: a server raises its price once the router knows its terms, and answers
/// the voucher paid ahead at the old price with a corrective 402. The router believes it only
/// after checking it (our signature on the voucher it holds, charged ≤ signed), then pays the
/// new price within the call with a voucher above the refused one, over the same intent: the
/// server can claim at most that ceiling, which the agent is charged; the server's account, the
/// ledger's and the lane's agree.
#[actix_web::test]
async fn a_price_raised_after_the_terms_were_learnt_is_paid_once_within_the_call() {
    let chain = Devnet::start().await;
    let server = start(&chain.token.to_string(), 1000).await;
    let app = app_on(&chain, &[]).await;
    let body = json!({"url": format!("http://127.0.0.1:{}/batch", server.port), "max_amount": "2000"});
    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (200, Some("settled")), "{env}");
    server.price.store(1500, Ordering::SeqCst);

    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (200, Some("settled")), "{env}");
    assert_eq!(env["payment"]["amount"], "1500", "{env}");
    assert_eq!(server.account.lock().unwrap().ceilings(), vec![1000, 2000, 2500], "refused at 2000, paid at 2500");
    assert_eq!(server.account.lock().unwrap().charged(), 2500);
    assert_eq!(settled_sum(&app).await, 2500, "the ledger charged the agent what the server charged");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 2, "one intent per call");
    let l = lanes(&app).await;
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!((l[0]["signed"].as_str(), l[0]["charged"].as_str()), (Some("2500"), Some("2500")), "{l:?}");
    assert!(l[0]["in_flight"].is_null(), "{l:?}");
    // The new terms are known: the next call pays them ahead.
    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["payment"]["amount"].as_str()), (200, Some("1500")), "{env}");
    assert_eq!(server.probes.load(Ordering::SeqCst), 1);
    assert_eq!(server.account.lock().unwrap().charged(), 4000);
}

/// A price cut after the terms were learnt: the voucher paid ahead at the old price is refused
/// (its corrective 402 checked), nothing is charged for it, and it is not outbid below its
/// ceiling on its lane (never a voucher below one signed): the call fails clearly, and the
/// next pays the new price on another lane. A voucher the server holds is never above what the
/// router's lanes record.
#[actix_web::test]
async fn a_price_cut_after_the_terms_were_learnt_charges_nothing_for_the_refused_voucher() {
    let chain = Devnet::start().await;
    let server = start(&chain.token.to_string(), 1000).await;
    let app = app_on(&chain, &[]).await;
    let body = json!({"url": format!("http://127.0.0.1:{}/batch", server.port), "max_amount": "1000"});
    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (200, Some("settled")), "{env}");
    server.price.store(400, Ordering::SeqCst);

    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["code"].as_str()), (502, Some("payment_rejected")), "{env}");
    assert_eq!(env["payment"]["status"], "rejected", "the server's checked state says it took nothing: {env}");
    let l = lanes(&app).await;
    assert_eq!((l[0]["signed"].as_str(), l[0]["charged"].as_str()), (Some("2000"), Some("1000")), "{l:?}");

    let (status, env) = route(&app, &body).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (200, Some("settled")), "{env}");
    assert_eq!(env["payment"]["amount"], "400", "{env}");
    {
        let account = server.account.lock().unwrap();
        assert_eq!(account.ceilings(), vec![1000, 2000, 400], "the new price on a new channel");
        assert_ne!(account.sent[2].0, account.sent[0].0);
        assert_eq!(account.charged(), 1400);
    }
    assert_eq!(settled_sum(&app).await, 1400, "the ledger charged the agent what the server charged");
    let l = lanes(&app).await;
    assert_eq!(l.len(), 2, "{l:?}");
    let signed: u64 = l.iter().map(|x| x["signed"].as_str().unwrap().parse::<u64>().unwrap()).sum();
    assert_eq!(signed, 2400, "every voucher out is on record: {l:?}");
}
