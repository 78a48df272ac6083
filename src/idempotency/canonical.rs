//! The request fingerprint: one function for idempotency and receipts.
//!
//! `request_hash` = lowercase hex sha256 of the RFC 8785 (JCS) bytes of
//! `{"body": <parsed JSON body>, "path": <request path>, "query": {<name>: <value> | [<values>]}}`.
//!
//! JCS is only collision-free on I-JSON (RFC 7493), so [`parse_strict`] refuses what JCS
//! would silently merge: duplicate object keys (a parser keeps one of them), and numbers
//! that an IEEE-754 double cannot hold exactly as written (JCS would round them, so
//! `9007199254740993` and `9007199254740992` would hash alike). Invalid UTF-8 and lone
//! surrogates are rejected by the JSON parser itself.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use alloy::primitives::hex;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Why a body is not acceptable JSON.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JsonError {
    #[error("request body is not valid JSON: {0}")]
    Syntax(String),
    #[error("request body has a number that cannot be represented exactly ({0}); send it as a string")]
    Precision(String),
}

/// Parses JSON, refusing duplicate keys and numbers a double cannot hold exactly.
///
/// # Errors
/// [`JsonError`] with a message suitable for a 400 response.
pub fn parse_strict(bytes: &[u8]) -> Result<Value, JsonError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = StrictSeed.deserialize(&mut de).map_err(|e| JsonError::Syntax(e.to_string()))?;
    de.end().map_err(|e| JsonError::Syntax(e.to_string()))?;
    check_number_literals(bytes)?;
    Ok(value)
}

/// The fingerprint of a request (see the module docs).
///
/// # Errors
/// Only if `body` holds a non-finite float, which [`parse_strict`] never produces.
pub fn request_hash(body: &Value, path: &str, query: &str) -> Result<String, serde_json::Error> {
    let query = query_object(query);
    // Borrowed, not copied into a `Value`: the body is serialized once, straight into the
    // canonical bytes. The members are in JCS order already (a unit test holds the bytes equal
    // to those of the document as a JSON object).
    let doc = Document { body, path, query: &query };
    Ok(sha256_hex(&serde_jcs::to_vec(&doc)?))
}

/// The digest of a request's bytes as they arrived (body, path, query, each length-framed):
/// equal digests mean identical bytes, so an answer recorded with a digest may answer a
/// request with the same digest without the body being parsed again (the Redis replay's
/// fast path). Not a fingerprint: two spellings of one request have one [`request_hash`] and
/// two digests.
#[must_use]
pub fn raw_digest(raw: &[u8], path: &str, query: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"x402-router/raw-request/v1\0");
    for part in [path.as_bytes(), query.as_bytes(), raw] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    hex::encode(h.finalize())
}

/// The fingerprinted document.
#[derive(serde::Serialize)]
struct Document<'a> {
    body: &'a Value,
    path: &'a str,
    query: &'a Map<String, Value>,
}

/// The query string as the fingerprint holds it: each name once, its value, or its values in
/// order when repeated.
fn query_object(query: &str) -> Map<String, Value> {
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        params.entry(name.into_owned()).or_default().push(value.into_owned());
    }
    params
        .into_iter()
        .map(|(name, mut values)| {
            let v = if values.len() == 1 {
                Value::String(values.remove(0))
            } else {
                Value::Array(values.into_iter().map(Value::String).collect())
            };
            (name, v)
        })
        .collect()
}

/// Lowercase hex sha256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

struct StrictSeed;

impl<'de> DeserializeSeed<'de> for StrictSeed {
    type Value = Value;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v).map(Value::Number).ok_or_else(|| E::custom("number out of range"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictSeed)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate object key {key:?}")));
            }
            let value = map.next_value_seed(StrictSeed)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

/// Walks the (already valid) JSON text and checks every number literal.
fn check_number_literals(bytes: &[u8]) -> Result<(), JsonError> {
    let mut i = 0;
    let mut in_string = false;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            match b {
                b'\\' => i += 2,
                b'"' => {
                    in_string = false;
                    i += 1;
                }
                _ => i += 1,
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                while i < bytes.len() && matches!(bytes[i], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    i += 1;
                }
                let literal = std::str::from_utf8(&bytes[start..i]).unwrap_or_default();
                if !exactly_representable(literal) {
                    return Err(JsonError::Precision(literal.chars().take(40).collect()));
                }
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// True when the decimal literal denotes exactly the number that its nearest double
/// prints as in JCS (the ECMAScript shortest round-trip form), i.e. JCS will not change its
/// value. JCS's own formatter is the reference: where two shortest forms are equally close
/// (`1205387014673215.2` and `…15.3` for the double `…15.25`), ECMAScript takes the even
/// digit and Rust's `Display` may not, and the canonical form must parse again.
fn exactly_representable(literal: &str) -> bool {
    let Ok(v) = literal.parse::<f64>() else {
        return false;
    };
    if !v.is_finite() {
        return false;
    }
    let Ok(jcs) = serde_jcs::to_string(&v) else {
        return false;
    };
    normalize(literal) == normalize(&jcs)
}

/// Decimal literal → (negative, significant digits, exponent); zero → (false, "", 0).
fn normalize(literal: &str) -> Option<(bool, String, i64)> {
    let (negative, rest) = match literal.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, literal),
    };
    let (mantissa, exp) = match rest.find(['e', 'E']) {
        Some(pos) => (&rest[..pos], rest[pos + 1..].parse::<i64>().ok()?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mut digits: String = format!("{int_part}{frac_part}");
    let mut exp = exp - i64::try_from(frac_part.len()).ok()?;
    let trimmed = digits.trim_start_matches('0');
    digits = trimmed.to_owned();
    while digits.ends_with('0') {
        digits.pop();
        exp += 1;
    }
    if digits.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, digits, exp))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn raw_digests_frame_their_parts() {
        let d = |raw: &[u8], path, query| raw_digest(raw, path, query);
        assert_eq!(d(b"{}", "/route", ""), d(b"{}", "/route", ""));
        // Bytes moved across a boundary are another request.
        assert_ne!(d(b"{}", "/route", "a"), d(b"{}", "/routea", ""));
        assert_ne!(d(b"a{}", "/route", ""), d(b"{}", "/route", "a"));
        // One request, two spellings: one fingerprint, two digests.
        assert_ne!(d(br#"{"a":1}"#, "/route", ""), d(br#"{ "a": 1 }"#, "/route", ""));
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert!(parse_strict(br#"{"a":1,"a":2}"#).is_err());
        assert!(parse_strict(br#"{"x":{"b":1,"b":1}}"#).is_err());
        assert!(parse_strict(br#"[{"b":1},{"b":1}]"#).is_ok());
    }

    #[test]
    fn numbers_that_jcs_would_round_are_refused() {
        assert!(parse_strict(b"9007199254740993").is_err());
        assert!(parse_strict(b"[12345678901234567890123]").is_err());
        assert!(parse_strict(b"0.10000000000000000001").is_err());
        assert!(parse_strict(b"1e400").is_err());
        // 2^60 is a double, but JCS prints it as 1152921504606847000: two literals, one hash.
        assert!(parse_strict(b"1152921504606846976").is_err());
    }

    #[test]
    fn ordinary_numbers_are_accepted() {
        for ok in ["9007199254740992", "-9007199254740992", "0", "-0", "1.0", "1e21", "0.1", "1E-7", "2.5e3", "100"] {
            assert!(parse_strict(ok.as_bytes()).is_ok(), "{ok}");
        }
    }

    #[test]
    fn strings_with_digits_and_escapes_are_not_numbers() {
        assert!(parse_strict(br#"{"n":"9007199254740993","q":"a\"12345678901234567890123"}"#).is_ok());
    }

    #[test]
    fn invalid_unicode_is_refused() {
        assert!(parse_strict(br#""\ud800""#).is_err());
        assert!(parse_strict(b"\"\xff\"").is_err());
    }

    #[test]
    fn hash_ignores_key_order_and_whitespace_but_not_values() {
        let a = parse_strict(br#"{"a":1,"b":[1,2]}"#).unwrap_or_default();
        let b = parse_strict(br#"{ "b" : [1, 2], "a" : 1.0 }"#).unwrap_or_default();
        let c = parse_strict(br#"{"a":2,"b":[1,2]}"#).unwrap_or_default();
        let h = |v: &Value| request_hash(v, "/route", "").unwrap_or_default();
        assert_eq!(h(&a), h(&b));
        assert_ne!(h(&a), h(&c));
        assert_eq!(h(&a).len(), 64);
    }

    #[test]
    fn query_is_part_of_the_hash_and_repeats_keep_order() {
        let v = Value::Null;
        let h = |q: &str| request_hash(&v, "/route", q).unwrap_or_default();
        assert_eq!(h("a=1&b=2"), h("b=2&a=1"));
        assert_ne!(h("a=1&a=2"), h("a=2&a=1"));
        assert_ne!(h(""), h("a=1"));
    }

    #[test]
    fn hash_matches_an_independent_computation() {
        // sha256 of {"body":{"x":1},"path":"/route","query":{}} computed with Python's
        // hashlib over the hand-written canonical text.
        let v = parse_strict(br#"{"x":1}"#).unwrap_or_default();
        assert_eq!(
            request_hash(&v, "/route", "").unwrap_or_default(),
            sha256_hex(br#"{"body":{"x":1},"path":"/route","query":{}}"#)
        );
    }

    #[test]
    fn serde_jcs_follows_rfc_8785_number_and_ordering_rules() {
        // Property ordering by UTF-16 code units (RFC 8785 §3.2.3 example).
        let v = parse_strict(
            "{\"\\u20ac\":\"Euro Sign\",\"\\r\":\"Carriage Return\",\"\\ufb33\":\"Hebrew Letter Dalet With Dagesh\",\
             \"1\":\"One\",\"\\ud83d\\ude00\":\"Emoji: Grinning Face\",\"\\u0080\":\"Control\",\"\\u00f6\":\"Latin Small Letter O With Diaeresis\"}"
                .as_bytes(),
        )
        .unwrap();
        let keys: Vec<String> =
            serde_json::from_str::<serde_json::Map<String, Value>>(&serde_jcs::to_string(&v).unwrap())
                .map(|m| m.keys().cloned().collect())
                .unwrap_or_default();
        let jcs = serde_jcs::to_string(&v).unwrap();
        let order: Vec<usize> = ["\\r", "1", "\u{80}", "ö", "€", "😀", "\u{fb33}"]
            .iter()
            .map(|k| jcs.find(&format!("\"{k}\"")).unwrap_or(usize::MAX))
            .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{jcs}");
        assert_eq!(keys.len(), 7);
        // ES6 number serialization (RFC 8785 §3.2.2.3).
        for (input, expected) in [
            ("1.0", "1"),
            ("1e21", "1e+21"),
            ("1E30", "1e+30"),
            ("-0", "0"),
            ("1e-7", "1e-7"),
            ("0.000001", "0.000001"),
            ("333333333.33333329", "333333333.3333333"),
        ] {
            let v: Value = serde_json::from_str(input).unwrap();
            assert_eq!(serde_jcs::to_string(&v).unwrap(), expected, "{input}");
        }
    }

    #[test]
    fn the_borrowed_document_has_the_bytes_of_the_json_object() {
        let bodies = [
            json!({"url": "https://a.example/x?y=1", "method": "POST", "body": {"z": [1, 2.5, "é\u{0}"], "a": null}}),
            json!({"b": {"\u{20ac}": 1e300, "a": -0.0}, "a": [true, false, {}]}),
            json!({}),
        ];
        for body in bodies {
            for query in ["", "a=1&a=2&b=%C3%A9", "z&y=&x=1"] {
                let object = json!({ "body": body, "path": "/route", "query": query_object(query) });
                let expected = sha256_hex(serde_jcs::to_string(&object).unwrap().as_bytes());
                assert_eq!(request_hash(&body, "/route", query).unwrap(), expected, "{body} {query}");
            }
        }
    }

    #[test]
    fn a_number_is_accepted_as_jcs_writes_it_and_refused_as_it_would_be_rewritten() {
        // The double 1205387014673215.25: both neighbours read back as it; JCS writes `.2`.
        let canonical = serde_jcs::to_string(&"1205387014673215.25".parse::<f64>().unwrap()).unwrap();
        assert_eq!(canonical, "1205387014673215.2");
        assert!(parse_strict(br#"{"a":1205387014673215.2}"#).is_ok(), "the canonical form parses again");
        assert!(
            matches!(parse_strict(br#"{"a":1205387014673215.3}"#), Err(JsonError::Precision(_))),
            "a spelling that JCS would rewrite is refused"
        );
        assert!(parse_strict(b"[1e21, 1e+21, 0.1, 5e-324, 1.7976931348623157e308]").is_ok());
    }
}
