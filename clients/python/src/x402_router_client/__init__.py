"""Call paid x402 APIs through an x402-router: one idempotency key per call, safe retries, receipts.

    from x402_router_client import Router
    with Router() as router:  # X402_ROUTER_URL, X402_ROUTER_AGENT_KEY
        r = router.fetch("https://api.example.com/forecast?city=Paris", max_amount="50000")
        print(r.status_code, r.json(), r.payment, r.receipt_id)
"""

from ._client import AsyncRouter, Router
from ._core import RoutedResponse, RouterError, new_idempotency_key
from ._policy import RELEASED_PAYMENT_STATES, Next, classify

__all__ = [
    "AsyncRouter",
    "Next",
    "RELEASED_PAYMENT_STATES",
    "RoutedResponse",
    "Router",
    "RouterError",
    "classify",
    "new_idempotency_key",
]
__version__ = "0.1.0"
