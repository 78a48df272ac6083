//! Known payment terms: the requirements an upstream's last `402` asked, per agent, method
//! and URL without its query, so that the next call pays on its first request instead of
//! probing unpaid first (docs/DESIGN.md §6, "Paying ahead").
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

use reqwest::Method;
use reqwest::header::{CACHE_CONTROL, HeaderMap};
use serde_json::{Map, Value, json};
use url::Url;
use uuid::Uuid;

pub use crate::config::TermsLimits;
use crate::x402::PaymentRequired;

/// Where terms apply: one agent's calls with this method to this URL (without query).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TermsKey {
    agent_id: Uuid,
    method: Method,
    url: String,
}

impl TermsKey {
    pub fn new(agent_id: Uuid, method: &Method, url: &Url) -> Self {
        let mut bare = url.clone();
        bare.set_query(None);
        bare.set_fragment(None);
        Self { agent_id, method: method.clone(), url: bare.into() }
    }
}

struct Known {
    required: PaymentRequired,
    /// The URL whose 402 this was (the v2 `resource` names it).
    url: Url,
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

    /// The terms to pay `url` ahead with, if known and fresh. A v2 `resource` that named the
    /// URL the terms were learnt from names `url` instead (the query may differ).
    pub fn get(&self, key: &TermsKey, url: &Url) -> Option<PaymentRequired> {
        self.limits?;
        let now = Instant::now();
        let mut known = self.known();
        let entry = known.get(key)?;
        if entry.until <= now {
            known.remove(key);
            return None;
        }
        let mut required = entry.required.clone();
        if let Some(resource) = &required.resource
            && entry.url != *url
            && resource.get("url").and_then(Value::as_str) == Some(entry.url.as_str())
        {
            required.resource = Some(with_url(resource, url));
        }
        Some(required)
    }

    /// Whether fresh terms are known for `key` (what [`Terms::get`] would find).
    pub fn knows(&self, key: &TermsKey) -> bool {
        self.limits.is_some() && self.known().get(key).is_some_and(|k| k.until > Instant::now())
    }

    /// Remembers what a `402` from `url` asked (unless the answer says not to).
    pub fn put(&self, key: TermsKey, url: &Url, required: &PaymentRequired, headers: &HeaderMap) {
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
        let entry = Known { required: required.clone(), url: url.clone(), until: now + ttl, stored: now };
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

/// `resource` with its `url` member set to `url`, other members kept.
fn with_url(resource: &Value, url: &Url) -> Value {
    match resource.as_object() {
        Some(members) => {
            let replaced =
                members.iter().map(|(k, v)| (k.clone(), if k == "url" { json!(url.as_str()) } else { v.clone() }));
            Value::Object(replaced.collect::<Map<String, Value>>())
        }
        None => resource.clone(),
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
    use reqwest::header::HeaderValue;

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

    #[test]
    fn keys_ignore_the_query_but_not_the_method_the_path_or_the_agent() {
        let agent = Uuid::new_v4();
        let a = Url::parse("https://api.example/x?city=Paris#f").unwrap();
        let b = Url::parse("https://api.example/x?city=Rome").unwrap();
        let c = Url::parse("https://api.example/y").unwrap();
        assert_eq!(TermsKey::new(agent, &Method::GET, &a), TermsKey::new(agent, &Method::GET, &b));
        assert_ne!(TermsKey::new(agent, &Method::GET, &a), TermsKey::new(agent, &Method::POST, &a));
        assert_ne!(TermsKey::new(agent, &Method::GET, &a), TermsKey::new(agent, &Method::GET, &c));
        assert_ne!(TermsKey::new(agent, &Method::GET, &a), TermsKey::new(Uuid::new_v4(), &Method::GET, &a));
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
        let urls: Vec<Url> = (0..3).map(|i| Url::parse(&format!("http://api.example/{i}")).unwrap()).collect();
        for (i, url) in urls.iter().enumerate() {
            terms.put(
                TermsKey::new(agent, &Method::GET, url),
                url,
                &required(&format!("{}", 1000 + i)),
                &HeaderMap::new(),
            );
        }
        assert_eq!(terms.len(), 2);
        assert!(terms.get(&TermsKey::new(agent, &Method::GET, &urls[0]), &urls[0]).is_none(), "the oldest went first");
        let kept = terms.get(&TermsKey::new(agent, &Method::GET, &urls[2]), &urls[2]).unwrap();
        assert_eq!(kept.accepts[0].amount().to_string(), "1002");
        // max-age=0 forgets what was known.
        terms.put(TermsKey::new(agent, &Method::GET, &urls[2]), &urls[2], &required("5"), &headers("max-age=0"));
        assert!(terms.get(&TermsKey::new(agent, &Method::GET, &urls[2]), &urls[2]).is_none());

        let off = Terms::new(None);
        off.put(TermsKey::new(agent, &Method::GET, &urls[0]), &urls[0], &required("1"), &HeaderMap::new());
        assert!(off.is_empty());
    }

    #[test]
    fn resource_names_the_url_being_paid() {
        let r = json!({"url": "https://api.example/x?city=Paris", "description": "d"});
        let to = Url::parse("https://api.example/x?city=Rome").unwrap();
        assert_eq!(with_url(&r, &to), json!({"url": "https://api.example/x?city=Rome", "description": "d"}));
    }
}
