//! Gas sponsoring for Permit2 (issue 43, item 2): a wallet with no native gas and no Permit2
//! allowance pays a token with EIP-2612 and without EIP-3009 (the project's PermitToken) when
//! the upstream's 402 offers `eip2612GasSponsoring`: the router signs the token's permit for
//! Permit2 and the facilitator submits it with the transfer (`settleWithPermit`). Real anvil,
//! real test upstream; money and gas counted on-chain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy::primitives::{Address, U256};
use alloy::providers::ProviderBuilder;
use alloy::sol;
use serde_json::{Value, json};
use x402_router::faults::Point;
use x402_router::startup::Hooks;
use x402_router_testkit::wait::let_time_pass;

use crate::helpers::*;

const OPERATOR: &str = "gas-sponsoring-test-operator-token";
const PERMIT2: Address = x402_router::x402::permit2::PERMIT2;

sol! {
    #[sol(rpc)]
    interface IPermitToken {
        function nonces(address owner) external view returns (uint256);
    }
}

/// Router settings paying the EIP-3009 token and PermitToken (`+permit2`) on `chain`.
fn permit_extra(chain: &Devnet) -> Vec<(String, String)> {
    let assets = format!("eip155:{0}={1}@6,eip155:{0}={2}@6+permit2", chain.chain_id, chain.token, chain.permit_token);
    vec![
        ("x402-rpc-urls".into(), format!("eip155:{}={}", chain.chain_id, chain.rpc_url)),
        ("x402-assets".into(), assets),
        ("operator-token".into(), OPERATOR.into()),
    ]
}

/// A chain whose router wallet holds PermitToken but no ETH at all and no Permit2 allowance.
async fn gasless_chain() -> Devnet {
    let chain = Devnet::start().await;
    chain.rpc("anvil_setBalance", json!([ROUTER_ADDRESS.to_string(), "0x0"])).await;
    assert_eq!(chain.eth(ROUTER_ADDRESS).await, U256::ZERO);
    assert_eq!(chain.allowance_in(chain.permit_token, ROUTER_ADDRESS, PERMIT2).await, U256::ZERO);
    chain
}

/// (wallet, payee) balances of PermitToken.
async fn permit_balances(chain: &Devnet) -> (U256, U256) {
    (chain.balance_in(chain.permit_token, ROUTER_ADDRESS).await, chain.balance_in(chain.permit_token, PAY_TO).await)
}

async fn token_nonce(chain: &Devnet) -> U256 {
    let provider = ProviderBuilder::new().connect_http(chain.rpc_url.parse().unwrap());
    IPermitToken::new(chain.permit_token, &provider).nonces(ROUTER_ADDRESS).call().await.unwrap()
}

async fn ledger(app: &TestApp, sql: &str) -> i64 {
    count(&app.db, sql).await
}

async fn get(app: &TestApp, path: &str) -> Value {
    let resp = app.client.get(format!("{}{path}", app.address)).bearer_auth(&app.agent.key).send().await.unwrap();
    resp.json().await.unwrap()
}

/// POSTs until the answer is final (not in flight, not 503).
async fn until_final(app: &TestApp, agent: &Agent, key: &str, body: &Value) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let resp = route_at(&app.client, &app.address, agent, key, body).await;
        let status = resp.status().as_u16();
        let env: Value = resp.json().await.unwrap_or(Value::Null);
        let retry = status == 503 || (status == 409 && env["code"] == "idempotency_key_in_flight");
        if !retry {
            return (status, env);
        }
        assert!(Instant::now() < deadline, "no final answer: {status} {env}");
        // lets time pass: a retry interval (the router asked to retry shortly).
        let_time_pass(Duration::from_millis(200)).await;
    }
}

fn call(chain: &Devnet, query: &str) -> Value {
    json!({"url": chain.url(&format!("/v2/permit2?token=permit{query}")), "max_amount": "50000"})
}

#[actix_web::test]
async fn a_wallet_without_gas_or_allowance_pays_a_route_offering_gas_sponsoring_once_per_key() {
    let chain = gasless_chain().await;
    let app = spawn_app_with(AppOptions { extra: permit_extra(&chain), ..Default::default() }).await;
    let (wallet0, payee0) = permit_balances(&chain).await;
    let price = U256::from(PRICE);
    let key = new_key();
    let body = call(&chain, "&gas=eip2612");

    let resp = app.route(&key, &body).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["asset_transfer_method"], "permit2");
    assert!(env["payment"]["tx_hash"].is_string(), "the settling transaction is proven: {env}");
    // Counted on-chain: the price moved once, the wallet spent no gas, the permit was used.
    assert_eq!(permit_balances(&chain).await, (wallet0 - price, payee0 + price));
    assert_eq!(chain.eth(ROUTER_ADDRESS).await, U256::ZERO, "the wallet paid no gas");
    assert_eq!(token_nonce(&chain).await, U256::from(1u8), "one permit was submitted");
    assert_eq!(
        chain.allowance_in(chain.permit_token, ROUTER_ADDRESS, PERMIT2).await,
        U256::ZERO,
        "the permit approved the price, and the transfer used it all"
    );
    let stats = chain.stats().await;
    assert_eq!((stats["/v2/permit2"]["paid"].as_u64(), stats["/v2/permit2"]["sponsored"].as_u64()), (Some(1), Some(1)));
    // The permit is no charge of its own: the agent is charged the price, once.
    let me = get(&app, "/agents/me").await;
    assert_eq!((me["spent"].as_str(), me["reserved"].as_str()), (Some(&*PRICE.to_string()), Some("0")), "{me}");

    // A replay of the key moves nothing more and signs nothing more.
    let replay: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(replay, env);
    assert_eq!(permit_balances(&chain).await, (wallet0 - price, payee0 + price));
    assert_eq!(token_nonce(&chain).await, U256::from(1u8));

    // Another key pays again with a new permit (the allowance was used up), still gasless.
    let again = app.route(&new_key(), &body).await;
    assert_eq!(again.status(), 200);
    assert_eq!(permit_balances(&chain).await, (wallet0 - price - price, payee0 + price + price));
    assert_eq!(token_nonce(&chain).await, U256::from(2u8));
    assert_eq!(chain.eth(ROUTER_ADDRESS).await, U256::ZERO);
    assert_eq!(chain.stats().await["/v2/permit2"]["sponsored"], 2);
}

/// The permit is part of the intent: committed before it leaves, so a router that dies with
/// the payment on its way is taken over and the recorded header — the same permit — is sent;
/// the thawed owner's copy is the same permit too, and the token's nonce moves once.
#[actix_web::test]
async fn a_crash_after_signing_re_sends_the_same_permit_and_the_money_moves_once() {
    let chain = gasless_chain().await;
    let db = Arc::new(TestDb::new().await);
    let options = |hooks| AppOptions {
        abandon_ms: 1000,
        heartbeat_ms: 200,
        extra: permit_extra(&chain),
        hooks,
        ..Default::default()
    };
    let (hook, freezer) = freeze_at(Point::PaymentLeaving);
    let owner = spawn_app_on(Arc::clone(&db), options(Hooks { at: Some(hook), ..Default::default() })).await;
    let retrier = spawn_app_on(Arc::clone(&db), options(Hooks::default())).await;
    let (wallet0, payee0) = permit_balances(&chain).await;
    let price = U256::from(PRICE);
    let key = new_key();
    let body = call(&chain, "&gas=eip2612");
    let first = spawn_route(&owner.client, &owner.address, &owner.agent, &key, &body);
    tokio::time::timeout(Duration::from_secs(30), freezer.reached.notified())
        .await
        .expect("the owner reached the point");
    // Durable before it leaves: the intent (with its sealed header) is committed, nothing sent.
    assert_eq!(ledger(&owner, "SELECT count(*) AS n FROM payments").await, 1);
    assert_eq!(chain.stats().await["/v2/permit2"]["payment_attempts"], 0, "nothing has left yet");

    let (status, env) = until_final(&retrier, &owner.agent, &key, &body).await;

    assert_eq!((status, &env["payment"]["status"]), (200, &json!("settled")), "{env}");
    assert_eq!(permit_balances(&chain).await, (wallet0 - price, payee0 + price));
    assert_eq!(ledger(&owner, "SELECT count(*) AS n FROM payments").await, 1, "one intent per request");
    assert_eq!(ledger(&owner, "SELECT attempts::bigint AS n FROM payments").await, 1, "never re-signed");
    // The frozen owner wakes and sends what it held: the same permit, and nothing more moves.
    freezer.thaw.send_replace(true);
    let _ = tokio::time::timeout(Duration::from_secs(60), first).await.expect("the thawed owner answers");
    assert_eq!(permit_balances(&chain).await, (wallet0 - price, payee0 + price));
    let stats = chain.stats().await;
    let p2 = &stats["/v2/permit2"];
    assert_eq!(p2["permits"].as_array().map(Vec::len), Some(1), "one permit ever signed: {p2}");
    assert_eq!((p2["paid"].as_u64(), p2["sponsored"].as_u64()), (Some(1), Some(1)), "{p2}");
    assert_eq!(token_nonce(&chain).await, U256::from(1u8));
    assert_eq!(chain.eth(ROUTER_ADDRESS).await, U256::ZERO);
    let (again, replayed) = until_final(&retrier, &owner.agent, &key, &body).await;
    assert_eq!((again, replayed), (status, env));
}

/// A 402 whose offer names what the router would not sign (another spender, an absurd
/// deadline, another chain) or whose requirement names an EIP-712 domain that is not the
/// token's is refused before anything is signed: no intent, nothing sent, nothing moved.
#[actix_web::test]
async fn a_hostile_gas_sponsoring_offer_is_refused_without_signing() {
    let chain = gasless_chain().await;
    let app = spawn_app_with(AppOptions { extra: permit_extra(&chain), ..Default::default() }).await;
    let before = permit_balances(&chain).await;
    for gas in ["spender", "deadline", "chain", "domain"] {
        let resp = app.route(&new_key(), &call(&chain, &format!("&gas={gas}"))).await;
        assert_ne!(resp.status(), 200, "{gas}");
        let env: Value = resp.json().await.unwrap();
        assert_eq!(env["code"], "payment_not_made", "{gas}: {env}");
        let msg = env.to_string();
        assert!(msg.contains("eip2612GasSponsoring offer is refused"), "{gas}: {msg}");
        assert!(msg.contains("nothing was signed or paid"), "{gas}: {msg}");
    }
    assert_eq!(chain.stats().await["/v2/permit2"]["payment_attempts"], 0, "nothing was sent");
    assert_eq!(ledger(&app, "SELECT count(*) AS n FROM payments").await, 0, "nothing was signed");
    assert_eq!(permit_balances(&chain).await, before);
    assert_eq!(token_nonce(&chain).await, U256::ZERO);
}

/// Without the offer, a wallet without a Permit2 allowance gets the existing answer naming the
/// operator's command; nothing moves and no permit is signed.
#[actix_web::test]
async fn without_the_offer_a_missing_allowance_is_the_clear_permit2_error() {
    let chain = gasless_chain().await;
    let app = spawn_app_with(AppOptions { extra: permit_extra(&chain), ..Default::default() }).await;
    let before = permit_balances(&chain).await;

    let resp = app.route(&new_key(), &call(&chain, "")).await;

    assert_ne!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["code"], "permit2_allowance_required", "{env}");
    assert!(env.to_string().contains("x402-router wallet approve-permit2"), "{env}");
    assert_eq!(permit_balances(&chain).await, before);
    assert_eq!(token_nonce(&chain).await, U256::ZERO);
    assert_eq!(chain.stats().await["/v2/permit2"]["sponsored"], 0);
}
