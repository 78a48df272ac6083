//! Hostile upstream content (NUL characters, integers beyond 2^53, deep nesting, invalid
//! UTF-8) is recorded exactly once and replayed byte for byte, never executed again.

use base64::Engine;
use serde_json::{Value, json};

use crate::helpers::upstream::{TWO_POW_64, TWO_POW_64_TIMES_10, hostile_body};
use crate::helpers::*;

/// Makes the key's row look abandoned: were it still in flight, the next call would take it
/// over and execute again.
async fn age_past_abandonment(app: &TestApp, key: &str) {
    exec(
        &app.db,
        &format!(
            "UPDATE idempotency_keys SET created_at = now() - interval '1 hour' \
             WHERE agent_id = '{}' AND key = '{key}'",
            app.agent.id
        ),
    )
    .await;
}

/// Calls `url` under a new key, then replays it past the abandonment window, from Redis and
/// from Postgres: every replay is the first answer byte for byte. Returns status and bytes.
async fn answer_and_replays(app: &TestApp, url: &str, max_amount: Option<&str>) -> (u16, Vec<u8>) {
    let key = new_key();
    let mut body = json!({ "url": url });
    if let Some(m) = max_amount {
        body["max_amount"] = json!(m);
    }
    let first = app.route(&key, &body).await;
    let status = first.status().as_u16();
    assert_eq!(first.headers().get("content-type").unwrap(), "application/json");
    let bytes = first.bytes().await.unwrap().to_vec();
    assert!(matches!(status, 200 | 402 | 502), "{url}: {status} {}", String::from_utf8_lossy(&bytes));
    age_past_abandonment(app, &key).await;
    for source in ["redis", "postgres"] {
        if source == "postgres" {
            app.forget_cached(&key).await;
        }
        let replay = app.route(&key, &body).await;
        assert_eq!(replay.status().as_u16(), status, "{url} from {source}");
        assert_eq!(replay.headers().get("x-idempotent-replay").unwrap(), "true", "{url} from {source}");
        let again = replay.bytes().await.unwrap().to_vec();
        assert_eq!(
            String::from_utf8_lossy(&again),
            String::from_utf8_lossy(&bytes),
            "{url}: the replay from {source} differs from the first answer"
        );
        assert_eq!(again, bytes);
    }
    let rows = count(
        &app.db,
        &format!("SELECT count(*) AS n FROM idempotency_keys WHERE key = '{key}' AND status <> 'in_flight'"),
    )
    .await;
    assert_eq!(rows, 1, "{url}: the answer was recorded");
    (status, bytes)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The exact body of `/hostile/<name>`.
fn upstream_bytes(name: &str) -> Vec<u8> {
    hostile_body(name).unwrap().2
}

#[actix_web::test]
async fn nul_in_an_upstream_answer_is_recorded_once_and_replayed_byte_identical() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;

    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/nul-json"), None).await;
    assert_eq!(status, 200);
    // The upstream's JSON is embedded verbatim as the envelope's body.
    let mut expected = b"\"body\":".to_vec();
    expected.extend(upstream_bytes("nul-json"));
    assert!(contains(&bytes, &expected), "{}", String::from_utf8_lossy(&bytes));
    let env: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(env["body"]["greeting"], "a\u{0}b");

    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/nul-text"), None).await;
    assert_eq!(status, 200);
    let env: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(env["body"], json!({ "text": "before\u{0}after" }));

    assert_eq!(up.hits.get("/hostile/nul-json"), 1);
    assert_eq!(up.hits.get("/hostile/nul-text"), 1);
}

#[actix_web::test]
async fn integers_beyond_two_pow_53_pass_through_verbatim() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/big-numbers"), None).await;
    assert_eq!(status, 200);
    let mut expected = b"\"body\":".to_vec();
    expected.extend(upstream_bytes("big-numbers"));
    assert!(contains(&bytes, &expected), "{}", String::from_utf8_lossy(&bytes));
    assert!(contains(&bytes, format!("\"two_pow_64\":{TWO_POW_64},").as_bytes()));
    assert!(contains(&bytes, format!("\"times_10\":{TWO_POW_64_TIMES_10},").as_bytes()));
    assert_eq!(up.hits.get("/hostile/big-numbers"), 1);
}

#[actix_web::test]
async fn deep_nesting_and_invalid_utf8_are_replayed_byte_identical() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;

    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/deep"), None).await;
    assert_eq!(status, 200);
    let mut expected = b"\"body\":".to_vec();
    expected.extend(upstream_bytes("deep"));
    assert!(contains(&bytes, &expected), "the nested JSON is embedded verbatim");

    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/bad-utf8-json"), None).await;
    assert_eq!(status, 200);
    let env: Value = serde_json::from_slice(&bytes).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(upstream_bytes("bad-utf8-json"));
    assert_eq!(env["body"], json!({ "base64": b64 }));

    assert_eq!(up.hits.get("/hostile/deep"), 1);
    assert_eq!(up.hits.get("/hostile/bad-utf8-json"), 1);
}

#[actix_web::test]
async fn nul_in_a_declined_402_is_recorded_once_and_replayed_byte_identical() {
    let app = spawn_app().await;
    let up = TestUpstream::start().await;
    let (status, bytes) = answer_and_replays(&app, &up.url("/hostile/v1-402-nul"), Some("50000")).await;
    assert_eq!(status, 402);
    let err: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(err["accepts"][0]["description"], "nul \u{0} inside");
    assert_eq!(up.hits.get("/hostile/v1-402-nul"), 1);
}

#[actix_web::test]
async fn nul_in_paid_402_requirements_is_stored_and_the_call_is_paid_once() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let (status, bytes) = answer_and_replays(&app, &chain.url("/v2/hostile"), Some("10000")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let env: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(env["body"]["note"], "nul\u{0}inside");
    let stats = &chain.stats().await["/v2/hostile"];
    assert_eq!(stats["payment_attempts"], 1, "{stats}");
    assert_eq!(stats["paid"], 1, "{stats}");
    assert_eq!(stats["requests"], 2, "one unpaid probe, one paid request: {stats}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'settled'").await, 1);
}

#[actix_web::test]
async fn nul_in_a_refusal_reason_is_recorded_and_the_payment_is_never_resent() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let (status, bytes) = answer_and_replays(&app, &chain.url("/v2/reject-hostile"), Some("10000")).await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&bytes));
    let err: Value = serde_json::from_slice(&bytes).unwrap();
    // Passed through unchanged to the agent.
    assert_eq!(err["invalidReason"], "invalid_\u{0}_signature", "{err}");
    assert_eq!(err["payment"]["status"], "rejected");
    let stats = &chain.stats().await["/v2/reject-hostile"];
    assert_eq!(stats["payment_attempts"], 1, "the signed payment was sent once: {stats}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments WHERE status = 'rejected'").await, 1);
}

/// A price the upstream gives as a JSON number (issue 22, item 6) may already be rounded by
/// any JSON parser (`123456789012345678901234567890` and `1e30` become doubles): the 402 is
/// refused with `upstream_invalid_402`, nothing is signed. A decimal string is exact, however
/// large, and is shown back to the agent as it was sent.
#[actix_web::test]
async fn a_price_that_is_not_an_exact_decimal_string_is_refused_and_nothing_is_signed() {
    let chain = Devnet::start().await;
    let app = spawn_app_with(AppOptions { extra: chain.router_extra(), ..Default::default() }).await;
    let up = TestUpstream::start().await;
    let huge = "123456789012345678901234567890";
    let price_url = |amount: &str| {
        let q: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("amount", amount)
            .append_pair("asset", &chain.token.to_string())
            .finish();
        up.url(&format!("/v1-402-price?{q}"))
    };
    for amount in [huge.to_owned(), "1e30".into(), "1E+30".into(), "10000".into(), "10000.0".into(), "\"1e30\"".into()]
    {
        let resp = app.route(&new_key(), &json!({"url": price_url(&amount), "max_amount": huge})).await;
        let status = resp.status().as_u16();
        let env: Value = resp.json().await.unwrap();
        assert_eq!((status, env["code"].as_str()), (502, Some("upstream_invalid_402")), "{amount}: {env}");
    }
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0, "nothing was signed");
    // Beside a well-formed entry too: on the old code the number was skipped as malformed and
    // echoed back to the agent rounded (1.2345678901234568e29) in the router's own 402.
    let resp = app.route(&new_key(), &json!({"url": format!("{}&second=1", price_url(huge)), "max_amount": "1"})).await;
    let status = resp.status().as_u16();
    let env: Value = resp.json().await.unwrap();
    assert_eq!((status, env["code"].as_str()), (502, Some("upstream_invalid_402")), "{env}");
    assert!(!env.to_string().contains("e29"), "never a rounded price: {env}");

    // Exact: the price is read as the upstream wrote it, compared exactly, and shown as sent.
    let resp = app.route(&new_key(), &json!({"url": price_url(&format!("\"{huge}\"")), "max_amount": "10000"})).await;
    let status = resp.status().as_u16();
    let env: Value = resp.json().await.unwrap();
    assert_eq!((status, env["code"].as_str()), (402, Some("payment_over_max_amount")), "{env}");
    assert_eq!(env["accepts"][0]["maxAmountRequired"], huge, "{env}");
    assert!(env["error"].as_str().unwrap().contains(huge), "{env}");
    assert_eq!(count(&app.db, "SELECT count(*) AS n FROM payments").await, 0);
}
