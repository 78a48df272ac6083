//! The body of `POST /route`: fingerprinted at the edge ([`Received`]), then validated into a
//! [`RouteCall`] unless it replays.
//!
//! Everything that can be refused without side effects is refused here, before any
//! idempotency row is written: malformed JSON, unknown fields, a bad URL, method,
//! header or amount.

use std::str::FromStr;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use url::Url;

use crate::idempotency::canonical::{self, JsonError};
use crate::money::Amount;
use crate::upstream::{Protocol, UpstreamRequest, is_dropped_request_header};

/// Longest upstream URL accepted.
const MAX_URL_LEN: usize = 8192;
/// Longest authority (`host[:port]`) accepted: a DNS name has at most 253 characters, plus
/// room for a port or an IPv6 literal. Checked before the URL parser, whose IDNA step spends
/// CPU time growing faster than linearly with the host's length (found by fuzzing).
const MAX_AUTHORITY_LEN: usize = 300;
/// The methods an agent may ask for (any case); the OpenAPI `RouteRequest.method` enum.
const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
/// Most headers an agent may pass through.
const MAX_HEADERS: usize = 64;
/// Longest MCP tool name (the MCP specification's limit).
const MAX_TOOL_LEN: usize = 128;

/// A refused `/route` body; the message goes to the agent as a 400.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(pub String);

impl From<JsonError> for BadRequest {
    fn from(e: JsonError) -> Self {
        Self(e.to_string())
    }
}

/// The body of `POST /route` as the parser reads it: the OpenAPI `RouteRequest` schema is
/// derived from this very struct (its members and `deny_unknown_fields`), each member's
/// schema stating what [`RouteCall::parse`] then checks.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = RouteRequest, description = "One upstream call to make (and pay for, within `max_amount`).")]
pub struct RawRouteRequest {
    #[serde(default)]
    #[schema(schema_with = doc::url)]
    url: Option<Value>,
    #[serde(default)]
    #[schema(schema_with = doc::mcp)]
    mcp: Option<Value>,
    #[serde(default)]
    #[schema(schema_with = doc::method)]
    method: Option<Value>,
    #[serde(default)]
    #[schema(schema_with = doc::headers)]
    headers: Option<Value>,
    #[serde(default)]
    #[schema(schema_with = doc::body)]
    body: Value,
    #[serde(default)]
    #[schema(schema_with = doc::max_amount)]
    max_amount: Option<Value>,
}

/// The schemas of [`RawRouteRequest`]'s members: what the parser accepts.
mod doc {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, SchemaType, Type};
    use utoipa::openapi::{RefOr, SchemaFormat};

    pub fn url() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("uri".into())))
            .description(Some(
                "Absolute http(s) URL of the upstream, without credentials. Required unless `mcp` is given.",
            ))
            .into()
    }

    pub fn mcp() -> RefOr<Schema> {
        let string =
            |description: &'static str| ObjectBuilder::new().schema_type(Type::String).description(Some(description));
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Instead of `url`, `method` and `body`: call a tool of an MCP server (streamable HTTP), paying its x402 \
                 price (x402 over MCP) within `max_amount`. `headers` are sent with every request to the server.",
            ))
            .property("url", string("Absolute http(s) URL of the MCP endpoint, without credentials.").format(Some(SchemaFormat::Custom("uri".into()))))
            .property(
                "tool",
                string("The tool's name: 1–128 of `A–Z a–z 0–9 _ - . /`.")
                    .min_length(Some(1))
                    .max_length(Some(super::MAX_TOOL_LEN))
                    .pattern(Some("^[A-Za-z0-9_./-]{1,128}$")),
            )
            .property(
                "arguments",
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .description(Some("The tool's arguments (a JSON object; absent: `{}`).")),
            )
            .required("url")
            .required("tool")
            .additional_properties(Some(AdditionalProperties::FreeForm(false)))
            .into()
    }

    pub fn method() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(super::METHODS.iter().copied()))
            .default(Some(serde_json::json!("GET")))
            .into()
    }

    pub fn headers() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(Schema::Object(
                ObjectBuilder::new().schema_type(Type::String).build(),
            )))))
            .description(Some("Sent to the upstream; `Host`, hop-by-hop and payment headers are dropped."))
            .into()
    }

    pub fn body() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some("Any JSON value, sent as `application/json` (not with GET/HEAD)."))
            .into()
    }

    pub fn max_amount() -> RefOr<Schema> {
        crate::schema_doc::amount("The most the agent pays for this call. Absent: pay nothing.")
    }
}

/// A validated routed call.
#[derive(Debug, Clone)]
pub struct RouteCall {
    pub upstream: UpstreamRequest,
    /// The most the agent will pay for this call, in atomic units (0 when absent).
    pub max_amount: Amount,
    /// The request fingerprint (idempotency and receipts).
    pub request_hash: String,
}

impl RouteCall {
    /// Parses and validates the raw body of `POST /route`.
    ///
    /// # Errors
    /// [`BadRequest`] with a message naming the problem.
    pub fn parse(raw: &[u8], path: &str, query: &str) -> Result<Self, BadRequest> {
        Received::parse(raw, path, query)?.into_call()
    }

    /// The upstream host as the ledger keeps it (`payments.upstream_host`): lowercase, with
    /// `:port` when the URL names one.
    pub fn upstream_host(&self) -> String {
        let url = &self.upstream.url;
        crate::payments::hosts::key(url.host_str().unwrap_or_default(), url.port())
    }
}

/// A `/route` request as it arrived: its body's bytes, not yet parsed, and where it was
/// posted (both are part of its fingerprint).
#[derive(Clone, Copy)]
pub struct Incoming<'a> {
    pub raw: &'a [u8],
    pub path: &'a str,
    pub query: &'a str,
}

impl Incoming<'_> {
    /// The digest of these very bytes ([`canonical::raw_digest`]).
    #[must_use]
    pub fn digest(&self) -> String {
        canonical::raw_digest(self.raw, self.path, self.query)
    }

    /// The body parsed and fingerprinted.
    ///
    /// # Errors
    /// See [`Received::parse`].
    pub fn parse(&self) -> Result<Received, BadRequest> {
        Received::parse(self.raw, self.path, self.query)
    }
}

/// A `/route` body as received: a strict JSON object and its fingerprint, not yet checked as
/// a call. A replay needs no more: its fingerprint is that of a request which was validated
/// (and executed) before, and validation depends on nothing but the request. Its `Debug`
/// shows the fingerprint only (the body carries the agent's headers).
pub struct Received {
    value: Value,
    /// The request fingerprint (idempotency and receipts).
    pub request_hash: String,
}

impl std::fmt::Debug for Received {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Received").field("request_hash", &self.request_hash).finish_non_exhaustive()
    }
}

impl Received {
    /// Parses the body as strict JSON (an object) and fingerprints it.
    ///
    /// # Errors
    /// [`BadRequest`] for an empty body, invalid or imprecise JSON, or a non-object.
    pub fn parse(raw: &[u8], path: &str, query: &str) -> Result<Self, BadRequest> {
        if raw.is_empty() {
            return Err(BadRequest("request body is required (JSON object with at least \"url\")".into()));
        }
        let value = canonical::parse_strict(raw)?;
        if !value.is_object() {
            return Err(BadRequest("request body must be a JSON object".into()));
        }
        let request_hash = canonical::request_hash(&value, path, query)
            .map_err(|e| BadRequest(format!("request body cannot be canonicalized: {e}")))?;
        Ok(Self { value, request_hash })
    }

    /// Validates the body as a routed call.
    ///
    /// # Errors
    /// [`BadRequest`] with a message naming the problem.
    pub fn into_call(self) -> Result<RouteCall, BadRequest> {
        let Self { value, request_hash } = self;
        let req: RawRouteRequest =
            serde_json::from_value(value).map_err(|e| BadRequest(format!("invalid request body: {e}")))?;

        let headers = parse_headers(req.headers.as_ref())?;
        let max_amount = parse_amount(req.max_amount.as_ref())?;
        let url = match (req.url, req.mcp) {
            (Some(url), None) => parse_url(&url)?,
            (None, Some(mcp)) => {
                if req.method.is_some() || !req.body.is_null() {
                    return Err(BadRequest("\"method\" and \"body\" are not allowed with \"mcp\"".into()));
                }
                let (url, params) = parse_mcp(&mcp)?;
                let upstream =
                    UpstreamRequest { protocol: Protocol::Mcp, method: Method::POST, url, headers, body: Some(params) };
                return Ok(RouteCall { upstream, max_amount, request_hash });
            }
            (None, None) => return Err(BadRequest("\"url\" (or \"mcp\") is required".into())),
            (Some(_), Some(_)) => return Err(BadRequest("give either \"url\" or \"mcp\", not both".into())),
        };
        let method = parse_method(req.method.as_ref())?;
        let body = match req.body {
            Value::Null => None,
            v => {
                if method == Method::GET || method == Method::HEAD {
                    return Err(BadRequest(format!("\"body\" is not allowed with {method}")));
                }
                // The canonical (RFC 8785) form, the very bytes the request hash covers: two
                // requests with one hash send one body. The agent's own spelling is not kept
                // (`1.0` and `1` are one JSON value, sent as `1`).
                Some(serde_jcs::to_vec(&v).map_err(|e| BadRequest(format!("invalid body: {e}")))?)
            }
        };
        Ok(RouteCall { upstream: UpstreamRequest::http(method, url, headers, body), max_amount, request_hash })
    }
}

/// `{"url", "tool", "arguments"}`: the MCP endpoint, and the `tools/call` params in their
/// RFC 8785 form (`{"arguments", "name"}`), the bytes the request hash covers.
fn parse_mcp(v: &Value) -> Result<(Url, Vec<u8>), BadRequest> {
    let Value::Object(o) = v else {
        return Err(BadRequest("\"mcp\" must be an object with \"url\", \"tool\" and \"arguments\"".into()));
    };
    if let Some(other) = o.keys().find(|k| !matches!(k.as_str(), "url" | "tool" | "arguments")) {
        return Err(BadRequest(format!("unknown field {other:?} in \"mcp\"; expected url, tool, arguments")));
    }
    let url = parse_url(o.get("url").ok_or_else(|| BadRequest("\"mcp.url\" is required".into()))?)
        .map_err(|e| BadRequest(e.0.replacen("\"url\"", "\"mcp.url\"", 1)))?;
    let tool = match o.get("tool") {
        Some(Value::String(t))
            if (1..=MAX_TOOL_LEN).contains(&t.len())
                && t.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/')) =>
        {
            t.clone()
        }
        _ => {
            return Err(BadRequest(format!(
                "\"mcp.tool\" must be a tool name of 1–{MAX_TOOL_LEN} characters A–Z a–z 0–9 _ - . /"
            )));
        }
    };
    let arguments = match o.get("arguments") {
        None | Some(Value::Null) => Value::Object(serde_json::Map::new()),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return Err(BadRequest("\"mcp.arguments\" must be a JSON object".into())),
    };
    let params = serde_json::json!({ "arguments": arguments, "name": tool });
    let params = serde_jcs::to_vec(&params).map_err(|e| BadRequest(format!("invalid \"mcp.arguments\": {e}")))?;
    Ok((url, params))
}

fn parse_url(v: &Value) -> Result<Url, BadRequest> {
    let Value::String(s) = v else {
        return Err(BadRequest("\"url\" must be a string".into()));
    };
    if s.len() > MAX_URL_LEN {
        return Err(BadRequest(format!("\"url\" is longer than {MAX_URL_LEN} characters")));
    }
    if authority(s).len() > MAX_AUTHORITY_LEN {
        return Err(BadRequest(format!("\"url\" has a host longer than {MAX_AUTHORITY_LEN} characters")));
    }
    let url = Url::parse(s).map_err(|e| BadRequest(format!("\"url\" is not a valid absolute URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(BadRequest("\"url\" must be http or https".into()));
    }
    if url.host().is_none() {
        return Err(BadRequest("\"url\" has no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(BadRequest("\"url\" must not carry credentials; pass an Authorization header instead".into()));
    }
    Ok(url)
}

/// The authority (`host[:port]`, with any userinfo) of an http(s) URL as the URL parser will
/// see it: tabs and newlines removed, leading spaces and C0 controls ignored, the scheme and
/// the slashes (or backslashes) after it skipped, up to the first `/`, `\\`, `?` or `#`. Empty
/// for other schemes (the parser's own checks refuse them).
fn authority(s: &str) -> String {
    let cleaned: String = s.chars().filter(|c| !matches!(c, '\t' | '\n' | '\r')).collect();
    let trimmed = cleaned.trim_start_matches(|c: char| c <= ' ');
    let Some((scheme, rest)) = trimmed.split_once(':') else {
        return String::new();
    };
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return String::new();
    }
    let rest = rest.trim_start_matches(['/', '\\']);
    rest.split(['/', '\\', '?', '#']).next().unwrap_or_default().to_owned()
}

fn parse_method(v: Option<&Value>) -> Result<Method, BadRequest> {
    let name = match v {
        None | Some(Value::Null) => return Ok(Method::GET),
        Some(Value::String(s)) => s.to_ascii_uppercase(),
        Some(_) => return Err(BadRequest("\"method\" must be a string".into())),
    };
    if METHODS.contains(&name.as_str()) {
        Method::from_str(&name).map_err(|_| BadRequest(format!("unsupported method {name:?}")))
    } else {
        Err(BadRequest(format!("unsupported method {name:?}; use {}", METHODS.join(", "))))
    }
}

fn parse_headers(v: Option<&Value>) -> Result<HeaderMap, BadRequest> {
    let mut out = HeaderMap::new();
    let obj = match v {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(BadRequest("\"headers\" must be an object of string values".into()));
        }
    };
    if obj.len() > MAX_HEADERS {
        return Err(BadRequest(format!("at most {MAX_HEADERS} headers")));
    }
    for (name, value) in obj {
        let Value::String(value) = value else {
            return Err(BadRequest(format!("header {name:?} must have a string value")));
        };
        let hname = HeaderName::from_str(name).map_err(|_| BadRequest(format!("invalid header name {name:?}")))?;
        let hvalue =
            HeaderValue::from_str(value).map_err(|_| BadRequest(format!("invalid value for header {name:?}")))?;
        if is_dropped_request_header(hname.as_str()) {
            continue;
        }
        out.append(hname, hvalue);
    }
    Ok(out)
}

/// A decimal string of atomic units, e.g. `"50000"`. Absent means 0: pay nothing.
fn parse_amount(v: Option<&Value>) -> Result<Amount, BadRequest> {
    match v {
        None | Some(Value::Null) => Ok(Amount::ZERO),
        Some(Value::String(s)) => Amount::parse(s).map_err(|_| {
            BadRequest(
                "\"max_amount\" must be a decimal string of atomic units without sign or leading zeros, e.g. \"50000\""
                    .into(),
            )
        }),
        Some(_) => Err(BadRequest(
            "\"max_amount\" must be a decimal string of atomic units (e.g. \"50000\"), not a number".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<RouteCall, BadRequest> {
        RouteCall::parse(body.as_bytes(), "/route", "")
    }

    #[test]
    fn minimal_get() {
        let c = parse(r#"{"url":"https://api.example.com/x?a=1"}"#).unwrap();
        assert_eq!(c.upstream.method, Method::GET);
        assert_eq!(c.max_amount, Amount::ZERO);
        assert!(c.upstream.body.is_none());
    }

    #[test]
    fn refusals() {
        for bad in [
            "",
            "[]",
            "{}",
            r#"{"url":1}"#,
            r#"{"url":"ftp://x/"}"#,
            r#"{"url":"/relative"}"#,
            r#"{"url":"http://u:p@x.com/"}"#,
            r#"{"url":"http://x.com/","method":"TRACE"}"#,
            r#"{"url":"http://x.com/","method":"GET","body":{"a":1}}"#,
            r#"{"url":"http://x.com/","headers":{"bad name":"v"}}"#,
            r#"{"url":"http://x.com/","headers":{"a":"v\n"}}"#,
            r#"{"url":"http://x.com/","headers":{"a":1}}"#,
            r#"{"url":"http://x.com/","max_amount":5}"#,
            r#"{"url":"http://x.com/","max_amount":"-5"}"#,
            r#"{"url":"http://x.com/","max_amount":"1.5"}"#,
            r#"{"url":"http://x.com/","extra":1}"#,
            r#"{"url":"http://x.com/","url":"http://y.com/"}"#,
        ] {
            assert!(parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn requests_with_one_hash_send_the_same_bytes_upstream() {
        // JSON numbers that are one value (and one hash) in several spellings.
        for (a, b) in [("1", "1.0"), ("1e2", "100"), ("-0", "0"), ("0.5", "5e-1"), ("[1e21]", "[1E+21]")] {
            let call =
                |body: &str| parse(&format!(r#"{{"url":"http://x.com/","method":"POST","body":{body}}}"#)).unwrap();
            let (a_call, b_call) = (call(a), call(b));
            assert_eq!(a_call.request_hash, b_call.request_hash, "{a} and {b} are one value");
            assert_eq!(a_call.upstream.body, b_call.upstream.body, "{a} and {b} hash alike, so must be sent alike");
        }
    }

    #[test]
    fn a_host_longer_than_dns_allows_is_refused_before_the_url_parser_sees_it() {
        // Found by the upstream_url_guard fuzz target: the URL parser's IDNA step spent about
        // a second of CPU on a 4 KB host of `xn--` labels.
        let slow = include_str!("../../fuzz/slow/upstream_url_guard-idna-1s").trim_start_matches('\u{8}');
        let body = serde_json::json!({ "url": slow }).to_string();
        let err = parse(&body).unwrap_err();
        assert!(err.0.contains("host"), "{err}");
        let long = format!("https://{}.example.com/", "a".repeat(300));
        assert!(parse(&serde_json::json!({ "url": long }).to_string()).unwrap_err().0.contains("host"));
        // Tabs and newlines are removed by the URL parser, so they do not hide a long host.
        let hidden = format!("https://\t{}\n.example.com/", "a".repeat(300));
        assert!(parse(&serde_json::json!({ "url": hidden }).to_string()).is_err());
        assert!(parse(r#"{"url":"https://api.example.com:8443/x"}"#).is_ok());
    }

    #[test]
    fn payment_and_hop_headers_are_dropped() {
        let c = parse(r#"{"url":"http://x.com/","headers":{"Host":"evil","X-PAYMENT":"x","Accept":"a/b"}}"#).unwrap();
        assert!(c.upstream.headers.get("host").is_none());
        assert!(c.upstream.headers.get("x-payment").is_none());
        assert_eq!(c.upstream.headers.get("accept").unwrap(), "a/b");
    }
}
