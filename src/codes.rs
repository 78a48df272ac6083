//! The machine-readable `code` of every error body (`{"error": "…", "code": "…"}`).
//!
//! `error` is a sentence for humans and may change; `code` is the contract: agents and the
//! client libraries (`clients/`) branch on it. [`Code::ALL`] is the one list: docs/api.md's
//! table, the OpenAPI document (`routes::openapi` writes one schema per code from it) and the clients'
//! retry rules are written from it. A code is never renamed or reused for another meaning.
//!
//! What an agent may do after each answer is `mcp::policy` (one table, which the client
//! libraries mirror).

use serde::Serialize;

use crate::x402::select::{RejectReason, Rejection};

/// Every error code the router answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    // The router's own refusals (nothing executed, nothing written).
    /// 400: malformed JSON, URL, method, header, amount, query or cursor; forbidden upstream.
    BadRequest,
    /// 400: the `Idempotency-Key` header is missing or not 16–128 visible ASCII characters.
    IdempotencyKeyRequired,
    /// 413: the request body is larger than `REQUEST_MAX_BYTES`.
    PayloadTooLarge,
    /// 401: missing or unknown API key (or operator token).
    Unauthorized,
    /// 403: the agent is disabled.
    AgentDisabled,
    /// 403: an agent key was presented to the operator API.
    OperatorOnly,
    /// 403: the upstream's host is not on the agent's allowlist; nothing was written.
    UpstreamNotAllowed,
    /// 404: no such endpoint or record (another agent's records are not found either).
    NotFound,
    /// 409: the key was used before for a different request.
    IdempotencyKeyReused,
    /// 409 + `Retry-After`: the key's first request is still running.
    IdempotencyKeyInFlight,
    /// 409: this attempt lost its key to a retry that took it over; retry to read the result.
    Superseded,
    /// 429 + `Retry-After`: the agent's calls or payments per minute are used up; nothing
    /// was recorded (retry the same key after `Retry-After`).
    RateLimited,
    /// 429 + `Retry-After`: too many failed operator authentications from the client's
    /// address; the token was not looked up.
    AuthThrottled,
    /// 409: revoking the last live admin operator with no `OPERATOR_TOKEN` configured would
    /// leave no one able to administer the router; nothing changed.
    LastAdmin,
    /// 503 + `Retry-After`: an operator paused payments (or all calls); nothing was paid or
    /// recorded (retry the same key later).
    PaymentsPaused,
    /// 503 + `Retry-After`: Postgres is unreachable; nothing was executed or paid (or the
    /// result of an executed call could not be recorded yet: the key stays in flight).
    DatabaseUnavailable,
    /// 503 + `Retry-After`: a takeover cannot read the chain to check an earlier payment;
    /// nothing was decided or paid.
    PaymentNetworkUnavailable,
    /// 500: a bug; the cause is in the router's log.
    InternalError,
    // A human in the loop (`crate::approvals`): nothing signed, the key released.
    /// 202 + `Retry-After`: the price is above the agent's `approval_above`; the payment waits
    /// for an operator (`approval` names its terms). Retry the same key.
    ApprovalPending,
    /// 403: an operator denied the payment; nothing was signed or paid.
    ApprovalDenied,
    /// 403: no operator decided within `APPROVAL_TTL`; nothing was signed or paid.
    ApprovalExpired,
    /// 409: an operator's decision on an approval already decided (by another operator, or
    /// twice) or expired; nothing changed.
    ApprovalDecided,
    // The two-person rule (`crate::admin::proposals`), operator API only: nothing changed.
    /// 403: the proposer of a change tried to confirm it; another admin must.
    OwnChange,
    /// 409: what a proposed change would apply to changed since it was proposed.
    ChangeStale,
    /// 409: a proposed change already confirmed or rejected (or twice), or expired.
    ChangeDecided,
    // Outcomes of the routed call (recorded: a retry with the same key replays them).
    /// 402: the price is above the call's `max_amount` (or no `max_amount` was given).
    PaymentOverMaxAmount,
    /// 402: the price is above the agent's per-call cap or what remains of one of its budgets.
    PaymentOverBudget,
    /// 402: no offered option pays a `payTo` the agent may pay (allowlist, block lists).
    PaymentNotAllowed,
    /// 402: no offered option has a scheme, network or asset the router pays with.
    PaymentUnsupported,
    /// 502: the upstream answered 5xx, was unreachable, or broke off (no payment made).
    UpstreamFailed,
    /// 504: the upstream did not answer in time (no payment made).
    UpstreamTimeout,
    /// 502: the upstream's 402 could not be read; nothing was paid.
    UpstreamInvalid402,
    /// 502: the payment could not be prepared (signing failed, chain unreadable before
    /// signing); nothing was signed or paid.
    PaymentNotMade,
    /// 502: the upstream refused the payment and the chain shows it unused.
    PaymentRejected,
    /// 502: the payment settled on-chain but the upstream's answer was lost (paid, not served).
    SettledResponseLost,
    /// 502/504: a signed payment left and its fate is unknown (no answer, chain silent):
    /// it may still settle until its `validBefore`.
    PaymentUnknown,
    /// 409: this request was already paid under this key before the key expired (it was
    /// reused for the same request); nothing was paid now. `previous_receipt_id` points at
    /// the payment's receipt. A new key buys again.
    AlreadyPaid,
    /// 502: the upstream (its facilitator) wants the router's wallet to have approved Uniswap
    /// Permit2 for the token first (HTTP 412 `permit2_allowance_required`); nothing moved. An
    /// operator runs `x402-router wallet approve-permit2`; the signed authorization stays
    /// reserved until `reconcile` sees it expire unused (do not re-key before).
    Permit2AllowanceRequired,
}

/// [`Code::ApprovalPending`]'s description.
const APPROVAL_PENDING: &str = "HTTP 202: the price is above the agent's `approval_above`, so the payment waits for an operator's decision; nothing was signed. `approval` names the terms (network, asset, amount, payTo, upstream URL), its id and `idempotency_key`. Retry the same key after `Retry-After`: 202 until decided, then the call's answer (approved: paid once, budgets checked again).";
/// [`Code::ApprovalExpired`]'s description.
const APPROVAL_EXPIRED: &str = "No operator decided on the payment within `APPROVAL_TTL` (`approval`); nothing was signed or paid. A new key asks again.";
/// [`Code::ApprovalDecided`]'s description.
const APPROVAL_DECIDED: &str = "The approval was already decided (by another operator, or twice) or has expired; nothing changed. `approval` shows its state.";
/// [`Code::OwnChange`]'s description.
const OWN_CHANGE: &str = "Under the two-person rule (`REQUIRE_SECOND_ADMIN`) a change is confirmed by a named admin other than the one who proposed it, and a held payment is approved by a named admin: the bootstrap `OPERATOR_TOKEN` names nobody, so it may do neither (it may still deny or reject); nothing changed.";
/// [`Code::ChangeStale`]'s description.
const CHANGE_STALE: &str = "What the proposed change would apply to (the agent's limits, or the settings) changed since it was proposed; nothing was written. Reject it and propose again against the current values.";
/// [`Code::ChangeDecided`]'s description.
const CHANGE_DECIDED: &str = "The proposed change was already confirmed or rejected (by another admin, or twice), or has expired (`CHANGE_TTL`); nothing changed.";
/// [`Code::Permit2AllowanceRequired`]'s description.
const PERMIT2_ALLOWANCE_REQUIRED: &str = "The upstream answered 412 (or 402) `permit2_allowance_required`: it takes payment only from a wallet that approved Uniswap Permit2 for the token, and the router's wallet has not. Nothing moved (`payment.status` `rejected` after the chain check). An operator runs `x402-router wallet approve-permit2 --network <caip2> --asset <token>`. (the signed authorization stays reserved until reconcile sees it expire unused)";
/// [`Code::AlreadyPaid`]'s description.
const ALREADY_PAID: &str = "The same request was re-sent under an Idempotency-Key that had expired, and its payment went through before: nothing is paid again. `previous_receipt_id` names that payment's receipt. A new key buys again.";
/// [`Code::PaymentUnknown`]'s description.
const PAYMENT_UNKNOWN: &str = "A signed payment left and its fate is unknown: it may still settle until its `validBefore`. Do not re-key; `GET /receipts/{id}` shows `X-Payment-Status` once `reconcile` decided (`expired`: nothing was paid, a new key is safe).";
/// [`Code::AuthThrottled`]'s description.
const AUTH_THROTTLED: &str = "Too many failed operator authentications (unknown, revoked or missing tokens, agent keys) from this client address within `OPERATOR_AUTH_WINDOW_MS`; every operator request from it is refused, a correct token too, without looking the token up. Retry after `Retry-After` seconds.";
/// [`Code::LastAdmin`]'s description.
const LAST_ADMIN: &str = "The operator is the last live admin and the router has no bootstrap `OPERATOR_TOKEN`: revoking it would leave no one able to administer the router. Nothing changed; create another admin first.";

impl Code {
    /// Every code, in documentation order.
    pub const ALL: &[Code] = &[
        Code::BadRequest,
        Code::IdempotencyKeyRequired,
        Code::PayloadTooLarge,
        Code::Unauthorized,
        Code::AgentDisabled,
        Code::OperatorOnly,
        Code::UpstreamNotAllowed,
        Code::NotFound,
        Code::IdempotencyKeyReused,
        Code::IdempotencyKeyInFlight,
        Code::Superseded,
        Code::RateLimited,
        Code::AuthThrottled,
        Code::LastAdmin,
        Code::PaymentsPaused,
        Code::DatabaseUnavailable,
        Code::PaymentNetworkUnavailable,
        Code::InternalError,
        Code::ApprovalPending,
        Code::ApprovalDenied,
        Code::ApprovalExpired,
        Code::ApprovalDecided,
        Code::OwnChange,
        Code::ChangeStale,
        Code::ChangeDecided,
        Code::PaymentOverMaxAmount,
        Code::PaymentOverBudget,
        Code::PaymentNotAllowed,
        Code::PaymentUnsupported,
        Code::UpstreamFailed,
        Code::UpstreamTimeout,
        Code::UpstreamInvalid402,
        Code::PaymentNotMade,
        Code::PaymentRejected,
        Code::SettledResponseLost,
        Code::PaymentUnknown,
        Code::AlreadyPaid,
        Code::Permit2AllowanceRequired,
    ];

    /// The wire form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::IdempotencyKeyRequired => "idempotency_key_required",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Unauthorized => "unauthorized",
            Self::AgentDisabled => "agent_disabled",
            Self::OperatorOnly => "operator_only",
            Self::UpstreamNotAllowed => "upstream_not_allowed",
            Self::NotFound => "not_found",
            Self::IdempotencyKeyReused => "idempotency_key_reused",
            Self::IdempotencyKeyInFlight => "idempotency_key_in_flight",
            Self::Superseded => "superseded",
            Self::RateLimited => "rate_limited",
            Self::AuthThrottled => "auth_throttled",
            Self::LastAdmin => "last_admin",
            Self::PaymentsPaused => "payments_paused",
            Self::DatabaseUnavailable => "database_unavailable",
            Self::PaymentNetworkUnavailable => "payment_network_unavailable",
            Self::InternalError => "internal_error",
            Self::ApprovalPending => "approval_pending",
            Self::ApprovalDenied => "approval_denied",
            Self::ApprovalExpired => "approval_expired",
            Self::ApprovalDecided => "approval_decided",
            Self::OwnChange => "own_change",
            Self::ChangeStale => "change_stale",
            Self::ChangeDecided => "change_decided",
            Self::PaymentOverMaxAmount => "payment_over_max_amount",
            Self::PaymentOverBudget => "payment_over_budget",
            Self::PaymentNotAllowed => "payment_not_allowed",
            Self::PaymentUnsupported => "payment_unsupported",
            Self::UpstreamFailed => "upstream_failed",
            Self::UpstreamTimeout => "upstream_timeout",
            Self::UpstreamInvalid402 => "upstream_invalid_402",
            Self::PaymentNotMade => "payment_not_made",
            Self::PaymentRejected => "payment_rejected",
            Self::SettledResponseLost => "settled_response_lost",
            Self::PaymentUnknown => "payment_unknown",
            Self::AlreadyPaid => "already_paid",
            Self::Permit2AllowanceRequired => "permit2_allowance_required",
        }
    }

    /// The HTTP status(es) an answer with this code has (the one mapping is `crate::error`;
    /// a test holds the two together).
    pub fn http_status(self) -> &'static [u16] {
        match self {
            Self::BadRequest | Self::IdempotencyKeyRequired => &[400],
            Self::PayloadTooLarge => &[413],
            Self::Unauthorized => &[401],
            Self::AgentDisabled
            | Self::OperatorOnly
            | Self::UpstreamNotAllowed
            | Self::ApprovalDenied
            | Self::ApprovalExpired
            | Self::OwnChange => &[403],
            Self::ApprovalPending => &[202],
            Self::NotFound => &[404],
            Self::IdempotencyKeyReused
            | Self::IdempotencyKeyInFlight
            | Self::Superseded
            | Self::AlreadyPaid
            | Self::LastAdmin
            | Self::ApprovalDecided
            | Self::ChangeStale
            | Self::ChangeDecided => &[409],
            Self::RateLimited | Self::AuthThrottled => &[429],
            Self::PaymentsPaused | Self::DatabaseUnavailable | Self::PaymentNetworkUnavailable => &[503],
            // 502: a /route call that reached the upstream but whose answer could not be recorded.
            Self::InternalError => &[500, 502],
            Self::PaymentOverMaxAmount
            | Self::PaymentOverBudget
            | Self::PaymentNotAllowed
            | Self::PaymentUnsupported => &[402],
            Self::UpstreamFailed
            | Self::UpstreamInvalid402
            | Self::PaymentNotMade
            | Self::PaymentRejected
            | Self::SettledResponseLost
            | Self::Permit2AllowanceRequired => &[502],
            Self::UpstreamTimeout => &[504],
            Self::PaymentUnknown => &[502, 504],
        }
    }

    /// The `payment.status` an answer with this code carries (the codes of a call that
    /// signed); `upstream_failed` carries one only when it paid.
    pub fn payment_status(self) -> Option<&'static str> {
        match self {
            Self::PaymentRejected | Self::Permit2AllowanceRequired => Some("rejected"),
            Self::SettledResponseLost => Some("settled_response_lost"),
            Self::PaymentUnknown => Some("unknown"),
            _ => None,
        }
    }

    /// What the code means and what was (not) done, for the API description.
    pub fn description(self) -> &'static str {
        match self {
            Self::BadRequest => {
                "Malformed JSON, URL, method, header, amount, query or cursor; or a forbidden upstream address. Nothing was written."
            }
            Self::IdempotencyKeyRequired => {
                "The `Idempotency-Key` header is missing or not 16–128 visible ASCII characters."
            }
            Self::PayloadTooLarge => "The request body is larger than `REQUEST_MAX_BYTES`.",
            Self::Unauthorized => "Missing or unknown API key (or operator token).",
            Self::AgentDisabled => "The agent is disabled.",
            Self::OperatorOnly => "An agent key was presented to the operator API.",
            Self::UpstreamNotAllowed => {
                "The upstream's host is not on the agent's allowlist (set by an operator); nothing was written or sent."
            }
            Self::NotFound => "No such endpoint or record; another agent's records are not found either.",
            Self::IdempotencyKeyReused => {
                "The key was used before for a different request (a client bug: a key names one request)."
            }
            Self::IdempotencyKeyInFlight => {
                "The key's first request is still running. Retry the same key after `Retry-After` (5 s)."
            }
            Self::Superseded => {
                "This attempt lost its key to a retry that took it over; retry the same key to read the recorded result."
            }
            Self::RateLimited => {
                "The agent's calls or payments per minute (set by an operator) are used up; nothing was recorded. Retry the same key after `Retry-After` seconds."
            }
            Self::AuthThrottled => AUTH_THROTTLED,
            Self::LastAdmin => LAST_ADMIN,
            Self::PaymentsPaused => {
                "An operator paused payments (or all calls); nothing was paid or recorded. Retry the same key after `Retry-After` seconds."
            }
            Self::DatabaseUnavailable => {
                "Postgres is unreachable: nothing was executed or paid, or an executed call's result is not recorded yet (the key stays in flight). Retry the same key after `Retry-After`."
            }
            Self::PaymentNetworkUnavailable => {
                "A retry that took over a key cannot read the chain to check the earlier attempt's payment; nothing was decided or paid. Retry the same key after `Retry-After`."
            }
            Self::InternalError => "A bug; the cause is in the router's log. Retry the same key.",
            Self::ApprovalPending => APPROVAL_PENDING,
            Self::ApprovalDecided => APPROVAL_DECIDED,
            Self::ApprovalDenied => {
                "An operator denied the payment (`approval`); nothing was signed or paid. A new key asks again."
            }
            Self::ApprovalExpired => APPROVAL_EXPIRED,
            Self::OwnChange | Self::ChangeStale | Self::ChangeDecided => self.two_person_description(),
            Self::PaymentOverMaxAmount => {
                "The price is above the call's `max_amount` (or no `max_amount` was given). Nothing was signed. The key is completed."
            }
            Self::PaymentOverBudget => {
                "The price is above the agent's per-call cap, what remains of its daily, month, week, lifetime or upstream host budget (`GET /agents/me`), or of the wallet-wide daily cap. Nothing was signed."
            }
            Self::PaymentNotAllowed => {
                "No offered option pays a `payTo` address the agent may pay: off its allowlist, or on its or the wallet-wide block list (set by an operator). Nothing was signed."
            }
            Self::PaymentUnsupported => {
                "No offered option has a scheme, network or asset the router pays with. Nothing was signed."
            }
            Self::UpstreamFailed => {
                "The upstream answered 5xx, was unreachable or broke off. With `payment` null nothing was paid; a paid call that got 5xx carries its payment's status."
            }
            Self::UpstreamTimeout => {
                "The upstream did not answer in time, or the route deadline passed before any payment."
            }
            Self::UpstreamInvalid402 => "The upstream's 402 could not be read; nothing was paid.",
            Self::PaymentNotMade => {
                "The payment could not be prepared (signing failed, or the chain could not be read before signing); nothing was signed or paid."
            }
            Self::PaymentRejected => {
                "The upstream refused the payment and the chain shows it unused (`payment.status` `rejected`; `invalidReason`/`errorReason` passed through). The refusal is the upstream's word: the signed authorization may still be submitted until `reconcile` sees it expire unused."
            }
            Self::SettledResponseLost => {
                "The payment settled on-chain but the upstream's answer was lost (paid, not served). Never pay again for this call."
            }
            Self::PaymentUnknown => PAYMENT_UNKNOWN,
            Self::AlreadyPaid => ALREADY_PAID,
            Self::Permit2AllowanceRequired => PERMIT2_ALLOWANCE_REQUIRED,
        }
    }

    /// The descriptions of the two-person rule's codes.
    fn two_person_description(self) -> &'static str {
        match self {
            Self::OwnChange => OWN_CHANGE,
            Self::ChangeStale => CHANGE_STALE,
            _ => CHANGE_DECIDED,
        }
    }

    /// The 402 code for a selection that refused every option: price over the call's
    /// `max_amount` first (raising it could help), then the agent's limits, else unsupported.
    pub fn for_rejection(rejection: &Rejection) -> Self {
        let any = |f: fn(&RejectReason) -> bool| rejection.options.iter().any(|o| f(&o.reason));
        if any(|r| matches!(r, RejectReason::OverMaxAmount { .. })) {
            Self::PaymentOverMaxAmount
        } else if any(|r| matches!(r, RejectReason::OverAgentLimit { .. })) {
            Self::PaymentOverBudget
        } else {
            Self::PaymentUnsupported
        }
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// `ErrorCode`: every code (`Error_<code>` describes each, see `routes::openapi`).
impl utoipa::PartialSchema for Code {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("The machine-readable error code (see `Error_<code>` for each)."))
            .enum_values(Some(Self::ALL.iter().map(|c| c.as_str())))
            .into()
    }
}

impl utoipa::ToSchema for Code {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("ErrorCode")
    }
}

impl std::fmt::Display for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_serialize_as_their_wire_form() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()), "duplicate {c}");
            assert!(c.as_str().chars().all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '_'));
            assert_eq!(serde_json::to_value(c).ok(), Some(serde_json::Value::String(c.as_str().into())));
        }
    }
}
