//! libFuzzer's entry for `x402_router_fuzz_checks::requirements_v2_header` (what it checks is written there).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| x402_router_fuzz_checks::requirements_v2_header::check(data));
