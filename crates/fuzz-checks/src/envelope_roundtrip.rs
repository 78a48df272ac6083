//! An upstream answer → the outcome's rendered envelope → storage (Postgres stores the bytes
//! as BYTEA; the Redis entry is sealed and opened again) → replay.
//!
//! Input: `[status hi, status lo, flags, header length, headers…, body…]`; headers are
//! `name:value` lines (invalid ones skipped). Flags: bit 0 adds `content-type:
//! application/json`; bits 1–2 pick the outcome (answered, failed with a reason taken from
//! the header text, declined with the body as `accepts`).
//!
//! Promises checked: the envelope is one JSON object; its `status`, `headers` and `body`
//! give back the upstream's answer (the JSON body as the same value, other text as `text`,
//! other bytes as `base64`, exactly); the Redis entry opens to the same bytes; what is
//! written to JSONB carries no NUL.

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;
use serde_json::value::RawValue;
use uuid::Uuid;
use x402_router::codes::Code;
use x402_router::db::storable;
use x402_router::idempotency::cache::Entry;
use x402_router::idempotency::redis_link::RedisTarget;
use x402_router::idempotency::{Cache, IdempotencyKey, Ownership, Status};
use x402_router::relay::envelope::{headers_json, to_value};
use x402_router::relay::request::RouteCall;
use x402_router::relay::{Failure, Outcome};
use x402_router::upstream::UpstreamResponse;

static CALL: LazyLock<RouteCall> = LazyLock::new(|| {
    RouteCall::parse(br#"{"url":"https://api.example.com/x","max_amount":"1"}"#, "/route", "").expect("valid")
});
static OWNER: LazyLock<Ownership> = LazyLock::new(|| Ownership {
    agent_id: Uuid::nil(),
    key: IdempotencyKey::parse(Some(b"fuzz-key-0123456789")).expect("valid"),
    request_hash: CALL.request_hash.clone(),
    lease: Uuid::nil(),
    took_over: false,
    durable: true,
    expires_unix: 4_000_000_000,
    credential: String::new(),
    raw_digest: None,
});
static CACHE: LazyLock<Cache> = LazyLock::new(|| {
    // Never connects: seal/open are pure.
    let target = RedisTarget::parse("redis://127.0.0.1:1", false, None).expect("valid");
    Cache::new(target, Duration::from_millis(1), "fuzz:".into(), [7; 32])
});

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let [hi, lo, flags, head_len, rest @ ..] = data else { return };
    let status = 100 + u16::from_be_bytes([*hi, *lo]) % 900;
    let (head, body) = rest.split_at((*head_len as usize).min(rest.len()));
    let mut headers = HeaderMap::new();
    if flags & 1 == 1 {
        headers.append(http::header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    for line in head.split(|&b| b == b'\n') {
        let Some(colon) = line.iter().position(|&b| b == b':') else { continue };
        if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(&line[..colon]), HeaderValue::from_bytes(&line[colon + 1..])) {
            headers.append(n, v);
        }
    }
    let resp = UpstreamResponse { status, headers: headers.clone(), body: body.to_vec() };
    let reason = String::from_utf8_lossy(head).into_owned();
    let accepts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let (outcome, has_upstream) = match (flags >> 1) & 3 {
        0 | 3 => (Outcome::Answered { resp, payment: None }, true),
        1 => (
            Outcome::Failed(
                Failure::new(Code::UpstreamFailed, "fuzz").upstream(resp).reason("errorReason", Some(reason.clone())),
            ),
            true,
        ),
        _ => (
            Outcome::Declined {
                code: Code::PaymentUnsupported,
                upstream: Some(resp),
                reason: reason.clone(),
                accepts: accepts.clone(),
            },
            false,
        ),
    };
    // Nothing redacted: the reason is the agent's to read back exactly (redaction has its own tests).
    let nothing = x402_router::secrets::Redaction::parse("").expect("an empty list redacts nothing");
    let rendered = outcome.render(&OWNER, &CALL, &nothing);
    let bytes = rendered.stored.body.clone();

    // Rendering: one JSON object that gives the answer back. Its members are read one by one
    // (the body is embedded verbatim and may be JSON that a serde_json Value cannot hold);
    // `to_value`, what the MCP server reads, must always succeed.
    let members: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(&bytes).expect("the envelope is an object");
    let env = to_value(&bytes).expect("the envelope reads as a value");
    let env = env.as_object().expect("the envelope is an object");
    assert_eq!(env.len(), members.len());
    if has_upstream {
        assert_eq!(env["status"], Value::from(status));
        assert_eq!(env["headers"], headers_json(&headers));
        check_body(&headers, body, members["body"].get());
    } else {
        assert_eq!(env["accepts"], accepts);
        assert_eq!(env["error"], Value::String(reason.clone()));
    }

    // Storage: the Redis entry gives back the bytes exactly (Postgres keeps them as BYTEA).
    let entry = Entry {
        status: rendered.stored.status,
        request_hash: CALL.request_hash.clone(),
        response_status_code: Some(i32::from(rendered.stored.http_status)),
        response: Some(bytes.clone()),
        receipt_id: rendered.stored.receipt_id,
        expires_unix: Some(4_000_000_000),
        raw_digest: Some(CALL.request_hash.clone()),
    };
    let sealed = CACHE.seal("fuzz:k", &entry).expect("an entry always seals");
    let opened = CACHE.open("fuzz:k", &sealed).expect("a sealed entry opens");
    assert_eq!(opened.response.as_deref(), Some(&bytes[..]));
    assert_eq!(opened.status, entry.status);
    assert_eq!(opened.receipt_id, entry.receipt_id);
    assert_eq!(opened.raw_digest, entry.raw_digest);
    assert!(CACHE.open("fuzz:other", &sealed).is_none());
    assert!(matches!(entry.status, Status::Completed | Status::Errored));

    check_jsonb(&[accepts, Value::String(reason)]);
}

/// JSONB (receipts, payment intents) never sees NUL, and nothing else changes.
fn check_jsonb(values: &[Value]) {
    for v in values {
        let stored = storable::json(v);
        assert!(!has_nul(&stored), "JSONB refuses NUL");
        if !has_nul(v) {
            assert_eq!(&*stored, v, "a value without NUL is stored as it is");
        }
    }
}

/// The envelope's `body` member (its JSON text) gives back the upstream's body.
fn check_body(headers: &HeaderMap, body: &[u8], shown: &str) {
    if body.is_empty() {
        assert_eq!(shown, "null");
        return;
    }
    let is_json = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    if is_json && serde_json::from_slice::<Box<RawValue>>(body).is_ok() {
        let json_ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        let start = body.iter().position(|b| !json_ws(b)).unwrap_or(body.len());
        let end = body.iter().rposition(|b| !json_ws(b)).map_or(start, |i| i + 1);
        assert_eq!(shown.as_bytes(), &body[start..end], "JSON is embedded verbatim");
        return;
    }
    let shown: Value = serde_json::from_str(shown).expect("text and base64 forms are plain JSON");
    if let Ok(text) = std::str::from_utf8(body) {
        assert_eq!(shown, serde_json::json!({ "text": text }));
    } else {
        let b64 = shown["base64"].as_str().expect("non-UTF-8 bodies are base64");
        assert_eq!(STANDARD.decode(b64).expect("valid base64"), body);
    }
}

/// True when a string or key anywhere in `v` holds NUL.
fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(m) => m.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}
