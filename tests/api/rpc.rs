//! Several RPC URLs per network (`X402_RPC_URLS` repeating a network): a dead URL is
//! skipped, a URL serving another chain is refused at start and never answers afterwards,
//! and every URL has its own metrics, labelled by position, never by URL. Real anvil
//! processes throughout.

use std::time::Duration;

use serde_json::{Value, json};
use x402_router::x402::{Chain, ChainError, Network};

use crate::helpers::*;

/// The value of the sample of `metric` whose labels include every one of `labels`.
fn sample(metrics: &str, metric: &str, labels: &[&str]) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[actix_web::test]
async fn a_dead_rpc_url_is_skipped_and_the_payment_settles_through_the_next() {
    let chain = Devnet::start().await;
    let dead = format!("http://127.0.0.1:{}/secret-key", free_port());
    let app = spawn_app_with(AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532={dead},eip155:84532={}", chain.rpc_url)),
            ("x402-assets".into(), format!("eip155:84532={}@6", chain.token)),
        ],
        ..Default::default()
    })
    .await;
    let before = chain.balance(PAY_TO).await;

    let resp = app.route(&new_key(), &json!({"url": chain.url("/v2/weather"), "max_amount": "50000"})).await;

    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    assert_eq!(chain.balance(PAY_TO).await, before + alloy::primitives::U256::from(PRICE));
    let metrics = app.metrics_text().await;
    let requests = "x402_router_rpc_endpoint_requests_total";
    let net = "network=\"eip155:84532\"";
    assert!(sample(&metrics, requests, &[net, "endpoint=\"0\"", "outcome=\"error\""]).unwrap_or(0.0) >= 1.0);
    assert!(sample(&metrics, requests, &[net, "endpoint=\"1\"", "outcome=\"ok\""]).unwrap_or(0.0) >= 1.0);
    assert_eq!(sample(&metrics, "x402_router_rpc_endpoint_up", &[net, "endpoint=\"1\""]), Some(1.0));
    assert!(!metrics.contains("secret-key") && !metrics.contains(&chain.rpc_url), "metrics name no URL");
}

#[actix_web::test]
async fn an_rpc_url_serving_another_chain_refuses_start_naming_its_position_not_its_url() {
    let chain = Devnet::start().await;
    let other = BareAnvil::start(31_337).await;
    let db = TestDb::new().await;
    let opts = AppOptions {
        extra: vec![
            ("x402-rpc-urls".into(), format!("eip155:84532={},eip155:84532={}", chain.rpc_url, other.rpc_url)),
            ("x402-assets".into(), format!("eip155:84532={}@6", chain.token)),
        ],
        ..Default::default()
    };
    let mut config = config_from(&serve_args(&opts, &db.url, "test:rpc:", "127.0.0.1:0"));

    let err = x402_router::startup::preflight(&mut config).await.unwrap_err().to_string();

    assert!(err.contains("URL 1 of eip155:84532 serves chain id 31337, not 84532"), "{err}");
    assert!(!err.contains(&other.rpc_url), "{err}");
}

#[actix_web::test]
async fn a_url_on_another_chain_never_answers_and_the_others_still_do() {
    let chain = Devnet::start().await;
    let other = BareAnvil::start(31_337).await;
    let metrics = x402_router::metrics::Metrics::new().unwrap();
    let urls = |list: &[&str]| list.iter().map(|u| u.parse().unwrap()).collect::<Vec<_>>();
    let timeout = Duration::from_secs(5);
    let rpc_metrics = x402_router::x402::rpc::EndpointMetrics {
        requests: metrics.rpc_endpoint_requests.clone(),
        seconds: metrics.rpc_endpoint_seconds.clone(),
        up: metrics.rpc_endpoint_up.clone(),
    };
    let mixed =
        Chain::with_metrics([(Network::BASE_SEPOLIA, urls(&[&other.rpc_url, &chain.rpc_url]))], timeout, rpc_metrics);
    let wrong_only = Chain::new([(Network::BASE_SEPOLIA, urls(&[&other.rpc_url]))], timeout);

    // The token exists only on the right chain: an answer proves which URL gave it.
    let decimals = mixed.decimals(Network::BASE_SEPOLIA, chain.token).await;
    let refused = wrong_only.decimals(Network::BASE_SEPOLIA, chain.token).await;

    assert_eq!(decimals.unwrap(), 6);
    assert!(matches!(refused, Err(ChainError::ChainIdMismatch { endpoint: 0, actual: 31_337, .. })), "{refused:?}");
    let rendered = metrics.render();
    let labels = ["network=\"eip155:84532\"", "endpoint=\"0\"", "outcome=\"wrong_chain\""];
    assert!(sample(&rendered, "x402_router_rpc_endpoint_requests_total", &labels).unwrap_or(0.0) >= 1.0);
    let ok = ["network=\"eip155:84532\"", "endpoint=\"1\"", "outcome=\"ok\""];
    assert!(sample(&rendered, "x402_router_rpc_endpoint_requests_total", &ok).unwrap_or(0.0) >= 1.0);
}

/// An RPC endpoint in front of `target` that answers 429 to its first `reject` requests.
struct RateLimited {
    url: String,
    seen: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl RateLimited {
    fn start(target: &str, reject: usize) -> Self {
        use actix_web::{App, HttpResponse, HttpServer, web};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let seen = std::sync::Arc::new(AtomicUsize::new(0));
        let state = web::Data::new((std::sync::Arc::clone(&seen), target.to_owned(), reqwest::Client::new()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = HttpServer::new(move || {
            App::new().app_data(state.clone()).default_service(web::to(
                move |s: web::Data<(std::sync::Arc<AtomicUsize>, String, reqwest::Client)>, body: web::Bytes| async move {
                    if s.0.fetch_add(1, Ordering::SeqCst) < reject {
                        return HttpResponse::TooManyRequests().body("rate limited");
                    }
                    let answer = s.2.post(&s.1).header("content-type", "application/json").body(body.to_vec()).send();
                    let bytes = answer.await.unwrap().bytes().await.unwrap();
                    HttpResponse::Ok().content_type("application/json").body(bytes)
                },
            ))
        })
        .workers(1)
        .shutdown_timeout(0)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { url, seen, handle }
    }
}

impl Drop for RateLimited {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

#[actix_web::test]
async fn a_rate_limited_rpc_answer_is_retried_with_back_off() {
    let chain = Devnet::start().await;
    let limited = RateLimited::start(&chain.rpc_url, 2);
    let reads = Chain::new([(Network::BASE_SEPOLIA, vec![limited.url.parse().unwrap()])], Duration::from_secs(5));

    let decimals = reads.decimals(Network::BASE_SEPOLIA, chain.token).await;

    assert_eq!(decimals.unwrap(), 6);
    // Two 429s, then the chain-id check and the call itself.
    assert_eq!(limited.seen.load(std::sync::atomic::Ordering::SeqCst), 4);
}

#[actix_web::test]
async fn a_silent_first_url_leaves_time_for_the_next_within_the_call_timeout() {
    let chain = Devnet::start().await;
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent = format!("http://{}", listener.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let urls = vec![silent.parse().unwrap(), chain.rpc_url.parse().unwrap()];
    let reads = Chain::new([(Network::BASE_SEPOLIA, urls)], Duration::from_secs(2));

    let started = std::time::Instant::now();
    let decimals = reads.decimals(Network::BASE_SEPOLIA, chain.token).await;

    assert_eq!(decimals.unwrap(), 6);
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    hold.abort();
}
