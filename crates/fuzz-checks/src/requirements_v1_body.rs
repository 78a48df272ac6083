//! The v1 402: requirements in a JSON body (no `PAYMENT-REQUIRED` header).

use crate::check_payment_required;
use http::{HeaderMap, StatusCode};
use x402_router::x402::wire::parse_payment_required;

/// One input: the promises above hold, or the check panics.
pub fn check(body: &[u8]) {
    if let Ok(p) = parse_payment_required(StatusCode::PAYMENT_REQUIRED, &HeaderMap::new(), body) {
        check_payment_required(&p);
    }
}
