//! x402 payments, client side: everything the router needs to pay an upstream that answers
//! `402 Payment Required`, for protocol v1 and v2, on EVM networks: scheme `exact` with
//! EIP-3009 ([`sign`]) or Permit2 ([`permit2`], v2 only), and scheme `upto` (Permit2).
//!
//! The paid path, in the order a caller uses this module:
//! 1. [`wire::parse_payment_required`]: the upstream's 402 → [`PaymentRequired`].
//! 2. [`select::select`] (or [`PaymentRequired::select`]): the cheapest option the router may
//!    pay, or a [`Rejection`] saying why none — never a fallback to `accepts[0]`.
//! 3. [`nonce::deterministic_nonce`]: the EIP-3009 nonce of `(agent, Idempotency-Key)`.
//! 4. [`sign::sign_authorization`]: the EIP-712 signed authorization ([`SignedAuthorization`],
//!    serializable for the payments ledger).
//! 5. [`wire::payment_payload`] + [`wire::encode_payment_header`]: the `PAYMENT-SIGNATURE`
//!    (v2) or `X-PAYMENT` (v1) header of the retry; [`wire::payment_extensions`] with
//!    [`nonce::payment_identifier_id`] when the upstream advertises `payment-identifier`.
//! 6. [`wire::parse_settlement`] / [`wire::refusal_reasons`]: what the upstream claims.
//! 7. [`chain::Chain`]: what the chain says (`authorizationState`, transaction receipts).
//! 8. [`siwx`]: Sign-In-With-X, re-accessing a resource already paid for when its answer was
//!    lost (a sign-in message signed with EIP-191; it cannot sign a payment).
//!
//! Module map: [`network`] (CAIP-2 ids and v1 names), [`wire`] (message formats), [`select`](mod@select)
//! (policy), [`nonce`] (HMAC derivations), [`sign`] (EIP-3009/EIP-712), [`siwx`] (sign-in messages),
//! [`chain`] (RPC reads),
//! [`rpc`] (several URLs per network: fallback, retry, a chain-id check per URL).
//! Nothing here touches the database, HTTP routing or configuration loading.

pub mod batch;
pub mod chain;
pub mod gas_sponsoring;
pub mod money;
pub mod network;
pub mod nonce;
pub mod payload;
pub mod permit2;
pub mod rejection;
pub mod rpc;
pub mod select;
pub mod sign;
pub mod signed;
pub mod siwx;
pub mod svm;
pub mod wire;

pub use chain::{Chain, ChainError};
pub use network::{Network, NetworkError};
pub use nonce::{deterministic_nonce, payment_identifier_id, permit2_nonce};
pub use permit2::SignedPermit2;
pub use select::{RejectReason, Rejection, Supported, select};
pub use sign::{Authorization, SignError, SignedAuthorization, sign_authorization};
pub use signed::{SignedPayment, sign_payment};
pub use wire::{EntryError, PaymentRequired, RefusalReasons, Requirement, SettlementResponse, WireError, X402Version};
