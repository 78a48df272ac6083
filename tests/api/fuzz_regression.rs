//! The fuzz targets as regression tests: every committed input of each target (its seeds in
//! `fuzz/seeds/<target>/`, the slow and crash cases kept in `fuzz/slow/<target>-*`) runs
//! through the same `check` that libFuzzer drives (crates/fuzz-checks), so a parser change
//! that breaks a promise on a known input fails the suite in seconds. The long fuzzing stays in `scripts/fuzz` (RELIABILITY.md, "Fuzzing").

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use x402_router_fuzz_checks as targets;

/// The committed inputs of `target`, in a stable order.
fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files: Vec<PathBuf> = std::fs::read_dir(fuzz.join("seeds").join(target))
        .unwrap_or_else(|e| panic!("fuzz/seeds/{target}: {e}"))
        .map(|entry| entry.expect("a readable directory entry").path())
        .collect();
    let slow_prefix = format!("{target}-");
    for entry in std::fs::read_dir(fuzz.join("slow")).expect("fuzz/slow is committed") {
        let path = entry.expect("a readable directory entry").path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&slow_prefix)) {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// A fuzz target's check: panics when an input breaks a promise.
type Check = fn(&[u8]);

/// Every fuzz target and its check, in `fuzz/fuzz_targets/` order.
const TARGETS: [(&str, Check); 7] = [
    ("envelope_roundtrip", targets::envelope_roundtrip::check),
    ("request_canonical", targets::request_canonical::check),
    ("requirements_v1_body", targets::requirements_v1_body::check),
    ("requirements_v2_header", targets::requirements_v2_header::check),
    ("settlement_header", targets::settlement_header::check),
    ("svm_requirement", targets::svm_requirement::check),
    ("upstream_url_guard", targets::upstream_url_guard::check),
];

/// Runs every committed input of `target` through `check`: the inputs that break a promise.
fn replay(target: &str, check: Check) -> Vec<String> {
    let files = inputs(target);
    assert!(!files.is_empty(), "{target} has no committed inputs");
    files
        .iter()
        .filter_map(|path| {
            let data = std::fs::read(path).expect("a committed input is readable");
            let outcome = catch_unwind(AssertUnwindSafe(|| check(&data)));
            outcome.is_err().then(|| path.display().to_string())
        })
        .collect()
}

#[test]
fn every_committed_fuzz_input_keeps_its_promises() {
    let failed: Vec<String> = TARGETS.iter().flat_map(|(target, check)| replay(target, *check)).collect();
    assert!(failed.is_empty(), "{} inputs break a promise: {failed:?}", failed.len());
}

/// Every target under `fuzz/fuzz_targets/` is replayed above, and its libFuzzer entry only
/// hands the bytes to the `check` replayed here (the suite does not build the fuzz crate, so
/// an entry that did more would go untested): a target cannot be left out or drift.
#[test]
fn every_fuzz_target_is_replayed() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/fuzz_targets");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).expect("fuzz/fuzz_targets is committed") {
        let path = entry.expect("a readable directory entry").path();
        let name = path.file_stem().and_then(|n| n.to_str()).expect("a target's file name").to_owned();
        let entry = std::fs::read_to_string(&path).expect("a target is readable");
        let call = format!("libfuzzer_sys::fuzz_target!(|data: &[u8]| x402_router_fuzz_checks::{name}::check(data));");
        let code: Vec<&str> = entry.lines().filter(|l| !l.starts_with("//") && !l.trim().is_empty()).collect();
        assert_eq!(code, ["#![no_main]", call.as_str()], "fuzz/fuzz_targets/{name}.rs only calls its check");
        names.push(name);
    }
    names.sort();
    let replayed: Vec<&str> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, replayed, "the fuzz targets and the ones replayed");
}
