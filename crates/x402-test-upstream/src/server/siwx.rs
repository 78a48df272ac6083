//! Sign-In-With-X on `/v2/siwx` and `/v2/pid-siwx` (CAIP-122, EIP-4361 messages signed with
//! EIP-191), this fixture's own implementation (independent of the router's `x402::siwx`).
//!
//! - Every 402 carries a fresh challenge: a random nonce issued here (kept with its issue and
//!   expiry times), `domain` = the request's host, `uri` and `resources` = the resource URL
//!   without its query, `supportedChains` = this server's network, `eip191`.
//! - A payer whose payment settled is recorded for the route's path.
//! - A request with `SIGN-IN-WITH-X` (base64 JSON) is granted instead of a payment when: every
//!   echoed field is the challenge this server issued for that nonce (nonce single-use, not
//!   expired), `domain`/`uri` are this server's, `chainId`/`type` match, the EIP-191 signature
//!   of the EIP-4361 text recovers to `address`, and `address` paid for this path.
//!
//! `?challenge=wrong-chain` / `?challenge=other-domain` serve hostile challenges (another
//! chain, another site); `?siwx=refuse` refuses every sign-in (402).

use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use alloy::primitives::{Address, Signature};
use base64::Engine as _;
use chrono::{DateTime, Duration, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{Value, json};

/// How long an issued challenge may be answered.
const CHALLENGE_SECONDS: i64 = 300;
/// Most challenges kept (older ones are dropped first once expired).
const MAX_CHALLENGES: usize = 10_000;

/// A challenge as issued.
#[derive(Clone, Debug)]
struct Issued {
    domain: String,
    uri: String,
    issued_at: String,
    expiration_time: String,
    expires: DateTime<Utc>,
}

#[derive(Default)]
struct Inner {
    challenges: HashMap<String, Issued>,
    /// (path, payer) pairs whose payment settled.
    paid: HashSet<(String, Address)>,
}

/// Issued challenges and paying addresses (shared by all workers).
#[derive(Clone, Default)]
pub(super) struct SiwxState {
    inner: Arc<Mutex<Inner>>,
}

/// The signed sign-in, as a client sends it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignIn {
    domain: String,
    address: String,
    statement: Option<String>,
    uri: String,
    version: String,
    chain_id: String,
    #[serde(rename = "type")]
    kind: String,
    nonce: String,
    issued_at: String,
    expiration_time: Option<String>,
    not_before: Option<String>,
    request_id: Option<String>,
    resources: Option<Vec<String>>,
    signature: String,
}

/// The hostile variants of the challenge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Variant {
    Honest,
    WrongChain,
    OtherDomain,
}

impl Variant {
    pub(super) fn of(query: &str) -> Self {
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            if k == "challenge" {
                return match &*v {
                    "wrong-chain" => Self::WrongChain,
                    "other-domain" => Self::OtherDomain,
                    _ => Self::Honest,
                };
            }
        }
        Self::Honest
    }
}

/// `?siwx=refuse`: refuse every sign-in.
pub(super) fn refuses(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "siwx" && v == "refuse")
}

fn time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn random_nonce() -> String {
    let mut bytes = [0u8; 16];
    // A fixture: a failed getrandom falls back to the clock (never in practice).
    if getrandom::getrandom(&mut bytes).is_err() {
        let n = Utc::now().timestamp_nanos_opt().unwrap_or_default();
        bytes[..8].copy_from_slice(&n.to_be_bytes());
    }
    alloy::primitives::hex::encode(bytes)
}

/// The EIP-4361 text of a sign-in (the reference `siwe` layout).
fn message(s: &SignIn, chain_id: u64) -> String {
    let mut lines = vec![format!("{} wants you to sign in with your Ethereum account:", s.domain), s.address.clone()];
    match &s.statement {
        Some(st) => {
            lines.push(String::new());
            lines.push(st.clone());
            lines.push(String::new());
        }
        None => {
            lines.push(String::new());
            lines.push(String::new());
        }
    }
    lines.push(format!("URI: {}", s.uri));
    lines.push(format!("Version: {}", s.version));
    lines.push(format!("Chain ID: {chain_id}"));
    lines.push(format!("Nonce: {}", s.nonce));
    lines.push(format!("Issued At: {}", s.issued_at));
    if let Some(e) = &s.expiration_time {
        lines.push(format!("Expiration Time: {e}"));
    }
    if let Some(n) = &s.not_before {
        lines.push(format!("Not Before: {n}"));
    }
    if let Some(r) = &s.request_id {
        lines.push(format!("Request ID: {r}"));
    }
    if let Some(rs) = &s.resources {
        lines.push("Resources:".into());
        lines.extend(rs.iter().map(|r| format!("- {r}")));
    }
    lines.join("\n")
}

impl SiwxState {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The `sign-in-with-x` declaration of a new 402 for `host` and `resource` (no query).
    pub(super) fn declaration(&self, host: &str, scheme: &str, path: &str, network: &str, variant: Variant) -> Value {
        let now = Utc::now();
        let (domain, origin) = match variant {
            Variant::OtherDomain => ("evil.example".to_owned(), "http://evil.example".to_owned()),
            _ => (host.to_owned(), format!("{scheme}://{host}")),
        };
        let uri = format!("{origin}{path}");
        let nonce = random_nonce();
        let expires = now + Duration::seconds(CHALLENGE_SECONDS);
        let issued = Issued {
            domain: domain.clone(),
            uri: uri.clone(),
            issued_at: time(now),
            expiration_time: time(expires),
            expires,
        };
        {
            let mut inner = self.lock();
            if inner.challenges.len() >= MAX_CHALLENGES {
                inner.challenges.retain(|_, c| c.expires > now);
            }
            if inner.challenges.len() < MAX_CHALLENGES {
                inner.challenges.insert(nonce.clone(), issued.clone());
            }
        }
        let chain = if variant == Variant::WrongChain { "eip155:1" } else { network };
        json!({ "sign-in-with-x": {
            "info": {
                "domain": domain,
                "uri": uri,
                "statement": "Sign in to re-access what you paid for",
                "version": "1",
                "nonce": nonce,
                "issuedAt": issued.issued_at,
                "expirationTime": issued.expiration_time,
                "resources": [uri],
            },
            "supportedChains": [{ "chainId": chain, "type": "eip191" }],
            "schema": { "type": "object" },
        }})
    }

    /// Records that `payer` paid (settled) for `path`.
    pub(super) fn record_payment(&self, path: &str, payer: Address) {
        self.lock().paid.insert((path.to_owned(), payer));
    }

    /// Checks a `SIGN-IN-WITH-X` header for `path` on `host`; `Ok(address)` grants access.
    pub(super) fn verify(
        &self,
        header: &[u8],
        host: &str,
        scheme: &str,
        path: &str,
        network: &str,
    ) -> Result<Address, String> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(header.trim_ascii())
            .map_err(|_| "the header is not base64".to_owned())?;
        let s: SignIn = serde_json::from_slice(&raw).map_err(|e| format!("the header is not a sign-in: {e}"))?;
        let chain_id = network
            .strip_prefix("eip155:")
            .and_then(|id| u64::from_str(id).ok())
            .ok_or("this server's network is not eip155")?;
        if s.chain_id != network || s.kind != "eip191" || s.version != "1" {
            return Err(format!("chain {} / type {} / version {} not offered", s.chain_id, s.kind, s.version));
        }
        if s.domain != host || s.uri != format!("{scheme}://{host}{path}") {
            return Err(format!("domain {:?} or uri {:?} is not this resource", s.domain, s.uri));
        }
        let now = Utc::now();
        let issued = {
            // Single use: the nonce is consumed by its first sign-in, valid or not.
            let mut inner = self.lock();
            inner.challenges.remove(&s.nonce).ok_or("the nonce was not issued here, or was used already")?
        };
        if issued.expires <= now {
            return Err("the challenge expired".into());
        }
        if s.domain != issued.domain
            || s.uri != issued.uri
            || s.issued_at != issued.issued_at
            || s.expiration_time.as_deref() != Some(issued.expiration_time.as_str())
            || s.resources.as_deref() != Some(std::slice::from_ref(&issued.uri))
            || s.not_before.is_some()
            || s.request_id.is_some()
        {
            return Err("the echoed fields are not the challenge issued with this nonce".into());
        }
        let address = Address::from_str(&s.address).map_err(|e| format!("address: {e}"))?;
        let signature = Signature::from_str(&s.signature).map_err(|e| format!("signature: {e}"))?;
        let signer = signature
            .recover_address_from_msg(message(&s, chain_id).as_bytes())
            .map_err(|e| format!("the signature does not recover: {e}"))?;
        if signer != address {
            return Err(format!("signed by {signer}, not by {address}"));
        }
        if !self.lock().paid.contains(&(path.to_owned(), address)) {
            return Err(format!("{address} has not paid for {path}"));
        }
        Ok(address)
    }
}

#[cfg(test)]
mod tests {
    use alloy::signers::SignerSync;
    use alloy::signers::local::PrivateKeySigner;

    use super::*;

    const NETWORK: &str = "eip155:84532";

    fn sign_in(signer: &PrivateKeySigner, decl: &Value, tamper: impl Fn(&mut Value)) -> Vec<u8> {
        let info = &decl["sign-in-with-x"]["info"];
        let mut p = info.clone();
        p["address"] = json!(signer.address().to_checksum(None));
        p["chainId"] = json!(NETWORK);
        p["type"] = json!("eip191");
        tamper(&mut p);
        let mut unsigned = p.clone();
        unsigned["signature"] = json!("0x");
        let s: SignIn = serde_json::from_value(unsigned).unwrap();
        let sig = signer.sign_message_sync(message(&s, 84532).as_bytes()).unwrap();
        p["signature"] = json!(format!("0x{}", alloy::primitives::hex::encode(sig.as_bytes())));
        base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&p).unwrap()).into_bytes()
    }

    #[test]
    fn a_payer_signs_in_once_per_challenge() {
        let state = SiwxState::default();
        let signer = PrivateKeySigner::random();
        let decl = state.declaration("127.0.0.1:9", "http", "/v2/siwx", NETWORK, Variant::Honest);
        let header = sign_in(&signer, &decl, |_| {});
        assert!(
            state.verify(&header, "127.0.0.1:9", "http", "/v2/siwx", NETWORK).unwrap_err().contains("has not paid")
        );
        // That consumed the nonce; a new challenge after paying.
        state.record_payment("/v2/siwx", signer.address());
        let decl = state.declaration("127.0.0.1:9", "http", "/v2/siwx", NETWORK, Variant::Honest);
        let header = sign_in(&signer, &decl, |_| {});
        assert_eq!(state.verify(&header, "127.0.0.1:9", "http", "/v2/siwx", NETWORK).unwrap(), signer.address());
        assert!(state.verify(&header, "127.0.0.1:9", "http", "/v2/siwx", NETWORK).is_err(), "nonce single-use");
    }

    #[test]
    fn tampered_sign_ins_are_refused() {
        let state = SiwxState::default();
        let signer = PrivateKeySigner::random();
        state.record_payment("/v2/siwx", signer.address());
        let tampers: [fn(&mut Value); 5] = [
            |p| p["nonce"] = json!("0000000000000000"),
            |p| p["issuedAt"] = json!("2020-01-01T00:00:00.000Z"),
            |p| p["chainId"] = json!("eip155:1"),
            |p| p["uri"] = json!("http://127.0.0.1:9/v2/other"),
            |p| p["address"] = json!(Address::repeat_byte(1).to_checksum(None)),
        ];
        for tamper in tampers {
            let decl = state.declaration("127.0.0.1:9", "http", "/v2/siwx", NETWORK, Variant::Honest);
            let header = sign_in(&signer, &decl, tamper);
            assert!(state.verify(&header, "127.0.0.1:9", "http", "/v2/siwx", NETWORK).is_err());
        }
    }
}
