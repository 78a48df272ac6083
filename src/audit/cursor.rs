//! The opaque page cursor: the `(created_at, id)` of the last row served, as base64url
//! (no padding) of a small JSON object. Opaque to clients, so its shape may change; it is
//! not signed because it grants nothing: it only says where the next page starts.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The position after which the next page starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Microsecond precision, as Postgres keeps it.
    pub created_at: DateTime<Utc>,
    pub id: Uuid,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    /// Microseconds since the Unix epoch: exact, unlike a formatted time.
    t: i64,
    id: Uuid,
}

/// Longest cursor text accepted (a real one is about 80 characters).
const MAX_LEN: usize = 256;

impl Cursor {
    /// The cursor text.
    pub fn encode(&self) -> String {
        let wire = Wire { t: self.created_at.timestamp_micros(), id: self.id };
        // Serializing an i64 and a uuid cannot fail; an empty cursor would only restart.
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&wire).unwrap_or_default())
    }

    /// Parses a cursor text; `None` when it is not one this service made.
    pub fn decode(text: &str) -> Option<Self> {
        if text.len() > MAX_LEN {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text.trim()).ok()?;
        let wire: Wire = serde_json::from_slice(&bytes).ok()?;
        Some(Self { created_at: DateTime::from_timestamp_micros(wire.t)?, id: wire.id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_round_trips_to_the_microsecond() {
        let c =
            Cursor { created_at: DateTime::from_timestamp_micros(1_767_225_600_123_456).unwrap(), id: Uuid::new_v4() };
        assert_eq!(Cursor::decode(&c.encode()), Some(c));
        assert!(!c.encode().contains(['+', '/', '=']));
    }

    #[test]
    fn garbage_is_not_a_cursor() {
        for bad in ["", "abc", "e30", &"A".repeat(400)] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
