//! The parts of an intent that may carry an agent's secrets, as the ledger holds them
//! (docs/DESIGN.md §10). Data only: sealing and opening is `crate::secrets`, which the ledger
//! does not know.
//!
//! What an agent forwards (every header, the full URL, the body) and what echoes it (the
//! 402's terms and context, whose `resource` repeats the URL; the payment header built from
//! them) are written only sealed (`payments.sealed`, under the key `payments.sealed_key_id`).
//! Beside them the row keeps what may be shown: the method, the URL with its secret query
//! parameters redacted, redacted copies of the terms, the context and the advertised
//! extensions. The sealed parts are dropped (set NULL) once the payment is `settled` (its
//! answer was served: nothing will be re-sent) and by `gc` past `SECRETS_RETENTION_HOURS`.

use serde_json::Value;

/// An intent's exact parts, in the clear (in memory only): what a takeover re-sends or
/// re-signs and what recovery re-sends byte for byte.
#[derive(Clone, PartialEq, Eq)]
pub struct Exact {
    /// The paid request as sent; `None` for intents written before it was recorded.
    pub request: Option<SentRequest>,
    /// The payment header's value as sent.
    pub header_value: String,
    /// The chosen requirement exactly as signed (JSON bytes).
    pub requirement_json: Vec<u8>,
    /// The 402's context exactly as signed: `{version, resource, extensions}` (JSON bytes).
    pub context_json: Vec<u8>,
    /// The 402's `extensions` exactly as advertised (JSON bytes; `None`: none).
    pub advertised_extensions: Option<Vec<u8>>,
}

impl std::fmt::Debug for Exact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Exact(…)")
    }
}

impl Exact {
    /// The chosen requirement as signed.
    ///
    /// # Errors
    /// A stored copy that is not JSON.
    pub fn requirement(&self) -> serde_json::Result<Value> {
        serde_json::from_slice(&self.requirement_json)
    }

    /// The 402's context as signed.
    ///
    /// # Errors
    /// A stored copy that is not JSON.
    pub fn context(&self) -> serde_json::Result<Value> {
        serde_json::from_slice(&self.context_json)
    }
}

/// Sealed bytes and the id of the key that sealed them.
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub key_id: String,
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sealed(key {:?}, {} bytes)", self.key_id, self.bytes.len())
    }
}

/// What the row shows of an intent's exact parts: secret query parameters redacted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown {
    pub request_method: Option<String>,
    pub request_url: Option<String>,
    pub requirement: Value,
    pub context: Value,
    pub advertised_extensions: Option<Vec<u8>>,
}

/// An intent's exact parts as written: sealed, and shown.
#[derive(Debug, Clone)]
pub struct Kept {
    pub sealed: Sealed,
    pub shown: Shown,
}

/// An intent's exact parts as read back (`crate::secrets::intent::open`).
#[derive(Debug, Clone)]
pub enum Opened {
    /// Opened.
    Exact(Box<Exact>),
    /// Dropped: the payment is settled, or older than `SECRETS_RETENTION_HOURS`.
    Dropped,
    /// Sealed, but not openable here (a key `SECRETS_KEY_FILE` no longer lists, or altered bytes).
    Unreadable(String),
}

/// Why an intent's exact parts are not at hand; its message says which, plainly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotKept(pub String);

impl Opened {
    /// The exact parts, or why there are none.
    ///
    /// # Errors
    /// [`NotKept`]: dropped, or unreadable.
    pub fn exact(&self) -> Result<&Exact, NotKept> {
        match self {
            Self::Exact(e) => Ok(e),
            Self::Dropped => Err(NotKept(
                "the request as sent was dropped (it is kept only until the payment is settled, and at most \
                 SECRETS_RETENTION_HOURS)"
                    .into(),
            )),
            Self::Unreadable(why) => Err(NotKept(format!("the request as sent cannot be opened: {why}"))),
        }
    }

    /// The paid request as sent, or why it is not at hand.
    ///
    /// # Errors
    /// [`NotKept`]: dropped, unreadable, or never recorded.
    pub fn request(&self) -> Result<&SentRequest, NotKept> {
        self.exact()?.request.as_ref().ok_or_else(|| NotKept("the request as sent was not recorded".into()))
    }
}

/// A paid request as sent, in storable form: everything needed to send it again
/// byte for byte (with the stored payment header), without the agent's `/route` body.
/// Kept only sealed ([`Exact`]); its `Debug` shows the method only.
#[derive(Clone, PartialEq, Eq)]
pub struct SentRequest {
    pub method: String,
    pub url: String,
    /// JSON array of `[name, value]` pairs, in the order sent.
    pub headers: Vec<u8>,
    pub body: Option<Vec<u8>>,
}

impl std::fmt::Debug for SentRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentRequest").field("method", &self.method).finish_non_exhaustive()
    }
}
