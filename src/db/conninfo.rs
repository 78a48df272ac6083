//! `DATABASE_URL` in either of libpq's two forms, taken apart into its parameters and put
//! back together, so that the router can remove the TLS parameters it handles itself and
//! add the session options ([`crate::config::DatabaseConfig::session_url`]) without
//! understanding the rest:
//!
//! - a URL, `postgres://user@host1:5432,host2:5433/db?target_session_attrs=read-write`
//!   (several hosts allowed, which a generic URL parser refuses: only the query is parsed);
//! - key/value pairs, `host=a,b port=5432,5433 dbname=db target_session_attrs=read-write`
//!   (values may be single-quoted, with `\'` and `\\` escapes).
//!
//! tokio-postgres reads both, several hosts included: it tries them in order and, with
//! `target_session_attrs=read-write`, skips a server that is read-only (a standby).

/// A malformed libpq connection string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadConnInfo(pub String);

impl From<String> for BadConnInfo {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl From<&str> for BadConnInfo {
    fn from(s: &str) -> Self {
        Self(s.to_owned())
    }
}

/// A connection string's form and its parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// `Some(everything before '?')` for the URL form; `None` for key/value pairs.
    url_base: Option<String>,
    params: Vec<(String, String)>,
}

impl ConnInfo {
    /// Parses a `postgres://`/`postgresql://` URL or libpq key/value pairs.
    ///
    /// # Errors
    /// Neither form, or a key/value string that does not parse (unterminated quote, a
    /// word without `=`).
    pub fn parse(s: &str) -> Result<Self, BadConnInfo> {
        let s = s.trim();
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            let (base, query) = s.split_once('?').unwrap_or((s, ""));
            // libpq reads a '+' in a URL as a plus sign, not as form encoding's space.
            let params = url::form_urlencoded::parse(query.replace('+', "%2B").as_bytes()).into_owned().collect();
            return Ok(Self { url_base: Some(base.to_owned()), params });
        }
        if !s.contains('=') {
            return Err("must be a postgres:// URL or libpq key=value pairs".into());
        }
        Ok(Self { url_base: None, params: parse_key_values(s)? })
    }

    /// Whether this is the key/value form.
    pub fn is_key_value(&self) -> bool {
        self.url_base.is_none()
    }

    /// The value of `key` (the first, if repeated).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Removes `key` and returns its value.
    ///
    /// # Errors
    /// `key` given more than once.
    pub fn take(&mut self, key: &str) -> Result<Option<String>, BadConnInfo> {
        let mut found: Vec<String> = Vec::new();
        self.params.retain(|(k, v)| {
            if k == key {
                found.push(v.clone());
                false
            } else {
                true
            }
        });
        match found.len() {
            0 => Ok(None),
            1 => Ok(found.pop()),
            _ => Err(format!("{key} is given twice").into()),
        }
    }

    /// Sets `key`: appends `value` to the existing value after a space, or adds the key.
    pub fn append(&mut self, key: &str, value: &str) {
        match self.params.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) if !v.is_empty() => *v = format!("{v} {value}"),
            Some((_, v)) => *v = value.to_owned(),
            None => self.params.push((key.to_owned(), value.to_owned())),
        }
    }
}

impl std::fmt::Display for ConnInfo {
    /// The connection string in its original form.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.url_base {
            Some(base) => {
                f.write_str(base)?;
                // Percent-encoded with spaces as `%20`: libpq-style parsers (tokio-postgres
                // among them) read a `+` as a plus sign, so form encoding would corrupt e.g.
                // `options`.
                let enc = |s: &str| {
                    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20")
                };
                for (i, (k, v)) in self.params.iter().enumerate() {
                    write!(f, "{}{}={}", if i == 0 { "?" } else { "&" }, enc(k), enc(v))?;
                }
                Ok(())
            }
            None => {
                for (i, (k, v)) in self.params.iter().enumerate() {
                    let quoted = v.replace('\\', "\\\\").replace('\'', "\\'");
                    write!(f, "{}{k}='{quoted}'", if i == 0 { "" } else { " " })?;
                }
                Ok(())
            }
        }
    }
}

/// libpq's key/value syntax: `key = value` pairs separated by whitespace; a value is a word
/// or a single-quoted string; a backslash escapes the next character in both.
fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, BadConnInfo> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    let skip_ws = |it: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while it.peek().is_some_and(|c| c.is_whitespace()) {
            it.next();
        }
    };
    loop {
        skip_ws(&mut chars);
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c.is_whitespace() {
                break;
            }
            key.push(c);
            chars.next();
        }
        skip_ws(&mut chars);
        if chars.next() != Some('=') {
            return Err(format!("connection parameter {key:?} has no value (key=value)").into());
        }
        skip_ws(&mut chars);
        let mut value = String::new();
        if chars.peek() == Some(&'\'') {
            chars.next();
            loop {
                match chars.next() {
                    Some('\\') => value.push(chars.next().ok_or("unterminated quoted value")?),
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(format!("unterminated quoted value of {key:?}").into()),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                chars.next();
                if c == '\\' {
                    value.push(chars.next().ok_or("a trailing backslash")?);
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_multi_host_url_keeps_its_hosts_and_its_query_round_trips() {
        let mut c =
            ConnInfo::parse("postgres://u:p@a:5432,b:5433/db?target_session_attrs=read-write&sslmode=require").unwrap();
        assert_eq!(c.take("sslmode").unwrap().as_deref(), Some("require"));
        c.append("options", "-c lock_timeout=5");
        assert_eq!(
            c.to_string(),
            "postgres://u:p@a:5432,b:5433/db?target_session_attrs=read-write&options=-c%20lock_timeout%3D5"
        );
        let plus = ConnInfo::parse("postgres://db/x?options=-c%20search_path%3Dx+y").unwrap();
        assert_eq!(plus.get("options"), Some("-c search_path=x+y"));
    }

    #[test]
    fn key_value_pairs_parse_with_quotes_and_escapes_and_round_trip() {
        let mut c = ConnInfo::parse(
            "host=127.0.0.1,127.0.0.1 port = 5433,5434 user=postgres options='-c a=1' password='it\\'s' \
             target_session_attrs=read-write sslmode=disable",
        )
        .unwrap();
        assert!(c.is_key_value());
        assert_eq!(c.get("port"), Some("5433,5434"));
        assert_eq!(c.get("password"), Some("it's"));
        assert_eq!(c.take("sslmode").unwrap().as_deref(), Some("disable"));
        c.append("options", "-c b=2");
        let s = c.to_string();
        assert_eq!(
            s,
            "host='127.0.0.1,127.0.0.1' port='5433,5434' user='postgres' options='-c a=1 -c b=2' \
             password='it\\'s' target_session_attrs='read-write'"
        );
        assert_eq!(ConnInfo::parse(&s).unwrap(), c);
        // tokio-postgres reads what we write.
        let parsed: tokio_postgres::Config = s.parse().unwrap();
        assert_eq!(parsed.get_ports(), [5433, 5434]);
        assert_eq!(parsed.get_options(), Some("-c a=1 -c b=2"));
    }

    #[test]
    fn malformed_strings_are_refused() {
        assert!(ConnInfo::parse("not a connection string").is_err());
        assert!(ConnInfo::parse("host=a port").is_err());
        assert!(ConnInfo::parse("host='a").is_err());
        let mut twice = ConnInfo::parse("host=a sslmode=disable sslmode=require").unwrap();
        assert!(twice.take("sslmode").is_err());
    }
}
