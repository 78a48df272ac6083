//! An MCP tool call over streamable HTTP, as one upstream exchange (x402 over MCP,
//! `specs/transports-v2/mcp.md` of the x402 specification, tool-result binding).
//!
//! A small strict JSON-RPC client on the router's own HTTP client (so the SSRF guard, the
//! timeouts and the response cap apply to every step): `initialize`, `notifications/initialized`,
//! `tools/call`, then the session is closed. The upstream is hostile: every answer is bounded
//! by the cap, parsed strictly (one JSON-RPC response to our request id, or an SSE stream
//! carrying it), and anything else is [`UpstreamError::Protocol`].
//!
//! The call is translated to and from the HTTP shape the paid path reads
//! ([`super::UpstreamResponse`]), so that paying, confirming, recording and recovering a tool
//! call is the one paid path of HTTP calls:
//! - a payment header given for the call (`PAYMENT-SIGNATURE` / `X-PAYMENT`, base64 JSON) is
//!   sent as `params._meta["x402/payment"]`, the decoded JSON;
//! - a tool result asking for payment (`isError: true` with a `PaymentRequired` in
//!   `structuredContent` or `content[0].text`) answers 402, the `PaymentRequired` as its JSON
//!   body;
//! - `result._meta["x402/payment-response"]` becomes the `PAYMENT-RESPONSE` header (base64 JSON);
//! - any other result answers 200 with the JSON-RPC `result` object, verbatim, as its body; a
//!   JSON-RPC error answers 500 (400 for a request the server calls invalid) with the error.
//!
//! Each call opens its own session, so a re-send (recovery) is the same exchange again.

use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::{Protocol, UpstreamClient, UpstreamError, UpstreamRequest, UpstreamResponse};

/// The method the ledger and receipts show for a tool call.
pub const SHOWN_METHOD: &str = "MCP";
/// The MCP revision the router speaks (streamable HTTP, `_meta`, `structuredContent`, `isError`).
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Longest protocol version or session id accepted from an upstream.
const MAX_TOKEN_LEN: usize = 128;
/// The request id of `initialize` and of `tools/call` (each call has a session of its own).
const INITIALIZE_ID: u64 = 1;
const CALL_ID: u64 = 2;
/// How long closing the session may take (best effort, after the answer is in).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The payment headers whose payload travels as `_meta["x402/payment"]`.
fn is_payment_header(name: &HeaderName) -> bool {
    matches!(name.as_str(), "payment-signature" | "x-payment")
}

/// Calls the tool `req` describes (see the module doc).
///
/// # Errors
/// [`UpstreamError`]: as an HTTP exchange's, plus [`UpstreamError::Protocol`].
pub(super) async fn call_tool(
    client: &UpstreamClient,
    req: &UpstreamRequest,
    extra: &[(HeaderName, HeaderValue)],
    timeout: Duration,
    cap: usize,
) -> Result<UpstreamResponse, UpstreamError> {
    let started = Instant::now();
    let left = || timeout.saturating_sub(started.elapsed());
    let params = req.body.as_deref().ok_or_else(|| UpstreamError::Protocol("no tool call to make".into()))?;
    let (payment, other): (Vec<_>, Vec<_>) = extra.iter().partition(|(name, _)| is_payment_header(name));
    let meta = match payment.as_slice() {
        [] => None,
        [(_, value)] => Some(decode_payment(value)?),
        _ => return Err(UpstreamError::Protocol("more than one payment for one tool call".into())),
    };
    let session = Session::open(client, req, left(), cap).await?;
    let session = match session {
        Opened::Session(s) => s,
        Opened::Refused(resp) => return Ok(resp),
    };
    let body = call_body(params, meta.as_deref())?;
    let step = session.request(req, body, &other);
    let resp = client.http(&step, &[], left(), cap).await;
    session.close(client, req);
    let resp = resp?;
    if !(200..300).contains(&resp.status) {
        return Ok(resp);
    }
    let message = response_to(&resp, CALL_ID)?;
    translate(message)
}

/// `base64(JSON)` of a payment header, as the JSON text for `_meta`.
fn decode_payment(value: &HeaderValue) -> Result<Box<RawValue>, UpstreamError> {
    let bytes = STANDARD
        .decode(value.as_bytes())
        .map_err(|_| UpstreamError::Protocol("the payment header is not base64".into()))?;
    serde_json::from_slice::<Box<RawValue>>(&bytes)
        .map_err(|_| UpstreamError::Protocol("the payment header is not JSON".into()))
}

/// The `tools/call` request: `params` (RFC 8785 text of `{"arguments", "name"}`), with
/// `_meta["x402/payment"]` when paid.
fn call_body(params: &[u8], payment: Option<&RawValue>) -> Result<Vec<u8>, UpstreamError> {
    let params =
        std::str::from_utf8(params).map_err(|_| UpstreamError::Protocol("the tool call is not UTF-8".into()))?;
    let params = match payment {
        None => params.to_owned(),
        Some(p) => {
            let rest = params
                .strip_prefix('{')
                .filter(|r| r.starts_with('"'))
                .ok_or_else(|| UpstreamError::Protocol("the tool call is not a JSON object".into()))?;
            format!("{{\"_meta\":{{\"x402/payment\":{}}},{rest}", p.get())
        }
    };
    Ok(format!("{{\"id\":{CALL_ID},\"jsonrpc\":\"2.0\",\"method\":\"tools/call\",\"params\":{params}}}").into_bytes())
}

/// An initialized MCP session (or a server that keeps none).
struct Session {
    id: Option<HeaderValue>,
    version: HeaderValue,
}

enum Opened {
    Session(Session),
    /// The server refused `initialize` at the HTTP level (e.g. 401, 404): its answer.
    Refused(UpstreamResponse),
}

impl Session {
    async fn open(
        client: &UpstreamClient,
        req: &UpstreamRequest,
        timeout: Duration,
        cap: usize,
    ) -> Result<Opened, UpstreamError> {
        let started = Instant::now();
        let init = serde_json::json!({
            "jsonrpc": "2.0", "id": INITIALIZE_ID, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": { "name": "x402-router", "version": env!("CARGO_PKG_VERSION") },
            },
        });
        let first = Self { id: None, version: HeaderValue::from_static(PROTOCOL_VERSION) };
        let step = first.request(req, init.to_string().into_bytes(), &[]);
        let resp = client.http(&step, &[], timeout, cap).await?;
        if !(200..300).contains(&resp.status) {
            return Ok(Opened::Refused(resp));
        }
        let id = match resp.headers.get("mcp-session-id") {
            Some(v) if v.len() <= MAX_TOKEN_LEN && v.as_bytes().iter().all(|b| (0x21..=0x7e).contains(b)) => {
                Some(v.clone())
            }
            Some(_) => return Err(UpstreamError::Protocol("invalid Mcp-Session-Id".into())),
            None => None,
        };
        let message = response_to(&resp, INITIALIZE_ID)?;
        let result = match message {
            Message::Result(r) => r,
            Message::Error(e) => return Err(UpstreamError::Protocol(format!("initialize failed: {}", short(e.get())))),
        };
        #[derive(Deserialize)]
        struct Initialized {
            #[serde(rename = "protocolVersion")]
            protocol_version: String,
        }
        let init: Initialized = serde_json::from_str(result.get())
            .map_err(|_| UpstreamError::Protocol("initialize: no protocolVersion".into()))?;
        let version = Some(init.protocol_version)
            .filter(|v| v.len() <= MAX_TOKEN_LEN)
            .and_then(|v| HeaderValue::from_str(&v).ok())
            .ok_or_else(|| UpstreamError::Protocol("initialize: invalid protocolVersion".into()))?;
        let session = Self { id, version };
        let note = b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}".to_vec();
        let resp =
            client.http(&session.request(req, note, &[]), &[], timeout.saturating_sub(started.elapsed()), cap).await?;
        if !(200..300).contains(&resp.status) {
            return Err(UpstreamError::Protocol(format!("notifications/initialized answered {}", resp.status)));
        }
        Ok(Opened::Session(session))
    }

    /// One POST of `body` to the endpoint: the agent's headers, the session's, `extra`.
    fn request(&self, req: &UpstreamRequest, body: Vec<u8>, extra: &[&(HeaderName, HeaderValue)]) -> UpstreamRequest {
        let mut headers: HeaderMap = req.headers.clone();
        headers.remove(CONTENT_TYPE);
        headers.insert(ACCEPT, HeaderValue::from_static("application/json, text/event-stream"));
        headers.insert(HeaderName::from_static("mcp-protocol-version"), self.version.clone());
        if let Some(id) = &self.id {
            headers.insert(HeaderName::from_static("mcp-session-id"), id.clone());
        }
        for (name, value) in extra {
            headers.append(name.clone(), value.clone());
        }
        UpstreamRequest {
            protocol: Protocol::Http,
            method: Method::POST,
            url: req.url.clone(),
            headers,
            body: Some(body),
        }
    }

    /// Ends the session (best effort, in the background: the answer is in).
    fn close(self, client: &UpstreamClient, req: &UpstreamRequest) {
        if self.id.is_none() {
            return;
        }
        let mut step = self.request(req, Vec::new(), &[]);
        step.method = Method::DELETE;
        step.body = None;
        let client = client.clone();
        tokio::spawn(async move {
            let _ = client.http(&step, &[], CLOSE_TIMEOUT, 4096).await;
        });
    }
}

/// A JSON-RPC response's outcome.
#[derive(Debug)]
enum Message {
    Result(Box<RawValue>),
    Error(Box<RawValue>),
}

/// The JSON-RPC response to request `id` in an HTTP answer: `application/json` (one
/// response), or `text/event-stream` (events; notifications and server requests skipped).
fn response_to(resp: &UpstreamResponse, id: u64) -> Result<Message, UpstreamError> {
    let content_type = resp
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase())
        .unwrap_or_default();
    match content_type.as_str() {
        "application/json" => parse_response(&resp.body, id)?
            .ok_or_else(|| UpstreamError::Protocol("the answer is not a JSON-RPC response".into())),
        "text/event-stream" => {
            let text = std::str::from_utf8(&resp.body)
                .map_err(|_| UpstreamError::Protocol("the event stream is not UTF-8".into()))?;
            for data in sse_data(text) {
                if let Some(message) = parse_response(data.as_bytes(), id)? {
                    return Ok(message);
                }
            }
            Err(UpstreamError::Protocol("the event stream ended without the response".into()))
        }
        other => Err(UpstreamError::Protocol(format!("unexpected content type {:?}", short(other)))),
    }
}

/// The `data` of each event of an SSE stream (multi-line data joined by `\n`).
fn sse_data(text: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l)) {
        if line.is_empty() {
            events.extend(data.take());
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        if field == "data" {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_owned()),
            }
        }
    }
    events.extend(data);
    events
}

/// One JSON-RPC message, strictly: a response to `id` (`Some`), a notification or a server
/// request (`None`: skipped); anything else is refused. A response to another id is refused.
fn parse_response(bytes: &[u8], id: u64) -> Result<Option<Message>, UpstreamError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Raw {
        jsonrpc: String,
        #[serde(default)]
        id: Option<Value>,
        #[serde(default)]
        method: Option<String>,
        #[serde(default)]
        params: Option<Box<RawValue>>,
        #[serde(default)]
        result: Option<Box<RawValue>>,
        #[serde(default)]
        error: Option<Box<RawValue>>,
    }
    let raw: Raw = serde_json::from_slice(bytes)
        .map_err(|e| UpstreamError::Protocol(format!("not a JSON-RPC message: {}", short(&e.to_string()))))?;
    if raw.jsonrpc != "2.0" {
        return Err(UpstreamError::Protocol("not JSON-RPC 2.0".into()));
    }
    if raw.method.is_some() {
        let _ = raw.params;
        return Ok(None);
    }
    if raw.id.as_ref().and_then(Value::as_u64) != Some(id) {
        return Err(UpstreamError::Protocol("a response to another request".into()));
    }
    match (raw.result, raw.error) {
        (Some(r), None) if r.get().starts_with('{') => Ok(Some(Message::Result(r))),
        (None, Some(e)) if e.get().starts_with('{') => Ok(Some(Message::Error(e))),
        _ => Err(UpstreamError::Protocol("a response needs exactly one of result and error (objects)".into())),
    }
}

/// The HTTP shape of a tool call's outcome (see the module doc).
fn translate(message: Message) -> Result<UpstreamResponse, UpstreamError> {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    let result = match message {
        Message::Error(e) => {
            #[derive(Deserialize)]
            struct Code {
                code: i64,
            }
            let code = serde_json::from_str::<Code>(e.get()).map(|c| c.code).unwrap_or_default();
            let status = if matches!(code, -32700 | -32600 | -32601 | -32602) { 400 } else { 500 };
            return Ok(UpstreamResponse { status, headers, body: e.get().as_bytes().to_vec() });
        }
        Message::Result(r) => r,
    };
    #[derive(Deserialize)]
    struct ToolResult<'a> {
        #[serde(rename = "isError", default)]
        is_error: Option<bool>,
        #[serde(rename = "structuredContent", default, borrow)]
        structured: Option<&'a RawValue>,
        #[serde(default, borrow)]
        content: Option<&'a RawValue>,
        #[serde(rename = "_meta", default, borrow)]
        meta: Option<&'a RawValue>,
        #[serde(rename = "resultType", default)]
        result_type: Option<String>,
        #[serde(rename = "paymentRequired", default, borrow)]
        payment_required: Option<&'a RawValue>,
    }
    let tool: ToolResult<'_> = serde_json::from_str(result.get())
        .map_err(|e| UpstreamError::Protocol(format!("not a tool result: {}", short(&e.to_string()))))?;
    let required = if tool.result_type.as_deref() == Some("payment_required") {
        Some(
            tool.payment_required
                .map(|p| p.get().to_owned())
                .ok_or_else(|| UpstreamError::Protocol("a payment_required result without paymentRequired".into()))?,
        )
    } else if tool.is_error == Some(true) {
        payment_required(tool.structured, tool.content)
    } else {
        None
    };
    if let Some(settlement) = tool.meta.map(settlement_of).transpose()?.flatten() {
        headers.insert(HeaderName::from_static(crate::x402::wire::PAYMENT_RESPONSE_HEADER), settlement);
    }
    match required {
        Some(required) => Ok(UpstreamResponse { status: 402, headers, body: required.into_bytes() }),
        None => Ok(UpstreamResponse { status: 200, headers, body: result.get().as_bytes().to_vec() }),
    }
}

/// The `PaymentRequired` of an error result: `structuredContent` when it is one, else the JSON
/// text of `content[0]` (x402 over MCP, "Client Requirements").
fn payment_required(structured: Option<&RawValue>, content: Option<&RawValue>) -> Option<String> {
    fn is_required(text: &str) -> bool {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(rename = "x402Version")]
            _version: Value,
            #[serde(rename = "accepts")]
            _accepts: Vec<Value>,
        }
        serde_json::from_str::<Shape>(text).is_ok()
    }
    if let Some(s) = structured.filter(|s| is_required(s.get())) {
        return Some(s.get().to_owned());
    }
    #[derive(Deserialize)]
    struct Text {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        text: Option<String>,
    }
    let first = serde_json::from_str::<Vec<Text>>(content?.get()).ok()?.into_iter().next()?;
    first.text.filter(|t| first.kind == "text" && is_required(t))
}

/// `_meta["x402/payment-response"]`, as the `PAYMENT-RESPONSE` header's value.
fn settlement_of(meta: &RawValue) -> Result<Option<HeaderValue>, UpstreamError> {
    let meta: serde_json::Map<String, Value> =
        serde_json::from_str(meta.get()).map_err(|_| UpstreamError::Protocol("_meta is not an object".into()))?;
    let Some(settlement) = meta.get("x402/payment-response") else {
        return Ok(None);
    };
    let json = serde_json::to_vec(settlement).map_err(|e| UpstreamError::Protocol(e.to_string()))?;
    // Base64 is always a valid header value; an oversized one is refused by the settlement
    // parser, as an HTTP upstream's would be.
    Ok(HeaderValue::from_str(&STANDARD.encode(json)).ok())
}

/// At most 200 characters of an upstream's text, for a message.
fn short(s: &str) -> String {
    s.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json_resp(body: &str) -> UpstreamResponse {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        UpstreamResponse { status: 200, headers, body: body.as_bytes().to_vec() }
    }

    #[test]
    fn the_payment_goes_in_meta_before_the_arguments() {
        let body = call_body(
            br#"{"arguments":{"a":1},"name":"t"}"#,
            Some(&RawValue::from_string("{\"x\":1}".into()).unwrap()),
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["params"]["_meta"]["x402/payment"]["x"], 1);
        assert_eq!(v["params"]["name"], "t");
        assert_eq!(v["method"], "tools/call");
    }

    #[test]
    fn responses_are_read_strictly() {
        assert!(matches!(
            response_to(&json_resp(r#"{"jsonrpc":"2.0","id":2,"result":{}}"#), 2),
            Ok(Message::Result(_))
        ));
        for bad in [
            r#"{"jsonrpc":"2.0","id":3,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{},"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":2}"#,
            r#"{"jsonrpc":"1.0","id":2,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{},"extra":1}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{},"id":2}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":[]}"#,
            r#"{"jsonrpc":"2.0","id":2,"result":{"#,
        ] {
            assert!(matches!(response_to(&json_resp(bad), 2), Err(UpstreamError::Protocol(_))), "{bad}");
        }
    }

    #[test]
    fn event_streams_skip_notifications() {
        let mut resp = json_resp(
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{}}\n\n\
             event: message\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata: \"id\":2,\"result\":{\"content\":[]}}\r\n\r\n",
        );
        resp.headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        assert!(matches!(response_to(&resp, 2), Ok(Message::Result(_))));
        resp.body = b"event: message\n\n".to_vec();
        assert!(response_to(&resp, 2).is_err());
    }

    #[test]
    fn tool_results_translate_to_http() {
        let required = r#"{"x402Version":2,"accepts":[{"scheme":"exact"}]}"#;
        let as_structured = format!(r#"{{"isError":true,"structuredContent":{required},"content":[]}}"#);
        let r = translate(Message::Result(RawValue::from_string(as_structured).unwrap())).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (402, required.as_bytes()));
        let as_text = serde_json::json!({ "isError": true, "content": [{ "type": "text", "text": required }] });
        let r = translate(Message::Result(RawValue::from_string(as_text.to_string()).unwrap())).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (402, required.as_bytes()));
        // An error result that is not a payment request is the tool's answer.
        let plain = r#"{"isError":true,"content":[{"type":"text","text":"no"}]}"#;
        let r = translate(Message::Result(RawValue::from_string(plain.into()).unwrap())).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, plain.as_bytes()));
        let paid = r#"{"content":[],"_meta":{"x402/payment-response":{"success":true}}}"#;
        let r = translate(Message::Result(RawValue::from_string(paid.into()).unwrap())).unwrap();
        assert_eq!(r.status, 200);
        assert!(crate::x402::wire::parse_settlement(&r.headers).unwrap().unwrap().success);
        let err = r#"{"code":-32602,"message":"unknown tool"}"#;
        assert_eq!(translate(Message::Error(RawValue::from_string(err.into()).unwrap())).unwrap().status, 400);
    }
}
