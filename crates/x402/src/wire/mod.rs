//! The x402 wire format, both protocol versions (one file per concept: [`requirements`],
//! [`payment`], [`settlement`], [`primitives`]): reading a `402 Payment Required`, building the
//! payment header of the paid retry, reading the settlement header and the reasons of a refusal.
//!
//! | | v2 | v1 |
//! |---|---|---|
//! | requirements (402) | `PAYMENT-REQUIRED` header, base64 JSON | JSON body |
//! | payment (retry) | `PAYMENT-SIGNATURE` | `X-PAYMENT` |
//! | settlement | `PAYMENT-RESPONSE` | `X-PAYMENT-RESPONSE` |
//!
//! Everything read here comes from an untrusted upstream. Invariants:
//! - Parsing never panics; every failure is a [`WireError`] (whole message) or an
//!   [`EntryError`] (one `accepts` entry). Inputs are bounded: header ≤ [`MAX_HEADER_BYTES`],
//!   v1 body ≤ [`MAX_BODY_BYTES`], ≤ [`MAX_ACCEPTS`] entries, reason strings ≤
//!   [`MAX_REASON_BYTES`]; serde_json bounds nesting depth.
//! - Amounts are `U256` parsed from canonical decimal strings (no sign, no leading zeros, no
//!   exponent, ≤ 2^256−1); addresses must be `0x` + 40 hex digits, with a valid EIP-55
//!   checksum when mixed-case. Nothing is ever a float.
//! - Entry policy: an entry that fails to parse is *skipped* (kept out of selection, listed in
//!   [`PaymentRequired::skipped`]) as long as the message itself is well-formed. Skipped entries
//!   are classed as *unsupported* (a non-EVM network or a scheme other than `exact` that we do
//!   not know how to read) or *malformed*. A 402 whose entries are all malformed is an error
//!   ([`WireError::NoValidRequirement`]): the upstream is broken. A 402 with only unsupported
//!   entries parses, with empty [`PaymentRequired::accepts`]: the upstream is fine, we just
//!   cannot pay it (selection then explains why).
//! - Each [`Requirement`] keeps its JSON object verbatim ([`Requirement::raw`]); a v2 payment
//!   copies it as `accepted`, and a v1 payment echoes the original network string.
//!   "Verbatim" means the same JSON value (serde_json may reorder keys; numbers beyond u64 go
//!   through f64 exactly as in the official JavaScript clients).

pub mod payment;
pub mod primitives;
pub mod requirements;
pub mod settlement;
#[cfg(test)]
pub(crate) mod tests;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::{Serialize, Serializer};

use super::network::NetworkError;

pub use payment::{decode_payment_header, encode_payment_header, payment_extensions, payment_message};
pub use requirements::{PaymentRequired, Requirement, parse_payment_required};
pub use settlement::{
    PERMIT2_ALLOWANCE_REQUIRED, RefusalReasons, SETTLEMENT_PENDING, SettlementResponse, parse_settlement,
    refusal_reasons,
};

/// v2: requirements sent by the upstream with its 402.
pub const PAYMENT_REQUIRED_HEADER: &str = "payment-required";
/// v2: the payment sent with the retry.
pub const PAYMENT_SIGNATURE_HEADER: &str = "payment-signature";
/// v2: the settlement result sent by the upstream with its answer.
pub const PAYMENT_RESPONSE_HEADER: &str = "payment-response";
/// v1: the payment sent with the retry.
pub const X_PAYMENT_HEADER: &str = "x-payment";
/// v1: the settlement result sent by the upstream with its answer.
pub const X_PAYMENT_RESPONSE_HEADER: &str = "x-payment-response";
/// Every x402 header, lowercase: an agent must not be able to inject any of them upstream.
pub const PAYMENT_HEADERS: [&str; 5] = [
    PAYMENT_REQUIRED_HEADER,
    PAYMENT_SIGNATURE_HEADER,
    PAYMENT_RESPONSE_HEADER,
    X_PAYMENT_HEADER,
    X_PAYMENT_RESPONSE_HEADER,
];

/// Largest x402 header value read (base64 text, before decoding).
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Largest v1 402 body read.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// Most `accepts` entries read; a longer list is refused as hostile.
pub const MAX_ACCEPTS: usize = 64;
/// Longest reason string (in UTF-8 bytes) kept from an upstream (`error`, `invalidReason`,
/// `errorReason`); longer ones are cut at a character boundary.
pub const MAX_REASON_BYTES: usize = 512;

/// Name of the `payment-identifier` extension (x402 v2 extensions).
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";
const PAYMENT_ID_MIN_LEN: usize = 16;
const PAYMENT_ID_MAX_LEN: usize = 128;

/// Standard alphabet, padding optional (the official clients pad; be lenient on receipt).
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
/// URL-safe alphabet, padding optional: tolerated when `-` or `_` show up.
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// x402 protocol version of an exchange. The payment must use the version of the 402.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum X402Version {
    /// Legacy: requirements in the body, `X-PAYMENT`, v1 network names.
    V1,
    /// Current: base64 JSON headers, CAIP-2 networks.
    V2,
}

impl X402Version {
    /// The `x402Version` number on the wire.
    pub fn number(self) -> u8 {
        match self {
            Self::V1 => 1,
            Self::V2 => 2,
        }
    }

    /// The version with this `x402Version` number.
    pub fn from_number(n: u64) -> Option<Self> {
        match n {
            1 => Some(Self::V1),
            2 => Some(Self::V2),
            _ => None,
        }
    }

    /// Name of the request header that carries the payment (lowercase).
    pub fn payment_header(self) -> &'static str {
        match self {
            Self::V1 => X_PAYMENT_HEADER,
            Self::V2 => PAYMENT_SIGNATURE_HEADER,
        }
    }

    /// Name of the response header that carries the settlement (lowercase).
    pub fn settlement_header(self) -> &'static str {
        match self {
            Self::V1 => X_PAYMENT_RESPONSE_HEADER,
            Self::V2 => PAYMENT_RESPONSE_HEADER,
        }
    }

    /// JSON field of a requirement that holds the amount.
    fn amount_field(self) -> &'static str {
        match self {
            Self::V1 => "maxAmountRequired",
            Self::V2 => "amount",
        }
    }
}

impl Serialize for X402Version {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(self.number())
    }
}

/// Why an x402 message could not be read or written. Messages never quote the input at length.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// Asked to parse requirements from a response that is not a 402.
    #[error("expected HTTP 402, got {0}")]
    NotPaymentRequired(u16),
    /// A 402 without x402 requirements (no `PAYMENT-REQUIRED`, body not an x402 message).
    #[error("402 response carries no x402 payment requirements")]
    NoRequirements,
    /// Header value over [`MAX_HEADER_BYTES`].
    #[error("{header} header is too large ({len} bytes, limit {limit})")]
    HeaderTooLarge {
        /// Header name.
        header: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The same x402 header twice, which could carry two different messages.
    #[error("{0} header appears more than once")]
    DuplicateHeader(&'static str),
    /// Header value is not base64.
    #[error("{0} header is not valid base64")]
    BadBase64(&'static str),
    /// Not valid JSON.
    #[error("{what} is not valid JSON: {source}")]
    BadJson {
        /// What was being read.
        what: &'static str,
        /// serde_json's reason (position only, no content).
        #[source]
        source: serde_json::Error,
    },
    /// v1 402 body over [`MAX_BODY_BYTES`].
    #[error("402 body is too large ({len} bytes, limit {limit})")]
    BodyTooLarge {
        /// Body length.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// `x402Version` missing or not 1/2 (or 1 inside the v2 header).
    #[error("unsupported x402Version {0}")]
    UnsupportedVersion(String),
    /// Structurally wrong message (e.g. `accepts` not an array).
    #[error("malformed x402 message: {0}")]
    Malformed(&'static str),
    /// `accepts` is an empty array.
    #[error("402 offers no payment options (empty accepts)")]
    EmptyAccepts,
    /// `accepts` longer than [`MAX_ACCEPTS`].
    #[error("402 offers {0} payment options, more than the {MAX_ACCEPTS} accepted")]
    TooManyRequirements(usize),
    /// Every entry of `accepts` is malformed.
    #[error("no payment option in the 402 is well-formed: {0}")]
    NoValidRequirement(String),
    /// An entry's price (v1 `maxAmountRequired`, v2 `amount`) is a JSON number, not a
    /// decimal string: a JSON number may already have been rounded to a double by any parser
    /// on the way (`123456789012345678901234567890`, `1e30`), so what the upstream asks
    /// cannot be known exactly. The whole 402 is refused.
    #[error(
        "payment option #{index}: `{field}` is a JSON number, not a decimal string of atomic units; prices must be exact"
    )]
    InexactAmount {
        /// Position in `accepts`.
        index: usize,
        /// The field (`maxAmountRequired` or `amount`).
        field: &'static str,
    },
    /// The signed authorization does not match the requirement it is sent for.
    #[error("signed authorization does not match the selected requirement: {0}")]
    AuthorizationMismatch(&'static str),
    /// A payment-identifier id outside 16–128 chars of `[A-Za-z0-9_-]`.
    #[error("payment identifier must be 16-128 characters of [A-Za-z0-9_-]")]
    InvalidPaymentId,
    /// Could not turn an outgoing payload into a header value.
    #[error("could not encode the payment header: {0}")]
    Encode(String),
}

/// Why one `accepts` entry was skipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Entry is not a JSON object.
    #[error("entry is not a JSON object")]
    NotObject,
    /// A required string field is missing or not a string.
    #[error("missing or non-string field `{0}`")]
    MissingField(&'static str),
    /// Amount is not a canonical decimal integer in U256 range.
    #[error("`{0}` is not a decimal integer between 0 and 2^256-1")]
    BadAmount(&'static str),
    /// Not an EVM address (or a mixed-case address with a wrong checksum).
    #[error("`{0}` is not an EVM address")]
    BadAddress(&'static str),
    /// `maxTimeoutSeconds` missing or not a non-negative integer.
    #[error("`maxTimeoutSeconds` is missing or not a non-negative integer")]
    BadTimeout,
    /// `extra` present but not an object.
    #[error("`extra` is not a JSON object")]
    BadExtra,
    /// Network not usable (non-EVM, unknown name, malformed id).
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// A scheme other than `exact` whose fields we cannot read.
    #[error("unsupported scheme {0:?}")]
    UnsupportedScheme(String),
}

impl EntryError {
    /// True for an entry that is well-formed as far as we can tell but names a network or
    /// scheme this router does not pay with; false for a malformed entry.
    pub fn is_unsupported(&self) -> bool {
        match self {
            Self::Network(e) => e.is_unsupported_family(),
            Self::UnsupportedScheme(_) => true,
            _ => false,
        }
    }
}

/// An `accepts` entry that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRequirement {
    /// Position in the upstream's `accepts` array.
    pub index: usize,
    /// Why it was skipped.
    pub error: EntryError,
}
