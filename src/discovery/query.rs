//! `GET /discovery`'s query string, parsed strictly (an unknown or repeated parameter is a 400,
//! as on the other endpoints).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use std::collections::HashMap;

use super::parse::Kind;
use crate::money::Amount;

/// Resources per page when `limit` is absent.
pub const DEFAULT_LIMIT: usize = 20;
/// The largest `limit`.
pub const MAX_LIMIT: usize = 100;
/// Longest `q`, in characters.
const MAX_Q_CHARS: usize = 200;

/// A malformed discovery query; the message names the parameter and why (a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadQuery(pub String);

/// The parameters of a query string, each given at most once and all of them `allowed`.
struct Params(HashMap<String, String>);

impl Params {
    fn parse(query: &str, allowed: &[&str]) -> Result<Self, BadQuery> {
        let mut map = HashMap::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(BadQuery(format!("unknown query parameter `{name}` (allowed: {})", allowed.join(", "))));
            }
            if map.insert(name.to_string(), value.into_owned()).is_some() {
                return Err(BadQuery(format!("`{name}` is given more than once")));
            }
        }
        Ok(Self(map))
    }

    fn take(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }
}

/// What an agent asks discovery for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DiscoveryQuery {
    /// Words (lower case) that must each appear in the URL, description, service name, tags,
    /// tool name or method.
    pub words: Vec<String>,
    /// Only resources with an option at most this price; options above it are not payable.
    pub max_price: Option<Amount>,
    /// Only resources with an option on this network (CAIP-2 or x402 v1 name).
    pub network: Option<String>,
    /// Only resources of this kind.
    pub kind: Option<Kind>,
    /// Only resources this agent may (`true`) or may not (`false`) pay now.
    pub payable: Option<bool>,
    pub limit: usize,
    /// The sort key of the last resource of the previous page.
    pub after: Option<String>,
}

impl DiscoveryQuery {
    /// Parses `q`, `max_price`, `network`, `type`, `payable`, `limit` (1–100, default 20) and
    /// `cursor`.
    ///
    /// # Errors
    /// [`BadQuery`] naming the offending parameter.
    pub fn parse(query: &str) -> Result<Self, BadQuery> {
        let mut p = Params::parse(query, &["q", "max_price", "network", "type", "payable", "limit", "cursor"])?;
        let words = match p.take("q") {
            None => Vec::new(),
            Some(q) if q.chars().count() > MAX_Q_CHARS || q.chars().any(char::is_control) => {
                return Err(BadQuery(format!("`q` must be at most {MAX_Q_CHARS} characters of text")));
            }
            Some(q) => q.split_whitespace().map(str::to_lowercase).collect(),
        };
        let max_price = p
            .take("max_price")
            .map(|v| {
                Amount::parse(&v).map_err(|_| BadQuery("`max_price` must be a decimal string of atomic units".into()))
            })
            .transpose()?;
        let network = match p.take("network") {
            Some(n) if n.is_empty() || n.len() > 128 || !n.bytes().all(|b| b.is_ascii_graphic()) => {
                return Err(BadQuery("`network` must be a network id, e.g. eip155:8453".into()));
            }
            n => n,
        };
        let kind = match p.take("type").as_deref() {
            None => None,
            Some("http") => Some(Kind::Http),
            Some("mcp") => Some(Kind::Mcp),
            Some(_) => return Err(BadQuery("`type` must be `http` or `mcp`".into())),
        };
        let payable = match p.take("payable").as_deref() {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(_) => return Err(BadQuery("`payable` must be `true` or `false`".into())),
        };
        let limit = match p.take("limit") {
            None => DEFAULT_LIMIT,
            Some(v) => v
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=MAX_LIMIT).contains(l))
                .ok_or_else(|| BadQuery(format!("`limit` must be an integer from 1 to {MAX_LIMIT}")))?,
        };
        let after = p.take("cursor").map(|c| decode_cursor(&c)).transpose()?;
        Ok(Self { words, max_price, network, kind, payable, limit, after })
    }
}

/// The cursor naming the sort key `key`.
pub fn encode_cursor(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

fn decode_cursor(cursor: &str) -> Result<String, BadQuery> {
    let bad = || BadQuery("`cursor` is not valid".into());
    if cursor.len() > 8192 {
        return Err(bad());
    }
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parameter_is_parsed_and_strangers_refused() {
        let q = DiscoveryQuery::parse(&format!(
            "q=Weather+Paris&max_price=50000&network=eip155:8453&type=http&payable=true&limit=5&cursor={}",
            encode_cursor("k")
        ))
        .unwrap();
        assert_eq!(q.words, vec!["weather".to_owned(), "paris".to_owned()]);
        assert_eq!(q.max_price, Some(Amount::from(50_000)));
        assert_eq!(
            (q.network.as_deref(), q.kind, q.payable, q.limit),
            (Some("eip155:8453"), Some(Kind::Http), Some(true), 5)
        );
        assert_eq!(q.after.as_deref(), Some("k"));
        assert_eq!(DiscoveryQuery::parse("").unwrap().limit, DEFAULT_LIMIT);
        for bad in [
            "qq=1",
            "q=a&q=b",
            "max_price=1.5",
            "max_price=-1",
            "max_price=0x10",
            "limit=0",
            "limit=101",
            "type=ftp",
            "payable=yes",
            "cursor=%%%",
            "network=",
            "q=%00",
        ] {
            assert!(DiscoveryQuery::parse(bad).is_err(), "{bad}");
        }
    }
}
