//! The v2 402: requirements in the base64 JSON `PAYMENT-REQUIRED` header.
//!
//! The first byte picks the form: even ⇒ the rest is the JSON message, base64-encoded here
//! (so the fuzzer explores the message's structure); odd ⇒ the rest is the header value
//! itself (so it explores the base64 reader: padding, URL-safe alphabet, whitespace).

use crate::check_payment_required;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderValue, StatusCode};
use x402_router::x402::wire::{PAYMENT_REQUIRED_HEADER, parse_payment_required};

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let value =
        if mode % 2 == 0 { HeaderValue::from_str(&STANDARD.encode(rest)) } else { HeaderValue::from_bytes(rest) };
    let Ok(value) = value else { return };
    let mut headers = HeaderMap::new();
    headers.insert(PAYMENT_REQUIRED_HEADER, value);
    // A body that is itself a v1 message must not be read when the header is present.
    let body = br#"{"x402Version":1,"accepts":[]}"#;
    if let Ok(p) = parse_payment_required(StatusCode::PAYMENT_REQUIRED, &headers, body) {
        assert_eq!(p.version.number(), 2, "the header only carries v2");
        check_payment_required(&p);
    }
}
