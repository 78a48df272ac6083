//! The body of `POST /route`: strict JSON parsing, canonicalisation (RFC 8785) and the
//! request hash. Input: the body, then optionally 0xFF (never in valid JSON text) and the
//! query string of the `/route` call.
//!
//! Promises checked on every accepted body: the hash is 64 lowercase hex digits; the
//! canonical form of the body is accepted again, with the same hash and the same upstream
//! request (canonicalisation is a fixed point: key order and whitespace never matter); and
//! the body sent upstream is exactly the canonical form of `body`, so two requests with one
//! hash send the same bytes.

use x402_router::idempotency::canonical::parse_strict;
use x402_router::relay::request::RouteCall;

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let (body, query) = match data.iter().position(|&b| b == 0xFF) {
        Some(i) => (&data[..i], String::from_utf8_lossy(&data[i + 1..]).into_owned()),
        None => (data, String::new()),
    };
    let Ok(call) = RouteCall::parse(body, "/route", &query) else { return };
    assert_eq!(call.request_hash.len(), 64);
    assert!(call.request_hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));

    let value = parse_strict(body).expect("an accepted body parses strictly");
    let canonical = serde_jcs::to_vec(&value).expect("parse_strict yields only finite numbers");
    let again = RouteCall::parse(&canonical, "/route", &query).expect("the canonical form is accepted");
    assert_eq!(again.request_hash, call.request_hash, "canonical form changes the hash");
    assert_eq!(again.upstream.body, call.upstream.body);
    assert_eq!(again.upstream.url, call.upstream.url);
    assert_eq!(again.upstream.method, call.upstream.method);
    assert_eq!(again.upstream.headers, call.upstream.headers);

    let sent_body = match value.get("body") {
        None | Some(serde_json::Value::Null) => None,
        Some(b) => Some(serde_jcs::to_vec(b).expect("finite")),
    };
    assert_eq!(call.upstream.body, sent_body, "the upstream receives the canonical body");
}
