//! SSRF guard: which upstream addresses the router may connect to.
//!
//! Only `http`/`https`. Every address a host name resolves to must be public unless the
//! operator allows private ranges (`UPSTREAM_ALLOW_PRIVATE`, or specific CIDRs). The
//! check runs in the HTTP client's DNS resolver, so the connection goes to exactly the
//! addresses that were checked (no DNS rebinding between check and connect). IP literals
//! never reach a resolver, so [`Guard::check_url`] checks them up front; the URL parser
//! has already turned decimal (`2130706433`), octal, hex and short (`127.1`) IPv4 forms
//! into dotted quads, and IPv4-mapped/-compatible IPv6 forms are unwrapped here.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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

/// The policy, built once from config.
#[derive(Debug, Clone)]
pub struct Guard {
    allow_private: bool,
    allow_cidrs: Vec<IpNet>,
}

impl Guard {
    pub fn new(allow_private: bool, allow_cidrs: Vec<IpNet>) -> Self {
        Self { allow_private, allow_cidrs }
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
        let ip = canonical(ip);
        if self.allow_private || is_public(ip) || self.allow_cidrs.iter().any(|n| n.contains(&ip)) {
            Ok(())
        } else {
            Err(GuardError::Forbidden(ip))
        }
    }

    /// Resolves `host` and checks every address; all must pass, so a name that mixes a
    /// public and a private address is refused as a whole.
    ///
    /// # Errors
    /// [`GuardError`] when resolution fails or any address is refused.
    pub async fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, GuardError> {
        let addrs: Vec<SocketAddr> =
            tokio::net::lookup_host((host, port)).await.map_err(|_| GuardError::Unresolved(host.to_owned()))?.collect();
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

/// IPv4-mapped (`::ffff:a.b.c.d`) and IPv4-compatible (`::a.b.c.d`) addresses are
/// judged as the IPv4 address they carry.
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
        || (o[0] == 198 && (o[1] & 0xfe) == 18)        // 198.18.0.0/15 benchmarking
        || o[0] >= 240) // 240.0.0.0/4 reserved
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    let s = ip.segments();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_multicast()
        || (s[0] & 0xfe00) == 0xfc00                   // fc00::/7 unique local
        || (s[0] & 0xffc0) == 0xfe80                   // fe80::/10 link-local
        || (s[0] & 0xffc0) == 0xfec0                   // fec0::/10 site-local (deprecated)
        || (s[0] == 0x2001 && s[1] == 0x0db8)          // documentation
        || (s[0] == 0x0064 && s[1] == 0xff9b)          // 64:ff9b::/96 NAT64 (may reach private v4)
        || s[0] == 0x2002                              // 6to4 (embeds an arbitrary v4)
        || (s[0] == 0x2001 && s[1] == 0)) // Teredo
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
