//! Traces (issue 26): with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a router process exports each
//! call as one OpenTelemetry trace over OTLP/HTTP (protobuf), with a span per upstream
//! exchange and per chain read; the trace id is in the call's log lines and in its signed
//! receipt. The collector here is a real HTTP server decoding the export requests.

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use x402_router_testkit::Deadline;

use actix_web::{App, HttpResponse, HttpServer, web};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{Value, json};

use crate::helpers::*;

/// One exported span: trace id (hex), span name, and whether it has a parent.
#[derive(Debug, Clone)]
struct Exported {
    trace_id: String,
    name: String,
    root: bool,
}

type Spans = Arc<Mutex<Vec<Exported>>>;

async fn receive(body: web::Bytes, spans: web::Data<Spans>) -> HttpResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body.as_ref()) else {
        return HttpResponse::BadRequest().finish();
    };
    let mut all = spans.lock().unwrap();
    for span in request.resource_spans.iter().flat_map(|r| &r.scope_spans).flat_map(|s| &s.spans) {
        all.push(Exported {
            trace_id: span.trace_id.iter().map(|b| format!("{b:02x}")).collect(),
            name: span.name.clone(),
            root: span.parent_span_id.is_empty(),
        });
    }
    HttpResponse::Ok().content_type("application/x-protobuf").body(Vec::new())
}

/// An OTLP/HTTP collector on 127.0.0.1: its base URL and what it received.
fn start_collector() -> (String, Spans, actix_web::dev::ServerHandle) {
    let spans: Spans = Arc::default();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let data = web::Data::new(spans.clone());
    let server =
        HttpServer::new(move || App::new().app_data(data.clone()).route("/v1/traces", web::post().to(receive)))
            .workers(1)
            .shutdown_timeout(0)
            .listen(listener)
            .unwrap()
            .run();
    let handle = server.handle();
    tokio::spawn(server);
    (format!("http://127.0.0.1:{port}"), spans, handle)
}

#[actix_web::test]
async fn a_paid_call_is_one_trace_with_its_upstream_and_chain_spans_and_its_id_is_in_logs_and_receipt() {
    let chain = Devnet::start().await;
    let db = TestDb::new().await;
    let agent = create_agent(&db, "traced").await;
    let (collector, spans, handle) = start_collector();
    let opts = AppOptions { extra: chain.router_extra(), ..Default::default() };
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let args = serve_args(&opts, &db.url, &format!("x4r-traces-{}:", uuid::Uuid::new_v4().simple()), &bind);
    let log_path = std::env::temp_dir().join(format!("x4r-traces-{}.log", uuid::Uuid::new_v4().simple()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut router = tokio::process::Command::new(env!("CARGO_BIN_EXE_x402-router"))
        .args(&args[1..])
        .env_remove("DATABASE_URL")
        .env_remove("REDIS_URL")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &collector)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env("LOG_FORMAT", "json")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let address = format!("http://{bind}");
    let client = reqwest::Client::new();
    let mut deadline =
        Deadline::after(Duration::from_secs(15), "the router did not come up").every(Duration::from_millis(50));
    while client.get(format!("{address}/healthz")).send().await.is_err() {
        deadline.next_poll().await.unwrap();
    }

    let body = json!({"url": chain.url("/v2/weather"), "max_amount": "10000"});
    let resp = route_at(&client, &address, &agent, &new_key(), &body).await;
    assert_eq!(resp.status(), 200);
    let env: Value = resp.json().await.unwrap();
    assert_eq!(env["payment"]["status"], "settled", "{env}");
    let receipt =
        get_json(&client, &format!("{address}/receipts/{}", env["receipt_id"].as_str().unwrap()), &agent.key).await;
    let trace_id = receipt["trace_id"].as_str().expect("the receipt carries the trace id").to_owned();
    assert_eq!(trace_id.len(), 32, "{receipt}");
    assert!(
        x402_router::receipts::Receipt::verify_json(&receipt.to_string()).is_ok(),
        "the trace id is part of a receipt that verifies"
    );

    // The call's spans arrive at the collector: one trace, one root (the request), two
    // upstream exchanges (unpaid, then paid) and the chain reads of the payment.
    let mut deadline = Deadline::after(Duration::from_secs(20), "the condition").every(Duration::from_millis(100));
    let of_call = loop {
        let of_call: Vec<Exported> = spans.lock().unwrap().iter().filter(|s| s.trace_id == trace_id).cloned().collect();
        let upstream = of_call.iter().filter(|s| s.name == "upstream").count();
        let chain_reads = of_call.iter().filter(|s| s.name == "chain").count();
        if upstream >= 2 && chain_reads >= 1 && of_call.iter().any(|s| s.root) {
            break of_call;
        }
        if deadline.next_poll().await.is_err() {
            panic!("spans of trace {trace_id} never arrived: {of_call:?}");
        }
    };
    assert_eq!(of_call.iter().filter(|s| s.root).count(), 1, "one root span: {of_call:?}");
    assert_eq!(of_call.iter().filter(|s| s.name == "upstream").count(), 2, "{of_call:?}");

    // Every log line of the request names the trace.
    router.kill().await.unwrap();
    handle.stop(false).await;
    let logs = std::fs::read_to_string(&log_path).unwrap();
    let _ = std::fs::remove_file(&log_path);
    let traced = logs.lines().filter(|l| l.contains(&trace_id) && l.contains("payment signed and recorded")).count();
    assert_eq!(traced, 1, "the paid call's log line carries its trace id:\n{logs}");
}
