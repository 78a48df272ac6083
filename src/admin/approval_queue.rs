//! The operators' side of approvals: the queue (`GET /admin/approvals`) and the decisions
//! (`POST /admin/approvals/{id}/approve|deny`). A decision is one conditional UPDATE of a
//! pending, unexpired row with its `operator_events` row in the same transaction: of two
//! operators deciding at once (or twice), exactly one wins; the other is told it was decided.

use diesel::sql_types::{Nullable, Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::approvals::store::{COLUMNS, Row};
use crate::approvals::{Approval, ApprovalState};
use crate::operators::{Actor, events};

/// An operator's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approve,
    Deny,
}

impl Decision {
    fn state(self) -> &'static str {
        match self {
            Self::Approve => "approved",
            Self::Deny => "denied",
        }
    }

    fn action(self) -> &'static str {
        match self {
            Self::Approve => "approval.approve",
            Self::Deny => "approval.deny",
        }
    }
}

/// Why a decision did not happen.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no such approval")]
    NotFound,
    /// Already decided (by another operator, or twice), or expired: nothing changed.
    #[error("the approval is already {}", .0.state.as_str())]
    Decided(Box<Approval>),
    /// Under the two-person rule a held payment is approved with a named admin's own token;
    /// the bootstrap `OPERATOR_TOKEN` names no person.
    #[error("under the two-person rule a payment is approved with a named admin's token")]
    Unnamed,
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// A `state` filter that names no state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadState(pub String);

/// Which approvals `GET /admin/approvals` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StateFilter {
    /// Every state.
    #[default]
    All,
    One(ApprovalState),
}

impl StateFilter {
    /// `state=pending|approved|denied|expired` (absent or empty: all).
    ///
    /// # Errors
    /// [`BadState`] naming the value, when it is none of those.
    pub fn parse(raw: Option<&str>) -> Result<Self, BadState> {
        match raw.map(str::trim).filter(|s| !s.is_empty()) {
            None => Ok(Self::All),
            Some(s) => ApprovalState::parse(s)
                .map(Self::One)
                .ok_or_else(|| BadState(format!("state must be pending, approved, denied or expired, not {s:?}"))),
        }
    }
}

/// One entry of the operators' queue: the approval and its agent's name.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct QueueEntry {
    #[serde(flatten)]
    pub approval: Approval,
    pub agent_name: String,
}

/// Most entries one listing returns (newest first).
pub const MAX_LISTED: i64 = 500;

/// The approvals in `filter`, newest first, at most [`MAX_LISTED`].
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection, filter: StateFilter) -> QueryResult<Vec<QueueEntry>> {
    #[derive(QueryableByName)]
    struct Listed {
        #[diesel(embed)]
        listed: Row,
        #[diesel(sql_type = Text)]
        agent_name: String,
    }
    let state = match filter {
        StateFilter::All => None,
        StateFilter::One(s) => Some(s.as_str()),
    };
    let rows: Vec<Listed> = diesel::sql_query(format!(
        "SELECT * FROM (SELECT {COLUMNS}, ag.name AS agent_name FROM approvals ap JOIN agents ag ON ag.id = ap.agent_id) q \
          WHERE $1::text IS NULL OR q.state = $1 \
          ORDER BY q.created_at DESC, q.id DESC LIMIT {MAX_LISTED}"
    ))
    .bind::<Nullable<Text>, _>(state)
    .load(conn)
    .await?;
    rows.into_iter()
        .map(|l| Ok(QueueEntry { approval: l.listed.into_approval()?.0, agent_name: l.agent_name }))
        .collect()
}

/// Records `decision` on the pending approval `id`, with its operator event. With
/// `named_only` (the two-person rule) an approval needs an operator row: the bootstrap
/// `OPERATOR_TOKEN` may still deny, which only stops a payment.
///
/// # Errors
/// [`DecideError::NotFound`], [`DecideError::Decided`] (409: nothing changed),
/// [`DecideError::Unnamed`]; database errors.
pub async fn decide(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    decision: Decision,
    named_only: bool,
) -> Result<Approval, DecideError> {
    if named_only && actor.operator_id.is_none() && matches!(decision, Decision::Approve) {
        return Err(DecideError::Unnamed);
    }
    conn.transaction::<_, DecideError, _>(async |c| {
        let decided: Option<Row> = diesel::sql_query(format!(
            "UPDATE approvals ap SET state = $2, decided_at = now(), decided_by = $3, decided_by_id = $4 \
              WHERE ap.id = $1 AND ap.state = 'pending' AND ap.expires_at > now() \
              RETURNING {COLUMNS}"
        ))
        .bind::<SqlUuid, _>(id)
        .bind::<Text, _>(decision.state())
        .bind::<Text, _>(&actor.name)
        .bind::<Nullable<SqlUuid>, _>(actor.operator_id)
        .get_result(c)
        .await
        .optional()?;
        let Some(row) = decided else {
            return Err(match find(c, id).await? {
                None => DecideError::NotFound,
                Some(a) => DecideError::Decided(Box::new(a)),
            });
        };
        let approval = row.into_approval()?.0;
        let after = serde_json::to_value(&approval).unwrap_or(Value::Null);
        let before = Value::Object([("state".to_owned(), Value::from("pending"))].into_iter().collect());
        events::record(c, actor, decision.action(), Some(&id.to_string()), Some(&before), Some(&after)).await?;
        Ok(approval)
    })
    .await
}

/// One approval, or None.
///
/// # Errors
/// Database errors.
pub async fn find(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<Approval>> {
    let row: Option<Row> = diesel::sql_query(format!("SELECT {COLUMNS} FROM approvals ap WHERE ap.id = $1"))
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()?;
    row.map(|r| r.into_approval().map(|(a, _)| a)).transpose()
}
