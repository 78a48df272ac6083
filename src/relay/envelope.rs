//! The response envelope of `POST /route` (docs/DESIGN.md §4), rendered once to the bytes that are
//! sent, stored and replayed.
//!
//! The upstream's JSON is embedded verbatim ([`RawValue`]), never parsed into a value and
//! printed again: integers beyond 2^53 keep every digit, escapes such as `\u0000` stay as
//! sent, and nesting of any depth is kept. Members are written in name order.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::HeaderMap;
use serde::Serialize;
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use super::view::PaymentView;
use crate::codes::Code;
use crate::upstream::{UpstreamResponse, is_kept_response_header};

/// A JSON object whose members are already rendered.
#[derive(Debug, Default)]
pub struct Envelope(BTreeMap<&'static str, Box<RawValue>>);

impl Envelope {
    /// Sets member `name` to `value` rendered as JSON.
    pub fn set(&mut self, name: &'static str, value: &impl Serialize) -> &mut Self {
        self.0.insert(name, raw(value));
        self
    }

    /// Sets member `name` to JSON that is already rendered.
    pub fn set_raw(&mut self, name: &'static str, value: Box<RawValue>) -> &mut Self {
        self.0.insert(name, value);
        self
    }

    /// The bytes of the object.
    pub fn to_bytes(&self) -> Vec<u8> {
        // A map of strings to valid JSON texts always serializes.
        serde_json::to_vec(&self.0).unwrap_or_else(|_| b"{}".to_vec())
    }
}

/// `value` rendered as JSON (`null` in the impossible case that it cannot be).
fn raw(value: &impl Serialize) -> Box<RawValue> {
    to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

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

/// The upstream body as JSON: the JSON itself, verbatim, when it is JSON; `{"text": …}` for
/// other UTF-8, `{"base64": …}` otherwise; `null` when empty.
pub fn body_json(headers: &HeaderMap, body: &[u8]) -> Box<RawValue> {
    if body.is_empty() {
        return RawValue::NULL.to_owned();
    }
    let is_json = headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.to_ascii_lowercase().contains("json"));
    if is_json && let Ok(v) = serde_json::from_slice::<Box<RawValue>>(body) {
        return v;
    }
    match std::str::from_utf8(body) {
        Ok(text) => raw(&json!({ "text": text })),
        Err(_) => raw(&json!({ "base64": STANDARD.encode(body) })),
    }
}

/// `status`, `headers` and `body` of an upstream answer.
fn upstream_fields(env: &mut Envelope, resp: &UpstreamResponse) {
    env.set("status", &resp.status)
        .set("headers", &headers_json(&resp.headers))
        .set_raw("body", body_json(&resp.headers, &resp.body));
}

/// The envelope for an upstream answer.
pub fn envelope(resp: &UpstreamResponse, payment: Option<&PaymentView>, receipt_id: Uuid) -> Envelope {
    let mut env = Envelope::default();
    upstream_fields(&mut env, resp);
    env.set("payment", &payment).set("receipt_id", &receipt_id);
    env
}

/// A 502/504 body: the error and its code plus the envelope fields known so far.
pub fn error_envelope(
    code: Code,
    error: &str,
    resp: Option<&UpstreamResponse>,
    payment: Option<&PaymentView>,
    receipt_id: Option<Uuid>,
) -> Envelope {
    let mut env = Envelope::default();
    if let Some(r) = resp {
        upstream_fields(&mut env, r);
    }
    env.set("error", &error).set("code", &code).set("payment", &payment).set("receipt_id", &receipt_id);
    env
}

/// The envelope `bytes` as a [`Value`], for in-process readers (the MCP server).
///
/// An envelope is always JSON text, but the upstream body inside it is embedded verbatim and
/// may be JSON that a `Value` cannot hold: a number beyond the double range (`1e400`), or
/// nesting deeper than serde_json's limit of 128. Parsing the whole envelope would then fail
/// and lose the status, payment and receipt with it; instead, such a member is given as
/// `{"text": <its JSON text>}`, like other text bodies. `None` only if `bytes` is not a JSON
/// object at all.
pub fn to_value(bytes: &[u8]) -> Option<Value> {
    if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(bytes) {
        return Some(v);
    }
    let members: BTreeMap<String, Box<RawValue>> = serde_json::from_slice(bytes).ok()?;
    let object = members
        .into_iter()
        .map(|(name, raw)| {
            let value = serde_json::from_str(raw.get()).unwrap_or_else(|_| json!({ "text": raw.get() }));
            (name, value)
        })
        .collect();
    Some(Value::Object(object))
}

#[cfg(test)]
mod tests {
    use reqwest::header::{CONTENT_TYPE, HeaderValue};

    use super::*;

    fn json_headers() -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"));
        h
    }

    #[test]
    fn json_bodies_are_embedded_verbatim() {
        let body = br#" {"n":18446744073709551616,"s":"\u0000","f":0.10000000000000000555} "#;
        assert_eq!(
            body_json(&json_headers(), body).get(),
            r#"{"n":18446744073709551616,"s":"\u0000","f":0.10000000000000000555}"#
        );
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        assert_eq!(body_json(&json_headers(), deep.as_bytes()).get(), deep);
    }

    #[test]
    fn other_bodies_are_text_or_base64() {
        assert_eq!(body_json(&json_headers(), b"").get(), "null");
        assert_eq!(body_json(&json_headers(), b"{\"a\":1} trailing").get(), r#"{"text":"{\"a\":1} trailing"}"#);
        assert_eq!(body_json(&HeaderMap::new(), b"a\0b").get(), r#"{"text":"a\u0000b"}"#);
        assert_eq!(body_json(&json_headers(), b"{\"a\":\"\xff\"}").get(), r#"{"base64":"eyJhIjoi/yJ9"}"#);
    }

    #[test]
    fn envelopes_with_json_that_a_value_cannot_hold_still_read_as_values() {
        // Found by the envelope_roundtrip fuzz target: the MCP server parsed the envelope
        // with serde_json and got `null` (status, payment and receipt lost) for these bodies.
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        for body in ["1e400", "[-1e99999]", deep.as_str()] {
            let resp = UpstreamResponse { status: 200, headers: json_headers(), body: body.as_bytes().to_vec() };
            let bytes = envelope(&resp, None, Uuid::nil()).to_bytes();
            assert!(serde_json::from_slice::<Value>(&bytes).is_err(), "{body}: serde_json refuses the envelope");
            let v = to_value(&bytes).unwrap();
            assert_eq!(v["status"], 200);
            assert_eq!(v["receipt_id"], "00000000-0000-0000-0000-000000000000");
            assert_eq!(v["body"], json!({ "text": body }));
        }
        let plain = envelope(
            &UpstreamResponse { status: 201, headers: json_headers(), body: b"[1]".to_vec() },
            None,
            Uuid::nil(),
        );
        assert_eq!(to_value(&plain.to_bytes()).unwrap()["body"], json!([1]));
        assert_eq!(to_value(b"[1]"), None);
    }

    #[test]
    fn members_are_in_name_order() {
        let resp = UpstreamResponse { status: 200, headers: json_headers(), body: b"[1]".to_vec() };
        let env = envelope(&resp, None, Uuid::nil()).to_bytes();
        assert_eq!(
            String::from_utf8(env).unwrap(),
            r#"{"body":[1],"headers":{"content-type":"application/json; charset=utf-8"},"payment":null,"receipt_id":"00000000-0000-0000-0000-000000000000","status":200}"#
        );
    }
}
