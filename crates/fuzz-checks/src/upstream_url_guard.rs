//! The SSRF guard's judgement of upstream URLs and addresses.
//!
//! First byte: 0 ⇒ the next 4 bytes are an IPv4 address, 1 ⇒ the next 16 an IPv6 address,
//! otherwise the rest is a URL (odd: as the `url` of a `/route` body; even: for the URL
//! parser directly). Promises checked: no address of a block that the IANA
//! special-purpose registries do not call globally reachable passes (nor its IPv4-mapped,
//! IPv4-compatible or NAT64 spellings); an IP-literal URL gets the same answer as its
//! address; schemes other than http(s) never pass; an operator's allowances apply.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::LazyLock;

use crate::iana_forbidden;
use ipnet::IpNet;
use url::{Host, Url};
use x402_router::relay::request::RouteCall;
use x402_router::upstream::Guard;

static FORBIDDEN: LazyLock<Vec<IpNet>> = LazyLock::new(iana_forbidden);

fn forbidden(ip: IpAddr) -> bool {
    FORBIDDEN.iter().any(|n| n.contains(&ip))
}

fn check_address(guard: &Guard, ip: IpAddr) {
    let ok = guard.check_ip(ip).is_ok();
    if forbidden(ip) {
        assert!(!ok, "{ip} is in a special-purpose block that is not globally reachable");
    }
    if let IpAddr::V4(v4) = ip {
        // Spellings of an IPv4 address in IPv6 are judged as the IPv4 address (or refused).
        let mapped = IpAddr::V6(v4.to_ipv6_mapped());
        let nat64 = IpAddr::V6(Ipv6Addr::from((0x0064_ff9b_u128 << 96) | u128::from(u32::from(v4))));
        if !ok {
            assert!(guard.check_ip(mapped).is_err(), "{mapped} passes but {ip} does not");
            assert!(guard.check_ip(nat64).is_err(), "{nat64} passes but {ip} does not");
        }
    }
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let url = Url::parse(&format!("http://{host}/")).expect("an address is a valid host");
    assert_eq!(guard.check_url(&url).is_ok(), ok, "{url} and {ip} are judged alike");
    assert!(Guard::new(true, vec![]).check_ip(ip).is_ok(), "allow_private allows everything");
    let embeds_v4 = matches!(ip, IpAddr::V6(v6) if v6.to_ipv4().is_some());
    if !embeds_v4 {
        let exact = IpNet::from(ip);
        assert!(Guard::new(false, vec![exact]).check_ip(ip).is_ok(), "an allowed CIDR is allowed");
    }
}

/// One input: the promises above hold, or the check panics.
pub fn check(data: &[u8]) {
    let guard = Guard::new(false, vec![]);
    match data {
        [0, a, b, c, d, ..] => check_address(&guard, IpAddr::V4(Ipv4Addr::new(*a, *b, *c, *d))),
        [1, rest @ ..] if rest.len() >= 16 => {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&rest[..16]);
            check_address(&guard, IpAddr::V6(Ipv6Addr::from(octets)));
        }
        [mode, rest @ ..] => {
            let Ok(text) = std::str::from_utf8(rest) else { return };
            // Odd: the URL as an agent sends it (through the /route body parser, which bounds
            // the host before the URL parser sees it); even: the URL parser alone, limited to
            // short inputs (its IDNA step is slow on long hosts, see RELIABILITY.md).
            let url = if mode % 2 == 1 {
                let body = serde_json::json!({ "url": text }).to_string();
                let Ok(call) = RouteCall::parse(body.as_bytes(), "/route", "") else { return };
                call.upstream.url
            } else {
                if text.len() > 320 {
                    return;
                }
                let Ok(url) = Url::parse(text) else { return };
                url
            };
            let ok = guard.check_url(&url).is_ok();
            if !matches!(url.scheme(), "http" | "https") {
                assert!(!ok, "{url}: only http and https");
            }
            match url.host() {
                Some(Host::Ipv4(ip)) if ok => assert!(!forbidden(IpAddr::V4(ip)), "{url} passes"),
                Some(Host::Ipv6(ip)) if ok => assert!(!forbidden(IpAddr::V6(ip)), "{url} passes"),
                None if matches!(url.scheme(), "http" | "https") => unreachable!("http URLs have a host"),
                _ => {}
            }
        }
        [] => {}
    }
}
