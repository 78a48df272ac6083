//! A paid request refused because the router's wallet has not approved Uniswap Permit2:
//! the official facilitator answers **412** with `PAYMENT-REQUIRED.error`
//! `permit2_allowance_required` (for a Permit2 requirement, before anything moves).
//!
//! It is refused like a 402 (the chain is asked; unused ⇒ `rejected`, still reserved until
//! `reconcile` sees it expire), with its own code, `permit2_allowance_required`, and a
//! message naming the command an operator runs: `x402-router wallet approve-permit2`.

use crate::upstream::UpstreamResponse;
use crate::x402::{self, SignedPayment};

/// True for a 412 whose reasons name `permit2_allowance_required`.
pub(super) fn needs_permit2(resp: &UpstreamResponse) -> bool {
    resp.status == 412
        && x402::wire::refusal_reasons(&resp.headers, &resp.body).names(x402::wire::PERMIT2_ALLOWANCE_REQUIRED)
}

/// What the operator must do, for the error body.
pub(super) fn message(s: &SignedPayment) -> String {
    format!(
        "the upstream takes payment only from a wallet that approved Uniswap Permit2 for this token \
         ({}); the router's wallet {} has not. Nothing moved. An operator must run \
         `x402-router wallet approve-permit2 --network {} --asset {}` before this upstream can be paid",
        x402::wire::PERMIT2_ALLOWANCE_REQUIRED,
        s.payer().to_checksum(None),
        s.network(),
        s.asset().to_checksum(None),
    )
}
