//! SSRF guard: which upstream addresses the router may connect to.
//!
//! Only `http`/`https`. Every address a host name resolves to must be public unless the
//! operator allows private ranges (`UPSTREAM_ALLOW_PRIVATE`, or specific CIDRs). The
//! check runs in the HTTP client's DNS resolver, so the connection goes to exactly the
//! addresses that were checked (no DNS rebinding between check and connect). IP literals
//! never reach a resolver, so [`Guard::check_url`] checks them up front; the URL parser
//! has already turned decimal (`2130706433`), octal, hex and short (`127.1`) IPv4 forms
//! into dotted quads. "Public" follows the IANA special-purpose address registries (IPv4
//! and IPv6; see `is_public_v4` and `is_public_v6`); IPv4-mapped/-compatible IPv6 forms
//! are never public, whatever IPv4 address they carry.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use ipnet::IpNet;
use url::{Host, Url};

/// Why an upstream URL or address is refused.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum GuardError {
    #[error("url scheme must be http or https")]
    Scheme,
    #[error("url has no host")]
    NoHost,
    #[error("upstream address {0} is not allowed (loopback, private, link-local or otherwise non-public)")]
    Forbidden(IpAddr),
    #[error("upstream host {0:?} did not resolve")]
    Unresolved(String),
}

/// A DNS lookup: the addresses a host name resolves to, with `port` set.
pub type Lookup =
    Arc<dyn Fn(String, u16) -> Pin<Box<dyn Future<Output = io::Result<Vec<SocketAddr>>> + Send>> + Send + Sync>;

/// The policy, built once from config.
#[derive(Clone)]
pub struct Guard {
    allow_private: bool,
    allow_cidrs: Vec<IpNet>,
    /// `None`: the system resolver (`getaddrinfo` through tokio).
    lookup: Option<Lookup>,
}

impl fmt::Debug for Guard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("allow_private", &self.allow_private)
            .field("allow_cidrs", &self.allow_cidrs)
            .field("lookup", &if self.lookup.is_some() { "custom" } else { "system" })
            .finish()
    }
}

impl Guard {
    pub fn new(allow_private: bool, allow_cidrs: Vec<IpNet>) -> Self {
        Self { allow_private, allow_cidrs, lookup: None }
    }

    /// The same policy resolving names with `lookup` instead of the system resolver: for
    /// tests that play a DNS server (e.g. one that rebinds a name between two lookups).
    pub fn with_lookup(mut self, lookup: Lookup) -> Self {
        self.lookup = Some(lookup);
        self
    }

    /// Checks scheme and, for IP-literal hosts, the address.
    ///
    /// # Errors
    /// [`GuardError`] describing the refusal.
    pub fn check_url(&self, url: &Url) -> Result<(), GuardError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(GuardError::Scheme);
        }
        match url.host() {
            None => Err(GuardError::NoHost),
            Some(Host::Ipv4(ip)) => self.check_ip(IpAddr::V4(ip)),
            Some(Host::Ipv6(ip)) => self.check_ip(IpAddr::V6(ip)),
            Some(Host::Domain(_)) => Ok(()),
        }
    }

    /// Checks one address.
    ///
    /// # Errors
    /// [`GuardError::Forbidden`] for a non-public address that is not allowed.
    pub fn check_ip(&self, ip: IpAddr) -> Result<(), GuardError> {
        // An IPv4 address written as IPv6 (mapped or compatible) is never public itself (the
        // registry: ::ffff:0:0/96 is not globally reachable), but an operator's allowance of
        // the IPv4 address covers it, and a refusal names the IPv4 address.
        let carried = canonical(ip);
        let allowed = |n: &IpNet| n.contains(&ip) || n.contains(&carried);
        if self.allow_private || is_public(ip) || self.allow_cidrs.iter().any(allowed) {
            Ok(())
        } else {
            Err(GuardError::Forbidden(carried))
        }
    }

    /// Resolves `host` and checks every address; all must pass, so a name that mixes a
    /// public and a private address is refused as a whole.
    ///
    /// # Errors
    /// [`GuardError`] when resolution fails or any address is refused.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, GuardError> {
        let addrs: Vec<SocketAddr> = match &self.lookup {
            None => tokio::net::lookup_host((host, port)).await.map(Iterator::collect),
            Some(lookup) => lookup(host.to_owned(), port).await,
        }
        .map_err(|_| GuardError::Unresolved(host.to_owned()))?;
        if addrs.is_empty() {
            return Err(GuardError::Unresolved(host.to_owned()));
        }
        for a in &addrs {
            self.check_ip(a.ip())?;
        }
        Ok(addrs)
    }

    /// Full pre-flight check of a URL, resolving its host name if it has one.
    ///
    /// # Errors
    /// [`GuardError`].
    pub async fn check(&self, url: &Url) -> Result<(), GuardError> {
        self.check_url(url)?;
        if let Some(Host::Domain(name)) = url.host() {
            let port = url.port_or_known_default().unwrap_or(80);
            self.resolve(name, port).await?;
        }
        Ok(())
    }
}

/// The IPv4 address carried by an IPv4-mapped (`::ffff:a.b.c.d`) or IPv4-compatible
/// (`::a.b.c.d`) address; any other address as it is.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return IpAddr::V4(v4);
            }
            let s = v6.segments();
            if s[..6].iter().all(|x| *x == 0) && !(s[6] == 0 && s[7] <= 1) {
                return IpAddr::V4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
            }
            IpAddr::V6(v6)
        }
        v4 => v4,
    }
}

fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

/// Public unless in a block of the IANA IPv4 special-purpose registry that is not globally
/// reachable (the registry as a table: tests/fixtures/iana-special-purpose.txt), or multicast.
fn is_public_v4(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_multicast()
        || ip.is_documentation()
        || o[0] == 0                                   // 0.0.0.0/8 "this network"
        || (o[0] == 100 && (o[1] & 0xc0) == 64)        // 100.64.0.0/10 CGNAT
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)     // 192.0.0.0/24 IETF protocol assignments
        || (o[0] == 192 && o[1] == 88 && o[2] == 99)   // 192.88.99.0/24 6to4 relay anycast (deprecated)
        || (o[0] == 198 && (o[1] & 0xfe) == 18)        // 198.18.0.0/15 benchmarking
        || o[0] >= 240) // 240.0.0.0/4 reserved
}

/// Public only inside 2000::/3, the one block IANA allocates as global unicast, and outside
/// its special-purpose blocks. Everything outside 2000::/3 is refused by that rule alone:
/// ::/8 (unspecified, loopback, IPv4-mapped/-compatible), 64:ff9b::/96 and 64:ff9b:1::/48
/// (NAT64, may reach private IPv4), 100::/64 (discard-only), 100:0:0:1::/64 (dummy),
/// 5f00::/16 (SRv6 SIDs), fc00::/7, fe80::/10, fec0::/10, ff00::/8, and unallocated space.
fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    let special = match s[0] {
        // 2001::/23 IETF protocol assignments (Teredo, benchmarking, ORCHID, AMT, …) and
        // 2001:db8::/32 documentation.
        0x2001 => s[1] < 0x0200 || s[1] == 0x0db8,
        // 2002::/16 6to4 (embeds an arbitrary IPv4 address).
        0x2002 => true,
        // 3fff::/20 documentation.
        0x3fff => s[1] < 0x1000,
        _ => false,
    };
    (s[0] & 0xe000) == 0x2000 && !special
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict() -> Guard {
        Guard::new(false, vec![])
    }

    fn url_ok(u: &str) -> bool {
        Url::parse(u).map(|u| strict().check_url(&u).is_ok()).unwrap_or(false)
    }

    #[test]
    fn refuses_non_public_literals_in_every_spelling() {
        for u in [
            "http://127.0.0.1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f000001/",
            "http://0177.0.0.1/",
            "http://0/",
            "http://10.0.0.1/",
            "http://172.16.5.4/",
            "http://192.168.1.1/",
            "http://169.254.169.254/latest",
            "http://100.64.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:7f00:1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[fd00::1]/",
            "http://[fe80::1]/",
            "http://[::]/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://[::127.0.0.1]/",
            "http://[64:ff9b::7f00:1]/",
        ] {
            assert!(!url_ok(u), "{u} should be refused");
        }
    }

    #[test]
    fn refuses_the_special_purpose_blocks_that_were_missed_before() {
        // Each is "not globally reachable" (or deprecated) in the IANA registries; the full
        // registries are checked in tests/api/properties.rs.
        for ip in [
            "192.88.99.1",      // 6to4 relay anycast (deprecated)
            "2001:2::1",        // benchmarking, inside 2001::/23 but outside Teredo
            "2001:10::1",       // ORCHID (deprecated)
            "2001:1ff::1",      // the rest of 2001::/23 (IETF protocol assignments)
            "64:ff9b:1::a00:1", // local-use IPv4/IPv6 translation
            "100::1",           // discard-only
            "100:0:0:1::1",     // dummy prefix
            "3fff::1",          // documentation (2024)
            "5f00::1",          // SRv6 SIDs
            "4000::1",          // outside 2000::/3, the only global unicast space allocated
            "::ffff:1.1.1.1",   // IPv4-mapped: not globally reachable as an IPv6 address
        ] {
            let addr: IpAddr = ip.parse().unwrap();
            assert!(strict().check_ip(addr).is_err(), "{ip} should be refused");
        }
    }

    #[test]
    fn accepts_public_literals_and_names() {
        for u in ["https://93.184.215.14/", "http://[2606:4700:4700::1111]/", "https://api.example.com/x"] {
            assert!(url_ok(u), "{u} should pass the literal check");
        }
    }

    #[test]
    fn refuses_other_schemes() {
        for u in ["ftp://example.com/", "file:///etc/passwd", "gopher://x/"] {
            assert!(!url_ok(u), "{u}");
        }
    }

    #[test]
    fn operator_allowances_apply() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(Guard::new(true, vec![]).check_ip(ip).is_ok());
        assert!(Guard::new(false, vec!["10.1.2.0/24".parse().unwrap()]).check_ip(ip).is_ok());
        assert!(Guard::new(false, vec!["10.1.3.0/24".parse().unwrap()]).check_ip(ip).is_err());
    }

    #[tokio::test]
    async fn localhost_name_is_refused_after_resolution() {
        let u = Url::parse("http://localhost:9/").unwrap();
        assert!(strict().check(&u).await.is_err());
    }
}
