//! Sign-In-With-X (`sign-in-with-x`, CAIP-122; EIP-4361 messages signed with EIP-191 on EVM
//! chains): re-accessing a resource the router's wallet already paid for, by proving control
//! of the paying address instead of paying again.
//!
//! An upstream's 402 may advertise `extensions["sign-in-with-x"]`: `info` (the challenge:
//! `domain`, `uri`, `version`, `nonce`, `issuedAt`, optional `statement`, `expirationTime`,
//! `notBefore`, `requestId`, `resources`) and `supportedChains` (`[{chainId, type}]`). The
//! client answers with the header `SIGN-IN-WITH-X`: base64 of the JSON of the echoed challenge
//! plus `address`, `chainId`, `type` and `signature` (EIP-191 over the EIP-4361 text).
//!
//! Every upstream is hostile, so a challenge is parsed into a [`Challenge`] only when it is
//! bound to the request's own origin (domain and every URI), offers exactly the network the
//! payment settled on, names the payer, is fresh and short-lived, and every field is small and
//! free of control characters (a line break would let an upstream write its own lines into
//! the signed text).
//!
//! **The only signature made here is a sign-in message**: [`sign_in`] takes a [`Challenge`]
//! and signs the EIP-4361 text it renders, with the EIP-191 prefix
//! (`"\x19Ethereum Signed Message:\n" ‖ len ‖ text`). It cannot produce a payment: an EIP-3009
//! authorization is an EIP-712 hash (`"\x19\x01" ‖ domain ‖ struct`), which no EIP-191
//! message hash can equal, and every rendered text starts with
//! `"<domain> wants you to sign in with your Ethereum account:"`.

use alloy::primitives::Address;
use alloy::signers::SignerSync;
use alloy::signers::local::PrivateKeySigner;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use chrono::{DateTime, Duration, Utc};
use serde_json::{Map, Value, json};
use url::Url;

use super::network::Network;

/// The extension's key in `extensions`.
pub const SIGN_IN_WITH_X: &str = "sign-in-with-x";
/// The request header that carries the signed sign-in.
pub const HEADER: &str = "SIGN-IN-WITH-X";
/// The signature type signed here (EOA, EIP-191).
pub const TYPE_EIP191: &str = "eip191";

/// Largest serialized `extensions["sign-in-with-x"]` accepted.
const MAX_EXTENSION_BYTES: usize = 8 * 1024;
/// Largest `domain`, `statement`, `requestId` and each time stamp.
const MAX_FIELD_CHARS: usize = 256;
/// Largest `uri` and each resource.
const MAX_URI_CHARS: usize = 2048;
/// Most `resources` and `supportedChains` entries.
const MAX_RESOURCES: usize = 8;
const MAX_CHAINS: usize = 16;
/// Nonce: EIP-4361 asks for at least 8 alphanumeric characters.
const NONCE_CHARS: std::ops::RangeInclusive<usize> = 8..=128;
/// A challenge issued longer ago than this is stale (the official server's limit).
const MAX_AGE_SECS: i64 = 300;
/// Clock skew tolerated for `issuedAt` in the future and `notBefore`.
const SKEW_SECS: i64 = 60;
/// Longest validity a sign-in may be asked for.
const MAX_VALIDITY_SECS: i64 = 3600;

/// Why a challenge is refused (nothing is signed).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChallengeError {
    #[error("the 402 does not advertise sign-in-with-x")]
    NotAdvertised,
    #[error("the sign-in-with-x declaration is larger than {MAX_EXTENSION_BYTES} bytes")]
    TooLarge,
    #[error("challenge field `{0}`: {1}")]
    Field(&'static str, String),
    #[error("the challenge's domain {got:?} is not the request's host {expected:?}")]
    DomainMismatch { expected: String, got: String },
    #[error("the challenge's {field} {got:?} is not on the request's origin")]
    OriginMismatch { field: &'static str, got: String },
    #[error("the challenge offers no eip191 sign-in on {0}, the network the payment settled on")]
    WrongChain(String),
    #[error("the challenge is not fresh: {0}")]
    Stale(String),
}

/// Why a sign-in could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("the challenge names {challenge}, not the signer {signer}")]
    WrongSigner { challenge: Address, signer: Address },
    #[error("signing failed: {0}")]
    Signer(#[from] alloy::signers::Error),
    #[error("cannot encode the sign-in: {0}")]
    Encode(#[from] serde_json::Error),
}

/// A validated challenge for one address on one chain, ready to be signed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    domain: String,
    address: Address,
    statement: Option<String>,
    uri: String,
    version: String,
    network: Network,
    nonce: String,
    issued_at: String,
    expiration_time: Option<String>,
    not_before: Option<String>,
    request_id: Option<String>,
    resources: Option<Vec<String>>,
}

/// `host[:port]` of a URL, as a browser's `URL.host` (no port when it is the default).
pub fn authority(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    Some(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    })
}

/// True when `extensions` (a 402's `extensions` object) declares sign-in-with-x.
pub fn advertised(extensions: &Value) -> bool {
    extensions.get(SIGN_IN_WITH_X).is_some_and(Value::is_object)
}

/// A string without control characters, of at most `max` characters.
fn text(
    info: &Map<String, Value>,
    field: &'static str,
    max: usize,
    required: bool,
) -> Result<Option<String>, ChallengeError> {
    let Some(v) = info.get(field) else {
        return if required { Err(ChallengeError::Field(field, "missing".into())) } else { Ok(None) };
    };
    let s = v.as_str().ok_or_else(|| ChallengeError::Field(field, "not a string".into()))?;
    if s.is_empty() {
        return Err(ChallengeError::Field(field, "empty".into()));
    }
    if s.chars().count() > max {
        return Err(ChallengeError::Field(field, format!("longer than {max} characters")));
    }
    if s.chars().any(char::is_control) {
        return Err(ChallengeError::Field(field, "holds a control character".into()));
    }
    Ok(Some(s.to_owned()))
}

fn time(field: &'static str, s: &str) -> Result<DateTime<Utc>, ChallengeError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| ChallengeError::Field(field, format!("not an RFC 3339 time: {e}")))
}

/// A URL on `origin`'s origin.
fn same_origin(field: &'static str, s: &str, origin: &Url) -> Result<(), ChallengeError> {
    let mismatch = || ChallengeError::OriginMismatch { field, got: s.to_owned() };
    let url = Url::parse(s).map_err(|_| mismatch())?;
    if url.origin() != origin.origin() || !url.username().is_empty() || url.password().is_some() {
        return Err(mismatch());
    }
    Ok(())
}

/// The optional `resources` of a challenge: at most a few, each of the request's origin.
fn resources(info: &Map<String, Value>, request_url: &Url) -> Result<Option<Vec<String>>, ChallengeError> {
    Ok(match info.get("resources") {
        None => None,
        Some(Value::Array(items)) => {
            if items.len() > MAX_RESOURCES {
                return Err(ChallengeError::Field("resources", format!("more than {MAX_RESOURCES}")));
            }
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let s = item.as_str().ok_or_else(|| ChallengeError::Field("resources", "not a string".into()))?;
                if s.chars().count() > MAX_URI_CHARS || s.chars().any(char::is_control) {
                    return Err(ChallengeError::Field("resources", "oversized or holds a control character".into()));
                }
                same_origin("resource", s, request_url)?;
                out.push(s.to_owned());
            }
            Some(out)
        }
        Some(_) => return Err(ChallengeError::Field("resources", "not an array".into())),
    })
}

/// The message version (`"1"`) and the nonce (8 to 128 alphanumeric characters).
fn version_and_nonce(info: &Map<String, Value>) -> Result<(String, String), ChallengeError> {
    let version = text(info, "version", 8, true)?.unwrap_or_default();
    if version != "1" {
        return Err(ChallengeError::Field("version", format!("{version:?} is not \"1\"")));
    }
    let nonce = text(info, "nonce", *NONCE_CHARS.end(), true)?.unwrap_or_default();
    if !NONCE_CHARS.contains(&nonce.len()) || !nonce.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(ChallengeError::Field("nonce", "not 8 to 128 alphanumeric characters".into()));
    }
    Ok((version, nonce))
}

/// `issuedAt`, `expirationTime` and `notBefore` of a challenge.
type Validity = (String, Option<String>, Option<String>);

/// `issuedAt` (fresh), `expirationTime` (not past, not too far) and `notBefore` (not in the future).
fn validity(info: &Map<String, Value>, now: DateTime<Utc>) -> Result<Validity, ChallengeError> {
    let issued_at = text(info, "issuedAt", 64, true)?.unwrap_or_default();
    let issued = time("issuedAt", &issued_at)?;
    if issued > now + Duration::seconds(SKEW_SECS) {
        return Err(ChallengeError::Stale(format!("issuedAt {issued_at} is in the future")));
    }
    if issued < now - Duration::seconds(MAX_AGE_SECS) {
        return Err(ChallengeError::Stale(format!("issuedAt {issued_at} is older than {MAX_AGE_SECS} s")));
    }
    let expiration_time = text(info, "expirationTime", 64, false)?;
    if let Some(e) = &expiration_time {
        let t = time("expirationTime", e)?;
        if t <= now {
            return Err(ChallengeError::Stale(format!("expired at {e}")));
        }
        if t > now + Duration::seconds(MAX_VALIDITY_SECS) {
            return Err(ChallengeError::Field(
                "expirationTime",
                format!("{e} asks for a sign-in valid longer than {MAX_VALIDITY_SECS} s"),
            ));
        }
    }
    let not_before = text(info, "notBefore", 64, false)?;
    if let Some(n) = &not_before
        && time("notBefore", n)? > now + Duration::seconds(SKEW_SECS)
    {
        return Err(ChallengeError::Stale(format!("not valid before {n}")));
    }
    Ok((issued_at, expiration_time, not_before))
}

/// The challenge offers `network` signed with EIP-191 among its (few) `supportedChains`.
fn offers_chain(decl: &Map<String, Value>, network: Network) -> Result<(), ChallengeError> {
    let chains = decl
        .get("supportedChains")
        .and_then(Value::as_array)
        .ok_or_else(|| ChallengeError::Field("supportedChains", "missing or not an array".into()))?;
    if chains.len() > MAX_CHAINS {
        return Err(ChallengeError::Field("supportedChains", format!("more than {MAX_CHAINS}")));
    }
    let caip2 = network.caip2();
    let offered = chains.iter().any(|c| {
        c.get("chainId").and_then(Value::as_str) == Some(caip2.as_str())
            && c.get("type").and_then(Value::as_str) == Some(TYPE_EIP191)
    });
    if !offered {
        return Err(ChallengeError::WrongChain(caip2));
    }
    Ok(())
}

impl Challenge {
    /// Reads the challenge of a 402's `extensions` for `payer` on `network` (the network the
    /// payment settled on), for a request to `request_url`, at `now`.
    ///
    /// # Errors
    /// [`ChallengeError`] when anything is missing, malformed, oversized, bound to another
    /// origin or chain, stale or too long-lived: nothing may be signed then.
    pub fn from_extensions(
        extensions: &Value,
        request_url: &Url,
        network: Network,
        payer: Address,
        now: DateTime<Utc>,
    ) -> Result<Self, ChallengeError> {
        let decl = extensions.get(SIGN_IN_WITH_X).ok_or(ChallengeError::NotAdvertised)?;
        let size = serde_json::to_vec(decl).map_or(usize::MAX, |b| b.len());
        if size > MAX_EXTENSION_BYTES {
            return Err(ChallengeError::TooLarge);
        }
        let decl = decl.as_object().ok_or_else(|| ChallengeError::Field("sign-in-with-x", "not an object".into()))?;
        let info = decl
            .get("info")
            .and_then(Value::as_object)
            .ok_or_else(|| ChallengeError::Field("info", "missing or not an object".into()))?;

        // Bound to the request's origin.
        let expected = authority(request_url).ok_or_else(|| ChallengeError::Field("domain", "no host".into()))?;
        let domain = text(info, "domain", MAX_FIELD_CHARS, true)?.unwrap_or_default();
        if domain != expected {
            return Err(ChallengeError::DomainMismatch { expected, got: domain });
        }
        let uri = text(info, "uri", MAX_URI_CHARS, true)?.unwrap_or_default();
        same_origin("uri", &uri, request_url)?;
        let resources = resources(info, request_url)?;

        let (version, nonce) = version_and_nonce(info)?;
        let statement = text(info, "statement", MAX_FIELD_CHARS, false)?;
        let request_id = text(info, "requestId", MAX_FIELD_CHARS, false)?;

        // Fresh and short-lived.
        let (issued_at, expiration_time, not_before) = validity(info, now)?;

        // The network the payment settled on, signed with EIP-191.
        offers_chain(decl, network)?;

        Ok(Self {
            domain,
            address: payer,
            statement,
            uri,
            version,
            network,
            nonce,
            issued_at,
            expiration_time,
            not_before,
            request_id,
            resources,
        })
    }

    /// The address that signs in.
    pub fn address(&self) -> Address {
        self.address
    }

    /// The challenge's nonce (not secret: the upstream chose it).
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// The EIP-4361 text that is signed (the layout of the reference `siwe` library: with no
    /// statement, an empty statement line).
    pub fn message(&self) -> String {
        let mut m = format!(
            "{} wants you to sign in with your Ethereum account:\n{}\n\n",
            self.domain,
            self.address.to_checksum(None)
        );
        if let Some(s) = &self.statement {
            m.push_str(s);
            m.push('\n');
        }
        m.push_str(&format!(
            "\nURI: {}\nVersion: {}\nChain ID: {}\nNonce: {}\nIssued At: {}",
            self.uri,
            self.version,
            self.network.chain_id(),
            self.nonce,
            self.issued_at
        ));
        if let Some(e) = &self.expiration_time {
            m.push_str(&format!("\nExpiration Time: {e}"));
        }
        if let Some(n) = &self.not_before {
            m.push_str(&format!("\nNot Before: {n}"));
        }
        if let Some(r) = &self.request_id {
            m.push_str(&format!("\nRequest ID: {r}"));
        }
        if let Some(resources) = &self.resources {
            m.push_str("\nResources:");
            for r in resources {
                m.push_str(&format!("\n- {r}"));
            }
        }
        m
    }

    /// The header's JSON without the signature: the echoed challenge, `address`, `chainId`,
    /// `type` (absent optional fields are left out, never `null`).
    fn payload(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("domain".into(), json!(self.domain));
        p.insert("address".into(), json!(self.address.to_checksum(None)));
        if let Some(s) = &self.statement {
            p.insert("statement".into(), json!(s));
        }
        p.insert("uri".into(), json!(self.uri));
        p.insert("version".into(), json!(self.version));
        p.insert("chainId".into(), json!(self.network.caip2()));
        p.insert("type".into(), json!(TYPE_EIP191));
        p.insert("nonce".into(), json!(self.nonce));
        p.insert("issuedAt".into(), json!(self.issued_at));
        for (k, v) in [
            ("expirationTime", &self.expiration_time),
            ("notBefore", &self.not_before),
            ("requestId", &self.request_id),
        ] {
            if let Some(v) = v {
                p.insert(k.into(), json!(v));
            }
        }
        if let Some(r) = &self.resources {
            p.insert("resources".into(), json!(r));
        }
        p
    }
}

/// Signs in: the `SIGN-IN-WITH-X` header value for `challenge` (base64 of its JSON with the
/// EIP-191 signature of [`Challenge::message`]). The only signature this module makes.
///
/// # Errors
/// [`SignInError::WrongSigner`] when the challenge was read for another address than the
/// signer's (nothing is signed); signer or encoding failures.
pub fn sign_in(signer: &PrivateKeySigner, challenge: &Challenge) -> Result<String, SignInError> {
    if signer.address() != challenge.address {
        return Err(SignInError::WrongSigner { challenge: challenge.address, signer: signer.address() });
    }
    let signature = signer.sign_message_sync(challenge.message().as_bytes())?;
    let mut payload = challenge.payload();
    payload.insert("signature".into(), json!(format!("0x{}", alloy::primitives::hex::encode(signature.as_bytes()))));
    Ok(STANDARD.encode(serde_json::to_vec(&Value::Object(payload))?))
}

#[cfg(test)]
mod tests {
    use alloy::primitives::Signature;

    use super::*;

    const PAYER_KEY: &str = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";

    fn signer() -> PrivateKeySigner {
        PAYER_KEY.parse().unwrap()
    }

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z").unwrap().with_timezone(&Utc)
    }

    fn network() -> Network {
        Network::parse("eip155:84532").unwrap()
    }

    fn url() -> Url {
        Url::parse("http://127.0.0.1:4021/v2/siwx?city=Paris").unwrap()
    }

    fn declaration() -> Value {
        json!({"sign-in-with-x": {
            "info": {
                "domain": "127.0.0.1:4021",
                "uri": "http://127.0.0.1:4021/v2/siwx",
                "statement": "Sign in to re-access what you paid for",
                "version": "1",
                "nonce": "a1b2c3d4e5f6a7b8",
                "issuedAt": "2026-12-03T11:59:30.000Z",
                "expirationTime": "2026-12-03T12:04:30.000Z",
                "resources": ["http://127.0.0.1:4021/v2/siwx"]
            },
            "supportedChains": [{"chainId": "eip155:1", "type": "eip191"}, {"chainId": "eip155:84532", "type": "eip191"}],
            "schema": {}
        }})
    }

    fn parse(ext: &Value) -> Result<Challenge, ChallengeError> {
        Challenge::from_extensions(ext, &url(), network(), signer().address(), now())
    }

    fn with(path: &str, value: Value) -> Value {
        let mut d = declaration();
        let (parent, key) = path.rsplit_once('/').unwrap();
        d.pointer_mut(parent).unwrap().as_object_mut().unwrap().insert(key.to_owned(), value);
        d
    }

    #[test]
    fn the_message_is_the_eip_4361_text() {
        let c = parse(&declaration()).unwrap();
        let expected = "127.0.0.1:4021 wants you to sign in with your Ethereum account:\n\
            0x70997970C51812dc3A010C7d01b50e0d17dc79C8\n\n\
            Sign in to re-access what you paid for\n\n\
            URI: http://127.0.0.1:4021/v2/siwx\n\
            Version: 1\n\
            Chain ID: 84532\n\
            Nonce: a1b2c3d4e5f6a7b8\n\
            Issued At: 2026-12-03T11:59:30.000Z\n\
            Expiration Time: 2026-12-03T12:04:30.000Z\n\
            Resources:\n\
            - http://127.0.0.1:4021/v2/siwx";
        assert_eq!(c.message(), expected);
    }

    #[test]
    fn without_a_statement_the_statement_line_is_empty() {
        let mut d = declaration();
        d["sign-in-with-x"]["info"].as_object_mut().unwrap().remove("statement");
        d["sign-in-with-x"]["info"].as_object_mut().unwrap().remove("resources");
        d["sign-in-with-x"]["info"].as_object_mut().unwrap().remove("expirationTime");
        let m = parse(&d).unwrap().message();
        assert!(m.contains("0x70997970C51812dc3A010C7d01b50e0d17dc79C8\n\n\nURI: "), "{m:?}");
        assert!(m.ends_with("Issued At: 2026-12-03T11:59:30.000Z"), "{m:?}");
    }

    #[test]
    fn the_header_echoes_the_challenge_and_its_signature_recovers_to_the_payer() {
        let c = parse(&declaration()).unwrap();
        let header = sign_in(&signer(), &c).unwrap();
        let p: Value = serde_json::from_slice(&STANDARD.decode(header).unwrap()).unwrap();
        assert_eq!(p["address"], "0x70997970C51812dc3A010C7d01b50e0d17dc79C8");
        assert_eq!(p["chainId"], "eip155:84532");
        assert_eq!(p["type"], "eip191");
        assert_eq!(p["nonce"], "a1b2c3d4e5f6a7b8");
        assert_eq!(p["resources"][0], "http://127.0.0.1:4021/v2/siwx");
        assert!(p.get("notBefore").is_none() && p.get("requestId").is_none(), "no nulls: {p}");
        let sig: Signature = p["signature"].as_str().unwrap().parse().unwrap();
        assert_eq!(sig.recover_address_from_msg(c.message().as_bytes()).unwrap(), signer().address());
    }

    #[test]
    fn a_challenge_for_another_address_is_not_signed() {
        let other = Address::repeat_byte(7);
        let c = Challenge::from_extensions(&declaration(), &url(), network(), other, now()).unwrap();
        assert!(matches!(sign_in(&signer(), &c), Err(SignInError::WrongSigner { .. })));
    }

    #[test]
    fn hostile_challenges_are_refused() {
        let cases: Vec<(&str, Value)> = vec![
            ("/sign-in-with-x/info/domain", json!("evil.example")),
            ("/sign-in-with-x/info/domain", json!("127.0.0.1")),
            ("/sign-in-with-x/info/uri", json!("http://evil.example/v2/siwx")),
            ("/sign-in-with-x/info/uri", json!("https://127.0.0.1:4021/v2/siwx")),
            ("/sign-in-with-x/info/resources", json!(["http://bank.example/transfer"])),
            ("/sign-in-with-x/info/statement", json!("hi\nChain ID: 1")),
            ("/sign-in-with-x/info/statement", json!("x".repeat(300))),
            ("/sign-in-with-x/info/nonce", json!("short")),
            ("/sign-in-with-x/info/nonce", json!("abc def ghi jkl")),
            ("/sign-in-with-x/info/version", json!("2")),
            ("/sign-in-with-x/info/issuedAt", json!("2026-12-03T11:50:00Z")),
            ("/sign-in-with-x/info/issuedAt", json!("2026-12-03T12:10:00Z")),
            ("/sign-in-with-x/info/issuedAt", json!("yesterday")),
            ("/sign-in-with-x/info/expirationTime", json!("2026-12-03T11:59:59Z")),
            ("/sign-in-with-x/info/expirationTime", json!("2027-12-03T12:00:00Z")),
            ("/sign-in-with-x/info/requestId", json!(7)),
            ("/sign-in-with-x/supportedChains", json!([{"chainId": "eip155:1", "type": "eip191"}])),
            ("/sign-in-with-x/supportedChains", json!([{"chainId": "eip155:84532", "type": "ed25519"}])),
            ("/sign-in-with-x/info/resources", json!(vec!["http://127.0.0.1:4021/a"; 9])),
            ("/sign-in-with-x/info", json!("nope")),
        ];
        for (path, value) in cases {
            let d = with(path, value.clone());
            assert!(parse(&d).is_err(), "{path} = {value} was accepted");
        }
        let huge = with("/sign-in-with-x/schema", json!("x".repeat(MAX_EXTENSION_BYTES)));
        assert_eq!(parse(&huge), Err(ChallengeError::TooLarge));
        assert_eq!(parse(&json!({"payment-identifier": {}})), Err(ChallengeError::NotAdvertised));
        assert!(matches!(
            parse(&with("/sign-in-with-x/supportedChains", json!([]))),
            Err(ChallengeError::WrongChain(_))
        ));
    }

    #[test]
    fn the_domain_carries_the_port_only_when_it_is_not_the_default() {
        assert_eq!(authority(&Url::parse("https://api.example.com/x").unwrap()).unwrap(), "api.example.com");
        assert_eq!(authority(&Url::parse("https://api.example.com:443/x").unwrap()).unwrap(), "api.example.com");
        assert_eq!(authority(&Url::parse("http://[::1]:8080/x").unwrap()).unwrap(), "[::1]:8080");
    }
}
