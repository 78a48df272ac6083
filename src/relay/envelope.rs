//! The response envelope of `POST /route` (DESIGN.md §4).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::codes::Code;
use crate::upstream::{UpstreamResponse, is_kept_response_header};

/// Upstream headers as a JSON object: lowercase names, repeated values joined by ", ".
pub fn headers_json(headers: &HeaderMap) -> Value {
    let mut out = Map::new();
    for name in headers.keys() {
        if !is_kept_response_header(name.as_str()) {
            continue;
        }
        let values: Vec<&str> = headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).collect();
        if !values.is_empty() {
            out.insert(name.as_str().to_owned(), Value::String(values.join(", ")));
        }
    }
    Value::Object(out)
}

/// The upstream body as JSON: the JSON itself when it is JSON, `{"text": …}` for other
/// UTF-8, `{"base64": …}` otherwise; `null` when empty.
pub fn body_json(headers: &HeaderMap, body: &[u8]) -> Value {
    if body.is_empty() {
        return Value::Null;
    }
    let is_json = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    if is_json && let Ok(v) = serde_json::from_slice::<Value>(body) {
        return v;
    }
    match std::str::from_utf8(body) {
        Ok(text) => json!({ "text": text }),
        Err(_) => json!({ "base64": STANDARD.encode(body) }),
    }
}

/// The envelope for an upstream answer.
pub fn envelope(resp: &UpstreamResponse, payment: Option<&Value>, receipt_id: Uuid) -> Value {
    json!({
        "status": resp.status,
        "headers": headers_json(&resp.headers),
        "body": body_json(&resp.headers, &resp.body),
        "payment": payment,
        "receipt_id": receipt_id,
    })
}

/// A 502/504 body: the error and its code plus the envelope fields known so far.
pub fn error_envelope(
    code: Code,
    error: &str,
    resp: Option<&UpstreamResponse>,
    payment: Option<&Value>,
    receipt_id: Option<Uuid>,
) -> Value {
    let mut body = match resp {
        Some(r) => json!({
            "status": r.status,
            "headers": headers_json(&r.headers),
            "body": body_json(&r.headers, &r.body),
        }),
        None => json!({}),
    };
    if let Value::Object(map) = &mut body {
        map.insert("error".into(), Value::String(error.to_owned()));
        map.insert("code".into(), Value::String(code.as_str().to_owned()));
        map.insert("payment".into(), payment.cloned().unwrap_or(Value::Null));
        map.insert("receipt_id".into(), receipt_id.map_or(Value::Null, |id| Value::String(id.to_string())));
    }
    body
}
