//! Why `/route` answers with an error of its own (not the routed call's outcome).
//! Mapped to HTTP in one place, `crate::error`.

use crate::db::PgPool;

/// An error of the relay use case: nothing was recorded for the call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not a valid call (checked after the Redis hint, which may replay it).
    #[error("{0}")]
    BadRequest(String),
    /// The upstream URL is refused by the SSRF guard (before anything is written).
    #[error("{0}")]
    ForbiddenUpstream(String),
    /// An operator's limit or stop refuses the call before anything is recorded: a host off
    /// the allowlist, a rate limit, a pause, a disabled agent or a rotated key
    /// ([`Refusal`](crate::payments::limits::Refusal)).
    /// After a claim, the key is released first, so the same key can be retried.
    #[error("{}", refusal_message(.0))]
    Refused(crate::payments::limits::Refusal),
    /// The payment waits for, or was refused by, an operator's approval (`crate::approvals`):
    /// nothing signed; the key is released, the approval row lasts.
    #[error("{}", held_message(.0))]
    Held(crate::approvals::Held),
    /// Another attempt owns the key.
    #[error("Original request still in flight; retry shortly")]
    InFlight,
    /// The key was used with a different request.
    #[error("Idempotency-Key reused with different body")]
    KeyReused,
    /// This attempt lost the key's lease to a takeover; the winner records the result.
    #[error("this attempt was superseded by a retry of the same Idempotency-Key; retry to read the recorded result")]
    Superseded,
    /// Postgres cannot be reached now; nothing was decided.
    #[error("service unavailable: {0}")]
    Unavailable(&'static str),
    /// The chain cannot be read (or an RPC endpoint serves another chain): nothing was
    /// decided or paid; retry the same key later.
    #[error("payment network unavailable: {0}")]
    PaymentNetworkUnavailable(&'static str),
    /// A query failed for a reason a retry would not fix, or an invariant broke.
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

fn held_message(h: &crate::approvals::Held) -> String {
    use crate::approvals::Held;
    match h {
        Held::Pending(_) => "the payment waits for an operator's approval; nothing was signed. Retry the same \
                             Idempotency-Key after Retry-After to get the call's answer"
            .into(),
        Held::Denied(_) => "an operator denied this payment; nothing was signed or paid".into(),
        Held::Expired(_) => "no operator decided on this payment in time; nothing was signed or paid".into(),
    }
}

fn refusal_message(r: &crate::payments::limits::Refusal) -> String {
    use crate::payments::limits::{RateKind, Refusal};
    match r {
        Refusal::OverBudget(why) | Refusal::PayToNotAllowed(why) | Refusal::HostNotAllowed(why) => why.clone(),
        Refusal::Paused => "payments are paused by an operator; nothing was paid or recorded, retry later".into(),
        Refusal::RateLimited { what: RateKind::Call, .. } => {
            "the agent's calls per minute are used up; nothing was recorded, retry after Retry-After".into()
        }
        Refusal::RateLimited { what: RateKind::Payment, .. } => {
            "the agent's payments per minute are used up; nothing was paid or recorded, retry after Retry-After".into()
        }
        Refusal::Disabled => "the agent was disabled by an operator; nothing more is signed or sent for it".into(),
        Refusal::KeyRotated => {
            "the agent's key was rotated after this call began; nothing more is signed for the old key".into()
        }
    }
}

impl Error {
    /// An unexpected state: a 500 whose cause is logged once, where HTTP is answered.
    pub fn invariant(msg: impl std::fmt::Display) -> Self {
        Self::Internal(anyhow::anyhow!("{msg}"))
    }
}

impl From<diesel::result::Error> for Error {
    fn from(e: diesel::result::Error) -> Self {
        if crate::db::is_transient(&e) {
            tracing::warn!(error = %e, "postgres unavailable");
            Self::Unavailable("database unavailable")
        } else {
            Self::Internal(anyhow::Error::new(e).context("database query failed"))
        }
    }
}

type PoolError = bb8::RunError<diesel_async::pooled_connection::PoolError>;

impl From<PoolError> for Error {
    fn from(e: PoolError) -> Self {
        tracing::warn!(error = %e, "postgres unavailable (no connection)");
        Self::Unavailable("database unavailable")
    }
}

/// A pooled connection, or [`Error::Unavailable`].
pub async fn conn(pool: &PgPool) -> Result<crate::db::PgConn<'_>, Error> {
    Ok(pool.get().await?)
}
