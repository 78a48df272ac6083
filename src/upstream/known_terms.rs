//! Known payment terms: the requirements an upstream's last `402` asked, per agent and
//! **whole request** (method, URL with its query, the headers the router forwards and the
//! body), so that the next identical call pays on its first request instead of probing unpaid
//! first (docs/DESIGN.md §6, "Paying ahead").
//!
//! Why the whole request: a price is the price of one request. Terms learnt for
//! `/item?size=large` signed, ahead, for `/item?size=small` would hand the upstream an
//! authorization for more than this request costs, which a lenient upstream settles. Keyed by
//! the whole request, what is signed ahead is what this very request was last asked; calls
//! that differ in any byte probe first (one round trip).
//!
//! Only a hint. Paying ahead is safe because the nonce is a function of the request
//! (agent, key, request hash), never of the price: if the terms changed, the upstream answers
//! `402` with new ones and the router signs those with the **same nonce**, in the same nonce
//! domain (network, token, method), so at most one of the two authorizations can ever move
//! money; the ledger reserves the larger amount until the chain shows which one did (or
//! neither can any more). Terms in another domain are never paid on top of a live
//! authorization.
//!
//! Bounded: at most `entries` terms (the oldest is dropped first) and each for at most `ttl`,
//! shorter when the `402` says so (`Cache-Control: max-age=N`, `max-age=0`: not kept; see
//! [`lifetime`] for why `no-store` is not read as "do not remember the price"). Keyed per agent: an agent's calls are never paid ahead on terms
//! another agent's request produced. In memory only: a restart starts cold, which costs one
//! probe per upstream.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use reqwest::header::{CACHE_CONTROL, HeaderMap};
use sha2::{Digest, Sha256};
use uuid::Uuid;

pub use crate::config::TermsLimits;
use crate::upstream::UpstreamRequest;
use crate::x402::PaymentRequired;

/// Where terms apply: one agent's calls of exactly this request (a digest of its method, URL
/// with query, forwarded headers in order, and body).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TermsKey {
    agent_id: Uuid,
    request: [u8; 32],
}

impl TermsKey {
    /// The key of `request` as the router sends it (before any payment header is added).
    pub fn of(agent_id: Uuid, request: &UpstreamRequest) -> Self {
        let mut h = Sha256::new();
        // Every part length-prefixed: no two different requests hash the same bytes.
        let mut part = |bytes: &[u8]| {
            h.update((bytes.len() as u64).to_be_bytes());
            h.update(bytes);
        };
        part(request.shown_method().as_bytes());
        let url = request.url.as_str();
        part(url.split_once('#').map_or(url, |(before, _)| before).as_bytes());
        for (name, value) in &request.headers {
            part(name.as_str().as_bytes());
            part(value.as_bytes());
        }
        match &request.body {
            Some(body) => part(body),
            None => h.update([0xff; 8]),
        }
        Self { agent_id, request: h.finalize().into() }
    }
}

struct Known {
    required: PaymentRequired,
    until: Instant,
    stored: Instant,
}

/// The known terms; off when its limits are `None`.
pub struct Terms {
    limits: Option<TermsLimits>,
    known: Mutex<HashMap<TermsKey, Known>>,
}

impl Terms {
    pub fn new(limits: Option<TermsLimits>) -> Self {
        Self { limits, known: Mutex::new(HashMap::new()) }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<TermsKey, Known>> {
        // A panic while holding the lock leaves a map that is still a valid map.
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The terms to pay the request of `key` ahead with, if known and fresh.
    pub fn get(&self, key: &TermsKey) -> Option<PaymentRequired> {
        self.limits?;
        let now = Instant::now();
        let mut known = self.known();
        let entry = known.get(key)?;
        if entry.until <= now {
            known.remove(key);
            return None;
        }
        Some(entry.required.clone())
    }

    /// Whether fresh terms are known for `key` (what [`Terms::get`] would find).
    pub fn knows(&self, key: &TermsKey) -> bool {
        self.limits.is_some() && self.known().get(key).is_some_and(|k| k.until > Instant::now())
    }

    /// Remembers what a `402` to the request of `key` asked (unless the answer says not to).
    pub fn put(&self, key: TermsKey, required: &PaymentRequired, headers: &HeaderMap) {
        let Some(limits) = self.limits else { return };
        let Some(ttl) = lifetime(headers, limits.ttl) else {
            self.forget(&key);
            return;
        };
        let now = Instant::now();
        let mut known = self.known();
        if !known.contains_key(&key) && known.len() >= limits.entries {
            known.retain(|_, k| k.until > now);
            if known.len() >= limits.entries
                && let Some(oldest) = known.iter().min_by_key(|(_, k)| k.stored).map(|(k, _)| k.clone())
            {
                known.remove(&oldest);
            }
        }
        let entry = Known { required: required.clone(), until: now + ttl, stored: now };
        known.insert(key, entry);
    }

    /// Drops the terms of `key` (they were refused or could not be paid).
    pub fn forget(&self, key: &TermsKey) {
        if self.limits.is_some() {
            self.known().remove(key);
        }
    }

    /// How many terms are known (for tests and metrics).
    pub fn len(&self) -> usize {
        self.known().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a `402`'s terms may be remembered: `max`, or less when its `Cache-Control`
/// gives a `max-age` (`max-age=0`: not at all). `no-store`, `no-cache` and `private` are left
/// to HTTP caches: they keep the response out of a shared cache, and the official servers
/// send `no-store` on every 402; what is remembered here is the price, only a hint that the
/// upstream's next answer checks.
fn lifetime(headers: &HeaderMap, max: Duration) -> Option<Duration> {
    let mut ttl = max;
    for value in headers.get_all(CACHE_CONTROL) {
        let Ok(text) = value.to_str() else { continue };
        for directive in text.split(',').map(|d| d.trim().to_ascii_lowercase()) {
            if let Some(("max-age" | "s-maxage", secs)) = directive.split_once('=') {
                match secs.trim().trim_matches('"').parse::<u64>() {
                    Ok(secs) => ttl = ttl.min(Duration::from_secs(secs)),
                    Err(_) => return None,
                }
            }
        }
    }
    (!ttl.is_zero()).then_some(ttl)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::Method;
    use reqwest::header::HeaderValue;
    use serde_json::json;
    use url::Url;

    fn headers(cache_control: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(CACHE_CONTROL, HeaderValue::from_str(cache_control).unwrap());
        h
    }

    #[test]
    fn cache_control_max_age_bounds_the_lifetime() {
        let max = Duration::from_secs(300);
        assert_eq!(lifetime(&HeaderMap::new(), max), Some(max));
        assert_eq!(lifetime(&headers("max-age=60"), max), Some(Duration::from_secs(60)));
        assert_eq!(lifetime(&headers("public, max-age=6000"), max), Some(max));
        assert_eq!(lifetime(&headers("no-store"), max), Some(max), "what the official servers send");
        for refused in ["max-age=0", "max-age=x", "No-Store, S-MaxAge=0"] {
            assert_eq!(lifetime(&headers(refused), max), None, "{refused}");
        }
    }

    fn request(method: Method, url: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> UpstreamRequest {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.append(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        UpstreamRequest::http(method, Url::parse(url).unwrap(), map, body.map(<[u8]>::to_vec))
    }

    #[test]
    fn keys_cover_the_whole_request_and_the_agent() {
        let agent = Uuid::new_v4();
        let key = |r: &UpstreamRequest| TermsKey::of(agent, r);
        let base = request(Method::GET, "https://api.example/x?size=large", &[("x-a", "1")], None);
        assert_eq!(key(&base), key(&request(Method::GET, "https://api.example/x?size=large#f", &[("x-a", "1")], None)));
        let others = [
            request(Method::GET, "https://api.example/x?size=small", &[("x-a", "1")], None),
            request(Method::GET, "https://api.example/x", &[("x-a", "1")], None),
            request(Method::POST, "https://api.example/x?size=large", &[("x-a", "1")], None),
            request(Method::GET, "https://api.example/y?size=large", &[("x-a", "1")], None),
            request(Method::GET, "https://api.example/x?size=large", &[("x-a", "2")], None),
            request(Method::GET, "https://api.example/x?size=large", &[], None),
            request(Method::GET, "https://api.example/x?size=large", &[("x-a", "1")], Some(b"")),
            request(Method::GET, "https://api.example/x?size=large", &[("x-a", "1")], Some(b"{}")),
            // A part boundary moved: length prefixes keep these apart.
            request(Method::GET, "https://api.example/x?size=large", &[("x-a1", "")], None),
        ];
        for other in &others {
            assert_ne!(key(&base), key(other), "{} {:?} {:?}", other.url, other.headers, other.body);
        }
        assert_ne!(key(&base), TermsKey::of(Uuid::new_v4(), &base));
        // A tool call and an HTTP POST of the same bytes to the same URL are two requests.
        let post = request(Method::POST, "https://api.example/mcp", &[], Some(b"{}"));
        let tool = UpstreamRequest { protocol: crate::upstream::Protocol::Mcp, ..post.clone() };
        assert_ne!(key(&post), key(&tool));
    }

    fn required(amount: &str) -> PaymentRequired {
        let body = json!({"x402Version": 1, "error": "", "accepts": [{
            "scheme": "exact", "network": "base-sepolia", "maxAmountRequired": amount,
            "resource": "http://api.example/x", "description": "", "mimeType": "application/json",
            "payTo": "0x1111111111111111111111111111111111111111", "maxTimeoutSeconds": 60,
            "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "extra": {"name": "USDC", "version": "2"}}]});
        let bytes = serde_json::to_vec(&body).unwrap();
        crate::x402::wire::parse_payment_required(reqwest::StatusCode::PAYMENT_REQUIRED, &HeaderMap::new(), &bytes)
            .unwrap()
    }

    #[test]
    fn at_most_entries_terms_are_kept_the_oldest_dropped_first_and_none_when_off() {
        let limits = TermsLimits { ttl: Duration::from_secs(60), entries: 2 };
        let terms = Terms::new(Some(limits));
        let agent = Uuid::new_v4();
        let keys: Vec<TermsKey> = (0..3)
            .map(|i| TermsKey::of(agent, &request(Method::GET, &format!("http://api.example/{i}"), &[], None)))
            .collect();
        for (i, key) in keys.iter().enumerate() {
            terms.put(key.clone(), &required(&format!("{}", 1000 + i)), &HeaderMap::new());
        }
        assert_eq!(terms.len(), 2);
        assert!(terms.get(&keys[0]).is_none(), "the oldest went first");
        let kept = terms.get(&keys[2]).unwrap();
        assert_eq!(kept.accepts[0].amount().to_string(), "1002");
        // max-age=0 forgets what was known.
        terms.put(keys[2].clone(), &required("5"), &headers("max-age=0"));
        assert!(terms.get(&keys[2]).is_none());

        let off = Terms::new(None);
        off.put(keys[0].clone(), &required("1"), &HeaderMap::new());
        assert!(off.is_empty());
    }
}
