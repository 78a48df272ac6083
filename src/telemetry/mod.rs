//! Logging and tracing set-up: human-readable or JSON lines, filtered by `RUST_LOG` (default
//! `info`); with `OTEL_EXPORTER_OTLP_ENDPOINT` set, `serve` also exports OpenTelemetry traces
//! over OTLP/HTTP (protobuf, `<endpoint>/v1/traces`): one trace per request, with a span per
//! upstream exchange (`upstream`) and per chain read (`chain`). The trace id is recorded on the
//! request's log span (`trace_id`, in every log line of the request) and in the call's
//! receipt. Without the variable nothing is exported and no trace id is made.
//!
//! Spans carry no secrets: the upstream's host and method, the RPC method and network; never
//! a URL's path or query, a header, a key or a signature. Other crates' events are let
//! through at `info` at most, whatever `RUST_LOG` asks ([`only_our_debug`]): the HTTP and MCP
//! libraries log whole requests at `debug`/`trace` (rmcp a `tools/call` with the agent's
//! headers, reqwest a redirect's URL, h2 a request's path and query), and what an agent
//! forwards must reach no log (docs/DESIGN.md §10).

pub mod progress;

use std::time::Duration;

use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The environment variable that turns traces on (the OpenTelemetry standard one).
pub const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// Installs the global subscriber once (logs only); later calls do nothing.
pub fn init(json: bool) {
    install(json, None);
}

/// The exporter of a serving process; dropping it flushes and stops the export.
pub struct Traces(Option<SdkTracerProvider>);

impl Drop for Traces {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            // The exporter's HTTP client is a blocking one: shut it down off the async runtime.
            let _ = std::thread::spawn(move || provider.shutdown()).join();
        }
    }
}

/// [`init`], plus traces exported over OTLP when [`OTLP_ENDPOINT`] is set.
///
/// # Errors
/// An endpoint that is not an http(s) URL, or an exporter that cannot be built.
pub fn init_serving(json: bool) -> anyhow::Result<Traces> {
    let Some(endpoint) = std::env::var(OTLP_ENDPOINT).ok().filter(|e| !e.trim().is_empty()) else {
        install(json, None);
        return Ok(Traces(None));
    };
    let base = url::Url::parse(endpoint.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| anyhow::anyhow!("invalid setting {OTLP_ENDPOINT}: must be an http(s) URL"))?;
    let traces_url = format!("{}/v1/traces", base.as_str().trim_end_matches('/'));
    // Built on a thread of its own: the blocking HTTP client starts a runtime of its own.
    let provider = std::thread::spawn(move || -> anyhow::Result<SdkTracerProvider> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url)
            .with_timeout(Duration::from_secs(5))
            .build()?;
        let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name()).build();
        Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("building the OTLP exporter panicked"))??;
    install(json, Some(&provider));
    Ok(Traces(Some(provider)))
}

fn service_name() -> String {
    std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "x402-router".into())
}

/// The crates whose `debug` and `trace` events (and spans) may be shown: the router's own.
const OUR_CRATES: [&str; 2] = ["x402_router", "x402"];

/// True for what may be logged at any level: the router's own events and spans, and other
/// crates' at `info` or above.
pub fn only_our_debug(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::INFO
        || OUR_CRATES
            .iter()
            .any(|c| meta.target() == *c || meta.target().strip_prefix(c).is_some_and(|r| r.starts_with("::")))
}

fn install(json: bool, provider: Option<&SdkTracerProvider>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ours = tracing_subscriber::filter::filter_fn(only_our_debug);
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let plain = (!json).then(|| tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(ansi));
    let json = json.then(|| tracing_subscriber::fmt::layer().json().with_writer(std::io::stderr));
    let otel = provider.map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("x402-router")));
    let _ = tracing_subscriber::registry().with(filter).with(ours).with(plain).with(json).with(otel).try_init();
}

/// The trace id of the current span, when traces are exported (32 lowercase hex digits).
pub fn current_trace_id() -> Option<String> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// Middleware inside the request's log span: records its trace id there (`trace_id`), so
/// every log line of the request carries it.
///
/// # Errors
/// Whatever the inner service returns.
pub async fn record_trace_id(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody>,
) -> Result<actix_web::dev::ServiceResponse<impl actix_web::body::MessageBody>, actix_web::Error> {
    if let Some(id) = current_trace_id() {
        tracing::Span::current().record("trace_id", tracing::field::display(id));
    }
    next.call(req).await
}
