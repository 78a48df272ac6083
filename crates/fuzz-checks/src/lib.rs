//! The fuzz targets' checks, one module per target, and what they share. Each `check` feeds
//! untrusted bytes to one parser of the router and asserts what the parser promises besides
//! "does not panic". libFuzzer drives them from `fuzz/fuzz_targets/` (scripts/fuzz, a
//! workspace of its own, so libFuzzer never reaches the service's build); the router's test
//! suite replays every committed seed and slow case through the same functions
//! (tests/api/fuzz_regression.rs).

pub mod envelope_roundtrip;
pub mod request_canonical;
pub mod requirements_v1_body;
pub mod requirements_v2_header;
pub mod settlement_header;
pub mod svm_requirement;
pub mod upstream_url_guard;

use x402_router::x402::wire::{MAX_ACCEPTS, MAX_REASON_BYTES, PaymentRequired, Requirement};

/// What a successfully parsed 402 promises: bounded, every entry accounted for exactly once,
/// and each usable requirement is what its own verbatim JSON parses to (so what is selected,
/// signed and sent is the same option).
pub fn check_payment_required(p: &PaymentRequired) {
    assert!(p.raw_accepts.len() <= MAX_ACCEPTS);
    assert_eq!(p.accepts.len() + p.skipped.len(), p.raw_accepts.len());
    assert!(!p.accepts.is_empty() || p.skipped.iter().any(|s| s.error.is_unsupported()));
    for r in &p.accepts {
        let again = Requirement::from_json(p.version, r.index(), &r.raw_json());
        assert_eq!(again.as_ref().ok(), Some(r), "a requirement re-parses from its raw JSON");
        assert_eq!(&p.raw_accepts[r.index()], &r.raw_json());
    }
    if let Some(e) = &p.error {
        assert!(!e.is_empty() && e.len() <= MAX_REASON_BYTES);
    }
}

/// A block of the IANA special-purpose address registries that the SSRF guard must refuse
/// (globally reachable "false" or "n/a"; see the table's header).
pub fn iana_forbidden() -> Vec<ipnet::IpNet> {
    include_str!("../../../tests/fixtures/iana-special-purpose.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let mut cols = l.split_whitespace();
            let block = cols.next()?.parse().ok()?;
            (cols.next()? != "true").then_some(block)
        })
        .collect()
}
