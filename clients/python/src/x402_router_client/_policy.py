"""The retry table, identical to the router's ``mcp::policy::classify`` and the TypeScript client."""

from __future__ import annotations

from typing import Any, Literal, Mapping

Next = Literal["done", "retry_same_key", "new_key_safe", "do_not_rekey", "fix_request"]

#: Payment states that can no longer move money.
RELEASED_PAYMENT_STATES = frozenset({"expired"})


def classify(status: int, body: Mapping[str, Any] | None) -> Next:
    """What may be done after an answer of ``POST /route`` (status and JSON body)."""
    code = (body or {}).get("code") or ""
    if status == 202 and code == "approval_pending":
        return "retry_same_key"
    if 200 <= status < 300:
        return "done"
    if status == 402:
        return "new_key_safe"
    if status == 403 and code in ("approval_denied", "approval_expired"):
        return "new_key_safe"
    if status == 409 and code == "idempotency_key_reused":
        return "fix_request"
    if status == 409 and code == "already_paid":
        return "do_not_rekey"
    if status in (409, 429, 500, 503):
        return "retry_same_key"
    if status in (502, 504):
        payment = (body or {}).get("payment")
        if payment is None:
            return "new_key_safe"
        return "new_key_safe" if payment.get("status") in RELEASED_PAYMENT_STATES else "do_not_rekey"
    if 400 <= status < 500:
        return "fix_request"
    return "retry_same_key"
