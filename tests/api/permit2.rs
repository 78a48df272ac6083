//! Paying with Permit2 (issue 15): `exact` via Permit2 and `upto`, on real anvil with the
//! project's own Permit2 and x402 proxies at their canonical addresses, the project's token
//! (approved for Permit2 by the router's wallet in the deploy step) and the test upstream's
//! `/v2/permit2` and `/v2/upto` routes. Money is counted on-chain.

use std::str::FromStr;
use std::time::Duration;
use x402_router_testkit::Deadline;

use alloy::network::TransactionBuilder;
use alloy::primitives::{Address, B256, Bytes, U256, address};
use alloy::providers::{Provider, ProviderBuilder};
use alloy::rpc::types::TransactionRequest;
use alloy::sol;
use alloy::sol_types::SolCall;
use serde_json::{Value, json};

use crate::helpers::tls_services::wait_until;
use crate::helpers::*;

const OPERATOR: &str = "permit2-test-operator-token";
/// anvil #3: a third party with ETH for gas and no stake in the payment.
const THIRD_PARTY: Address = address!("0x90F79bf6EB2c4f870365E785982E1f101E93b906");
const EXACT_PROXY: Address = address!("0x402085c248EeA27D92E8b30b2C58ed07f9E20001");

sol! {
    #[sol(rpc)]
    interface IPermit2 {
        function nonceBitmap(address owner, uint256 wordPos) external view returns (uint256);
    }
    struct TokenPermissions { address token; uint256 amount; }
    struct PermitTransferFrom { TokenPermissions permitted; uint256 nonce; uint256 deadline; }
    struct ExactWitness { address to; uint256 validAfter; }
    interface IExactProxy {
        function settle(PermitTransferFrom permit, address owner, ExactWitness witness, bytes signature) external;
    }
}

/// The `payment` object a real call returned fits `Payment` in the served OpenAPI document:
/// only documented members, each required one present, enums and consts respected.
fn assert_documented_payment(p: &Value) {
    let doc: Value = serde_json::from_str(x402_router::routes::openapi::json()).unwrap();
    let schema = &doc["components"]["schemas"]["Payment"];
    let props = schema["properties"].as_object().unwrap();
    for required in schema["required"].as_array().unwrap() {
        assert!(p.get(required.as_str().unwrap()).is_some(), "{required} missing from {p}");
    }
    for (name, value) in p.as_object().unwrap() {
        let prop = props.get(name).unwrap_or_else(|| panic!("undocumented payment member {name}: {p}"));
        if let Some(allowed) = prop["enum"].as_array() {
            assert!(allowed.contains(value), "{name} = {value} not in {allowed:?}");
        }
        if let Some(only) = prop.get("const") {
            assert_eq!(value, only, "{name}");
        }
        if prop["$ref"] == "#/components/schemas/Amount" {
            assert!(value.as_str().is_some_and(|a| !a.is_empty() && a.bytes().all(|b| b.is_ascii_digit())), "{name}");
        }
    }
}

async fn paid_app(chain: &Devnet) -> TestApp {
    let extra = [chain.router_extra(), vec![("operator-token".into(), OPERATOR.into())]].concat();
    spawn_app_with(AppOptions { extra, ..Default::default() }).await
}

async fn balances(chain: &Devnet) -> (U256, U256) {
    (chain.balance(ROUTER_ADDRESS).await, chain.balance(PAY_TO).await)
}

/// Whether Permit2's bitmap has `nonce` (the envelope's 0x-hex) of the router set.
async fn permit2_nonce_used(chain: &Devnet, nonce: &str) -> bool {
    let provider = ProviderBuilder::new().connect_http(chain.rpc_url.parse().unwrap());
    let nonce = U256::from_be_bytes(B256::from_str(nonce).unwrap().0);
    let bitmap = IPermit2::new(x402_router::x402::permit2::PERMIT2, &provider)
        .nonceBitmap(ROUTER_ADDRESS, nonce >> 8usize)
        .call()
        .await
        .unwrap();
    bitmap.bit(usize::try_from(nonce & U256::from(0xffu8)).unwrap())
}

async fn get(app: &TestApp, path: &str) -> Value {
    let resp = app.client.get(format!("{}{path}", app.address)).bearer_auth(&app.agent.key).send().await.unwrap();
    resp.json().await.unwrap()
}

async fn ledger_amount(app: &TestApp) -> String {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        amount: String,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = app.db.conn().await;
    let row: Row =
        diesel::sql_query("SELECT amount::text AS amount FROM payments").get_result(&mut conn).await.unwrap();
    row.amount
}

#[actix_web::test]
async fn permit2_exact_moves_exactly_the_price_through_the_proxy() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/permit2"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    let p = &env["payment"];
    assert_eq!(p["status"], "settled", "{env}");
    assert_eq!(p["scheme"], "exact");
    assert_eq!(p["asset_transfer_method"], "permit2");
    assert_eq!(p["amount"], PRICE.to_string());
    assert_documented_payment(p);
    assert_eq!(p["tx_hash"], chain.stats().await["/v2/permit2"]["last_transaction"], "the chain's transaction");
    assert!(permit2_nonce_used(&chain, p["nonce"].as_str().unwrap()).await);
    let price = U256::from(PRICE);
    assert_eq!(balances(&chain).await, (router0 - price, pay_to0 + price));
    // The nonce is the router's deterministic Permit2 nonce of (agent, key, request).
    let signer: alloy::signers::local::PrivateKeySigner = ROUTER_KEY.parse().unwrap();
    let expected = x402_router::x402::permit2_nonce(
        &x402_router::x402::nonce::nonce_secret(&signer),
        app.agent.id,
        &key,
        &request_hash(&body),
    );
    assert_eq!(p["nonce"], B256::from(expected).to_string());

    // A replay of the key moves nothing.
    let replay: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(replay, env);
    assert_eq!(balances(&chain).await, (router0 - price, pay_to0 + price));
    assert_eq!(chain.stats().await["/v2/permit2"]["paid"], 1);
}

#[actix_web::test]
async fn upto_signs_the_maximum_moves_the_used_amount_and_releases_the_rest() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1000000 WHERE id = '{}'", app.agent.id)).await;
    let (router0, pay_to0) = balances(&chain).await;
    let body = json!({"url": chain.url("/v2/upto?used=2500"), "max_amount": "50000"});

    let resp = app.route(&new_key(), &body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    let p = &env["payment"];
    assert_eq!(p["status"], "settled", "{env}");
    assert_eq!(p["scheme"], "upto");
    assert_eq!(p["max_amount"], PRICE.to_string(), "the signed maximum");
    assert_eq!(p["amount"], "2500", "what the chain shows moved");
    assert_eq!(p["claimed_amount"], "2500");
    assert_documented_payment(p);
    assert_eq!(balances(&chain).await, (router0 - U256::from(2500u64), pay_to0 + U256::from(2500u64)));
    // The stored authorization signed the maximum; the ledger charges what moved.
    let signed: Value =
        serde_json::from_str(&text_of(&app, "SELECT signed_authorization::text AS t FROM payments").await).unwrap();
    assert_eq!(signed["permit2Authorization"]["permitted"]["amount"], PRICE.to_string());
    assert_eq!(ledger_amount(&app).await, "2500");
    // The budget is charged the used amount only.
    let me = get(&app, "/agents/me").await;
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some("2500"), Some("0")), "{me}");
    assert_eq!(me["remaining"], (1_000_000 - 2500).to_string());
    // The receipt shows both.
    let receipt = get(&app, &format!("/receipts/{}", env["receipt_id"].as_str().unwrap())).await;
    assert_eq!(receipt["payment"]["amount"], "2500");
    assert_eq!(receipt["payment"]["max_amount"], PRICE.to_string());
    assert_eq!(receipt["payment"]["scheme"], "upto");
    assert_documented_payment(&receipt["payment"]);
}

#[actix_web::test]
async fn upto_with_nothing_used_moves_nothing_succeeds_and_stays_reserved_until_reconcile_expires_it() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let (router0, pay_to0) = balances(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/upto?used=0"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200);
    let p = &env["payment"];
    assert_eq!(p["scheme"], "upto");
    assert_eq!(p["claimed_amount"], "0");
    assert_eq!(p["tx_hash"], Value::Null);
    assert_eq!(p["status"], "not_settled", "{env}");
    assert!(!permit2_nonce_used(&chain, p["nonce"].as_str().unwrap()).await, "nothing consumed the nonce");
    assert_eq!(balances(&chain).await, (router0, pay_to0));
    assert_eq!(chain.stats().await["/v2/upto"]["paid"], 0);
    // The upstream still holds a valid authorization for the maximum: it stays reserved.
    let me = get(&app, "/agents/me").await;
    assert_eq!(me["reserved"], PRICE.to_string(), "{me}");

    // Once its deadline is past (the recorded deadline moved back, as time would), reconcile
    // finds the nonce unused on-chain and releases the reservation.
    exec(
        &app.db,
        "UPDATE payments SET valid_before = extract(epoch from now())::bigint - 300, \
                updated_at = now() - interval '5 minutes'",
    )
    .await;
    let out = router_command()
        .arg("reconcile")
        .env("DATABASE_URL", &app.db.url)
        .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["expired"], 1, "{report}");
    let me = get(&app, "/agents/me").await;
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some("0"), Some("0")), "{me}");
}

#[actix_web::test]
async fn a_hostile_upto_upstream_claiming_less_than_it_took_is_charged_what_moved() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let body = json!({"url": chain.url("/v2/upto?used=6000&claim=1000"), "max_amount": "50000"});

    let env: Value = app.route(&new_key(), &body).await.json().await.unwrap();

    let p = &env["payment"];
    assert_eq!(p["status"], "settled", "{env}");
    assert_eq!(p["claimed_amount"], "1000", "the upstream's word");
    assert_eq!(p["amount"], "6000", "the chain's logs");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(6000u64));
    assert_eq!(ledger_amount(&app).await, "6000");
    let me = get(&app, "/agents/me").await;
    assert_eq!(me["spent"], "6000", "{me}");
    let error = text_of(&app, "SELECT coalesce(error, '') AS t FROM payments").await;
    assert!(error.contains("claimed it charged 1000"), "{error}");
}

#[actix_web::test]
async fn a_replayed_permit2_payload_is_refused_by_the_chain() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let env: Value = app
        .route(&new_key(), &json!({"url": chain.url("/v2/permit2"), "max_amount": "50000"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    let after_first = balances(&chain).await;

    // A third party submits the very authorization the router sent (the payload's
    // `permit2Authorization` and `signature`, as the ledger keeps them), straight to the proxy.
    let sent: Value =
        serde_json::from_str(&text_of(&app, "SELECT signed_authorization::text AS t FROM payments").await).unwrap();
    let a = &sent["permit2Authorization"];
    let addr = |v: &Value| Address::from_str(v.as_str().unwrap()).unwrap();
    let uint = |v: &Value| U256::from_str_radix(v.as_str().unwrap(), 10).unwrap();
    let call = IExactProxy::settleCall {
        permit: PermitTransferFrom {
            permitted: TokenPermissions {
                token: addr(&a["permitted"]["token"]),
                amount: uint(&a["permitted"]["amount"]),
            },
            nonce: uint(&a["nonce"]),
            deadline: uint(&a["deadline"]),
        },
        owner: addr(&a["from"]),
        witness: ExactWitness { to: addr(&a["witness"]["to"]), validAfter: uint(&a["witness"]["validAfter"]) },
        signature: Bytes::from_str(sent["signature"].as_str().unwrap()).unwrap(),
    };
    let provider = ProviderBuilder::new().connect_http(chain.rpc_url.parse().unwrap());
    let tx = TransactionRequest::default()
        .with_from(THIRD_PARTY)
        .with_to(EXACT_PROXY)
        .with_input(call.abi_encode())
        .with_gas_limit(500_000);
    assert!(provider.call(tx.clone()).await.is_err(), "the simulation reverts: the nonce is used");
    let receipt = provider.send_transaction(tx).await.unwrap().get_receipt().await.unwrap();
    assert!(!receipt.status(), "the replay reverts on-chain");
    assert_eq!(balances(&chain).await, after_first, "nothing moved twice");
}

#[actix_web::test]
async fn a_router_killed_after_a_permit2_settlement_never_pays_again_on_retry() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "permit2-crash").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 30_000,
        extra: chain.router_extra(),
        ..Default::default()
    };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let client = reqwest::Client::new();
    let key = new_key();
    // The upstream settles, then keeps handling for 3 s: router A dies meanwhile.
    let body = json!({"url": chain.url("/v2/permit2?seconds=3"), "max_amount": "10000"});
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || {
        chain.stats().await["/v2/permit2"]["paid"] == 1
    })
    .await;
    a.kill9().await;
    assert!(call.await.unwrap().is_err(), "the killed router never answered");

    // Retry on router B until the key is abandoned and taken over.
    let mut deadline =
        Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
    let (status, env) = loop {
        let resp = route_at(&client, &b.address, &agent, &key, &body).await;
        let status = resp.status().as_u16();
        if status != 409 {
            break (status, resp.json::<Value>().await.unwrap());
        }
        deadline.next_poll().await.unwrap();
    };

    assert_eq!(status, 502, "{env}");
    assert_eq!(env["code"], "settled_response_lost");
    assert_eq!(env["payment"]["status"], "settled_response_lost");
    assert_eq!(env["payment"]["tx_hash"], chain.stats().await["/v2/permit2"]["last_transaction"], "found on-chain");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(PRICE), "paid exactly once");
    assert_eq!(chain.stats().await["/v2/permit2"]["paid"], 1);
    assert_eq!(count(&db, "SELECT count(*) AS n FROM payments").await, 1);
    assert_eq!(count(&db, "SELECT attempts::bigint AS n FROM payments").await, 1, "never re-signed");
}

async fn text_of(app: &TestApp, sql: &str) -> String {
    #[derive(diesel::QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        t: String,
    }
    use diesel_async::RunQueryDsl;
    let mut conn = app.db.conn().await;
    let row: Row = diesel::sql_query(sql).get_result(&mut conn).await.unwrap();
    row.t
}

#[actix_web::test]
async fn the_audit_api_shows_an_upstream_that_takes_the_whole_maximum() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    for path in ["/v2/upto", "/v2/upto?used=100", "/v2/upto", "/v2/upto?used=0"] {
        let env: Value =
            app.route(&new_key(), &json!({"url": chain.url(path), "max_amount": "50000"})).await.json().await.unwrap();
        assert_eq!(env["status"], 200, "{env}");
    }

    let resp = app.client.get(format!("{}/audit/upto", app.address)).bearer_auth(OPERATOR).send().await.unwrap();

    assert_eq!(resp.status(), 200);
    let audit: Value = resp.json().await.unwrap();
    let origin = chain.upstream.clone();
    assert_eq!(
        audit["upstreams"],
        json!([{"upstream": origin, "settled": 3, "at_max": 2,
                "charged": (2 * PRICE + 100).to_string(), "maximum": (3 * PRICE).to_string()}]),
        "the unused one is not settled"
    );
    let agent = app.client.get(format!("{}/audit/upto", app.address)).bearer_auth(&app.agent.key).send().await.unwrap();
    assert_eq!(agent.status(), 403, "operators only");
}

/// The owner of a Permit2 call commits its intent and is frozen for good just before the
/// payment leaves; another router process takes the key over. `max_auth` bounds the
/// authorization's lifetime (the takeover resends a stored authorization with ≥ 30 s left,
/// and re-signs with the same nonce otherwise).
async fn take_over_an_unsent_permit2_intent(
    path: &str,
    max_auth: &str,
) -> (Devnet, std::sync::Arc<TestDb>, Value, U256) {
    use x402_router::faults::Point;
    use x402_router::startup::Hooks;
    let chain = Devnet::start().await;
    let db = std::sync::Arc::new(TestDb::new().await);
    let timing = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        deadline_ms: 20_000,
        extra: [chain.router_extra(), vec![("x402-max-auth-seconds".into(), max_auth.into())]].concat(),
        hooks,
        ..Default::default()
    };
    let (hook, reached) = crash_at(Point::PaymentLeaving);
    let owner = spawn_app_on(db.clone(), timing(Hooks { at: Some(hook), ..Default::default() })).await;
    let retrier = RouterProcess::spawn(&db.url, &timing(Hooks::default()), "permit2:").await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let key = new_key();
    let body = json!({"url": chain.url(path), "max_amount": "50000"});
    let _first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(30), reached.notified()).await.expect("the owner signed and stopped");
    assert_eq!(chain.stats().await[path.split('?').next().unwrap()]["payment_attempts"], 0, "nothing was sent");

    let client = reqwest::Client::new();
    let mut deadline =
        Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
    let env = loop {
        let resp = route_at(&client, &retrier.address, &owner.agent, &key, &body).await;
        // 409: still in flight; 503: the earlier authorization is valid but too close to its
        // deadline to resend, and nothing is re-signed until it has expired.
        if resp.status() != 409 && resp.status() != 503 {
            assert_eq!(resp.status(), 200);
            break resp.json::<Value>().await.unwrap();
        }
        deadline.next_poll().await.unwrap();
    };
    drop(owner);
    (chain, db, env, router0)
}

#[actix_web::test]
async fn a_takeover_resends_the_stored_permit2_payload_while_it_is_valid() {
    let (chain, db, env, router0) = take_over_an_unsent_permit2_intent("/v2/permit2", "300").await;
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(PRICE));
    assert_eq!(chain.stats().await["/v2/permit2"]["paid"], 1);
    assert_eq!(count(&db, "SELECT attempts::bigint AS n FROM payments").await, 1, "resent, not re-signed");
}

#[actix_web::test]
async fn a_takeover_re_signs_an_expiring_permit2_intent_with_the_same_nonce() {
    // 10 s of validity: less than the 30 s a resend needs; once it has expired unused, the
    // takeover re-signs.
    let (chain, db, env, router0) = take_over_an_unsent_permit2_intent("/v2/upto?used=700", "10").await;
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["amount"], "700");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(700u64));
    assert_eq!(chain.stats().await["/v2/upto"]["paid"], 1);
    assert_eq!(count(&db, "SELECT attempts::bigint AS n FROM payments").await, 2, "re-signed once");
    assert!(permit2_nonce_used(&chain, env["payment"]["nonce"].as_str().unwrap()).await, "the same nonce");
}

#[actix_web::test]
async fn with_every_record_lost_the_chain_still_refuses_to_pay_a_permit2_request_twice() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/permit2"), "max_amount": "50000"});
    let env: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    let after_first = balances(&chain).await;
    // Postgres (and Redis) forget everything about the call.
    exec(&app.db, "DELETE FROM receipts").await;
    exec(&app.db, "DELETE FROM payments").await;
    exec(&app.db, "DELETE FROM idempotency_keys").await;
    app.forget_cached(&key).await;

    let resp = app.route(&key, &body).await;

    assert_eq!(resp.status(), 502);
    let again: Value = resp.json().await.unwrap();
    assert_eq!(again["code"], "settled_response_lost", "the Permit2 nonce is used on-chain: {again}");
    assert_eq!(balances(&chain).await, after_first, "nothing paid twice");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0, "nothing signed");
    assert_eq!(chain.stats().await["/v2/permit2"]["paid"], 1);
}

/// A hook that, once `target` is reached, blocks every point for good (the call and its
/// heartbeats): an owner crashed there. Notifies when reached.
fn crash_at(target: x402_router::faults::Point) -> (x402_router::faults::Hook, std::sync::Arc<tokio::sync::Notify>) {
    use x402_router::faults::{Hook, Inject};
    let reached = std::sync::Arc::new(tokio::sync::Notify::new());
    let crashed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (r, c) = (reached.clone(), crashed.clone());
    let hook: Hook = std::sync::Arc::new(move |p| {
        let (r, c) = (r.clone(), c.clone());
        Box::pin(async move {
            if p == target && !c.swap(true, std::sync::atomic::Ordering::SeqCst) {
                r.notify_one();
            }
            if c.load(std::sync::atomic::Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            Inject::Nothing
        })
    });
    (hook, reached)
}

#[actix_web::test]
async fn reconcile_charges_a_crashed_upto_payment_what_its_transaction_moved() {
    use x402_router::faults::Point;
    use x402_router::startup::Hooks;
    let chain = Devnet::start().await;
    let (hook, reached) = crash_at(Point::PaidAnswered);
    let extra = chain.router_extra();
    let owner = spawn_app_with(AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra,
        hooks: Hooks { at: Some(hook), ..Default::default() },
        ..Default::default()
    })
    .await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let body = json!({"url": chain.url("/v2/upto?used=3000&claim=10"), "max_amount": "50000"});
    let _call = spawn_route(&owner.client, &owner.address, &owner.agent, &new_key(), &body);
    // The upstream settled and answered; the router died before it looked at the chain.
    tokio::time::timeout(Duration::from_secs(30), reached.notified()).await.expect("the owner was answered");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(3000u64));
    assert_eq!(ledger_amount(&owner).await, PRICE.to_string(), "the maximum is reserved");

    let reconcile = || {
        let out = router_command()
            .arg("reconcile")
            .env("DATABASE_URL", &owner.db.url)
            .env("X402_RPC_URLS", format!("eip155:84532={}", chain.rpc_url))
            .env("RECONCILE_OLDER_THAN_SECS", "0")
            .env("IDEMPOTENCY_ABANDON_AFTER_MS", "1000")
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // Until the owner's heartbeat is older than the abandonment threshold, it is left alone.
    let mut deadline = Deadline::after(Duration::from_secs(20), "the condition").every(Duration::from_millis(200));
    loop {
        let report = reconcile();
        if report["settled_response_lost"] == 1 {
            break;
        }
        if deadline.next_poll().await.is_err() {
            panic!("never reconciled: {report}");
        }
    }

    assert_eq!(text_of(&owner, "SELECT status AS t FROM payments").await, "settled_response_lost");
    assert_eq!(ledger_amount(&owner).await, "3000", "what the transaction moved, not the claim nor the maximum");
    let me = get(&owner, "/agents/me").await;
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some("3000"), Some("0")), "{me}");
}

#[actix_web::test]
async fn a_lost_permit2_answer_is_recovered_from_a_payment_identifier_upstream_without_paying_again() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "permit2-recovery").await;
    let prefix = format!("test:{}:", uuid::Uuid::new_v4().simple());
    let opts = AppOptions {
        abandon_ms: 1500,
        heartbeat_ms: 300,
        deadline_ms: 30_000,
        extra: chain.router_extra(),
        ..Default::default()
    };
    let mut a = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let b = RouterProcess::spawn(&db.url, &opts, &prefix).await;
    let router0 = chain.balance(ROUTER_ADDRESS).await;
    let client = reqwest::Client::new();
    let key = new_key();
    // upto with payment-identifier: settles 4000 of the maximum, then handles for 2 s more.
    let body = json!({"url": chain.url("/v2/upto?used=4000&seconds=2&pid=1"), "max_amount": "50000"});
    let call = spawn_route(&client, &a.address, &agent, &key, &body);
    wait_until("the upstream to settle", Duration::from_secs(20), async || {
        chain.stats().await["/v2/upto"]["paid"] == 1
    })
    .await;
    a.kill9().await;
    assert!(call.await.unwrap().is_err(), "the killed router never answered");
    wait_until("the upstream to finish the original", Duration::from_secs(20), async || {
        chain.stats().await["/v2/upto"]["pid_completed"] == 1
    })
    .await;

    let mut deadline =
        Deadline::after(Duration::from_secs(40), "the key stayed in flight").every(Duration::from_millis(100));
    let (status, env) = loop {
        let resp = route_at(&client, &b.address, &agent, &key, &body).await;
        let status = resp.status().as_u16();
        if status != 409 {
            break (status, resp.json::<Value>().await.unwrap());
        }
        deadline.next_poll().await.unwrap();
    };

    assert_eq!(status, 200, "{env}");
    assert_eq!(env["body"]["handled_for_seconds"], 2, "the original answer: {env}");
    let p = &env["payment"];
    assert_eq!((p["status"].as_str(), p["recovery"].as_str()), (Some("settled"), Some("recovered")), "{env}");
    assert_eq!(p["amount"], "4000", "what the transaction moved");
    assert_eq!(p["tx_hash"], chain.stats().await["/v2/upto"]["last_transaction"]);
    let stats = chain.stats().await["/v2/upto"].clone();
    assert_eq!((stats["paid"].as_u64(), stats["pid_replays"].as_u64()), (Some(1), Some(1)), "{stats}");
    assert_eq!(chain.balance(ROUTER_ADDRESS).await, router0 - U256::from(4000u64), "paid once");
    assert_eq!(count(&db, "SELECT attempts::bigint AS n FROM payments").await, 1, "never re-signed");
    assert_eq!(count(&db, "SELECT amount::bigint AS n FROM payments").await, 4000);
}

/// A router paying with the EIP-3009 token and with PlainToken, configured `+permit2`.
async fn plain_app(chain: &Devnet) -> TestApp {
    let assets = format!("eip155:{0}={1}@6,eip155:{0}={2}@6+permit2", chain.chain_id, chain.token, chain.plain_token);
    let extra = vec![
        ("x402-rpc-urls".into(), format!("eip155:{}={}", chain.chain_id, chain.rpc_url)),
        ("x402-assets".into(), assets),
        ("operator-token".into(), OPERATOR.into()),
    ];
    spawn_app_with(AppOptions { extra, ..Default::default() }).await
}

async fn plain_balances(chain: &Devnet) -> (U256, U256) {
    (chain.balance_in(chain.plain_token, ROUTER_ADDRESS).await, chain.balance_in(chain.plain_token, PAY_TO).await)
}

#[actix_web::test]
async fn a_token_without_eip3009_is_paid_via_permit2_once() {
    let chain = Devnet::start().await;
    let app = plain_app(&chain).await;
    let (plain0, usdc0) = (plain_balances(&chain).await, balances(&chain).await);
    let key = new_key();
    let body = json!({"url": chain.url("/v2/permit2?token=plain"), "max_amount": "50000"});

    let resp = app.route(&key, &body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    let p = &env["payment"];
    assert_eq!(p["status"], "settled", "{env}");
    assert_eq!(p["asset_transfer_method"], "permit2");
    assert_eq!(Address::from_str(p["asset"].as_str().unwrap()).unwrap(), chain.plain_token);
    assert!(permit2_nonce_used(&chain, p["nonce"].as_str().unwrap()).await);
    let price = U256::from(PRICE);
    assert_eq!(plain_balances(&chain).await, (plain0.0 - price, plain0.1 + price));
    assert_eq!(balances(&chain).await, usdc0, "the EIP-3009 token did not move");

    // A replay of the key moves nothing more.
    let replay: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(replay, env);
    assert_eq!(plain_balances(&chain).await, (plain0.0 - price, plain0.1 + price));
    assert_eq!(chain.stats().await["/v2/permit2"]["paid"], 1);
}

#[actix_web::test]
async fn an_eip3009_offer_in_a_token_without_eip3009_is_refused_and_nothing_is_signed() {
    let chain = Devnet::start().await;
    let app = plain_app(&chain).await;
    let plain0 = plain_balances(&chain).await;
    let body = json!({"url": chain.url("/v2/permit2?token=plain&offer=eip3009"), "max_amount": "50000"});

    let resp = app.route(&new_key(), &body).await;

    assert_ne!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("is configured without EIP-3009 (+permit2): it is paid only via Permit2"), "{text}");
    assert_eq!(chain.stats().await["/v2/permit2"]["payment_attempts"], 0, "nothing was sent");
    assert_eq!(text_of(&app, "SELECT count(*)::text AS t FROM payments").await, "0", "nothing was signed");
    assert_eq!(plain_balances(&chain).await, plain0);
}

#[actix_web::test]
async fn an_unmarked_token_whose_authorization_state_reverts_is_never_paid() {
    // PlainToken configured without `+permit2` is taken for an EIP-3009 token: its
    // `authorizationState` reverts, so the pre-signing check fails closed and nothing is signed.
    let chain = Devnet::start().await;
    let assets = format!("eip155:{0}={1}@6,eip155:{0}={2}@6", chain.chain_id, chain.token, chain.plain_token);
    let extra = vec![
        ("x402-rpc-urls".into(), format!("eip155:{}={}", chain.chain_id, chain.rpc_url)),
        ("x402-assets".into(), assets),
    ];
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    let (plain0, usdc0) = (plain_balances(&chain).await, balances(&chain).await);

    for path in ["/v2/permit2?token=plain", "/v2/permit2"] {
        let resp = app.route(&new_key(), &json!({"url": chain.url(path), "max_amount": "50000"})).await;
        assert_ne!(resp.status(), 200, "{path}");
        let text = resp.text().await.unwrap();
        assert!(text.contains("nothing was signed or paid"), "{path}: {text}");
    }
    assert_eq!(chain.stats().await["/v2/permit2"]["payment_attempts"], 0, "nothing was sent");
    assert_eq!(text_of(&app, "SELECT count(*)::text AS t FROM payments").await, "0", "nothing was signed");
    assert_eq!((plain_balances(&chain).await, balances(&chain).await), (plain0, usdc0));
}

/// Every way an `upto` payment can settle without its answer being served (issue 22, item 3):
/// a bare 402 or a 412 after settling, a dropped connection, a `settlement_pending` 402. Each
/// is `settled_response_lost` (visible to recovery), charged what the settling transaction
/// moved (never the signed maximum, never the upstream's claim), counted on-chain. On the old
/// code the paid 402/412 were recorded `settled` and, like the others, kept the maximum charged.
#[actix_web::test]
async fn an_upto_payment_that_settles_without_its_answer_is_charged_what_moved_and_is_settled_response_lost() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1000000 WHERE id = '{}'", app.agent.id)).await;
    let mut charged_total = 0u64;
    for (i, end) in ["402", "412", "drop", "pending"].into_iter().enumerate() {
        let used = 1000 + 111 * i as u64;
        let (router0, pay_to0) = balances(&chain).await;
        let key = new_key();
        let body = json!({"url": chain.url(&format!("/v2/upto?used={used}&end={end}")), "max_amount": "50000"});
        let resp = app.route(&key, &body).await;
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["code"], "settled_response_lost", "{end}: {env}");
        assert_eq!(env["payment"]["status"], "settled_response_lost", "{end}: {env}");
        assert_eq!(env["payment"]["amount"], used.to_string(), "{end}: what moved: {env}");
        assert_eq!(env["payment"]["max_amount"], PRICE.to_string(), "{end}");
        assert!(env["payment"]["tx_hash"].is_string(), "{end}: the proven transaction: {env}");
        // Counted on-chain: exactly `used` moved.
        assert_eq!(balances(&chain).await, (router0 - U256::from(used), pay_to0 + U256::from(used)), "{end}");
        let row = text_of(
            &app,
            &format!(
                "SELECT status || ' ' || amount::text || ' ' || charge_proven::text AS t FROM payments \
                  WHERE idempotency_key = '{key}'"
            ),
        )
        .await;
        assert_eq!(row, format!("settled_response_lost {used} true"), "{end}");
        charged_total += used;
    }
    let me = get(&app, "/agents/me").await;
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some(&*charged_total.to_string()), Some("0")), "{me}");
}

/// A spent `upto` payment whose settling transaction could not be read when it ended (its
/// charge unproven) keeps the maximum only until `reconcile` reads the transaction.
#[actix_web::test]
async fn reconcile_proves_the_charge_of_a_spent_upto_payment_that_kept_its_maximum() {
    let chain = Devnet::start().await;
    let app = paid_app(&chain).await;
    exec(&app.db, &format!("UPDATE agents SET daily_budget = 1000000 WHERE id = '{}'", app.agent.id)).await;
    let body = json!({"url": chain.url("/v2/upto?used=777&end=drop"), "max_amount": "50000"});
    app.route(&new_key(), &body).await;
    assert_eq!(ledger_amount(&app).await, "777");
    // As an ending that could not read the chain leaves it: the maximum, unproven.
    exec(&app.db, &format!("UPDATE payments SET amount = {PRICE}, charge_proven = false")).await;
    let report = reconcile_now(&app.db, &chain);
    assert_eq!(report["charges_proven"], 1, "{report}");
    assert_eq!(ledger_amount(&app).await, "777");
    assert_eq!(text_of(&app, "SELECT charge_proven::text AS t FROM payments").await, "true");
}
