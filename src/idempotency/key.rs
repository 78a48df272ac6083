//! The `Idempotency-Key` header value.

use std::fmt;

/// A validated idempotency key: 16–128 characters of visible ASCII (0x21–0x7E).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// The header value was missing or not a valid key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("Idempotency-Key header required (16–128 chars)")]
pub struct InvalidKey;

impl IdempotencyKey {
    pub const MIN_LEN: usize = 16;
    pub const MAX_LEN: usize = 128;

    /// Parses a raw header value.
    ///
    /// # Errors
    /// [`InvalidKey`] when absent, too short, too long, or containing anything but
    /// visible ASCII (no spaces, no control characters, no non-ASCII bytes).
    pub fn parse(raw: Option<&[u8]>) -> Result<Self, InvalidKey> {
        let raw = raw.ok_or(InvalidKey)?;
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&raw.len()) || !raw.iter().all(|b| (0x21..=0x7e).contains(b)) {
            return Err(InvalidKey);
        }
        // All bytes are ASCII, so this cannot fail; map anyway rather than unwrap.
        std::str::from_utf8(raw).map(|s| Self(s.to_owned())).map_err(|_| InvalidKey)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_bounds_and_rejects_outside() {
        assert!(IdempotencyKey::parse(Some(&[b'a'; 16])).is_ok());
        assert!(IdempotencyKey::parse(Some(&[b'~'; 128])).is_ok());
        assert_eq!(IdempotencyKey::parse(Some(&[b'a'; 15])), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse(Some(&[b'a'; 129])), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse(Some(b"")), Err(InvalidKey));
        assert_eq!(IdempotencyKey::parse(None), Err(InvalidKey));
    }

    #[test]
    fn rejects_spaces_controls_and_non_ascii() {
        assert!(IdempotencyKey::parse(Some(b"aaaaaaaa aaaaaaaa")).is_err());
        assert!(IdempotencyKey::parse(Some(b"aaaaaaaa\taaaaaaaa")).is_err());
        assert!(IdempotencyKey::parse(Some("aaaaaaaaaaaaaaaé".as_bytes())).is_err());
    }
}
