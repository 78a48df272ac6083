//! A human in the loop (issue 42, item 1; docs/DESIGN.md §8, "Approvals"): a paid call whose
//! price is above its agent's `approval_above` is not signed until an operator approved its
//! exact terms.
//!
//! ```text
//! /route ─▶ 402 ─▶ choice ─▶ gate ─┬─ no threshold, or price ≤ it ─────────────▶ sign (the normal path)
//!                                  ├─ approved, same terms ────────────────────▶ sign (budgets re-checked
//!                                  │                                               by the reservation)
//!                                  ├─ none yet, or approved for other terms ───▶ a new pending approval: 202
//!                                  ├─ pending ─────────────────────────────────▶ 202 approval_pending
//!                                  ├─ pending past its TTL ────────────────────▶ 403 approval_expired
//!                                  └─ denied ──────────────────────────────────▶ 403 approval_denied
//! ```
//! Nothing is signed or recorded while a call is held: the relay gives its Idempotency-Key
//! back, so the agent's retry with the same key runs the call again and reaches the gate again.
//! The approval row is what lasts (one per key and request, `approvals`): the decision an
//! operator takes (`crate::admin::approval_queue`) is one conditional UPDATE, so of two deciding at once exactly
//! one wins. At most one payment follows an approval because the retry that pays owns the
//! key (the idempotency ledger) and signs the request's one nonce.
//!
//! Time is the database's (`now()`): every router reads the same expiry.

pub(crate) mod store;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

use diesel::QueryResult;
use diesel_async::AsyncPgConnection;

use crate::money::Amount;

/// The terms of a payment as an operator approves them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Terms {
    /// CAIP-2.
    pub network: String,
    /// The token (EVM: checksummed address; Solana: the mint).
    pub asset: String,
    pub amount: Amount,
    pub pay_to: String,
}

/// The state of an approval as served: `expired` is a pending one past its TTL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Approved, Self::Denied, Self::Expired].into_iter().find(|st| st.as_str() == s)
    }
}

/// One approval as agents and operators see it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Approval {
    pub id: Uuid,
    pub agent_id: Uuid,
    /// The call's Idempotency-Key: retry with it to get the call's answer.
    pub idempotency_key: String,
    pub state: ApprovalState,
    /// CAIP-2 network of the payment.
    pub network: String,
    /// The token paid.
    pub asset: String,
    /// Atomic units.
    #[schema(value_type = String)]
    pub amount: Amount,
    #[serde(rename = "payTo")]
    pub pay_to: String,
    /// The upstream URL (query parameters named by `REDACT_QUERY_PARAMS` redacted).
    pub upstream_url: String,
    pub created_at: DateTime<Utc>,
    /// A pending approval not decided by then expires.
    pub expires_at: DateTime<Utc>,
    #[schema(required = true)]
    pub decided_at: Option<DateTime<Utc>>,
    /// The deciding operator's name.
    #[schema(required = true)]
    pub decided_by: Option<String>,
}

impl Approval {
    pub fn terms(&self) -> Terms {
        Terms {
            network: self.network.clone(),
            asset: self.asset.clone(),
            amount: self.amount,
            pay_to: self.pay_to.clone(),
        }
    }
}

/// Why a paid call is held instead of signed.
#[derive(Debug, Clone)]
pub enum Held {
    /// Waiting for an operator (202, `Retry-After`).
    Pending(Box<Approval>),
    /// An operator denied it (403).
    Denied(Box<Approval>),
    /// Nobody decided within the TTL (403).
    Expired(Box<Approval>),
}

impl Held {
    pub fn approval(&self) -> &Approval {
        match self {
            Self::Pending(a) | Self::Denied(a) | Self::Expired(a) => a,
        }
    }
}

/// What the gate says of a payment about to be signed.
#[derive(Debug, Clone)]
pub enum Gate {
    /// Sign it: no threshold, a price within it, or an operator approved these terms.
    Clear,
    /// Do not sign.
    Held(Held),
    /// The key names another request (its approval was asked for a different body).
    KeyReused,
}

/// The call a payment is for: its agent, key, request fingerprint and shown URL.
#[derive(Debug, Clone, Copy)]
pub struct CallRef<'a> {
    pub agent_id: Uuid,
    pub key: &'a str,
    pub request_hash: &'a str,
    pub shown_url: &'a str,
}

/// The agent's threshold: `None` when it has none (or no longer exists: the reservation
/// refuses that).
///
/// # Errors
/// Database errors.
pub async fn threshold(conn: &mut AsyncPgConnection, agent_id: Uuid) -> QueryResult<Option<Amount>> {
    store::threshold(conn, agent_id).await
}

/// Decides whether a payment of `terms` (counting `charge` against the agent's `threshold`,
/// its `approval_above` read with its limits: the amount, or with a budget currency its budget
/// units) for `call` may be signed now, opening a pending approval (expiring after `ttl`) when
/// it needs one and has none for these terms.
///
/// # Errors
/// Database errors.
pub async fn gate(
    conn: &mut AsyncPgConnection,
    call: CallRef<'_>,
    (terms, charge): (&Terms, Option<Amount>),
    threshold: Option<Amount>,
    ttl: std::time::Duration,
) -> QueryResult<Gate> {
    // `charge`: what the terms count in budget units (`None`: too large to count: held).
    match threshold {
        Some(limit) if charge.is_none_or(|c| c > limit) => {}
        _ => return Ok(Gate::Clear),
    }
    let latest = store::latest(conn, call.agent_id, call.key).await?;
    let Some((approval, hash)) = latest else {
        return Ok(Gate::Held(Held::Pending(Box::new(store::open(conn, call, terms, ttl).await?))));
    };
    if hash != call.request_hash {
        return Ok(Gate::KeyReused);
    }
    Ok(match approval.state {
        ApprovalState::Pending => Gate::Held(Held::Pending(Box::new(approval))),
        ApprovalState::Denied => Gate::Held(Held::Denied(Box::new(approval))),
        ApprovalState::Expired => Gate::Held(Held::Expired(Box::new(approval))),
        ApprovalState::Approved if approval.terms() == *terms => Gate::Clear,
        // The upstream now asks other terms than the approved ones: never paid silently.
        ApprovalState::Approved => Gate::Held(Held::Pending(Box::new(store::open(conn, call, terms, ttl).await?))),
    })
}
