//! Reconciling and closing batch-settlement channels (issue 40, item 4): the router pays the
//! official batch server (interop/server.mjs GET /v2/batch, the official facilitator), then an
//! operator closes the channel: a cooperative refund over HTTP, or, when the server does not
//! refund, the wallet's `initiateWithdraw` and, after the withdraw delay (time passed on anvil),
//! `finalizeWithdraw`; counted on-chain. A server that claims more than it charged is flagged by
//! reconcile. Closing is admin-only.

use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use alloy::primitives::{Address, Bytes, U256, address};
use alloy::sol;
use alloy::sol_types::SolCall;
use base64::Engine;
use serde_json::{Value, json};
use x402_router::operators::Role;

use crate::helpers::*;

/// interop/server.mjs: /v2/batch's payee (anvil #5) and price.
const BATCH_PAY_TO: Address = address!("0x9965507D1a55bcC2695C58ba16FB37d819B0A4dc");
const BATCH_PRICE: u64 = 1000;
/// The router deposits ten times the price.
const DEPOSIT: u64 = 10 * BATCH_PRICE;
const SETTLEMENT: Address = address!("0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003");

sol! {
    struct ChannelConfig {
        address payer;
        address payerAuthorizer;
        address receiver;
        address receiverAuthorizer;
        address token;
        uint40 withdrawDelay;
        bytes32 salt;
    }
    struct Voucher { ChannelConfig channel; uint128 maxClaimableAmount; }
    struct VoucherClaim { Voucher voucher; bytes signature; uint128 totalClaimed; }
    function claim(VoucherClaim[] voucherClaims) external;
}

async fn app_on(chain: &Devnet) -> TestApp {
    paid_app_with(chain, &[("x402-schemes", "batch-settlement")]).await
}

async fn pay(app: &TestApp, url: &str) -> (u16, Value) {
    let resp = app.route(&new_key(), &json!({"url": url, "max_amount": BATCH_PRICE.to_string()})).await;
    (resp.status().as_u16(), resp.json().await.unwrap())
}

async fn admin_call(app: &TestApp, token: &str, method: reqwest::Method, path: &str) -> (u16, Value) {
    let mut req = app.client.request(method.clone(), format!("{}{path}", app.address)).bearer_auth(token);
    if method == reqwest::Method::POST {
        req = req.json(&json!({}));
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn channels(app: &TestApp) -> Vec<Value> {
    let (status, body) = admin_call(app, &app.viewer_token, reqwest::Method::GET, "/admin/channels").await;
    assert_eq!(status, 200, "{body}");
    body["channels"].as_array().cloned().unwrap()
}

async fn close(app: &TestApp, token: &str, id: &str) -> (u16, Value) {
    admin_call(app, token, reqwest::Method::POST, &format!("/admin/channels/{id}/close")).await
}

async fn reconcile(app: &TestApp, admin: &str) -> Value {
    let (status, report) = admin_call(app, admin, reqwest::Method::POST, "/admin/reconcile").await;
    assert_eq!(status, 200, "{report}");
    report
}

#[actix_web::test]
async fn closing_a_channel_refunds_the_unclaimed_rest_counted_on_chain_and_only_an_admin_may() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain).await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let (router0, payee0, escrow0) =
        (chain.balance(ROUTER_ADDRESS).await, chain.balance(BATCH_PAY_TO).await, chain.balance(SETTLEMENT).await);
    let n = 3u64;
    for i in 0..n {
        let (status, env) = pay(&app, &official.url("/v2/batch")).await;
        assert_eq!(status, 200, "call {i}: {env}");
    }
    let report = reconcile(&app, &admin).await;
    assert_eq!((report["channels_checked"].as_u64(), report["channels_flagged"].as_u64()), (Some(1), Some(0)));
    let c = channels(&app).await;
    assert_eq!(c.len(), 1, "{c:?}");
    let ch = &c[0];
    assert_eq!((ch["state"].as_str(), ch["network"].as_str()), (Some("open"), Some("eip155:84532")), "{ch}");
    assert_eq!(ch["deposited"], DEPOSIT.to_string(), "{ch}");
    assert_eq!(ch["signed_ceiling"], (n * BATCH_PRICE).to_string(), "{ch}");
    assert_eq!(ch["charged"], (n * BATCH_PRICE).to_string(), "{ch}");
    assert_eq!((ch["claimed"].as_str(), ch["refunded"].as_str()), (Some("0"), Some("0")), "{ch}");
    let id = ch["id"].as_str().unwrap().to_owned();
    let locked = async || {
        admin_call(&app, &admin, reqwest::Method::GET, "/admin/settings").await.1["wallet_locked_in_channels"].clone()
    };
    assert_eq!(
        locked().await,
        (DEPOSIT - n * BATCH_PRICE).to_string(),
        "the unclaimed rest counts against the wallet cap"
    );

    // Viewers and agents may not close it.
    assert_eq!(close(&app, &app.viewer_token, &id).await.0, 403);
    assert_eq!(close(&app, &app.agent.key, &id).await.0, 403);
    assert_eq!(channels(&app).await[0]["state"], "open");

    // The server claims and settles what it charged; the router closes: the rest comes back.
    official.claim_and_settle().await;
    let (status, done) = close(&app, &admin, &id).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["step"], "refunded", "{done}");
    assert_eq!(done["channel"]["state"], "closed", "{done}");
    assert_eq!(done["channel"]["refunded"], (DEPOSIT - n * BATCH_PRICE).to_string(), "{done}");
    assert_eq!(done["channel"]["claimed"], (n * BATCH_PRICE).to_string(), "{done}");
    assert_eq!(chain.balance(BATCH_PAY_TO).await, payee0 + U256::from(n * BATCH_PRICE));
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(n * BATCH_PRICE));
    assert_eq!(chain.balance(SETTLEMENT).await, escrow0);
    assert_eq!(locked().await, "0", "refunded: nothing locked any more");
    let events = count(&app.db, "SELECT count(*) AS n FROM operator_events WHERE action LIKE 'channel.%'").await;
    assert_eq!(events, 3, "closing, refunded, closed");
    // Closing again changes nothing; the next call opens another channel.
    assert_eq!(close(&app, &admin, &id).await.1["step"], "closed");
    let (status, env) = pay(&app, &official.url("/v2/batch")).await;
    assert_eq!(status, 200, "{env}");
    let c = channels(&app).await;
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!(c[0]["signed_ceiling"], (n * BATCH_PRICE).to_string(), "nothing signed on the closed one");
}

#[actix_web::test]
async fn a_server_that_does_not_refund_is_withdrawn_from_after_the_delay() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let app = app_on(&chain).await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let (router0, payee0) = (chain.balance(ROUTER_ADDRESS).await, chain.balance(BATCH_PAY_TO).await);
    for _ in 0..2 {
        let (status, env) = pay(&app, &official.url("/v2/batch")).await;
        assert_eq!(status, 200, "{env}");
    }
    official.claim_and_settle().await;
    // The server goes away: no cooperative refund.
    drop(official);
    let id = channels(&app).await[0]["id"].as_str().unwrap().to_owned();
    let (status, first) = close(&app, &admin, &id).await;
    assert_eq!((status, first["step"].as_str()), (200, Some("withdraw_initiated")), "{first}");
    assert_eq!(first["channel"]["state"], "closing", "{first}");
    assert!(first["channel"]["withdraw_after"].is_i64(), "{first}");
    let (status, early) = close(&app, &admin, &id).await;
    assert_eq!((status, early["step"].as_str()), (200, Some("withdraw_pending")), "{early}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(DEPOSIT), "nothing back before the delay");
    // The channel's withdraw delay (900 s) passes on the chain.
    chain.rpc("evm_increaseTime", json!([901])).await;
    chain.rpc("evm_mine", json!([])).await;
    let (status, last) = close(&app, &admin, &id).await;
    assert_eq!((status, last["step"].as_str()), (200, Some("withdraw_finalized")), "{last}");
    assert_eq!(last["channel"]["state"], "closed", "{last}");
    assert_eq!(last["channel"]["refunded"], (DEPOSIT - 2 * BATCH_PRICE).to_string(), "{last}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(2 * BATCH_PRICE));
    assert_eq!(chain.balance(BATCH_PAY_TO).await, payee0 + U256::from(2 * BATCH_PRICE));
}

/// A proxy to the official server that answers its second paid request with a corrective 402
/// saying it did not take that voucher (its state: charged the first voucher only), and keeps
/// the voucher.
struct Liar {
    port: u16,
    paid: Arc<Mutex<Vec<Value>>>,
    handle: actix_web::dev::ServerHandle,
}

impl Drop for Liar {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(v).unwrap())
}

fn unb64(s: &[u8]) -> Value {
    serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(s).unwrap()).unwrap()
}

/// What the proxy does with the second paid request.
#[derive(Clone, Copy)]
enum Second {
    /// A corrective 402: "not taken" (the server's state: the first voucher only).
    Refuse,
    /// A 200 without `PAYMENT-RESPONSE`, the voucher kept from the server (an answer that says
    /// nothing of the charge).
    Swallow,
}

async fn liar(target: String, second: Second) -> Liar {
    let paid = Arc::new(Mutex::new(Vec::<Value>::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let p = Arc::clone(&paid);
    let server = HttpServer::new(move || {
        let (p, target) = (Arc::clone(&p), target.clone());
        App::new().default_service(web::to(move |req: HttpRequest| {
            let (p, target) = (Arc::clone(&p), target.clone());
            async move {
                let client = reqwest::Client::new();
                let sig = req.headers().get("PAYMENT-SIGNATURE").map(|v| v.as_bytes().to_vec());
                if let Some(sig) = &sig {
                    let payment = unb64(sig);
                    let n = {
                        let mut g = p.lock().unwrap();
                        g.push(payment.clone());
                        g.len()
                    };
                    if n == 2 && matches!(second, Second::Swallow) {
                        return HttpResponse::Ok().json(json!({"served": "without a word on the charge"}));
                    }
                    if n == 2 {
                        let first = p.lock().unwrap()[0].clone();
                        let unpaid = client.get(&target).send().await.unwrap();
                        let mut body = unb64(unpaid.headers()["PAYMENT-REQUIRED"].as_bytes());
                        body["error"] = json!("invalid_batch_settlement_evm_cumulative_amount_mismatch");
                        body["accepts"][0]["extra"]["channelState"] = json!({
                            "channelId": payment["payload"]["voucher"]["channelId"], "balance": DEPOSIT.to_string(),
                            "totalClaimed": "0", "chargedCumulativeAmount": BATCH_PRICE.to_string()});
                        body["accepts"][0]["extra"]["voucherState"] = json!({
                            "signedMaxClaimable": BATCH_PRICE.to_string(),
                            "signature": first["payload"]["voucher"]["signature"]});
                        return HttpResponse::PaymentRequired()
                            .insert_header(("PAYMENT-REQUIRED", b64(&body)))
                            .json(json!({}));
                    }
                }
                let mut fwd = client.get(&target);
                if let Some(sig) = sig {
                    fwd = fwd.header("PAYMENT-SIGNATURE", sig);
                }
                let resp = fwd.send().await.unwrap();
                let mut out =
                    HttpResponse::build(actix_web::http::StatusCode::from_u16(resp.status().as_u16()).unwrap());
                for h in ["PAYMENT-REQUIRED", "PAYMENT-RESPONSE", "content-type"] {
                    if let Some(v) = resp.headers().get(h) {
                        out.insert_header((h, v.to_str().unwrap().to_owned()));
                    }
                }
                out.body(resp.bytes().await.unwrap().to_vec())
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
    Liar { port, paid, handle }
}

#[actix_web::test]
async fn a_server_that_claims_a_voucher_it_said_it_did_not_take_is_flagged_by_reconcile() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let proxy = liar(official.url("/v2/batch"), Second::Refuse).await;
    let app = app_on(&chain).await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let url = format!("http://127.0.0.1:{}/v2/batch", proxy.port);
    let (status, env) = pay(&app, &url).await;
    assert_eq!(status, 200, "{env}");
    let (status, env) = pay(&app, &url).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (502, Some("rejected")), "{env}");
    assert_eq!(channels(&app).await[0]["charged"], BATCH_PRICE.to_string());
    assert_eq!(reconcile(&app, &admin).await["channels_flagged"], 0);

    // It claims the voucher it said it did not take (as the channel's receiver, anvil #5).
    let second = proxy.paid.lock().unwrap()[1].clone();
    let cfg = &second["payload"]["channelConfig"];
    let a = |k: &str| cfg[k].as_str().unwrap().parse::<Address>().unwrap();
    let config = ChannelConfig {
        payer: a("payer"),
        payerAuthorizer: a("payerAuthorizer"),
        receiver: a("receiver"),
        receiverAuthorizer: a("receiverAuthorizer"),
        token: a("token"),
        withdrawDelay: alloy::primitives::aliases::U40::from(cfg["withdrawDelay"].as_u64().unwrap()),
        salt: cfg["salt"].as_str().unwrap().parse().unwrap(),
    };
    let ceiling = 2 * u128::from(BATCH_PRICE);
    let signature: Bytes = second["payload"]["voucher"]["signature"].as_str().unwrap().parse().unwrap();
    let row = VoucherClaim {
        voucher: Voucher { channel: config, maxClaimableAmount: ceiling },
        signature,
        totalClaimed: ceiling,
    };
    let data = Bytes::from(claimCall { voucherClaims: vec![row] }.abi_encode());
    let tx = chain.rpc("eth_sendTransaction", json!([{"from": BATCH_PAY_TO, "to": SETTLEMENT, "data": data}])).await;
    let mut deadline = x402_router_testkit::Deadline::after(std::time::Duration::from_secs(30), "the claim mined");
    let receipt = loop {
        let r = chain.rpc("eth_getTransactionReceipt", json!([tx])).await;
        if !r.is_null() {
            break r;
        }
        deadline.next_poll().await.unwrap();
    };
    assert_eq!(receipt["status"], "0x1", "{receipt}");

    let report = reconcile(&app, &admin).await;
    assert_eq!(report["channels_flagged"], 1, "{report}");
    let ch = &channels(&app).await[0];
    assert!(ch["stopped"].as_str().is_some_and(|s| s.contains("claimed 2000")), "{ch}");
    assert_eq!(ch["claimed"], (2 * BATCH_PRICE).to_string(), "{ch}");
    // The voucher it claimed is charged after all.
    let sql = "SELECT count(*) AS n FROM payments WHERE status = 'settled_response_lost'";
    assert_eq!(count(&app.db, sql).await, 1);
    // A flagged channel is never signed on again.
    let before = proxy.paid.lock().unwrap().len();
    let _ = pay(&app, &url).await;
    let paid = proxy.paid.lock().unwrap().clone();
    assert_eq!(paid.len(), before + 1);
    assert_ne!(paid[before]["payload"]["voucher"]["channelId"], second["payload"]["voucher"]["channelId"]);
}

#[actix_web::test]
async fn closing_a_channel_while_a_call_signs_on_it_keeps_that_voucher_from_leaving() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let db = Arc::new(TestDb::new().await);
    let (hook, freezer, armed) = hold_at(x402_router::faults::Point::BeforeIntent);
    let mut extra = chain.router_extra();
    extra.push(("x402-schemes".into(), "batch-settlement".into()));
    let hooks = x402_router::startup::Hooks { at: Some(hook), ..Default::default() };
    let app = spawn_app_on(Arc::clone(&db), AppOptions { extra, hooks, ..Default::default() }).await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let (status, env) = pay(&app, &official.url("/v2/batch")).await;
    assert_eq!(status, 200, "{env}");
    let id = channels(&app).await[0]["id"].as_str().unwrap().to_owned();
    // The next call holds the lane and signs its voucher; it waits before recording it.
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let body = json!({"url": official.url("/v2/batch"), "max_amount": BATCH_PRICE.to_string()});
    let call = spawn_route(&app.client, &app.address, &app.agent, &new_key(), &body);
    tokio::time::timeout(std::time::Duration::from_secs(30), freezer.reached.notified()).await.expect("signed");
    let (status, busy) = close(&app, &admin, &id).await;
    assert_eq!((status, busy["step"].as_str()), (200, Some("busy")), "{busy}");
    assert_eq!(busy["channel"]["state"], "closing", "{busy}");
    freezer.thaw.send_replace(true);
    let resp = call.await.unwrap().unwrap();
    let status = resp.status().as_u16();
    let env: Value = resp.json().await.unwrap_or(Value::Null);
    let c = channels(&app).await;
    assert_eq!(c[0]["signed_ceiling"], BATCH_PRICE.to_string(), "no voucher recorded on it: {c:?}");
    let channel_id = c[0]["channel_id"].as_str().unwrap().to_lowercase();
    let on_server: Vec<Value> = official.channels().await.as_array().cloned().unwrap();
    let charged = on_server
        .iter()
        .find(|x| x["channelId"].as_str().unwrap().to_lowercase() == channel_id)
        .map(|x| x["chargedCumulativeAmount"].as_str().unwrap().to_owned());
    assert_eq!(charged.as_deref(), Some("1000"), "the server got no voucher more on it: {on_server:?}");
    // The call was not paid on the closing lane (answered otherwise, or paid on a new one).
    if status == 200 {
        assert_eq!(c.len(), 2, "{env} {c:?}");
    }
}

#[actix_web::test]
async fn an_unanswered_voucher_is_released_only_once_its_closed_channel_can_never_be_claimed_at_it() {
    let chain = Devnet::start().await;
    let official = Official::start(&chain).await;
    let proxy = liar(official.url("/v2/batch"), Second::Swallow).await;
    let app = app_on(&chain).await;
    let (_, admin) = create_operator(&app.db, "ada", Role::Admin).await;
    let url = format!("http://127.0.0.1:{}/v2/batch", proxy.port);
    let (status, env) = pay(&app, &url).await;
    assert_eq!(status, 200, "{env}");
    let (status, env) = pay(&app, &url).await;
    assert_eq!((status, env["payment"]["status"].as_str()), (200, Some("unconfirmed")), "{env}");
    let unanswered = "SELECT count(*) AS n FROM payments WHERE status = 'unconfirmed'";
    // Open channel: the voucher may still be claimed; it stays counted as charged.
    let report = reconcile(&app, &admin).await;
    assert_eq!(report["pending"], 1, "{report}");
    assert_eq!(count(&app.db, unanswered).await, 1);
    // Closed by a cooperative refund at what the server charged: the second voucher's increment
    // can never be claimed now; reconcile releases it.
    let id = channels(&app).await[0]["id"].as_str().unwrap().to_owned();
    let (status, done) = close(&app, &admin, &id).await;
    assert_eq!((status, done["step"].as_str()), (200, Some("refunded")), "{done}");
    assert_eq!(done["channel"]["state"], "closed", "{done}");
    assert_eq!(done["channel"]["claimed"], BATCH_PRICE.to_string(), "{done}");
    let report = reconcile(&app, &admin).await;
    assert_eq!(report["expired"], 1, "{report}");
    assert_eq!(count(&app.db, unanswered).await, 0);
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'expired'").await, 1);
}
