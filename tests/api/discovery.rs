//! Discovery (`GET /discovery`, docs/DESIGN.md §11): the Bazaar metadata of a 402 the router
//! saw, judged per agent; and hostile catalogues (huge, deep, NUL, absurd prices, thousands of
//! entries, an endless body, redirects, a private address) that must leave the router bounded
//! and answering.

use std::convert::Infallible;
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use base64::Engine;
use serde_json::{Value, json};

use crate::helpers::*;

const TOKEN: &str = "0x036CbD53842c5426634e7929541eC2318f3dCF7e";
const OTHER_PAY_TO: &str = "0x00000000000000000000000000000000000000aa";

fn option(network: &str, amount: &str) -> Value {
    json!({"scheme": "exact", "network": network, "amount": amount, "asset": TOKEN, "payTo": PAY_TO.to_string(),
           "maxTimeoutSeconds": 60, "extra": {"name": "USD Coin", "version": "2"}})
}

fn bazaar() -> Value {
    json!({"info": {"input": {"type": "http", "method": "GET", "queryParams": {"city": "Paris"}},
                    "output": {"type": "json", "example": {"temperature_c": 19}}},
           "schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                      "properties": {"input": {"type": "object"}}, "required": ["input"]}})
}

/// A catalogue item in the official facilitator's shape.
fn item(url: &str, description: &str, accepts: Value) -> Value {
    json!({"resource": url, "type": "http", "x402Version": 2, "accepts": accepts, "lastUpdated": "2026-01-01T00:00:00Z",
           "description": description, "mimeType": "application/json", "extensions": {"bazaar": bazaar()}})
}

/// A test server: `/weather` and `/plain` answer an x402 v2 402 (with and without `bazaar`);
/// `/<name>/discovery/resources` serves the catalogue `name` (see [`catalogue`]).
struct Server {
    port: u16,
    hits: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl Server {
    fn start(host: &str, redirect_to: Option<String>) -> Self {
        let listener = TcpListener::bind(format!("{host}:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let data = web::Data::new((Arc::clone(&hits), redirect_to));
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

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let h = self.handle.clone();
        drop(tokio::spawn(async move { h.stop(false).await }));
    }
}

async fn serve(req: HttpRequest, data: web::Data<(Arc<AtomicUsize>, Option<String>)>) -> HttpResponse {
    data.0.fetch_add(1, Ordering::SeqCst);
    let path = req.path().to_owned();
    let required = |extensions: Option<Value>| {
        let mut message = json!({"x402Version": 2, "error": "Payment required",
            "resource": {"url": "https://claimed.example/elsewhere", "description": "Weather\u{0} in a city",
                         "mimeType": "application/json", "serviceName": "Test Weather", "tags": ["weather", "forecast"]},
            "accepts": [option("eip155:84532", "10000"), option("eip155:8453", "7000")]});
        if let Some(e) = extensions {
            message["extensions"] = e;
        }
        let header = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&message).unwrap());
        HttpResponse::PaymentRequired().insert_header(("PAYMENT-REQUIRED", header)).json(json!({}))
    };
    match path.as_str() {
        "/weather" => return required(Some(json!({"bazaar": bazaar()}))),
        "/plain" => return required(None),
        _ => {}
    }
    let Some(name) = path.strip_suffix("/discovery/resources").map(|p| p.trim_start_matches('/').to_owned()) else {
        return HttpResponse::NotFound().finish();
    };
    if name == "redirect" {
        let to = data.1.clone().unwrap_or_default();
        return HttpResponse::Found().insert_header(("location", to)).finish();
    }
    if name == "endless" {
        // An endless body, a few bytes at a time: only a timeout ends it.
        let chunks = futures_util::stream::unfold((), |()| async {
            // lets time pass: this catalogue trickles its body out forever.
            actix_rt::time::sleep(Duration::from_millis(50)).await;
            Some((Ok::<_, Infallible>(web::Bytes::from_static(b"{\"items\": [          ")), ()))
        });
        return HttpResponse::Ok().content_type("application/json").streaming(chunks);
    }
    match catalogue(&name) {
        Some(body) => HttpResponse::Ok().content_type("application/json").body(body),
        None => HttpResponse::NotFound().finish(),
    }
}

/// The bytes of catalogue `name`.
fn catalogue(name: &str) -> Option<Vec<u8>> {
    let page = |items: Vec<Value>| serde_json::to_vec(&json!({"x402Version": 2, "items": items})).unwrap();
    Some(match name {
        "good" => page(
            (0..3)
                .map(|i| {
                    item(
                        &format!("https://good.example/forecast/{i}"),
                        "Good forecast",
                        json!([option("eip155:84532", "1000")]),
                    )
                })
                .collect(),
        ),
        // 3 MB of valid items.
        "huge" => page(
            (0..3000)
                .map(|i| {
                    item(&format!("https://huge.example/{i}"), &"h".repeat(1000), json!([option("eip155:84532", "1")]))
                })
                .collect(),
        ),
        // One item whose schema is nested 40 deep (kept without it), one fine.
        "deep" => {
            let mut deep = json!("leaf");
            for _ in 0..40 {
                deep = json!({"properties": deep});
            }
            let mut a = item("https://deep.example/a", "Deep schema", json!([option("eip155:84532", "1")]));
            a["extensions"]["bazaar"]["schema"] = deep;
            page(vec![a, item("https://deep.example/b", "Shallow", json!([option("eip155:84532", "1")]))])
        }
        // A page nested deeper than any JSON reader goes: not read at all.
        "deeper" => format!("{{\"items\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes(),
        "nul" => {
            let mut a =
                item("https://nul.example/a", "NUL\u{0}here\u{7}\u{1b}[31m", json!([option("eip155:84532", "1")]));
            a["extensions"]["bazaar"]["info"]["input"]["queryParams"] = json!({"k\u{0}ey": "v\u{0}alue"});
            a["tags"] = json!(["t\u{0}ag"]);
            let b = item("https://nul.example/b\u{0}/x", "NUL in the URL", json!([option("eip155:84532", "1")]));
            page(vec![a, b])
        }
        "absurd" => {
            let bad = ["1e30", "-5", "00012", "0x10", "", &"9".repeat(100)];
            let mut items: Vec<Value> = bad
                .iter()
                .enumerate()
                .map(|(i, a)| {
                    item(&format!("https://absurd.example/{i}"), "Bad price", json!([option("eip155:84532", a)]))
                })
                .collect();
            let mut number = option("eip155:84532", "1");
            number["amount"] = json!(1e300);
            items.push(item("https://absurd.example/number", "A JSON number", json!([number])));
            let huge = format!("1{}", "0".repeat(76));
            items.push(item("https://absurd.example/huge", "A huge price", json!([option("eip155:84532", &huge)])));
            page(items)
        }
        // Thousands of small items (under the page cap).
        "thousands" => page(
            (0..3000)
                .map(|i| {
                    json!({"resource": format!("https://many.example/{i}"), "type": "http", "x402Version": 2,
                                "accepts": [option("eip155:84532", "1")]})
                })
                .collect(),
        ),
        _ => return None,
    })
}

async fn discovery(app: &TestApp, query: &str) -> (u16, Value) {
    let resp =
        app.client.get(format!("{}/discovery{query}", app.address)).bearer_auth(&app.agent.key).send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// Every resource of every page of `query` (following `next_cursor`).
async fn all_pages(app: &TestApp, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("{query}&cursor={c}"),
            None => query.to_owned(),
        };
        let (status, page) = discovery(app, &q).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["resources"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

fn urls(resources: &[Value]) -> Vec<String> {
    resources.iter().map(|r| r["url"].as_str().unwrap().to_owned()).collect()
}

async fn set(app: &TestApp, assignments: &str) {
    exec(&app.db, &format!("UPDATE agents SET {assignments} WHERE id = '{}'", app.agent.id)).await;
}

/// The first option of the one resource `GET /discovery?q=weather` shows.
async fn weather_option(app: &TestApp, query: &str) -> Value {
    let (status, page) = discovery(app, &format!("?q=weather{query}")).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["resources"].as_array().unwrap().len(), 1, "{page}");
    page["resources"][0]["accepts"][0].clone()
}

#[actix_web::test]
async fn a_seen_402s_bazaar_metadata_appears_judged_for_each_agents_limits() {
    let anvil = BareAnvil::start(84532).await;
    let app = spawn_app_with(AppOptions { extra: paying_on(&anvil), ..Default::default() }).await;
    let server = Server::start("127.0.0.1", None);
    assert_eq!(discovery(&app, "").await.1["resources"], json!([]), "nothing seen yet");

    // The agent asks for the price (no max_amount): declined, and the 402 is seen.
    for path in ["/weather?city=Paris&api_key=SECRET123", "/plain"] {
        let resp = app.route(&new_key(), &json!({"url": server.url(path)})).await;
        assert_eq!(resp.status(), 402);
    }
    let (status, page) = discovery(&app, "").await;
    assert_eq!(status, 200);
    let text = page.to_string();
    assert!(!text.contains("SECRET123") && !text.contains("claimed.example"), "{page}");
    let resources = page["resources"].as_array().unwrap();
    assert_eq!(urls(resources), vec![server.url("/weather")], "only the 402 that declares bazaar, without its query");
    let r = &resources[0];
    assert_eq!(
        (r["source"].as_str(), r["method"].as_str(), r["type"].as_str()),
        (Some("seen"), Some("GET"), Some("http"))
    );
    assert_eq!(r["description"], "Weather  in a city", "NUL replaced");
    assert_eq!(r["input"]["queryParams"]["city"], "Paris");
    assert_eq!(r["output"]["example"]["temperature_c"], 19);
    assert_eq!(r["schema"]["required"], json!(["input"]));
    let accepts = r["accepts"].as_array().unwrap();
    assert_eq!((accepts[0]["amount"].as_str(), accepts[0]["payable"].as_bool()), (Some("10000"), Some(true)), "{r}");
    assert_eq!(accepts[0]["code"], Value::Null);
    assert_eq!(
        (accepts[1]["payable"].as_bool(), accepts[1]["code"].as_str()),
        (Some(false), Some("payment_unsupported"))
    );
    assert_eq!(r["payable"], true);

    // Filters.
    assert_eq!(discovery(&app, "?q=forecast+WEATHER").await.1["resources"].as_array().unwrap().len(), 1);
    assert_eq!(discovery(&app, "?q=rain").await.1["resources"], json!([]));
    assert_eq!(discovery(&app, "?max_price=6999").await.1["resources"], json!([]));
    assert_eq!(discovery(&app, "?network=eip155:10").await.1["resources"], json!([]));
    assert_eq!(discovery(&app, "?network=base").await.1["resources"].as_array().unwrap().len(), 1, "v1 name of 8453");
    let capped = weather_option(&app, "&max_price=9999").await;
    assert_eq!((capped["payable"].as_bool(), capped["code"].as_str()), (Some(false), Some("payment_over_max_amount")));
    for bad in ["?nope=1", "?q=a&q=b", "?max_price=1.5", "?limit=0", "?cursor=%25", "?payable=maybe"] {
        let (status, body) = discovery(&app, bad).await;
        assert_eq!((status, body["code"].as_str()), (400, Some("bad_request")), "{bad}: {body}");
    }

    // What this agent may pay follows its limits as they are now.
    for (limit, code) in [
        ("max_per_call = 5000", "payment_over_budget"),
        ("daily_budget = 9999", "payment_over_budget"),
        (&format!("allowed_pay_to = ARRAY['{OTHER_PAY_TO}']"), "payment_not_allowed"),
        ("allowed_hosts = ARRAY['other.example']", "upstream_not_allowed"),
    ] {
        set(&app, "max_per_call = NULL, daily_budget = NULL, allowed_pay_to = NULL, allowed_hosts = NULL").await;
        set(&app, limit).await;
        let o = weather_option(&app, "").await;
        assert_eq!((o["payable"].as_bool(), o["code"].as_str()), (Some(false), Some(code)), "{limit}: {o}");
        assert!(o["why_not"].as_str().is_some_and(|w| !w.is_empty()), "{o}");
        assert_eq!(discovery(&app, "?payable=true").await.1["resources"], json!([]), "{limit}");
    }
    let pay_to = PAY_TO.to_string().to_ascii_lowercase();
    set(&app, &format!("allowed_pay_to = ARRAY['{pay_to}'], allowed_hosts = ARRAY['127.0.0.1'], max_per_call = 10000"))
        .await;
    let o = weather_option(&app, "").await;
    assert_eq!(o["payable"], true, "{o}");
    assert_eq!(discovery(&app, "?payable=true").await.1["resources"].as_array().unwrap().len(), 1);
}

/// A router reading these catalogues, keeping at most `max_entries`.
async fn router_reading(catalogues: &[String], max_entries: usize, options: AppOptions) -> TestApp {
    let mut extra = options.extra.clone();
    extra.push(("x402-discovery-urls".into(), catalogues.join(",")));
    extra.push(("x402-discovery-max-entries".into(), max_entries.to_string()));
    spawn_app_with(AppOptions { extra, ..options }).await
}

/// Waits until every configured catalogue was read or failed; the page then.
async fn sources_settled(app: &TestApp) -> Value {
    x402_router_testkit::wait_for(Duration::from_secs(30), "every catalogue read or failed", || async {
        let page = discovery(app, "?limit=1").await.1;
        let settled = page["sources"]
            .as_array()
            .is_some_and(|s| s.iter().all(|s| !s["fetched_at"].is_null() || !s["error"].is_null()));
        settled.then_some(page)
    })
    .await
    .unwrap()
}

/// Settings that pay on `anvil` (chain 84532) with [`TOKEN`].
fn paying_on(anvil: &BareAnvil) -> Vec<(String, String)> {
    vec![
        ("x402-rpc-urls".to_owned(), format!("eip155:84532={}", anvil.rpc_url)),
        ("x402-assets".to_owned(), format!("eip155:84532={TOKEN}@6")),
    ]
}

#[actix_web::test]
async fn hostile_catalogues_leave_the_router_bounded_and_answering() {
    let elsewhere = Server::start("127.0.0.2", None);
    let server =
        Server::start("127.0.0.1", Some(format!("http://127.0.0.2:{}/good/discovery/resources", elsewhere.port)));
    let names = ["good", "huge", "deep", "deeper", "nul", "absurd", "thousands", "endless", "redirect"];
    let catalogues: Vec<String> = names.iter().map(|n| server.url(&format!("/{n}"))).collect();
    // A response cap far above discovery's own page cap: what bounds the catalogues is discovery's.
    let anvil = BareAnvil::start(84532).await;
    let options = AppOptions {
        upstream_timeout_ms: 5000,
        max_response_bytes: 64 << 20,
        extra: paying_on(&anvil),
        ..Default::default()
    };
    let app = router_reading(&catalogues, 200, options).await;

    // The router answers at once while the endless catalogue is still being read (for 5 s).
    let started = Instant::now();
    let (status, _) = discovery(&app, "").await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_millis(2500), "GET /discovery waited {:?}", started.elapsed());

    let page = sources_settled(&app).await;
    let sources: Vec<&Value> = page["sources"].as_array().unwrap().iter().collect();
    let source = |name: &str| sources[names.iter().position(|n| *n == name).unwrap()];
    for (name, resources, error) in [
        ("good", 3, None),
        ("huge", 0, Some("exceeds")),
        ("deep", 2, None),
        ("deeper", 0, Some("not JSON")),
        ("nul", 1, None),
        ("absurd", 1, None),
        ("endless", 0, Some("timed out")),
        ("redirect", 0, Some("HTTP 302")),
    ] {
        let s = source(name);
        assert_eq!(s["resources"], resources, "{name}: {s}");
        match error {
            None => assert!(s["error"].is_null(), "{name}: {s}"),
            Some(e) => assert!(s["error"].as_str().is_some_and(|t| t.contains(e)), "{name}: {s}"),
        }
    }
    assert_eq!(elsewhere.hits.load(Ordering::SeqCst), 0, "a redirect to another origin is never followed");
    // Thousands of entries: the catalogue keeps its share (200 / 10 sources) and pushes out nobody.
    assert_eq!(source("thousands")["resources"], 20, "{}", source("thousands"));
    let everything = all_pages(&app, "?limit=100").await;
    assert!(everything.len() <= 200, "{}", everything.len());
    let good: Vec<String> = urls(&everything).into_iter().filter(|u| u.contains("good.example")).collect();
    assert_eq!(good.len(), 3, "{good:?}");

    let text = serde_json::to_string(&everything).unwrap();
    assert!(!text.contains("\\u0000") && !text.contains("\\u001b"), "NUL and control characters are replaced");
    let find = |url: &str| everything.iter().find(|r| r["url"] == url).cloned().unwrap_or_else(|| panic!("{url}"));
    let nul = find("https://nul.example/a");
    assert_eq!(nul["description"], "NUL here  [31m");
    assert_eq!(nul["input"]["queryParams"]["k\u{FFFD}ey"], "v\u{FFFD}alue");
    assert!(nul["tags"].as_array().unwrap().iter().all(|t| t.as_str().is_some_and(|t| !t.contains('\0'))));
    assert!(find("https://deep.example/a")["schema"].is_null(), "the too-deep schema is left out");
    assert!(!find("https://deep.example/b")["schema"].is_null());
    // Absurd prices: only the one that is a real (if absurd) amount is kept, and no cap pays it.
    let absurd: Vec<String> = urls(&everything).into_iter().filter(|u| u.contains("absurd.example")).collect();
    assert_eq!(absurd, vec!["https://absurd.example/huge".to_owned()]);
    set(&app, "max_per_call = 100000").await;
    let huge = all_pages(&app, "?q=absurd.example").await;
    assert_eq!(huge[0]["accepts"][0]["code"], "payment_over_budget", "{}", huge[0]);
}

#[actix_web::test]
async fn a_catalogue_on_a_refused_address_is_never_contacted() {
    let private = Server::start("127.0.0.2", None);
    let options = AppOptions {
        allow_private: false,
        extra: vec![("upstream-allow-cidrs".into(), "127.0.0.1/32".into())],
        ..Default::default()
    };
    let app = router_reading(&[format!("http://127.0.0.2:{}/good", private.port)], 100, options).await;
    let page = sources_settled(&app).await;
    let error = page["sources"][0]["error"].as_str().unwrap_or_default().to_owned();
    assert!(error.contains("not allowed"), "{page}");
    assert_eq!(private.hits.load(Ordering::SeqCst), 0);
    assert_eq!(page["resources"], json!([]));
}
