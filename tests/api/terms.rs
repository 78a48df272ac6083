//! Paying ahead on known terms (issue 25, item 1): the router remembers what an upstream's
//! 402 asked (per agent and whole request: method, URL with query, forwarded headers, body)
//! and pays the next identical call with its first request. Terms that changed are paid once
//! more with the same nonce, so the chain lets at most one of the two authorizations move
//! money. Real anvil, the project's token and test upstream (`?price=N` changes a route's
//! price, `?keep=all` hoards every authorization it is sent, `?free=1` stops charging; `POST
//! /_defaults` sets them for one exact URL between two calls); money is counted on-chain.

use alloy::primitives::U256;
use serde_json::{Value, json};

use crate::helpers::*;

async fn stat(chain: &Devnet, path: &str, field: &str) -> u64 {
    chain.stats().await[path][field].as_u64().unwrap_or(0)
}

/// `(amount, charge_proven)` of the intent of `key`.
async fn intent(app: &TestApp, key: &str) -> (String, bool) {
    let of = |column: &str| format!("SELECT {column} AS n FROM payments WHERE idempotency_key = '{key}'");
    let amount = count(&app.db, &of("amount::bigint")).await;
    let proven = count(&app.db, &of("charge_proven::int::bigint")).await;
    (amount.to_string(), proven == 1)
}

async fn paid(app: &TestApp, url: String) -> Value {
    let resp = app.route(&new_key(), &json!({"url": url, "max_amount": "50000"})).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    env
}

#[actix_web::test]
async fn known_terms_are_paid_with_the_first_request_unless_turned_off() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    let requests = async || stat(&chain, "/v2/weather", "requests").await;
    paid(&app, chain.url("/v2/weather?city=Paris")).await;
    assert_eq!(requests().await, 2, "probe, then the paid request");
    // The same request under another key: the terms are known, the first request pays.
    paid(&app, chain.url("/v2/weather?city=Paris")).await;
    assert_eq!(requests().await, 3);
    assert_eq!(stat(&chain, "/v2/weather", "paid").await, 2);
    // Another query is another request: its price is asked first.
    paid(&app, chain.url("/v2/weather?city=Rome")).await;
    assert_eq!(requests().await, 5);
    // Another agent learns its own terms (never paid ahead on another agent's).
    let other = create_agent(&app.db, "other").await;
    let resp = app
        .route_as(&other, &new_key(), &json!({"url": chain.url("/v2/weather?city=Paris"), "max_amount": "50000"}))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(requests().await, 7);

    let off = paid_app_with(&chain, &[("requirements-cache-seconds", "0")]).await;
    paid(&off, chain.url("/v2/weather")).await;
    paid(&off, chain.url("/v2/weather")).await;
    assert_eq!(requests().await, 11, "off: every call probes");
}

/// A price is the price of one request (issue 38, item 2): terms learnt for `?price=30000`
/// are never signed for `?price=10000`, nor for another body of the same URL, even to an
/// upstream that keeps every authorization it is sent (a lenient one would settle it).
#[actix_web::test]
async fn terms_learnt_for_one_request_are_never_signed_for_another() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    paid(&app, chain.url("/v2/weather?price=30000")).await;
    let env = paid(&app, chain.url("/v2/weather?price=10000&keep=all")).await;
    assert_eq!(env["payment"]["amount"], "10000");
    // Another body, same URL: the price learnt for the first body is not this one's.
    let echo = |size: &str| json!({"url": chain.url("/v2/echo"), "method": "POST", "body": {"size": size}, "max_amount": "50000"});
    chain.set_defaults("price=30000").await;
    assert_eq!(app.route(&new_key(), &echo("large")).await.status(), 200);
    chain.set_defaults("price=10000&keep=all").await;
    assert_eq!(app.route(&new_key(), &echo("small")).await.status(), 200);
    let kept = chain.kept().await;
    assert_eq!(kept.len(), 2, "{kept:?}");
    for auth in &kept {
        assert_eq!(auth["value"], "10000", "only this request's own price was signed: {kept:?}");
    }
    assert_eq!(settle_kept(&chain).await["settled"], 0, "both were settled as asked, once");
    // The same request again is paid ahead, at its own price.
    let requests = stat(&chain, "/v2/weather", "requests").await;
    let env = paid(&app, chain.url("/v2/weather?price=10000&keep=all")).await;
    assert_eq!(env["payment"]["amount"], "10000");
    assert_eq!(stat(&chain, "/v2/weather", "requests").await, requests + 1, "paid with the first request");
}

/// The price fell between two calls of one request, and the upstream hoards every
/// authorization it gets: it holds the one signed for the old price and the one for the new.
/// Both carry the same nonce, so exactly one moves money: the new price, once.
#[actix_web::test]
async fn a_changed_price_is_paid_once_with_the_same_nonce_even_by_a_hoarding_upstream() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    chain.set_defaults("price=3000").await;
    paid(&app, chain.url("/v2/weather")).await;
    let before = chain.balance(PAY_TO).await;
    let router_before = chain.balance(ROUTER_ADDRESS).await;

    chain.set_defaults("price=1200&keep=all").await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["amount"], "1200");
    assert_eq!(env["payment"]["nonce"], router_nonce(app.agent.id, &key, &body).to_string());
    assert_eq!(stat(&chain, "/v2/weather", "kept").await, 2, "the old price's and the new price's");
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(1200u64));
    // The upstream submits both: the chain refuses both (the nonce is used).
    let kept = settle_kept(&chain).await;
    assert_eq!(kept["settled"], 0, "{kept}");
    assert_eq!(kept["refused"].as_array().unwrap().len(), 2, "{kept}");
    assert_eq!(router_before - chain.balance(ROUTER_ADDRESS).await, U256::from(1200u64));
    // The intent reserved the larger price until the chain showed what moved.
    assert_eq!(intent(&app, &key).await, ("1200".into(), true));
    assert_eq!(chain.authorizations_used_by(ROUTER_ADDRESS).await, 2, "one per call");
}

#[actix_web::test]
async fn a_price_rise_is_paid_at_the_new_price_on_v1_too() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    chain.set_defaults("price=1000").await;
    paid(&app, chain.url("/v1/weather")).await;
    let before = chain.balance(PAY_TO).await;
    chain.set_defaults("price=2500").await;
    let key = new_key();
    let body = json!({"url": chain.url("/v1/weather"), "max_amount": "50000"});
    let env: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["x402_version"], 1);
    assert_eq!(env["payment"]["amount"], "2500");
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(2500u64));
    assert_eq!(intent(&app, &key).await, ("2500".into(), true));
}

#[actix_web::test]
async fn a_changed_permit2_price_is_paid_once_at_the_new_price() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    chain.set_defaults("price=3000").await;
    paid(&app, chain.url("/v2/permit2")).await;
    let before = chain.balance(PAY_TO).await;
    chain.set_defaults("price=1500").await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/permit2"), "max_amount": "50000"});
    let env: Value = app.route(&key, &body).await.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["payment"]["amount"], "1500");
    assert_eq!(chain.balance(PAY_TO).await - before, U256::from(1500u64));
    assert_eq!(intent(&app, &key).await, ("1500".into(), true));
    assert_eq!(stat(&chain, "/v2/permit2", "paid").await, 2);
}

/// The upstream stopped charging but keeps the authorization it was sent ahead: the call is
/// answered, and the authorization counts against the budget until it settles or expires.
#[actix_web::test]
async fn an_upstream_that_stopped_charging_keeps_the_payment_reserved_until_the_chain_decides() {
    let chain = Devnet::start().await;
    let app = paid_app_with(&chain, &[]).await;
    paid(&app, chain.url("/v2/weather")).await;
    chain.set_defaults("free=1&keep=all").await;
    let key = new_key();
    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "50000"});
    let resp = app.route(&key, &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["status"], 200);
    assert_ne!(env["payment"]["status"], "settled", "{env}");
    // It charged nothing: the next call probes first instead of handing out another one.
    let requests = stat(&chain, "/v2/weather", "requests").await;
    let again = app.route(&new_key(), &json!({"url": chain.url("/v2/weather")})).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap()["payment"], Value::Null);
    assert_eq!(stat(&chain, "/v2/weather", "requests").await, requests + 1);
    assert_eq!(stat(&chain, "/v2/weather", "kept").await, 1, "one authorization handed out, not two");
    let reserved = count(
        &app.db,
        &format!("SELECT amount::bigint AS n FROM payments WHERE idempotency_key = '{key}' AND status <> 'expired'"),
    )
    .await;
    assert_eq!(reserved, i64::try_from(PRICE).unwrap(), "the authorization it holds stays reserved");
    // It settles it later: reconcile counts it as spent.
    assert_eq!(settle_kept(&chain).await["settled"], 1);
    reconcile_now(&app.db, &chain);
    let settled = count(
        &app.db,
        &format!("SELECT count(*) AS n FROM payments WHERE idempotency_key = '{key}' AND status = 'settled'"),
    )
    .await;
    assert_eq!(settled, 1);
}

/// Terms moved to another token: never paid on top of a live authorization (another token
/// is another nonce space); the call is refused with the reason, and a new key pays the new
/// terms.
#[actix_web::test]
async fn terms_moved_to_another_token_are_not_paid_on_top_of_a_live_authorization() {
    let chain = Devnet::start().await;
    let assets = format!("eip155:{0}={1}@6,eip155:{0}={2}@6+permit2", chain.chain_id, chain.token, chain.plain_token);
    let mut extra: Vec<(String, String)> =
        chain.router_extra().into_iter().filter(|(k, _)| k != "x402-assets").collect();
    extra.push(("x402-assets".into(), assets));
    let app = spawn_app_with(AppOptions { extra, ..Default::default() }).await;
    paid(&app, chain.url("/v2/permit2")).await;
    let plain_before = chain.balance_in(chain.plain_token, PAY_TO).await;
    let before = chain.balance(PAY_TO).await;
    chain.set_defaults("token=plain").await;
    let body = json!({"url": chain.url("/v2/permit2"), "max_amount": "50000"});
    let resp = app.route(&new_key(), &body).await;
    assert_eq!(resp.status(), 502);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["code"], "payment_rejected", "{env}");
    assert_eq!(chain.balance(PAY_TO).await, before, "nothing moved");
    assert_eq!(chain.balance_in(chain.plain_token, PAY_TO).await, plain_before, "nothing moved");
    // A new key pays the terms now known, once.
    paid(&app, chain.url("/v2/permit2")).await;
    assert_eq!(chain.balance_in(chain.plain_token, PAY_TO).await - plain_before, U256::from(PRICE));
}

/// Notes, for every claim, its transaction and whether it committed without waiting for the
/// WAL flush (`synchronous_commit` as the claim's statement left it).
async fn note_claims(app: &TestApp) {
    for sql in [
        "CREATE TABLE claim_commits (key text PRIMARY KEY, xid bigint NOT NULL, sync text NOT NULL)",
        "CREATE FUNCTION note_claim() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           INSERT INTO claim_commits VALUES (NEW.key, txid_current(), current_setting('synchronous_commit')); \
           RETURN NULL; END $$",
        "CREATE TRIGGER note_claim AFTER INSERT ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION note_claim()",
    ] {
        exec(&app.db, sql).await;
    }
}

/// Whether the claim of `key` committed without waiting for the WAL flush.
async fn claim_deferred(app: &TestApp, key: &str) -> bool {
    count(&app.db, &format!("SELECT (sync = 'off')::int::bigint AS n FROM claim_commits WHERE key = '{key}'")).await
        == 1
}

/// Transactions committed after the claim of `key` that wrote its key row or its intent: a
/// synchronous commit of the call after its claim, which flushed the claim's WAL too.
async fn writes_after_claim(app: &TestApp, key: &str) -> i64 {
    count(
        &app.db,
        &format!(
            "SELECT count(*) AS n FROM claim_commits c, \
               (SELECT xmin::text::bigint AS x FROM idempotency_keys WHERE key = '{key}' \
                UNION ALL SELECT xmin::text::bigint FROM payments WHERE idempotency_key = '{key}') w \
              WHERE c.key = '{key}' AND w.x <> c.xid % 4294967296"
        ),
    )
    .await
}

/// A call paid ahead commits its claim without waiting for the WAL flush: the intent's
/// synchronous commit, before the payment leaves, writes it to disk. Every other way to the
/// upstream makes the claim durable first: a call on known terms that cannot be paid ahead
/// (here over the agent's `max_amount`) rewrites its key row synchronously before the unpaid
/// request leaves, and a call on unknown terms claims synchronously. Held at the moment the
/// upstream is contacted, the ledger shows it; the answers are as ever.
#[actix_web::test]
async fn a_claim_is_on_disk_before_the_upstream_hears_of_the_call() {
    use x402_router::faults::Point;
    use x402_router::startup::Hooks;
    let chain = Devnet::start().await;
    for (target, max_amount, status) in [(Point::PaymentLeaving, "50000", 200), (Point::BeforeUpstreamSend, "10", 402)]
    {
        let (hook, held, armed) = hold_at(target);
        let hooks = Hooks { at: Some(hook), ..Default::default() };
        let app = spawn_app_with(AppOptions { extra: chain.router_extra(), hooks, ..Default::default() }).await;
        note_claims(&app).await;
        paid(&app, chain.url("/v2/weather")).await;
        // Terms unknown at the first call: claimed durably at once.
        let deferred = count(&app.db, "SELECT count(*) AS n FROM claim_commits WHERE sync = 'off'").await;
        assert_eq!(deferred, 0, "a claim on unknown terms waits for its flush");

        let key = new_key();
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        let body = json!({"url": chain.url("/v2/weather"), "max_amount": max_amount});
        let check = async {
            held.reached.notified().await;
            assert!(claim_deferred(&app, &key).await, "{target:?}: terms known, the claim is deferred");
            assert!(writes_after_claim(&app, &key).await >= 1, "{target:?}: nothing flushed the claim");
            held.thaw.send(true).unwrap();
        };
        let (resp, ()) = tokio::join!(app.route(&key, &body), check);
        assert_eq!(resp.status(), status, "{target:?}");
    }
}
