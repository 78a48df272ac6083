//! Properties (RELIABILITY.md, "Properties"): the request hash against the bytes that are sent
//! upstream, the canonical form against an independent RFC 8785 implementation, and the SSRF
//! guard against the IANA special-purpose address registries and a rebinding DNS server.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ipnet::IpNet;
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::Value;
use x402_router::config::UpstreamConfig;
use x402_router::idempotency::canonical::parse_strict;
use x402_router::relay::request::RouteCall;
use x402_router::upstream::{Guard, GuardError, UpstreamClient, UpstreamError, UpstreamRequest};

use crate::helpers::TestUpstream;

fn config(cases: u32) -> Config {
    // Failures are turned into named regression tests by hand, not kept in files.
    Config { cases, failure_persistence: None, ..Config::default() }
}

// ---------------------------------------------------------------------------------------------
// A JSON document that can be written in many spellings of the same value.

#[derive(Debug, Clone)]
enum Doc {
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Arr(Vec<Doc>),
    /// Keys are distinct.
    Obj(Vec<(String, Doc)>),
}

/// Keys that sort differently by UTF-8 bytes and by UTF-16 code units (RFC 8785 §3.2.3),
/// plus escapes and the empty key.
const KEYS: &[&str] = &["a", "b", "1", "", "\r", "é", "€", "\u{fb33}", "😀", "a\"b", "\u{7f}", "\u{2028}"];

fn number() -> impl Strategy<Value = Doc> {
    prop_oneof![
        (-1000i64..1000).prop_map(Doc::Int),
        (-(1i64 << 53)..=(1i64 << 53)).prop_map(Doc::Int),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Doc::Float),
        (-100_000i64..100_000, 0u32..8).prop_map(|(m, d)| Doc::Float(m as f64 / 10f64.powi(d as i32))),
        prop::sample::select(vec![0.0, -0.0, 1e21, 1e-7, 1e-6, 5e-324, f64::MAX, f64::MIN_POSITIVE, 123e20])
            .prop_map(Doc::Float),
    ]
}

fn doc() -> impl Strategy<Value = Doc> {
    let leaf = prop_oneof![
        Just(Doc::Null),
        any::<bool>().prop_map(Doc::Bool),
        number(),
        any::<String>().prop_map(Doc::Str),
        prop::sample::select(KEYS).prop_map(|s| Doc::Str(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Doc::Arr),
            prop::collection::btree_map(
                prop_oneof![prop::sample::select(KEYS).prop_map(str::to_owned), "[a-z]{0,3}"],
                inner,
                0..6
            )
            .prop_map(|m| Doc::Obj(m.into_iter().collect())),
        ]
    })
}

/// A deterministic source of spelling choices.
struct Style(u64);

impl Style {
    fn pick(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    fn space(&mut self) -> &'static str {
        ["", "", " ", "\n", "\t", "\r\n  "][self.pick(6)]
    }
}

/// `d` as JSON text, with key order, whitespace, string escapes and number spellings chosen
/// by `style`.
fn write(d: &Doc, style: &mut Style, out: &mut String) {
    match d {
        Doc::Null => out.push_str("null"),
        Doc::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Doc::Int(i) => out.push_str(&spell_int(*i, style)),
        Doc::Float(f) => out.push_str(&spell_float(*f, style)),
        Doc::Str(s) => write_str(s, style, out),
        Doc::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(style.space());
                write(item, style, out);
                out.push_str(style.space());
            }
            out.push(']');
        }
        Doc::Obj(members) => {
            let mut order: Vec<usize> = (0..members.len()).collect();
            for i in (1..order.len()).rev() {
                let j = style.pick(i + 1);
                order.swap(i, j);
            }
            out.push('{');
            for (n, &i) in order.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                out.push_str(style.space());
                write_str(&members[i].0, style, out);
                out.push_str(style.space());
                out.push(':');
                out.push_str(style.space());
                write(&members[i].1, style, out);
            }
            out.push_str(style.space());
            out.push('}');
        }
    }
}

fn write_str(s: &str, style: &mut Style, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        let must_escape = c == '"' || c == '\\' || c < ' ';
        if must_escape || style.pick(8) == 0 {
            match (c, style.pick(2)) {
                ('"', 0) => out.push_str("\\\""),
                ('\\', 0) => out.push_str("\\\\"),
                ('\n', 0) => out.push_str("\\n"),
                ('/', 0) => out.push_str("\\/"),
                _ => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        out.push_str(&if style.pick(2) == 0 { format!("\\u{u:04x}") } else { format!("\\u{u:04X}") });
                    }
                }
            }
        } else {
            out.push(c);
        }
    }
    out.push('"');
}

fn spell_int(i: i64, style: &mut Style) -> String {
    match style.pick(4) {
        0 => format!("{i}.0"),
        1 => format!("{i}e0"),
        2 if i != 0 && i % 10 == 0 => format!("{}E+1", i / 10),
        _ => i.to_string(),
    }
}

/// Spellings of one double, every one of which `parse_strict` accepts.
fn spell_float(f: f64, style: &mut Style) -> String {
    if f == 0.0 {
        return ["0", "-0", "0.0", "-0.0", "0e7", "0E-3"][style.pick(6)].to_owned();
    }
    // The digits JCS writes (ECMAScript's shortest round trip: in a rounding tie it may differ
    // from Rust's `{:e}`, and the router accepts only a spelling of JCS's value), as `d.ddde±x`.
    let jcs = serde_jcs::to_string(&f).unwrap();
    let sci = scientific(&jcs);
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    match style.pick(5) {
        0 => format!("{mantissa}e{exp}"),
        1 => format!("{mantissa}{}E{exp:+}", if mantissa.contains('.') { "000" } else { ".0" }),
        2 => {
            // Move the point one digit right: 1.5e2 → 15e1.
            let (neg, digits) = mantissa.strip_prefix('-').map_or((false, mantissa), |m| (true, m));
            let digits: String = digits.chars().filter(|c| *c != '.').collect();
            let point = exp - (digits.len() as i32 - 1);
            format!("{}{digits}e{point}", if neg { "-" } else { "" })
        }
        3 => jcs,
        _ => sci,
    }
}

/// A JCS number literal as `[-]d[.ddd]e<exp>` with the same digits.
fn scientific(literal: &str) -> String {
    let (sign, rest) = literal.strip_prefix('-').map_or(("", literal), |r| ("-", r));
    let (mantissa, exp) = rest.split_once(['e', 'E']).map_or((rest, 0), |(m, e)| (m, e.parse::<i32>().unwrap()));
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int_part}{frac_part}");
    let leading = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_start_matches('0').trim_end_matches('0');
    let exp = exp + int_part.len() as i32 - 1 - leading as i32;
    let mantissa = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits.to_owned() };
    format!("{sign}{mantissa}e{exp}")
}

fn text(d: &Doc, seed: u64) -> String {
    let mut out = String::new();
    write(d, &mut Style(seed), &mut out);
    out
}

/// A `/route` body sending `body` with the given method, URL and headers (members in an
/// order and with whitespace chosen by `seed`).
fn route_body(method: &str, url: &str, headers: &[(&str, &str)], body: &str, seed: u64) -> String {
    let mut style = Style(seed ^ 0x5eed);
    let headers: Vec<String> = headers.iter().map(|(n, v)| format!("{n:?}:{v:?}")).collect();
    let mut members = [
        format!("\"url\":{url:?}"),
        format!("\"method\"{}:{method:?}", style.space()),
        format!("\"headers\":{{{}}}", headers.join(",")),
        format!("\"body\":{}{body}", style.space()),
        "\"max_amount\":\"10\"".to_owned(),
    ];
    for i in (1..members.len()).rev() {
        let j = style.pick(i + 1);
        members.swap(i, j);
    }
    format!("{}{{{}}}", style.space(), members.join(&format!(",{}", style.space())))
}

fn parse(body: &str) -> RouteCall {
    RouteCall::parse(body.as_bytes(), "/route", "").unwrap_or_else(|e| panic!("{body}: {e}"))
}

proptest! {
    #![proptest_config(config(2000))]

    /// Key order, whitespace, string escapes and the spelling of numbers never change the
    /// hash, nor what is sent upstream.
    #[test]
    fn hash_is_equal_for_semantically_equal_requests(d in doc(), s1 in any::<u64>(), s2 in any::<u64>()) {
        let a = parse(&route_body("POST", "https://api.example.com/x", &[("accept", "a/b")], &text(&d, s1), s1));
        let b = parse(&route_body("POST", "https://api.example.com/x", &[("accept", "a/b")], &text(&d, s2), s2));
        prop_assert_eq!(&a.request_hash, &b.request_hash);
        prop_assert_eq!(&a.upstream.body, &b.upstream.body);
    }

    /// Over a small domain where collisions are common: two requests have the same hash
    /// exactly when the router sends the same request upstream (method, URL, headers and body
    /// bytes).
    #[test]
    fn hash_differs_whenever_the_bytes_sent_upstream_differ(
        a in small_request(), b in small_request(), s1 in any::<u64>(), s2 in any::<u64>(),
    ) {
        let ca = parse(&route_body(a.0, a.1, a.2, &text(&a.3, s1), s1));
        let cb = parse(&route_body(b.0, b.1, b.2, &text(&b.3, s2), s2));
        let same_bytes = ca.upstream.method == cb.upstream.method
            && ca.upstream.url == cb.upstream.url
            && ca.upstream.headers == cb.upstream.headers
            && ca.upstream.body == cb.upstream.body;
        prop_assert_eq!(ca.request_hash == cb.request_hash, same_bytes, "{:?} / {:?}", ca.upstream, cb.upstream);
    }

    /// serde_jcs (the router's canonicaliser) agrees with serde_json_canonicalizer, an
    /// independent RFC 8785 implementation, on everything `parse_strict` accepts; and with
    /// the ECMAScript number rules written out below (the two libraries share ryu-js).
    #[test]
    fn canonical_form_matches_an_independent_rfc8785_implementation(d in doc(), seed in any::<u64>()) {
        let v = parse_strict(text(&d, seed).as_bytes()).unwrap();
        let ours = serde_jcs::to_string(&v).unwrap();
        prop_assert_eq!(&ours, &serde_json_canonicalizer::to_string(&v).unwrap());
        let again = serde_jcs::to_string(&parse_strict(ours.as_bytes()).unwrap()).unwrap();
        prop_assert_eq!(&again, &ours, "canonicalisation is idempotent");
        check_numbers(&v)?;
    }
}

fn check_numbers(v: &Value) -> Result<(), TestCaseError> {
    match v {
        Value::Number(n) => {
            let f = n.as_f64().unwrap();
            prop_assert_eq!(serde_jcs::to_string(v).unwrap(), es6_number(f), "{}", n);
        }
        Value::Array(items) => items.iter().try_for_each(check_numbers)?,
        Value::Object(m) => m.values().try_for_each(check_numbers)?,
        _ => {}
    }
    Ok(())
}

/// ECMAScript `Number::toString(x)` (ECMA-262 §6.1.6.1.20, the number form of RFC 8785
/// §3.2.2.3), written from the spec over Rust's own shortest round-trip digits.
fn es6_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap();
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let n = exp.parse::<i32>().unwrap() + 1;
    let digits = nearest_of_shortest(x.abs(), digits, n);
    let k = digits.len() as i32;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let e = if e >= 0 { format!("+{e}") } else { e.to_string() };
        if k == 1 { format!("{digits}e{e}") } else { format!("{}.{}e{e}", &digits[..1], &digits[1..]) }
    };
    format!("{sign}{body}")
}

/// Among the shortest digit strings that read back as `x` (`digits`, at decimal exponent `n`),
/// the one closest to `x`'s exact value, the even one on a tie (ECMAScript's Number::toString,
/// as V8 does it): Rust's shortest form may pick the other neighbour when `x` lies exactly
/// half-way (e.g. -1267482917736552.25 is "…552.2" in JavaScript).
fn nearest_of_shortest(x: f64, digits: String, n: i32) -> String {
    let k = digits.len();
    // The exact decimal expansion of `x` (an f64 has fewer than 800 significant digits).
    let exact = format!("{x:.800e}");
    let (mantissa, exp) = exact.split_once('e').unwrap();
    if exp.parse::<i32>().unwrap() + 1 != n {
        return digits; // the shortest form rounded up to the next power of ten
    }
    let all: String = mantissa.chars().filter(|c| *c != '.').collect();
    let (head, rest) = all.split_at(k);
    let rest = rest.trim_end_matches('0');
    let floor: u128 = head.parse().unwrap();
    let pick = match rest {
        "" => floor,
        "5" => floor + floor % 2,
        r if r.as_bytes()[0] >= b'5' => floor + 1,
        _ => floor,
    };
    let candidate = pick.to_string();
    let reads_back = format!("{candidate}e{}", n - k as i32).parse::<f64>().is_ok_and(|b| b == x);
    if candidate.len() == k && !candidate.ends_with('0') && reads_back { candidate } else { digits }
}

#[test]
fn es6_number_breaks_a_tie_towards_the_even_digit() {
    // -1267482917736552.25 is exactly half-way between …552.2 and …552.3 (what node prints).
    let x: f64 = "-1267482917736552.25".parse().unwrap();
    assert_eq!(es6_number(x), "-1267482917736552.2");
    assert_eq!(serde_jcs::to_string(&serde_json::json!(x)).unwrap(), "-1267482917736552.2");
}

type SmallRequest = (&'static str, &'static str, &'static [(&'static str, &'static str)], Doc);

fn small_request() -> impl Strategy<Value = SmallRequest> {
    let body = prop_oneof![
        Just(Doc::Int(1)),
        Just(Doc::Float(1.0)),
        Just(Doc::Int(100)),
        Just(Doc::Float(-0.0)),
        Just(Doc::Int(0)),
        Just(Doc::Float(0.5)),
        Just(Doc::Str("1".into())),
        Just(Doc::Bool(true)),
        Just(Doc::Arr(vec![Doc::Int(1), Doc::Float(2.5)])),
        Just(Doc::Obj(vec![("a".into(), Doc::Int(1)), ("😀".into(), Doc::Null), ("\u{fb33}".into(), Doc::Int(2))])),
        Just(Doc::Obj(vec![("a".into(), Doc::Float(1e21))])),
    ];
    (
        prop::sample::select(vec!["POST", "PUT"]),
        prop::sample::select(vec!["https://api.example.com/x", "https://api.example.com/y"]),
        prop::sample::select(vec![&[][..], &[("accept", "a/b")][..]]),
        body,
    )
}

#[test]
fn es6_number_follows_the_rfc_8785_examples() {
    // RFC 8785 Appendix B (a selection).
    for (bits, expected) in [
        (0x0000_0000_0000_0000_u64, "0"),
        (0x8000_0000_0000_0000, "0"),
        (0x0000_0000_0000_0001, "5e-324"),
        (0x8000_0000_0000_0001, "-5e-324"),
        (0x7fef_ffff_ffff_ffff, "1.7976931348623157e+308"),
        (0x4340_0000_0000_0000, "9007199254740992"),
        (0x4430_0000_0000_0000, "295147905179352830000"),
        (0x44b5_2d02_c7e1_4af6, "1e+23"),
        (0x3eb0_c6f7_a0b5_ed8d, "0.000001"),
        (0x3eb0_c6f7_a0b5_ed8c, "9.999999999999997e-7"),
        (0x41b3_de43_5555_5553, "333333333.3333332"),
    ] {
        let f = f64::from_bits(bits);
        assert_eq!(es6_number(f), expected, "{bits:#x}");
        assert_eq!(serde_jcs::to_string(&serde_json::Number::from_f64(f).unwrap()).unwrap(), expected, "{bits:#x}");
    }
}

// ---------------------------------------------------------------------------------------------
// The SSRF guard.

struct Block {
    net: IpNet,
    /// "Globally Reachable": `true`, `false` or `n/a`.
    reachable: &'static str,
    name: String,
}

/// tests/fixtures/iana-special-purpose.txt (transcribed by hand from the two registries).
fn iana_registry() -> Vec<Block> {
    include_str!("../fixtures/iana-special-purpose.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut cols = l.split_whitespace();
            let net = cols.next().unwrap().parse().unwrap_or_else(|e| panic!("{l}: {e}"));
            let reachable = cols.next().unwrap();
            assert!(["true", "false", "n/a"].contains(&reachable), "{l}");
            Block { net, reachable, name: cols.collect::<Vec<_>>().join(" ") }
        })
        .collect()
}

fn nth_address(net: IpNet, n: u128) -> IpAddr {
    match net {
        IpNet::V4(v4) => {
            let host_bits = 32 - u32::from(v4.prefix_len());
            let mask = if host_bits == 32 { u32::MAX } else { (1u32 << host_bits) - 1 };
            IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()) | (n as u32 & mask)))
        }
        IpNet::V6(v6) => {
            let host_bits = 128 - u32::from(v6.prefix_len());
            let mask = if host_bits == 128 { u128::MAX } else { (1u128 << host_bits) - 1 };
            IpAddr::V6(Ipv6Addr::from(u128::from(v6.network()) | (n & mask)))
        }
    }
}

fn strict() -> Guard {
    Guard::new(false, vec![])
}

#[test]
fn the_registry_table_has_both_registries() {
    let table = iana_registry();
    assert_eq!(table.iter().filter(|b| b.net.addr().is_ipv4()).count(), 25);
    assert_eq!(table.iter().filter(|b| b.net.addr().is_ipv6()).count(), 25);
}

#[test]
fn every_block_that_is_not_globally_reachable_is_refused_at_its_edges() {
    for b in iana_registry().iter().filter(|b| b.reachable != "true") {
        for ip in [b.net.network(), b.net.broadcast(), nth_address(b.net, 1)] {
            assert!(strict().check_ip(ip).is_err(), "{ip} ({}, {}) passes the guard", b.net, b.name);
            if let IpAddr::V4(v4) = ip {
                let mapped = IpAddr::V6(v4.to_ipv6_mapped());
                assert!(strict().check_ip(mapped).is_err(), "{mapped} ({}) passes the guard", b.name);
            }
        }
    }
}

proptest! {
    #![proptest_config(config(5000))]

    /// Any address inside a block that is not globally reachable is refused (IPv4 also in
    /// its IPv4-mapped and IPv4-compatible IPv6 spellings).
    #[test]
    fn any_address_in_a_special_purpose_block_is_refused(i in any::<prop::sample::Index>(), n in any::<u128>()) {
        let forbidden: Vec<Block> = iana_registry().into_iter().filter(|b| b.reachable != "true").collect();
        let b = &forbidden[i.index(forbidden.len())];
        let ip = nth_address(b.net, n);
        prop_assert!(strict().check_ip(ip).is_err(), "{} ({}, {}) passes the guard", ip, b.net, b.name);
        if let IpAddr::V4(v4) = ip {
            prop_assert!(strict().check_ip(IpAddr::V6(v4.to_ipv6_mapped())).is_err());
            prop_assert!(strict().check_ip(IpAddr::V6(v4.to_ipv6_compatible())).is_err());
        }
    }

    /// Outside every special-purpose block (and outside multicast), an IPv4 unicast address
    /// passes; so does an IPv6 address of the global unicast space 2000::/3.
    #[test]
    fn ordinary_public_addresses_pass(v4 in any::<u32>(), v6 in any::<u128>()) {
        let table = iana_registry();
        let special = |ip: IpAddr| table.iter().any(|b| b.net.contains(&ip));
        let v4 = IpAddr::V4(Ipv4Addr::from(v4));
        if !special(v4) && !v4.is_multicast() {
            prop_assert!(strict().check_ip(v4).is_ok(), "{} is refused", v4);
        }
        let v6 = IpAddr::V6(Ipv6Addr::from((v6 >> 3) | (1u128 << 125)));
        if !special(v6) {
            prop_assert!(strict().check_ip(v6).is_ok(), "{} is refused", v6);
        }
    }
}

fn upstream_config() -> UpstreamConfig {
    UpstreamConfig {
        allow_private: false,
        allow_cidrs: vec![],
        connect_timeout: Duration::from_secs(2),
        timeout: Duration::from_secs(5),
        max_response_bytes: 1 << 20,
    }
}

/// A DNS server that answers `first` to the first lookup and `then` to every later one.
fn rebinding_lookup(
    first: Vec<IpAddr>,
    then: Vec<IpAddr>,
    lookups: Arc<AtomicUsize>,
) -> x402_router::upstream::guard::Lookup {
    Arc::new(move |_host: String, port: u16| {
        let answer = if lookups.fetch_add(1, Ordering::SeqCst) == 0 { &first } else { &then };
        let addrs: Vec<SocketAddr> = answer.iter().map(|ip| SocketAddr::new(*ip, port)).collect();
        Box::pin(async move { Ok(addrs) })
    })
}

fn get(url: &str) -> UpstreamRequest {
    UpstreamRequest::http(reqwest::Method::GET, url.parse().unwrap(), reqwest::header::HeaderMap::new(), None)
}

#[actix_web::test]
async fn a_name_that_rebinds_to_a_private_address_at_connect_time_is_never_connected_to() {
    // Arrange: a real upstream on loopback, and a name whose first answer is public.
    let up = TestUpstream::start().await;
    let loopback: IpAddr = Ipv4Addr::LOCALHOST.into();
    for later in [vec![loopback], vec!["93.184.215.14".parse().unwrap(), loopback]] {
        let lookups = Arc::new(AtomicUsize::new(0));
        let guard = strict().with_lookup(rebinding_lookup(
            vec!["93.184.215.14".parse().unwrap()],
            later.clone(),
            Arc::clone(&lookups),
        ));
        let client = UpstreamClient::with_guard(&upstream_config(), guard).unwrap();
        let url = format!("http://rebinding.test:{}/secret", up.port);

        // Act: the pre-flight check sees the public answer; the connection asks again.
        let preflight = client.guard().check(&url.parse().unwrap()).await;
        let sent = client.send(&get(&url), &[], Duration::from_secs(5)).await;

        // Assert
        assert!(preflight.is_ok(), "{preflight:?}");
        assert!(
            matches!(sent, Err(UpstreamError::Blocked(GuardError::Forbidden(ip))) if ip == loopback),
            "{later:?}: {sent:?}"
        );
        assert_eq!(lookups.load(Ordering::SeqCst), 2, "the connection resolved the name itself");
        assert_eq!(up.hits.total(), 0, "nothing reached the private address");
    }
}

#[actix_web::test]
async fn the_connection_goes_to_the_address_the_guard_checked() {
    // The control for the test above: the same lookup, with loopback allowed by the operator,
    // reaches the real upstream, so the refusal there is the guard's, not a failed connection.
    let up = TestUpstream::start().await;
    let loopback: IpAddr = Ipv4Addr::LOCALHOST.into();
    let lookups = Arc::new(AtomicUsize::new(0));
    let guard = Guard::new(false, vec!["127.0.0.1/32".parse().unwrap()]).with_lookup(rebinding_lookup(
        vec![loopback],
        vec![loopback],
        Arc::clone(&lookups),
    ));
    let client = UpstreamClient::with_guard(&upstream_config(), guard).unwrap();

    let resp = client.send(&get(&format!("http://rebinding.test:{}/ok", up.port)), &[], Duration::from_secs(5)).await;

    assert_eq!(resp.unwrap().status, 200);
    assert_eq!(up.hits.get("/ok"), 1);
}
