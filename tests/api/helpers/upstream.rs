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
/// `/slow?ms=N` (then JSON), `/big?bytes=N`, `/v1-402` (a v1 402 body), and `/hostile/<name>`
/// (the exact bytes of [`hostile_body`]).
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
            // lets time pass: this route simulates an upstream that takes `ms` to answer.
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
        // A v1 402 whose `maxAmountRequired` is the raw JSON token `?amount=` (a number or a
        // quoted string, inserted verbatim), for the token `?asset=`; `&second=1` adds a
        // well-formed second entry (price "10000").
        "v1-402-price" => {
            let param = |name: &str| {
                url::form_urlencoded::parse(req.query_string().as_bytes())
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.into_owned())
            };
            let amount = param("amount").unwrap_or_else(|| "\"10000\"".into());
            let asset = param("asset").unwrap_or_else(|| "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into());
            let entry = |amount: &str| {
                format!(
                    r#"{{"scheme":"exact","network":"base-sepolia","maxAmountRequired":{amount},"resource":"http://example.test/x","description":"d","mimeType":"application/json","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"asset":"{asset}","extra":{{"name":"USD Coin","version":"2"}}}}"#
                )
            };
            let mut accepts = entry(&amount);
            if param("second").as_deref() == Some("1") {
                accepts = format!("{accepts},{}", entry("\"10000\""));
            }
            let body = format!(r#"{{"x402Version":1,"error":"X-PAYMENT header is required","accepts":[{accepts}]}}"#);
            HttpResponse::PaymentRequired().content_type("application/json").body(body)
        }
        "hostile" => {
            let name = path.rsplit('/').next().unwrap_or("");
            match hostile_body(name) {
                Some((status, content_type, bytes)) => {
                    HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                        .content_type(content_type)
                        .body(bytes)
                }
                None => HttpResponse::NotFound().finish(),
            }
        }
        _ => HttpResponse::Ok().json(json!({"ok": true, "path": path})),
    }
}

/// `2^64`, and `2^64 · 10`: integers no double (and no u64) holds.
pub const TWO_POW_64: &str = "18446744073709551616";
pub const TWO_POW_64_TIMES_10: &str = "184467440737095516160";

/// What `/hostile/<name>` answers: status, content type and the exact body bytes.
pub fn hostile_body(name: &str) -> Option<(u16, &'static str, Vec<u8>)> {
    let json = "application/json";
    Some(match name {
        // JSON whose strings hold NUL (escaped, as JSON requires).
        "nul-json" => (200, json, br#"{"greeting":"a\u0000b","nested":{"nul":"\u0000"},"list":["\u0000x"]}"#.to_vec()),
        // Plain text with a raw NUL byte.
        "nul-text" => (200, "text/plain", b"before\0after".to_vec()),
        "big-numbers" => (
            200,
            json,
            format!(r#"{{"two_pow_64":{TWO_POW_64},"times_10":{TWO_POW_64_TIMES_10},"negative":-{TWO_POW_64},"exact":0.10000000000000000555}}"#)
                .into_bytes(),
        ),
        // Deeper than serde_json's default recursion limit (128).
        "deep" => (200, json, format!("{}{}", "[".repeat(1000), "]".repeat(1000)).into_bytes()),
        // Declared JSON, but not UTF-8.
        "bad-utf8-json" => (200, json, b"{\"a\":\"\xff\xfe\"}".to_vec()),
        // A v1 402 (for a network the test router does not pay on) with NUL in its strings.
        "v1-402-nul" => (
            402,
            json,
            br#"{"x402Version":1,"error":"pay\u0000me","accepts":[{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000","resource":"http://example.test/x","description":"nul \u0000 inside","mimeType":"application/json","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,"asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","extra":{"name":"USDC","version":"2","note":"\u0000"}}]}"#
                .to_vec(),
        ),
        _ => return None,
    })
}
