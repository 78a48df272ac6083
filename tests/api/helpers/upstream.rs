//! A real HTTP upstream for the tests, counting the requests it serves per path.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use serde_json::json;

#[derive(Clone, Default)]
pub struct Hits(Arc<Mutex<HashMap<String, usize>>>);

impl Hits {
    fn hit(&self, path: &str) {
        *self.0.lock().unwrap().entry(path.to_owned()).or_default() += 1;
    }
    /// Requests served on `path`.
    pub fn get(&self, path: &str) -> usize {
        self.0.lock().unwrap().get(path).copied().unwrap_or(0)
    }
    /// Requests served in all.
    pub fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
}

pub struct TestUpstream {
    pub port: u16,
    pub hits: Hits,
    handle: actix_web::dev::ServerHandle,
}

impl TestUpstream {
    pub async fn start() -> Self {
        let hits = Hits::default();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let data = web::Data::new(hits.clone());
        let server = HttpServer::new(move || App::new().app_data(data.clone()).default_service(web::to(serve)))
            .workers(2)
            .shutdown_timeout(0)
            .listen(listener)
            .unwrap()
            .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { port, hits, handle }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for TestUpstream {
    fn drop(&mut self) {
        let h = self.handle.clone();
        // Stopping is async; fire and forget (the runtime ends with the test anyway).
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

fn query_u64(req: &HttpRequest, name: &str) -> Option<u64> {
    url::form_urlencoded::parse(req.query_string().as_bytes())
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// Every path counts a hit, then behaves by its first segment:
/// `/ok…` JSON, `/echo` echoes method/headers/body, `/text`, `/binary`, `/status/N`,
/// `/slow?ms=N` (then JSON), `/big?bytes=N`, `/v1-402` (a v1 402 body).
async fn serve(req: HttpRequest, hits: web::Data<Hits>, body: web::Bytes) -> HttpResponse {
    let path = req.path().to_owned();
    hits.hit(&path);
    let first = path.trim_start_matches('/').split('/').next().unwrap_or("").to_owned();
    match first.as_str() {
        "echo" => {
            let headers: HashMap<String, String> = req
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
                .collect();
            let body_json: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
            HttpResponse::Ok().json(json!({
                "method": req.method().as_str(), "query": req.query_string(), "headers": headers, "body": body_json,
            }))
        }
        "text" => HttpResponse::Ok().content_type("text/plain").body("plain text"),
        "binary" => HttpResponse::Ok().content_type("application/octet-stream").body(vec![0u8, 159, 146, 150]),
        "status" => {
            let code = path.rsplit('/').next().and_then(|c| c.parse::<u16>().ok()).unwrap_or(500);
            HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap()).json(json!({"status": code}))
        }
        "slow" => {
            let ms = query_u64(&req, "ms").unwrap_or(1000);
            actix_rt::time::sleep(Duration::from_millis(ms)).await;
            HttpResponse::Ok().json(json!({"slept_ms": ms, "path": path}))
        }
        "big" => {
            let n = query_u64(&req, "bytes").unwrap_or(2_000_000) as usize;
            HttpResponse::Ok().content_type("text/plain").body("x".repeat(n))
        }
        "v1-402" => HttpResponse::PaymentRequired().json(json!({
            "x402Version": 1, "error": "X-PAYMENT header is required",
            "accepts": [{"scheme": "exact", "network": "base-sepolia", "maxAmountRequired": "10000",
                "resource": "http://example.test/x", "description": "d", "mimeType": "application/json",
                "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "maxTimeoutSeconds": 60,
                "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "extra": {"name": "USDC", "version": "2"}}]
        })),
        _ => HttpResponse::Ok().json(json!({"ok": true, "path": path})),
    }
}
