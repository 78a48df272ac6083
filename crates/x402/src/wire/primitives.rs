//! Bounded readers shared by the wire messages: base64 JSON headers, fields, addresses.

use alloy::primitives::{Address, B256};
use base64::Engine as _;
use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use super::{EntryError, MAX_HEADER_BYTES, MAX_REASON_BYTES, STANDARD_LENIENT, URL_SAFE_LENIENT, WireError};

/// Reads one x402 header as base64 JSON. `Ok(None)` when absent.
pub(crate) fn header_json(headers: &HeaderMap, name: &'static str) -> Result<Option<Value>, WireError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(WireError::DuplicateHeader(name));
    }
    decode_json_header(name, value).map(Some)
}

pub(crate) fn decode_json_header(name: &'static str, value: &HeaderValue) -> Result<Value, WireError> {
    let raw = value.as_bytes();
    if raw.len() > MAX_HEADER_BYTES {
        return Err(WireError::HeaderTooLarge { header: name, len: raw.len(), limit: MAX_HEADER_BYTES });
    }
    let compact: Vec<u8> = raw.iter().copied().filter(|b| !b.is_ascii_whitespace()).collect();
    let engine = if compact.iter().any(|&b| b == b'-' || b == b'_') { &URL_SAFE_LENIENT } else { &STANDARD_LENIENT };
    let json = engine.decode(&compact).map_err(|_| WireError::BadBase64(name))?;
    serde_json::from_slice(&json).map_err(|source| WireError::BadJson { what: name, source })
}

pub(crate) fn str_field<'a>(obj: &'a Map<String, Value>, field: &'static str) -> Result<&'a str, EntryError> {
    obj.get(field).and_then(Value::as_str).ok_or(EntryError::MissingField(field))
}

/// A string field of an upstream message, bounded; `None` if absent, empty or not a string.
pub(crate) fn reason_field(obj: &Map<String, Value>, field: &str) -> Option<String> {
    obj.get(field).and_then(Value::as_str).filter(|s| !s.is_empty()).map(|s| truncate(s, MAX_REASON_BYTES))
}

/// Parses `0x` + 40 hex digits; a mixed-case address must carry a valid EIP-55 checksum.
pub(crate) fn parse_address(s: &str) -> Option<Address> {
    let hex = s.strip_prefix("0x")?;
    if hex.len() != 40 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let has_upper = hex.bytes().any(|b| b.is_ascii_uppercase());
    let has_lower = hex.bytes().any(|b| b.is_ascii_lowercase());
    if has_upper && has_lower { Address::parse_checksummed(s, None).ok() } else { s.parse().ok() }
}

/// Parses `0x` + 64 hex digits.
pub(crate) fn parse_b256(s: &str) -> Option<B256> {
    let hex = s.strip_prefix("0x")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    s.parse().ok()
}

/// Cuts `s` to at most `max` bytes at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
