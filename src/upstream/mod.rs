//! Calls to upstream HTTP APIs: one reqwest client with timeouts, a response size cap,
//! same-host redirects only, no proxies, and the SSRF [`guard`] inside its resolver.

pub mod guard;
pub mod known_terms;
pub mod mcp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, redirect};
use url::Url;

pub use guard::{Guard, GuardError};

use crate::config::UpstreamConfig;

/// Request headers an agent may not set: the router owns the connection (hop-by-hop,
/// Host, framing) and the payment headers.
const DROPPED_REQUEST_HEADERS: &[&str] = &[
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "expect",
    "x-payment",
    "payment-signature",
    "payment-required",
    "payment-response",
    "x-payment-response",
];

/// Response headers not passed back to the agent (they describe our hop only).
const DROPPED_RESPONSE_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// True when an agent-supplied header is dropped before the upstream call.
pub fn is_dropped_request_header(name: &str) -> bool {
    DROPPED_REQUEST_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// True when an upstream response header is kept in the envelope.
pub fn is_kept_response_header(name: &str) -> bool {
    !DROPPED_RESPONSE_HEADERS.iter().any(|h| name.eq_ignore_ascii_case(h))
}

/// How a request reaches its upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// One HTTP request: `method`, `url`, `headers`, `body`.
    Http,
    /// One MCP tool call over streamable HTTP ([`mcp`]): `url` is the MCP endpoint, `body` the
    /// RFC 8785 form of the `tools/call` params (`{"arguments", "name"}`), `method` POST; a
    /// payment header travels as `_meta["x402/payment"]`.
    Mcp,
}

impl Protocol {
    /// The method as the ledger and receipts show it: the HTTP method, or `MCP`.
    pub fn shown_method(self, method: &Method) -> String {
        match self {
            Self::Http => method.to_string(),
            Self::Mcp => mcp::SHOWN_METHOD.to_owned(),
        }
    }
}

/// A validated upstream request. Its `Debug` shows the method and host only: the URL's
/// query, the headers and the body may carry the agent's secrets.
#[derive(Clone)]
pub struct UpstreamRequest {
    pub protocol: Protocol,
    pub method: Method,
    pub url: Url,
    pub headers: HeaderMap,
    /// JSON body bytes (sent as `application/json`), if any: the RFC 8785 canonical form of
    /// the agent's `body`, so that the request hash covers exactly these bytes.
    pub body: Option<Vec<u8>>,
}

impl UpstreamRequest {
    /// An HTTP request.
    pub fn http(method: Method, url: Url, headers: HeaderMap, body: Option<Vec<u8>>) -> Self {
        Self { protocol: Protocol::Http, method, url, headers, body }
    }

    /// The method as the ledger and receipts show it (`MCP` for a tool call).
    pub fn shown_method(&self) -> String {
        self.protocol.shown_method(&self.method)
    }
}

impl std::fmt::Debug for UpstreamRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamRequest")
            .field("protocol", &self.protocol)
            .field("method", &self.method)
            .field("host", &self.url.host_str())
            .finish_non_exhaustive()
    }
}

/// What the upstream answered (body fully read, within the cap).
#[derive(Debug, Clone)]
pub struct UpstreamResponse {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// Why an upstream exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream timed out")]
    Timeout,
    #[error("upstream response exceeds {0} bytes")]
    TooLarge(usize),
    #[error("upstream refused by policy: {0}")]
    Blocked(GuardError),
    #[error("upstream unreachable: {0}")]
    Unreachable(String),
    #[error("upstream connection failed while reading the response: {0}")]
    Broken(String),
    /// An MCP upstream answered outside the protocol (not JSON-RPC, another request's id, …).
    #[error("upstream broke the MCP protocol: {0}")]
    Protocol(String),
}

/// The upstream HTTP client. Cheap to clone.
#[derive(Clone)]
pub struct UpstreamClient {
    client: reqwest::Client,
    guard: Arc<Guard>,
    max_response_bytes: usize,
    timeout: Duration,
}

struct GuardedResolver {
    guard: Arc<Guard>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = Arc::clone(&self.guard);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = guard
                .resolve(&host, 0)
                .await
                .map_err(|e| -> Box<dyn std::error::Error + Send + Sync> { Box::new(e) })?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

impl UpstreamClient {
    /// Builds the client.
    ///
    /// # Errors
    /// If the TLS backend cannot be initialised.
    pub fn new(config: &UpstreamConfig) -> Result<Self, reqwest::Error> {
        Self::with_guard(config, Guard::new(config.allow_private, config.allow_cidrs.clone()))
    }

    /// Builds the client around `guard` instead of the one `config` describes (tests give it
    /// a guard with their own DNS lookup); the other settings come from `config`.
    ///
    /// # Errors
    /// If the TLS backend cannot be initialised.
    pub fn with_guard(config: &UpstreamConfig, guard: Guard) -> Result<Self, reqwest::Error> {
        let guard = Arc::new(guard);
        // Follow redirects only to the same scheme, host and port, at most 5 times.
        let policy = redirect::Policy::custom(|attempt| {
            let same_origin = attempt.previous().last().is_some_and(|prev| {
                prev.scheme() == attempt.url().scheme()
                    && prev.host_str() == attempt.url().host_str()
                    && prev.port_or_known_default() == attempt.url().port_or_known_default()
            });
            if attempt.previous().len() > 5 || !same_origin { attempt.stop() } else { attempt.follow() }
        });
        let client = reqwest::Client::builder()
            .no_proxy()
            .redirect(policy)
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            .dns_resolver(Arc::new(GuardedResolver { guard: Arc::clone(&guard) }))
            .user_agent(concat!("x402-router/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, guard, max_response_bytes: config.max_response_bytes, timeout: config.timeout })
    }

    /// The SSRF policy, for the pre-flight check before a request is claimed.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// The configured whole-exchange timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `req` plus `extra` headers (e.g. a payment header), reading at most the
    /// configured number of response bytes, within `timeout`.
    ///
    /// # Errors
    /// [`UpstreamError`].
    pub async fn send(
        &self,
        req: &UpstreamRequest,
        extra: &[(HeaderName, HeaderValue)],
        timeout: Duration,
    ) -> Result<UpstreamResponse, UpstreamError> {
        self.exchange(req, extra, timeout, self.max_response_bytes).await
    }

    /// Sends `req` as [`Self::send`] does, reading at most `cap` response bytes (never more than
    /// the configured cap): for what the router fetches for itself, e.g. a discovery catalogue.
    ///
    /// # Errors
    /// [`UpstreamError`].
    pub async fn send_capped(
        &self,
        req: &UpstreamRequest,
        timeout: Duration,
        cap: usize,
    ) -> Result<UpstreamResponse, UpstreamError> {
        self.exchange(req, &[], timeout, cap.min(self.max_response_bytes)).await
    }

    async fn exchange(
        &self,
        req: &UpstreamRequest,
        extra: &[(HeaderName, HeaderValue)],
        timeout: Duration,
        cap: usize,
    ) -> Result<UpstreamResponse, UpstreamError> {
        match req.protocol {
            Protocol::Http => self.http(req, extra, timeout, cap).await,
            Protocol::Mcp => mcp::call_tool(self, req, extra, timeout, cap).await,
        }
    }

    /// One HTTP exchange (the whole of an HTTP call, one step of an MCP call).
    async fn http(
        &self,
        req: &UpstreamRequest,
        extra: &[(HeaderName, HeaderValue)],
        timeout: Duration,
        cap: usize,
    ) -> Result<UpstreamResponse, UpstreamError> {
        self.guard.check_url(&req.url).map_err(UpstreamError::Blocked)?;
        let mut builder =
            self.client.request(req.method.clone(), req.url.clone()).headers(req.headers.clone()).timeout(timeout);
        for (name, value) in extra {
            builder = builder.header(name, value);
        }
        if let Some(body) = &req.body {
            builder = builder.header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone());
        }
        let exchange = async {
            let resp = builder.send().await.map_err(classify)?;
            let status = resp.status().as_u16();
            let headers = resp.headers().clone();
            if let Some(len) = resp.content_length()
                && len > cap as u64
            {
                return Err(UpstreamError::TooLarge(cap));
            }
            let mut body = Vec::new();
            let mut stream = resp.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| {
                    if e.is_timeout() {
                        UpstreamError::Timeout
                    } else {
                        UpstreamError::Broken(e.without_url().to_string())
                    }
                })?;
                if body.len() + chunk.len() > cap {
                    return Err(UpstreamError::TooLarge(cap));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(UpstreamResponse { status, headers, body })
        };
        // One span per upstream exchange: its method and host, never its path or query.
        let span = tracing::info_span!(
            "upstream",
            http.request.method = %req.method,
            server.address = req.url.host_str().unwrap_or(""),
        );
        // reqwest's own timeout covers the whole exchange; this outer one is a backstop.
        tokio::time::timeout(timeout + Duration::from_millis(250), tracing::Instrument::instrument(exchange, span))
            .await
            .map_err(|_| UpstreamError::Timeout)?
    }
}

fn classify(e: reqwest::Error) -> UpstreamError {
    // reqwest's message ends with the request's URL, query and all: never kept or shown.
    let e = e.without_url();
    if e.is_timeout() {
        return UpstreamError::Timeout;
    }
    // A refusal by the guard inside the resolver surfaces as a connect error whose
    // source chain holds the GuardError.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(s) = source {
        if let Some(g) = s.downcast_ref::<GuardError>() {
            return UpstreamError::Blocked(g.clone());
        }
        source = s.source();
    }
    if e.is_connect() {
        return UpstreamError::Unreachable(root_cause(&e));
    }
    UpstreamError::Broken(root_cause(&e))
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last = e;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string()
}
