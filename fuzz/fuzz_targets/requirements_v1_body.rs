//! The v1 402: requirements in a JSON body (no `PAYMENT-REQUIRED` header).
#![no_main]

use http::{HeaderMap, StatusCode};
use libfuzzer_sys::fuzz_target;
use x402_router::x402::wire::parse_payment_required;
use x402_router_fuzz::check_payment_required;

fuzz_target!(|body: &[u8]| {
    if let Ok(p) = parse_payment_required(StatusCode::PAYMENT_REQUIRED, &HeaderMap::new(), body) {
        check_payment_required(&p);
    }
});
