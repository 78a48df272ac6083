//! The settlement header of a paid answer (`PAYMENT-RESPONSE`, v1 `X-PAYMENT-RESPONSE`) and
//! the refusal reasons read from headers and body.
//!
//! First byte: bit 0 picks raw header value (1) or base64 of the JSON (0); bits 1–2 pick the
//! header(s): v2, v1, both, or v2 twice. The rest is split at the first 0xFF: header part,
//! then a response body for `refusal_reasons`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use http::{HeaderMap, HeaderValue};
use x402_router::x402::wire::{
    MAX_REASON_BYTES, PAYMENT_RESPONSE_HEADER, X_PAYMENT_RESPONSE_HEADER, parse_settlement, refusal_reasons,
};

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (head, body) = match rest.iter().position(|&b| b == 0xFF) {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let value =
        if mode & 1 == 0 { HeaderValue::from_str(&STANDARD.encode(head)) } else { HeaderValue::from_bytes(head) };
    let Ok(value) = value else { return };
    let mut headers = HeaderMap::new();
    match (mode >> 1) & 3 {
        0 => {
            headers.append(PAYMENT_RESPONSE_HEADER, value);
        }
        1 => {
            headers.append(X_PAYMENT_RESPONSE_HEADER, value);
        }
        2 => {
            headers.append(PAYMENT_RESPONSE_HEADER, value.clone());
            headers.append(X_PAYMENT_RESPONSE_HEADER, value);
        }
        _ => {
            headers.append(PAYMENT_RESPONSE_HEADER, value.clone());
            headers.append(PAYMENT_RESPONSE_HEADER, value);
            assert!(parse_settlement(&headers).is_err(), "a repeated settlement header is refused");
        }
    }
    if let Ok(Some(s)) = parse_settlement(&headers) {
        for text in [&s.transaction, &s.network, &s.error_reason].into_iter().flatten() {
            assert!(!text.is_empty() && text.len() <= MAX_REASON_BYTES);
        }
        if s.tx_hash.is_some() {
            assert!(s.transaction.is_some());
        }
    }
    let reasons = refusal_reasons(&headers, body);
    for text in [&reasons.error, &reasons.invalid_reason, &reasons.error_reason].into_iter().flatten() {
        assert!(!text.is_empty() && text.len() <= MAX_REASON_BYTES);
    }
}
