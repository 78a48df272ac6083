//! THE route table of the test upstream and what each paid route does.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// What a paid route does once the payment verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Settle, then 200 with a weather report.
    Weather,
    /// Settle, then 200 echoing the JSON request body (400 without settling if it is not JSON).
    Echo,
    /// Like `Weather`, with several offers of which one is payable and cheapest among payables.
    Multi,
    /// Like `Weather`, advertising the payment-identifier extension, with the spec's response
    /// cache ("Recovering a Lost Response", `pid_cache.rs`); `?seconds=N` waits N s after
    /// settling before answering (the handler still running); `?conflict=true` answers 409
    /// to every re-send.
    PaymentIdentifier,
    /// Like `PaymentIdentifier` without the cache, advertising `sign-in-with-x` (`siwx.rs`):
    /// settles, records the payer for the path, waits `?seconds=N`, answers 200 with a unique
    /// `answer_id`; a valid `SIGN-IN-WITH-X` of a payer runs the handler again without payment.
    Siwx,
    /// Both extensions: the payment-identifier cache and sign-in-with-x.
    PidSiwx,
    /// 500 and no settlement.
    Error500,
    /// Settle first, then 500 carrying the settlement header.
    SettleThen500,
    /// Settle, then close the connection without any HTTP response.
    SettleThenDrop,
    /// Always refuse the payment (402 with a reason).
    Reject,
    /// Sleep `?seconds=N`, then settle and answer 200.
    Stall,
    /// 200 with a settlement header naming a made-up transaction; nothing is settled.
    Lie,
    /// Settle, sleep `?seconds=N`, then answer 200.
    SlowSettle,
    /// Hostile: verify the payment, keep the signed authorization (settled later by
    /// `POST /_settle_kept`), and answer 402 "payment failed".
    KeepThenReject,
    /// Hostile: verify, keep the authorization, answer 200 without any settlement header.
    KeepThenAnswer,
    /// Hostile: the price goes up by the base price every time a 402 is served, so a paid
    /// retry never matches the current offer.
    Reprice,
    /// Hostile strings: NUL characters in the offer's `extra`, in the resource description
    /// and in the answer; settles and answers 200 like `Weather`.
    Hostile,
    /// Always refuses the payment with a reason that holds a NUL character.
    RejectHostile,
    /// Verify, broadcast the transfer without waiting for it to be mined, and answer like the
    /// official middleware when the facilitator's receipt wait failed: 402, body `{}`, a
    /// `PAYMENT-RESPONSE` with `success: false`, `errorReason: "settlement_pending"` and the
    /// broadcast hash. (On anvil with automine the transfer is mined at once; with automine
    /// off it waits for `evm_mine`.)
    SettlementPending,
    /// Hostile: verify, keep the authorization (for `POST /_settle_kept`), answer
    /// `settlement_pending` naming a made-up transaction; nothing is broadcast.
    SettlementPendingLie,
    /// Hostile: verify, keep the authorization, send an unrelated transaction (0 ETH to
    /// itself) and answer `settlement_pending` naming that mined transaction.
    SettlementPendingWrongTx,
    /// Broadcast without waiting, then answer 200 with the report and a `PAYMENT-RESPONSE`
    /// `settlement_pending` (an answer served while the transfer is still pending).
    SettlementPendingAnswered,
    /// Takes payment only from a payer that approved Uniswap Permit2 for the token, read on
    /// chain (`allowance(payer, Permit2)` of the token): without it, 412 with
    /// `PAYMENT-REQUIRED.error` `permit2_allowance_required`, as the official facilitator
    /// answers a Permit2 requirement; with it, settles (EIP-3009) and answers like `Weather`.
    Permit2Gate,
}

impl Behaviour {
    /// Advertises payment-identifier and answers re-sends from its cache.
    pub fn payment_identifier(self) -> bool {
        matches!(self, Self::PaymentIdentifier | Self::PidSiwx)
    }

    /// Advertises sign-in-with-x and accepts sign-ins of payers.
    pub fn siwx(self) -> bool {
        matches!(self, Self::Siwx | Self::PidSiwx)
    }
}

/// The NUL-bearing strings of the hostile routes.
pub const HOSTILE_NOTE: &str = "nul\u{0}inside";
pub const HOSTILE_REASON: &str = "invalid_\u{0}_signature";

pub struct RouteSpec {
    pub path: &'static str,
    pub method: Method,
    pub version: Version,
    pub behaviour: Behaviour,
    pub description: &'static str,
}

/// THE route table. Besides these: `GET /free` (no payment) and `GET /_stats` (counters).
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        path: "/v2/weather",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Weather,
        description: "Weather report (x402 v2)",
    },
    RouteSpec {
        path: "/v2/echo",
        method: Method::Post,
        version: Version::V2,
        behaviour: Behaviour::Echo,
        description: "Echoes the JSON body (x402 v2)",
    },
    RouteSpec {
        path: "/v2/error500",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Error500,
        description: "Fails with 500 after verifying; never settles (x402 v2)",
    },
    RouteSpec {
        path: "/v2/settle-then-500",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettleThen500,
        description: "Settles up front, then fails with 500 (x402 v2)",
    },
    RouteSpec {
        path: "/v2/settle-then-drop",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettleThenDrop,
        description: "Settles, then drops the connection without answering (x402 v2)",
    },
    RouteSpec {
        path: "/v2/reject",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Reject,
        description: "Refuses every payment (x402 v2)",
    },
    RouteSpec {
        path: "/v2/stall",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Stall,
        description: "Waits ?seconds=N after verifying, then settles and answers (x402 v2)",
    },
    RouteSpec {
        path: "/v2/lie",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Lie,
        description: "Claims a settlement that never happened (x402 v2)",
    },
    RouteSpec {
        path: "/v2/slow-settle",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SlowSettle,
        description: "Settles, then waits ?seconds=N before answering (x402 v2)",
    },
    RouteSpec {
        path: "/v2/multi",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Multi,
        description: "Offers several requirements; one cheapest payable (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pid",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::PaymentIdentifier,
        description: "Advertises payment-identifier; caches answers by id (x402 v2)",
    },
    RouteSpec {
        path: "/v2/siwx",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Siwx,
        description: "Advertises sign-in-with-x; payers may re-access by signing in (x402 v2)",
    },
    RouteSpec {
        path: "/v2/siwx-post",
        method: Method::Post,
        version: Version::V2,
        behaviour: Behaviour::Siwx,
        description: "POST, advertises sign-in-with-x (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pid-siwx",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::PidSiwx,
        description: "Advertises payment-identifier (cached) and sign-in-with-x (x402 v2)",
    },
    RouteSpec {
        path: "/v2/hostile",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Hostile,
        description: "NUL \u{0} in the offer, the resource and the answer (x402 v2)",
    },
    RouteSpec {
        path: "/v2/reject-hostile",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::RejectHostile,
        description: "Refuses every payment with a reason holding NUL (x402 v2)",
    },
    RouteSpec {
        path: "/v1/weather",
        method: Method::Get,
        version: Version::V1,
        behaviour: Behaviour::Weather,
        description: "Weather report (x402 v1)",
    },
    RouteSpec {
        path: "/v1/error500",
        method: Method::Get,
        version: Version::V1,
        behaviour: Behaviour::Error500,
        description: "Fails with 500 after verifying; never settles (x402 v1)",
    },
    RouteSpec {
        path: "/v2/keep-reject",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::KeepThenReject,
        description: "Hostile: keeps the signed authorization and answers 402 (x402 v2)",
    },
    RouteSpec {
        path: "/v2/keep-answer",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::KeepThenAnswer,
        description: "Hostile: keeps the signed authorization and answers 200 without settling (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pending",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettlementPending,
        description: "Broadcasts the transfer, then answers 402 settlement_pending with its hash (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pending-lie",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettlementPendingLie,
        description: "Hostile: keeps the authorization, answers 402 settlement_pending with a made-up hash (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pending-wrong-tx",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettlementPendingWrongTx,
        description: "Hostile: keeps the authorization, answers settlement_pending naming an unrelated mined tx (x402 v2)",
    },
    RouteSpec {
        path: "/v2/pending-answered",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::SettlementPendingAnswered,
        description: "Broadcasts the transfer, answers 200 with settlement_pending and its hash (x402 v2)",
    },
    RouteSpec {
        path: "/v2/permit2-gate",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Permit2Gate,
        description: "412 permit2_allowance_required unless the payer approved Permit2 (x402 v2)",
    },
    RouteSpec {
        path: "/v2/reprice",
        method: Method::Get,
        version: Version::V2,
        behaviour: Behaviour::Reprice,
        description: "Hostile: a new, higher price with every 402 (x402 v2)",
    },
];
