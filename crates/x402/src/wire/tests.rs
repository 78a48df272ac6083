//! Tests of the wire format, with messages captured from the official implementations.

use alloy::primitives::address;
use alloy::signers::local::PrivateKeySigner;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};

use alloy::primitives::U256;

use super::*;
use crate::money::Amount;
use crate::network::Network;

/// PROTOCOL.md §3, the decoded `PAYMENT-REQUIRED` of `GET /v2/weather`.
pub(crate) const V2_REQUIRED: &str = r#"{"x402Version":2,"error":"Payment required",
 "resource":{"url":"http://127.0.0.1:4021/v2/weather","description":"Weather report (x402 v2)","mimeType":"application/json"},
 "accepts":[{"scheme":"exact","network":"eip155:84532","amount":"10000",
   "asset":"0x5FbDB2315678afecb367f032d93F642f64180aa3","payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
   "maxTimeoutSeconds":300,"extra":{"name":"USD Coin","version":"2"}}]}"#;

/// PROTOCOL.md §4, the 402 body of `GET /v1/weather`.
pub(crate) const V1_BODY: &str = r#"{"x402Version":1,"error":"X-PAYMENT header is required",
 "accepts":[{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000",
   "resource":"http://127.0.0.1:4021/v1/weather","description":"Weather report (x402 v1)","mimeType":"application/json",
   "payTo":"0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC","maxTimeoutSeconds":60,
   "asset":"0x5FbDB2315678afecb367f032d93F642f64180aa3",
   "outputSchema":{"input":{"type":"http","method":"GET","discoverable":true}},
   "extra":{"name":"USD Coin","version":"2"}}]}"#;

/// PROTOCOL.md §3 and §4, settlement headers exactly as captured.
const V2_SETTLEMENT: &str = "eyJzdWNjZXNzIjp0cnVlLCJwYXllciI6IjB4NzA5OTc5NzBDNTE4MTJkYzNBMDEwQzdkMDFiNTBlMGQxN2RjNzlDOCIsInRyYW5zYWN0aW9uIjoiMHhlNjg2ZGU5MTQzNjc0ZGJlYTlkYmM5OTcwMTdmZWM2NGYzZDdkZTA3NjdmNGM2YjM3Y2EzZjIzMTcwZWQ5NTE1IiwibmV0d29yayI6ImVpcDE1NTo4NDUzMiJ9";
const V1_SETTLEMENT: &str = "eyJzdWNjZXNzIjp0cnVlLCJ0cmFuc2FjdGlvbiI6IjB4N2EwYTg4OWNiYWNkZGQxOWYxNzQ2ODc1MjMxMzhmZWU1NDI5MDMwNjlmM2I0MDI2OTZkZWNlODNjNDYwMTEzMyIsIm5ldHdvcmsiOiJiYXNlLXNlcG9saWEiLCJwYXllciI6IjB4NzA5OTc5NzBDNTE4MTJkYzNBMDEwQzdkMDFiNTBlMGQxN2RjNzlDOCJ9";

/// anvil #1, a public test key.
pub(crate) const PAYER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

pub(crate) fn b64(s: &str) -> String {
    STANDARD.encode(s.as_bytes())
}

pub(crate) fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(*name, HeaderValue::from_str(value).unwrap());
    }
    map
}

pub(crate) fn v2_402(message: &str) -> Result<PaymentRequired, WireError> {
    parse_payment_required(StatusCode::PAYMENT_REQUIRED, &headers(&[("PAYMENT-REQUIRED", &b64(message))]), b"{}")
}

pub(crate) fn v1_402(body: &str) -> Result<PaymentRequired, WireError> {
    parse_payment_required(StatusCode::PAYMENT_REQUIRED, &HeaderMap::new(), body.as_bytes())
}

pub(crate) fn v2_with_entries(entries: Value) -> Result<PaymentRequired, WireError> {
    v2_402(&json!({"x402Version": 2, "resource": {"url": "http://x/"}, "accepts": entries}).to_string())
}

pub(crate) fn v2_entry(amount: &str) -> Value {
    json!({"scheme": "exact", "network": "eip155:84532", "amount": amount,
           "asset": "0x5FbDB2315678afecb367f032d93F642f64180aa3",
           "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
           "maxTimeoutSeconds": 300, "extra": {"name": "USD Coin", "version": "2"}})
}

pub(crate) fn signer() -> PrivateKeySigner {
    PAYER_KEY.parse().unwrap()
}

#[test]
fn parses_the_captured_v2_402() {
    let pr = v2_402(V2_REQUIRED).unwrap();
    assert_eq!(pr.version, X402Version::V2);
    assert_eq!(pr.error.as_deref(), Some("Payment required"));
    assert_eq!(pr.resource.as_ref().unwrap()["url"], "http://127.0.0.1:4021/v2/weather");
    assert!(pr.skipped.is_empty());
    assert_eq!(pr.accepts.len(), 1);
    let r = &pr.accepts[0];
    assert_eq!(r.index(), 0);
    assert_eq!(r.scheme(), "exact");
    assert_eq!(r.network(), Network::BASE_SEPOLIA);
    assert_eq!(r.network_raw(), "eip155:84532");
    assert_eq!(r.amount(), Amount::from(10_000));
    assert_eq!(r.asset(), address!("0x5FbDB2315678afecb367f032d93F642f64180aa3"));
    assert_eq!(r.pay_to(), address!("0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"));
    assert_eq!(r.max_timeout_seconds(), 300);
    assert_eq!(r.extra_name(), Some("USD Coin"));
    assert_eq!(r.extra_version(), Some("2"));
    let original: Value = serde_json::from_str(V2_REQUIRED).unwrap();
    assert_eq!(r.raw_json(), original["accepts"][0]);
    assert_eq!(pr.raw_accepts, original["accepts"].as_array().unwrap().clone());
}

#[test]
fn parses_the_captured_v1_402() {
    let pr = v1_402(V1_BODY).unwrap();
    assert_eq!(pr.version, X402Version::V1);
    assert_eq!(pr.error.as_deref(), Some("X-PAYMENT header is required"));
    assert_eq!(pr.resource, None);
    let r = &pr.accepts[0];
    assert_eq!(r.network(), Network::BASE_SEPOLIA);
    assert_eq!(r.network_raw(), "base-sepolia");
    assert_eq!(r.amount(), Amount::from(10_000));
    assert_eq!(r.max_timeout_seconds(), 60);
    assert_eq!(r.raw()["outputSchema"]["input"]["method"], "GET");
}

#[test]
fn base64_is_read_leniently() {
    let encoded = b64(V2_REQUIRED);
    let unpadded = encoded.trim_end_matches('=').to_owned();
    let mut spaced = String::new();
    for (i, c) in encoded.chars().enumerate() {
        if i > 0 && i % 76 == 0 {
            spaced.push(' ');
        }
        spaced.push(c);
    }
    let url_safe = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(V2_REQUIRED);
    for value in [unpadded, spaced, format!("  {encoded}  "), url_safe] {
        let pr = parse_payment_required(StatusCode::PAYMENT_REQUIRED, &headers(&[("payment-required", &value)]), b"")
            .unwrap();
        assert_eq!(pr.accepts.len(), 1);
    }
}

#[test]
fn only_a_402_is_read() {
    let err = parse_payment_required(StatusCode::OK, &HeaderMap::new(), V1_BODY.as_bytes());
    assert!(matches!(err, Err(WireError::NotPaymentRequired(200))));
}

#[test]
fn a_402_without_x402_content_is_an_error() {
    for body in ["", "<html>pay up</html>", "{}", "[]", r#"{"error":"no"}"#] {
        assert!(matches!(v1_402(body), Err(WireError::NoRequirements)), "{body:?}");
    }
}

#[test]
fn hostile_headers_are_typed_errors() {
    let too_big = "A".repeat(MAX_HEADER_BYTES + 1);
    type Expect = fn(&WireError) -> bool;
    let cases: Vec<(String, Expect)> = vec![
        ("!!!not base64!!!".to_owned(), |e| matches!(e, WireError::BadBase64(_))),
        (b64("not json"), |e| matches!(e, WireError::BadJson { .. })),
        (b64("[1,2]"), |e| matches!(e, WireError::Malformed(_))),
        (b64(r#"{"x402Version":2}"#), |e| matches!(e, WireError::Malformed(_))),
        (b64(r#"{"x402Version":2,"accepts":{}}"#), |e| matches!(e, WireError::Malformed(_))),
        (b64(r#"{"x402Version":2,"accepts":[]}"#), |e| matches!(e, WireError::EmptyAccepts)),
        (b64(r#"{"x402Version":3,"accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
        (b64(r#"{"x402Version":"2","accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
        (b64(r#"{"accepts":[]}"#), |e| matches!(e, WireError::UnsupportedVersion(_))),
        (b64(V1_BODY), |e| matches!(e, WireError::UnsupportedVersion(_))),
        (too_big, |e| matches!(e, WireError::HeaderTooLarge { .. })),
    ];
    for (value, expected) in cases {
        let err = parse_payment_required(
            StatusCode::PAYMENT_REQUIRED,
            &headers(&[("payment-required", &value)]),
            V1_BODY.as_bytes(),
        )
        .unwrap_err();
        assert!(expected(&err), "{err:?}");
    }
}

#[test]
fn non_ascii_and_duplicate_headers_are_errors() {
    let mut map = HeaderMap::new();
    map.insert("payment-required", HeaderValue::from_bytes(b"eyJ\xff\xfe").unwrap());
    assert!(matches!(parse_payment_required(StatusCode::PAYMENT_REQUIRED, &map, b""), Err(WireError::BadBase64(_))));
    let value = b64(V2_REQUIRED);
    let map = headers(&[("payment-required", &value), ("payment-required", &value)]);
    assert!(matches!(
        parse_payment_required(StatusCode::PAYMENT_REQUIRED, &map, b""),
        Err(WireError::DuplicateHeader(_))
    ));
}

#[test]
fn deeply_nested_json_does_not_overflow_the_stack() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(v2_402(&deep).is_err());
    let body = format!(r#"{{"x402Version":1,"accepts":{}{}}}"#, "[".repeat(50_000), "]".repeat(50_000));
    assert!(v1_402(&body).is_err());
}

#[test]
fn oversized_bodies_and_lists_are_refused() {
    let big = format!(r#"{{"x402Version":1,"pad":"{}","accepts":[]}}"#, "x".repeat(MAX_BODY_BYTES));
    assert!(matches!(v1_402(&big), Err(WireError::BodyTooLarge { .. })));
    let many = Value::Array(vec![v2_entry("1"); MAX_ACCEPTS + 1]);
    assert!(matches!(v2_with_entries(many), Err(WireError::TooManyRequirements(65))));
    let max = Value::Array(vec![v2_entry("1"); MAX_ACCEPTS]);
    assert_eq!(v2_with_entries(max).unwrap().accepts.len(), MAX_ACCEPTS);
}

#[test]
fn amounts_must_be_canonical_decimal_u256() {
    let max = U256::MAX.to_string();
    assert_eq!(v2_with_entries(json!([v2_entry(&max)])).unwrap().accepts[0].amount().as_u256(), U256::MAX);
    assert!(v2_with_entries(json!([v2_entry("0")])).unwrap().accepts[0].amount().is_zero());
    let over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
    for bad in ["-1", "+1", "1.5", "1e6", " 1", "1 ", "01", "0x10", "", "١٢", over, &"9".repeat(79)] {
        let err = v2_with_entries(json!([v2_entry(bad)])).unwrap_err();
        assert!(matches!(&err, WireError::NoValidRequirement(m) if m.contains("amount")), "{bad:?}: {err}");
    }
    let mut numeric = v2_entry("1");
    numeric["amount"] = json!(10000);
    assert!(v2_with_entries(json!([numeric])).is_err());
}

#[test]
fn malformed_fields_are_reported_per_entry() {
    let mutate = |field: &str, value: Value| {
        let mut e = v2_entry("10");
        e[field] = value;
        e
    };
    let remove = |field: &str| {
        let mut e = v2_entry("10");
        e.as_object_mut().unwrap().remove(field);
        e
    };
    let bad = [
        mutate("asset", json!("0x5FbDB2315678afecb367f032d93F642f64180aa")),
        mutate("asset", json!("5FbDB2315678afecb367f032d93F642f64180aa3")),
        mutate("asset", json!("0x5fbDB2315678afecb367f032d93F642f64180aa3")), // bad checksum
        mutate("payTo", json!("0xZZbDB2315678afecb367f032d93F642f64180aa3")),
        mutate("payTo", json!(12)),
        mutate("maxTimeoutSeconds", json!(-1)),
        mutate("maxTimeoutSeconds", json!(1.5)),
        mutate("maxTimeoutSeconds", json!("300")),
        mutate("extra", json!("USD Coin")),
        mutate("network", json!("eip155:0")),
        mutate("network", json!("")),
        remove("payTo"),
        remove("network"),
        remove("scheme"),
        json!("not an object"),
        json!(null),
    ];
    for entry in bad {
        let err = v2_with_entries(json!([entry.clone()])).unwrap_err();
        assert!(matches!(err, WireError::NoValidRequirement(_)), "{entry}: {err}");
    }
    // All-lowercase and all-uppercase addresses carry no checksum and are fine.
    let lower = mutate("asset", json!("0x5fbdb2315678afecb367f032d93f642f64180aa3"));
    assert!(v2_with_entries(json!([lower])).is_ok());
}

#[test]
fn unparseable_entries_are_skipped_when_others_parse() {
    let pr = v2_with_entries(json!([v2_entry("-5"), v2_entry("7")])).unwrap();
    assert_eq!(pr.accepts.len(), 1);
    assert_eq!(pr.accepts[0].index(), 1);
    assert_eq!(pr.skipped.len(), 1);
    assert_eq!(pr.skipped[0].index, 0);
    assert_eq!(pr.skipped[0].error, EntryError::BadAmount("amount"));
    assert!(!pr.skipped[0].error.is_unsupported());
    assert_eq!(pr.raw_accepts.len(), 2);
}

#[test]
fn non_evm_and_unknown_scheme_entries_are_unsupported_not_broken() {
    let solana = json!({"scheme": "exact", "network": "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
        "amount": "10000", "asset": "EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v",
        "payTo": "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin", "maxTimeoutSeconds": 60});
    let pr = v2_with_entries(json!([solana])).unwrap();
    assert!(pr.accepts.is_empty());
    assert!(pr.skipped[0].error.is_unsupported());

    let odd_scheme = json!({"scheme": "streaming", "network": "eip155:84532", "rate": "1/s"});
    let pr = v2_with_entries(json!([odd_scheme])).unwrap();
    assert_eq!(pr.skipped[0].error, EntryError::UnsupportedScheme("streaming".into()));

    // A well-formed non-exact EVM entry parses; selection refuses it later.
    let mut upto = v2_entry("5");
    upto["scheme"] = json!("upto");
    assert_eq!(v2_with_entries(json!([upto])).unwrap().accepts[0].scheme(), "upto");

    // A v1 name outside the EVM table (solana-devnet) is unsupported, not malformed.
    let v1 = json!({"x402Version": 1, "accepts": [{"scheme": "exact", "network": "solana-devnet",
        "maxAmountRequired": "1", "asset": "x", "payTo": "y", "maxTimeoutSeconds": 60}]});
    assert!(v1_402(&v1.to_string()).unwrap().accepts.is_empty());
}

#[test]
fn v2_in_the_body_is_accepted_when_no_header() {
    let pr = v1_402(V2_REQUIRED).unwrap();
    assert_eq!(pr.version, X402Version::V2);
    assert_eq!(pr.accepts.len(), 1);
}

#[test]
fn payment_identifier_absent_or_prefilled() {
    assert_eq!(payment_extensions(None, "pay_0123456789abcdef").unwrap(), None);
    assert_eq!(payment_extensions(Some(&json!({})), "pay_0123456789abcdef").unwrap(), None);
    // Not declared: other extensions are echoed untouched, no id is invented, any id is fine.
    let other = json!({"bazaar": {"info": {}, "schema": {}}});
    assert_eq!(payment_extensions(Some(&other), "x").unwrap(), Some(other));
    // Declared without `info`: it is created. With an `id` already there: kept.
    let bare = json!({"payment-identifier": {"schema": {}}});
    let ext = payment_extensions(Some(&bare), "pay_0123456789abcdef").unwrap().unwrap();
    assert_eq!(ext["payment-identifier"]["info"]["id"], "pay_0123456789abcdef");
    let prefilled = json!({"payment-identifier": {"info": {"id": "server-chosen-id-123"}}});
    let ext = payment_extensions(Some(&prefilled), "pay_0123456789abcdef").unwrap().unwrap();
    assert_eq!(ext["payment-identifier"]["info"]["id"], "server-chosen-id-123");

    let pr = v2_402(V2_REQUIRED).unwrap();
    assert!(!pr.advertises_payment_identifier());
    assert!(!pr.requires_payment_identifier());
}

#[test]
fn parses_the_captured_settlement_headers() {
    let v2 = parse_settlement(&headers(&[("PAYMENT-RESPONSE", V2_SETTLEMENT)])).unwrap().unwrap();
    assert!(v2.success);
    assert_eq!(v2.tx_hash.unwrap().to_string(), "0xe686de9143674dbea9dbc997017fec64f3d7de0767f4c6b37ca3f23170ed9515");
    assert_eq!(v2.network.as_deref(), Some("eip155:84532"));
    assert_eq!(v2.parsed_network(), Some(Network::BASE_SEPOLIA));
    assert_eq!(v2.payer, Some(address!("0x70997970C51812dc3A010C7d01b50e0d17dc79C8")));
    assert_eq!(v2.error_reason, None);

    let v1 = parse_settlement(&headers(&[("X-PAYMENT-RESPONSE", V1_SETTLEMENT)])).unwrap().unwrap();
    assert!(v1.success);
    assert_eq!(v1.network.as_deref(), Some("base-sepolia"));
    assert_eq!(v1.parsed_network(), Some(Network::BASE_SEPOLIA));
    assert!(v1.tx_hash.is_some());
}

#[test]
fn settlement_is_tolerant_of_missing_fields_but_not_of_garbage() {
    assert_eq!(parse_settlement(&HeaderMap::new()).unwrap(), None);
    let failed = b64(
        r#"{"success":false,"errorReason":"invalid_exact_evm_nonce_already_used","transaction":"","network":"eip155:84532"}"#,
    );
    let s = parse_settlement(&headers(&[("payment-response", &failed)])).unwrap().unwrap();
    assert!(!s.success);
    assert_eq!(s.transaction, None);
    assert_eq!(s.tx_hash, None);
    assert_eq!(s.error_reason.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

    let sparse = b64(r#"{"transaction":"5xSolanaSignature","payer":"not-an-address"}"#);
    let s = parse_settlement(&headers(&[("payment-response", &sparse)])).unwrap().unwrap();
    assert!(!s.success, "missing success is not a success");
    assert_eq!(s.transaction.as_deref(), Some("5xSolanaSignature"));
    assert_eq!(s.tx_hash, None);
    assert_eq!(s.payer, None);

    for bad in ["%%%", &b64("nope"), &b64("[true]")] {
        assert!(parse_settlement(&headers(&[("payment-response", bad)])).is_err(), "{bad}");
    }
}

#[test]
fn refusal_reasons_are_passed_through() {
    // v2: the new PAYMENT-REQUIRED carries the facilitator's reason.
    let refused = V2_REQUIRED.replace("Payment required", "invalid_exact_evm_nonce_already_used");
    let r = refusal_reasons(&headers(&[("payment-required", &b64(&refused))]), b"{}");
    assert_eq!(r.error.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

    // v1: the body.
    let body = r#"{"x402Version":1,"error":"invalid_exact_evm_nonce_already_used","accepts":[],"payer":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}"#;
    let r = refusal_reasons(&HeaderMap::new(), body.as_bytes());
    assert_eq!(r.error.as_deref(), Some("invalid_exact_evm_nonce_already_used"));

    // Forwarded facilitator fields, and the settlement header's errorReason.
    let body = r#"{"invalidReason":"invalid_exact_evm_signature"}"#;
    let settle = b64(r#"{"success":false,"errorReason":"invalid_exact_evm_insufficient_balance"}"#);
    let r = refusal_reasons(&headers(&[("payment-response", &settle)]), body.as_bytes());
    assert_eq!(r.invalid_reason.as_deref(), Some("invalid_exact_evm_signature"));
    assert_eq!(r.error_reason.as_deref(), Some("invalid_exact_evm_insufficient_balance"));
    assert_eq!(
        serde_json::to_value(&r).unwrap(),
        json!({"invalidReason": "invalid_exact_evm_signature",
               "errorReason": "invalid_exact_evm_insufficient_balance"})
    );

    // Garbage everywhere: no reasons, no panic. Huge reasons are bounded.
    let r = refusal_reasons(&headers(&[("payment-required", "%%%")]), b"\xff\xfe");
    assert!(r.is_empty());
    let long = json!({"error": "é".repeat(10_000)}).to_string();
    let r = refusal_reasons(&HeaderMap::new(), long.as_bytes());
    assert!(r.error.unwrap().len() <= MAX_REASON_BYTES);
}

#[test]
fn version_numbers_and_header_names() {
    assert_eq!(X402Version::V1.payment_header(), "x-payment");
    assert_eq!(X402Version::V2.settlement_header(), "payment-response");
    assert_eq!(serde_json::to_value(X402Version::V2).unwrap(), json!(2));
    assert_eq!(X402Version::from_number(3), None);
}

#[test]
fn settlement_pending_and_the_permit2_412_are_recognised() {
    // As the official middleware sends it after a failed receipt wait (PROTOCOL.md).
    let pending = b64(
        r#"{"success":false,"errorReason":"settlement_pending","transaction":"0xe686de9143674dbea9dbc997017fec64f3d7de0767f4c6b37ca3f23170ed9515","payer":"0x70997970C51812dc3A010C7d01b50e0d17dc79C8","network":"eip155:84532"}"#,
    );
    let s = parse_settlement(&headers(&[("PAYMENT-RESPONSE", &pending)])).unwrap().unwrap();
    assert!(s.is_pending());
    assert!(s.tx_hash.is_some());
    let ok = parse_settlement(&headers(&[("PAYMENT-RESPONSE", V2_SETTLEMENT)])).unwrap().unwrap();
    assert!(!ok.is_pending());
    // A "success" that also says pending is a success, not a pending claim.
    let odd = b64(r#"{"success":true,"errorReason":"settlement_pending"}"#);
    assert!(!parse_settlement(&headers(&[("PAYMENT-RESPONSE", &odd)])).unwrap().unwrap().is_pending());

    let required = V2_REQUIRED.replace("Payment required", PERMIT2_ALLOWANCE_REQUIRED);
    let r = refusal_reasons(&headers(&[("payment-required", &b64(&required))]), b"{}");
    assert!(r.names(PERMIT2_ALLOWANCE_REQUIRED));
    assert!(!r.names("permit2"), "whole reasons only");
    assert!(!RefusalReasons::default().names(PERMIT2_ALLOWANCE_REQUIRED));
}

#[test]
fn a_price_given_as_a_json_number_refuses_the_whole_402() {
    // Whatever parsed it, a JSON number may have been rounded: 123456789012345678901234567890
    // and 1e30 both become doubles. Even one such entry beside a good one refuses the 402.
    for amount in [json!(10000), json!(1e30), serde_json::from_str::<Value>("123456789012345678901234567890").unwrap()]
    {
        let mut bad = v2_entry("1");
        bad["amount"] = amount.clone();
        let err = v2_with_entries(json!([v2_entry("7"), bad])).unwrap_err();
        assert!(matches!(err, WireError::InexactAmount { index: 1, field: "amount" }), "{amount}: {err}");
    }
    // A decimal string is exact, however large (within 2^256).
    let pr = v2_with_entries(json!([v2_entry("123456789012345678901234567890")])).unwrap();
    assert_eq!(pr.accepts[0].amount().to_string(), "123456789012345678901234567890");
    // Exponents and fractions in a string are not decimal integers: that entry is refused.
    for amount in ["1e30", "1.0", "0x10", " 1"] {
        let err = v2_with_entries(json!([v2_entry(amount)])).unwrap_err();
        assert!(matches!(err, WireError::NoValidRequirement(_)), "{amount}: {err}");
    }
}
