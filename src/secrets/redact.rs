//! Redacting secret query parameters from every URL the router shows or keeps in the clear:
//! receipts (signed as shown), the ledger's `request_url` and its copies of the 402's terms,
//! the audit API and its CSV, the recovery log. The upstream is always sent the real URL.
//!
//! A parameter is secret when its name, percent-decoded (`+` as a space) and compared without
//! regard to letter case, is one of `REDACT_QUERY_PARAMS` (default `api_key`, `key`, `token`,
//! `sig`). Every occurrence is redacted (a repeated parameter too): its value, up to the next
//! `&`, `;`, `#`, white space, quote or angle bracket, becomes [`REDACTED`]. The same scan
//! finds such parameters in free text (an error message quoting a URL, a string of a 402):
//! a name counts where it starts the text or follows `?`, `&`, `;` or `#`.

use std::borrow::Cow;

use serde_json::Value;
use url::Url;

/// What a secret parameter's value becomes.
pub const REDACTED: &str = "REDACTED";
/// `REDACT_QUERY_PARAMS` by default.
pub const DEFAULT_NAMES: &str = "api_key,key,token,sig";

/// The names of the secret query parameters (lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redaction {
    names: Vec<String>,
}

impl Default for Redaction {
    fn default() -> Self {
        let mut names: Vec<String> = DEFAULT_NAMES.split(',').map(str::to_owned).collect();
        names.sort();
        Self { names }
    }
}

/// A bad `REDACT_QUERY_PARAMS`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected comma-separated parameter names (visible ASCII, without `=&;#?`)")]
pub struct BadNames;

/// Bytes that end a parameter's name.
fn ends_name(b: u8) -> bool {
    matches!(b, b'=' | b'&' | b';' | b'#' | b'?' | b'"' | b'\'' | b'<' | b'>' | b'\\') || b.is_ascii_whitespace()
}

/// Bytes that end a parameter's value.
fn ends_value(b: u8) -> bool {
    matches!(b, b'&' | b';' | b'#' | b'"' | b'\'' | b'<' | b'>' | b'\\') || b.is_ascii_whitespace()
}

impl Redaction {
    /// Parses `REDACT_QUERY_PARAMS`: names separated by commas; empty: nothing is redacted.
    ///
    /// # Errors
    /// [`BadNames`] for a name that could never be matched.
    pub fn parse(list: &str) -> Result<Self, BadNames> {
        let mut names: Vec<String> = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !name.bytes().all(|b| b.is_ascii_graphic() && !ends_name(b)) {
                return Err(BadNames);
            }
            let name = name.to_ascii_lowercase();
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names.sort();
        Ok(Self { names })
    }

    /// The names, lowercase and sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// `url` as shown: its secret parameters redacted.
    pub fn url(&self, url: &Url) -> String {
        self.text(url.as_str()).into_owned()
    }

    fn is_secret(&self, raw_name: &[u8]) -> bool {
        if self.names.is_empty() || raw_name.is_empty() {
            return false;
        }
        let decoded: Vec<u8> = url::form_urlencoded::parse(raw_name)
            .next()
            .map_or_else(Vec::new, |(k, _)| k.as_bytes().iter().map(u8::to_ascii_lowercase).collect());
        self.names.iter().any(|n| n.as_bytes() == decoded.as_slice())
    }

    /// `s` with the value of every secret parameter in it redacted (borrowed when none is).
    pub fn text<'a>(&self, s: &'a str) -> Cow<'a, str> {
        let bytes = s.as_bytes();
        let mut out: Option<String> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            let starts = i == 0 || matches!(bytes[i - 1], b'?' | b'&' | b';' | b'#');
            if !starts || ends_name(bytes[i]) {
                i += 1;
                continue;
            }
            let mut j = i;
            while j < bytes.len() && !ends_name(bytes[j]) {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == b'=' && self.is_secret(&bytes[i..j]) {
                let start = j + 1;
                let mut end = start;
                while end < bytes.len() && !ends_value(bytes[end]) {
                    end += 1;
                }
                // Separators are ASCII, so `start` and `end` are character boundaries.
                let o = out.get_or_insert_with(|| String::with_capacity(s.len()));
                o.push_str(&s[copied..start]);
                o.push_str(REDACTED);
                copied = end;
                i = end;
            } else {
                i = j.max(i + 1);
            }
        }
        match out {
            None => Cow::Borrowed(s),
            Some(mut o) => {
                o.push_str(&s[copied..]);
                Cow::Owned(o)
            }
        }
    }

    /// `v` with [`Self::text`] applied to every string and object key.
    pub fn json(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.text(s).into_owned()),
            Value::Array(items) => Value::Array(items.iter().map(|i| self.json(i)).collect()),
            Value::Object(map) => {
                Value::Object(map.iter().map(|(k, v)| (self.text(k).into_owned(), self.json(v))).collect())
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => v.clone(),
        }
    }

    /// JSON bytes with [`Self::json`] applied; bytes that are not JSON are redacted as text
    /// (lossily, if they are not UTF-8).
    pub fn json_bytes(&self, bytes: &[u8]) -> Vec<u8> {
        match serde_json::from_slice::<Value>(bytes) {
            Ok(v) => serde_json::to_vec(&self.json(&v)).unwrap_or_default(),
            Err(_) => self.text(&String::from_utf8_lossy(bytes)).into_owned().into_bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn shown(u: &str) -> String {
        Redaction::default().url(&Url::parse(u).unwrap())
    }

    #[test]
    fn secret_parameters_are_redacted_in_any_case_encoding_and_repetition() {
        assert_eq!(shown("https://a.test/p?api_key=s3cr3t&q=1"), "https://a.test/p?api_key=REDACTED&q=1");
        assert_eq!(shown("https://a.test/p?API_KEY=s3cr3t"), "https://a.test/p?API_KEY=REDACTED");
        assert_eq!(shown("https://a.test/p?api%5Fkey=s3cr3t"), "https://a.test/p?api%5Fkey=REDACTED");
        assert_eq!(shown("https://a.test/p?%6Bey=s3%63r3t"), "https://a.test/p?%6Bey=REDACTED");
        assert_eq!(
            shown("https://a.test/p?token=a&x=1&Token=b;sig=c#key=d"),
            "https://a.test/p?token=REDACTED&x=1&Token=REDACTED;sig=REDACTED#key=REDACTED"
        );
        assert_eq!(shown("https://a.test/p?keys=1&monkey=2&akey=3"), "https://a.test/p?keys=1&monkey=2&akey=3");
        assert_eq!(shown("https://a.test/p?key="), "https://a.test/p?key=REDACTED");
        assert_eq!(shown("https://a.test/key=1/p?q"), "https://a.test/key=1/p?q");
    }

    #[test]
    fn urls_quoted_in_text_and_json_are_redacted_too() {
        let r = Redaction::default();
        assert_eq!(
            r.text("refused: uri \"https://a.test/x?sig=abc&b=1\" is not this origin"),
            "refused: uri \"https://a.test/x?sig=REDACTED&b=1\" is not this origin"
        );
        assert!(matches!(r.text("nothing secret here: a=b"), Cow::Borrowed(_)));
        assert_eq!(r.text("token=abc def"), "token=REDACTED def");
        let v = json!({"resource": {"url": "http://u.test/w?api_key=k1"}, "accepts": [{"resource": "http://u.test/?key=k2"}], "n": 1});
        assert_eq!(
            r.json(&v),
            json!({"resource": {"url": "http://u.test/w?api_key=REDACTED"}, "accepts": [{"resource": "http://u.test/?key=REDACTED"}], "n": 1})
        );
        assert_eq!(r.json_bytes(br#"{"u":"x?token=t"}"#), br#"{"u":"x?token=REDACTED"}"#);
    }

    #[test]
    fn the_names_are_configurable_and_empty_redacts_nothing() {
        let r = Redaction::parse(" Access_Token , sig ,sig").unwrap();
        assert_eq!(r.names(), ["access_token", "sig"]);
        assert_eq!(r.text("?access_token=a&key=b&SIG=c"), "?access_token=REDACTED&key=b&SIG=REDACTED");
        assert_eq!(Redaction::parse("").unwrap().text("?key=a"), "?key=a");
        assert_eq!(Redaction::parse("a=b"), Err(BadNames));
        assert_eq!(Redaction::parse("a b"), Err(BadNames));
        assert_eq!(Redaction::parse(DEFAULT_NAMES).unwrap(), Redaction::default());
        assert_eq!(Redaction::default(), Redaction::parse("sig,token,key,api_key").unwrap());
    }
}
