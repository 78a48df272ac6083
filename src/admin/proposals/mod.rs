//! The two-person rule (issue 42, item 2; docs/DESIGN.md §3): with `REQUIRE_SECOND_ADMIN`, an
//! admin change that raises spending power ([`classify::raises`]) is recorded as proposed
//! (`proposed_changes`) inside the change's own transaction, under the changed thing's lock,
//! and takes effect only when a *different* admin confirms it; lowering limits, disabling and
//! pausing take effect at once. A change with any raising field is proposed as a whole.
//!
//! A confirmation is one conditional UPDATE of a pending, unexpired row not proposed by the
//! confirmer (of two confirming at once exactly one wins), then, under the thing's lock, the
//! thing's watched values compared with those it was proposed against ([`classify::base`]):
//! changed in between, the confirmation refuses (stale) and nothing is written; else the
//! proposed values are applied by the same writer as an immediate change, with its event, in
//! the same transaction.

pub mod classify;

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Jsonb, Nullable, Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

pub use classify::FieldChange;

use super::{AdminError, Invalid};
use crate::operators::manage::NewOperator;
use crate::operators::{Actor, Role, events};

/// The two-person rule of a deployment: `Some(CHANGE_TTL)` with `REQUIRE_SECOND_ADMIN`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rule {
    pub ttl: Option<Duration>,
}

impl Rule {
    /// Every change applies at once (the default; the command line).
    pub const OFF: Self = Self { ttl: None };
}

/// What a change did: applied, or proposed for a second admin.
#[derive(Debug)]
pub enum Done<T> {
    Applied(T),
    Proposed(Box<Proposal>),
}

/// How a writer checks a change, inside its transaction.
pub(super) enum Gate<'a> {
    /// A new change under the deployment's rule.
    Rule(Rule),
    /// A confirmed proposal: the thing's watched values when it was proposed.
    Confirmed(&'a Value),
}

/// The state of a proposal as served: `expired` is a pending one past its `expires_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProposalState {
    Pending,
    Confirmed,
    Rejected,
    Expired,
}

impl ProposalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Confirmed => "confirmed",
            Self::Rejected => "rejected",
            Self::Expired => "expired",
        }
    }

    /// Parses the wire form.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Confirmed, Self::Rejected, Self::Expired].into_iter().find(|st| st.as_str() == s)
    }
}

/// What a proposal changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub enum ChangeKind {
    /// `PATCH /admin/agents/{id}`.
    #[serde(rename = "agent.update")]
    AgentUpdate,
    /// `POST /admin/agents/{id}/enable` (and a new agent, created disabled under the rule).
    #[serde(rename = "agent.enable")]
    AgentEnable,
    /// `PATCH /admin/settings`.
    #[serde(rename = "settings.update")]
    SettingsUpdate,
    /// `DELETE /admin/pause`.
    #[serde(rename = "payments.resume")]
    PaymentsResume,
    /// `POST /admin/operators` with the `admin` role: a second vote the proposer must not
    /// mint alone. The confirming admin receives the new token.
    #[serde(rename = "operator.create")]
    OperatorCreate,
}

impl ChangeKind {
    const ALL: [Self; 5] =
        [Self::AgentUpdate, Self::AgentEnable, Self::SettingsUpdate, Self::PaymentsResume, Self::OperatorCreate];

    /// The stored name, also the action of the change's operator event.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AgentUpdate => "agent.update",
            Self::AgentEnable => "agent.enable",
            Self::SettingsUpdate => "settings.update",
            Self::PaymentsResume => "payments.resume",
            Self::OperatorCreate => "operator.create",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A change proposed by one admin, waiting for another.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Proposal {
    pub id: Uuid,
    pub kind: ChangeKind,
    /// The agent's id, `settings`, or `operators`.
    pub target: String,
    pub state: ProposalState,
    /// The proposed values, as the request gave them (normalized); applied exactly.
    #[schema(value_type = Object)]
    pub change: Value,
    /// What would change, field by field, against the values when it was proposed.
    pub fields: Vec<FieldChange>,
    /// The proposing operator's name (`bootstrap` for the `OPERATOR_TOKEN`).
    pub proposed_by: String,
    /// null: the bootstrap `OPERATOR_TOKEN`.
    #[schema(required = true)]
    pub proposed_by_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    /// A pending proposal not confirmed by then expires (`CHANGE_TTL`).
    pub expires_at: DateTime<Utc>,
    #[schema(required = true)]
    pub decided_at: Option<DateTime<Utc>>,
    /// The confirming or rejecting operator's name.
    #[schema(required = true)]
    pub decided_by: Option<String>,
}

const COLUMNS: &str = "pc.id, pc.kind, pc.target, \
     CASE WHEN pc.state = 'pending' AND pc.expires_at <= now() THEN 'expired' ELSE pc.state END AS state, \
     pc.change, pc.fields, pc.base, pc.proposed_by, pc.proposed_by_id, pc.created_at, pc.expires_at, \
     pc.decided_at, pc.decided_by";

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Text)]
    target: String,
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = Jsonb)]
    change: Value,
    #[diesel(sql_type = Jsonb)]
    fields: Value,
    #[diesel(sql_type = Jsonb)]
    base: Value,
    #[diesel(sql_type = Text)]
    proposed_by: String,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    proposed_by_id: Option<Uuid>,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    created_at: DateTime<Utc>,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    expires_at: DateTime<Utc>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Timestamptz>)]
    decided_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    decided_by: Option<String>,
}

impl Row {
    /// The proposal and the watched values it was proposed against.
    fn into_proposal(self) -> QueryResult<(Proposal, Value)> {
        let broken =
            |what: &str| diesel::result::Error::DeserializationError(format!("proposed_changes.{what}").into());
        let kind = ChangeKind::parse(&self.kind).ok_or_else(|| broken("kind"))?;
        let state = ProposalState::parse(&self.state).ok_or_else(|| broken("state"))?;
        let fields: Vec<FieldChange> = serde_json::from_value(self.fields).map_err(|_| broken("fields"))?;
        let proposal = Proposal {
            id: self.id,
            kind,
            target: self.target,
            state,
            change: self.change,
            fields,
            proposed_by: self.proposed_by,
            proposed_by_id: self.proposed_by_id,
            created_at: self.created_at,
            expires_at: self.expires_at,
            decided_at: self.decided_at,
            decided_by: self.decided_by,
        };
        Ok((proposal, self.base))
    }
}

/// Under [`Gate::Rule`] with the rule on, records `change` of `target` as proposed when any of
/// its fields raises spending power against `now` (the thing's JSON, read under its lock);
/// under [`Gate::Confirmed`], refuses ([`AdminError::Stale`]) when the watched values of `now`
/// are not those the proposal was made against. `None`: write the change now.
pub(super) async fn gate(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    gate: &Gate<'_>,
    (action, target): (&str, &str),
    now: &Value,
    change: &Value,
) -> Result<Option<Proposal>, AdminError> {
    let ttl = match gate {
        Gate::Rule(Rule { ttl: None }) => return Ok(None),
        Gate::Rule(Rule { ttl: Some(ttl) }) => *ttl,
        Gate::Confirmed(base) if classify::base(now) == **base => return Ok(None),
        Gate::Confirmed(_) => return Err(AdminError::Stale),
    };
    let fields = change.as_object().map(|c| classify::fields(now, c)).unwrap_or_default();
    if !fields.iter().any(|f| f.raises) {
        return Ok(None);
    }
    let kind = ChangeKind::parse(action).ok_or_else(|| Invalid(format!("{action} cannot be proposed")))?;
    Ok(Some(propose(conn, actor, kind, target, change, &fields, &classify::base(now), ttl).await?))
}

#[allow(clippy::too_many_arguments)]
async fn propose(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    kind: ChangeKind,
    target: &str,
    change: &Value,
    fields: &[FieldChange],
    base: &Value,
    ttl: Duration,
) -> QueryResult<Proposal> {
    let fields = serde_json::to_value(fields).unwrap_or(Value::Null);
    let row: Row = diesel::sql_query(format!(
        "INSERT INTO proposed_changes AS pc (id, kind, target, change, fields, base, proposed_by, proposed_by_id, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, now() + make_interval(secs => $9)) RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(Uuid::new_v4())
    .bind::<Text, _>(kind.as_str())
    .bind::<Text, _>(target)
    .bind::<Jsonb, _>(change)
    .bind::<Jsonb, _>(&fields)
    .bind::<Jsonb, _>(base)
    .bind::<Text, _>(&actor.name)
    .bind::<Nullable<SqlUuid>, _>(actor.operator_id)
    .bind::<BigInt, _>(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX))
    .get_result(conn)
    .await?;
    let proposal = row.into_proposal()?.0;
    let after = serde_json::to_value(&proposal).ok();
    events::record(conn, actor, "change.propose", Some(&proposal.id.to_string()), None, after.as_ref()).await?;
    Ok(proposal)
}

/// Under the rule, a new admin operator is proposed (nothing created, no token yet): the
/// confirming admin creates it and receives its token. `None`: create it now.
///
/// # Errors
/// Database errors.
pub async fn propose_operator(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    new: &NewOperator,
) -> QueryResult<Option<Proposal>> {
    let Some(ttl) = rule.ttl.filter(|_| new.role == Role::Admin) else { return Ok(None) };
    let change = serde_json::json!({ "name": new.name, "role": new.role });
    let fields = [
        FieldChange { field: "name".into(), before: Value::Null, after: change["name"].clone(), raises: false },
        FieldChange { field: "role".into(), before: Value::Null, after: change["role"].clone(), raises: true },
    ];
    let kind = ChangeKind::OperatorCreate;
    conn.transaction(async |c| {
        propose(c, actor, kind, "operators", &change, &fields, &serde_json::json!({}), ttl).await
    })
    .await
    .map(Some)
}

/// A confirmed change; for a new admin operator, its token (shown this once, to the
/// confirming admin).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Confirmed {
    #[serde(flatten)]
    pub change: Proposal,
    /// `operator.create`: the new admin's `x4o_…` token, shown this once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// Most proposals one listing returns (newest first).
pub const MAX_LISTED: i64 = 500;

/// The proposals in `state` (None: every state), newest first, at most [`MAX_LISTED`].
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection, state: Option<ProposalState>) -> QueryResult<Vec<Proposal>> {
    let rows: Vec<Row> = diesel::sql_query(format!(
        "SELECT * FROM (SELECT {COLUMNS} FROM proposed_changes pc) q \
          WHERE $1::text IS NULL OR q.state = $1 ORDER BY q.created_at DESC, q.id DESC LIMIT {MAX_LISTED}"
    ))
    .bind::<Nullable<Text>, _>(state.map(ProposalState::as_str))
    .load(conn)
    .await?;
    rows.into_iter().map(|r| r.into_proposal().map(|(p, _)| p)).collect()
}

/// One proposal, or None.
///
/// # Errors
/// Database errors.
pub async fn find(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<Proposal>> {
    let row: Option<Row> = diesel::sql_query(format!("SELECT {COLUMNS} FROM proposed_changes pc WHERE pc.id = $1"))
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()?;
    row.map(|r| r.into_proposal().map(|(p, _)| p)).transpose()
}

/// Why a confirmation or rejection did not happen; nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("no such change")]
    NotFound,
    /// Already confirmed or rejected (by another admin, or twice), or expired.
    #[error("the change is already {}", .0.state.as_str())]
    Decided(Box<Proposal>),
    /// The proposer tried to confirm their own change, or the confirmer is the bootstrap
    /// `OPERATOR_TOKEN`, which names no person (it could be the proposer's).
    #[error("a change is confirmed by a named admin other than the one who proposed it")]
    OwnChange,
    /// What the change would apply to changed since it was proposed.
    #[error("the change's target changed since it was proposed; propose it again")]
    Stale,
    #[error(transparent)]
    Admin(AdminError),
}

impl From<diesel::result::Error> for DecideError {
    fn from(e: diesel::result::Error) -> Self {
        Self::Admin(AdminError::Database(e))
    }
}

impl From<AdminError> for DecideError {
    fn from(e: AdminError) -> Self {
        match e {
            AdminError::Stale => Self::Stale,
            e => Self::Admin(e),
        }
    }
}

/// The conditional UPDATE that decides a pending, unexpired proposal; `confirm` adds that the
/// decider is not the proposer (the same operator row, or the same row-less name).
fn decide_sql(confirm: bool) -> String {
    let not_own = if confirm {
        " AND NOT (pc.proposed_by_id IS NOT DISTINCT FROM $4 AND (pc.proposed_by_id IS NOT NULL OR pc.proposed_by = $3))"
    } else {
        ""
    };
    format!(
        "UPDATE proposed_changes pc SET state = $2, decided_at = now(), decided_by = $3, decided_by_id = $4 \
          WHERE pc.id = $1 AND pc.state = 'pending' AND pc.expires_at > now(){not_own} RETURNING {COLUMNS}"
    )
}

async fn claim(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    confirm: bool,
) -> Result<(Proposal, Value), DecideError> {
    let row: Option<Row> = diesel::sql_query(decide_sql(confirm))
        .bind::<SqlUuid, _>(id)
        .bind::<Text, _>(if confirm { "confirmed" } else { "rejected" })
        .bind::<Text, _>(&actor.name)
        .bind::<Nullable<SqlUuid>, _>(actor.operator_id)
        .get_result(conn)
        .await
        .optional()?;
    if let Some(row) = row {
        return Ok(row.into_proposal()?);
    }
    Err(match find(conn, id).await? {
        None => DecideError::NotFound,
        Some(p) if p.state == ProposalState::Pending => DecideError::OwnChange,
        Some(p) => DecideError::Decided(Box::new(p)),
    })
}

/// Rejects the pending proposal `id` (any admin, its proposer too), with a `change.reject`
/// event.
///
/// # Errors
/// [`DecideError::NotFound`], [`DecideError::Decided`]; database errors.
pub async fn reject(conn: &mut AsyncPgConnection, actor: &Actor, id: Uuid) -> Result<Proposal, DecideError> {
    conn.transaction::<_, DecideError, _>(async |c| {
        let (proposal, _) = claim(c, actor, id, false).await?;
        let after = serde_json::to_value(&proposal).ok();
        events::record(c, actor, "change.reject", Some(&id.to_string()), None, after.as_ref()).await?;
        Ok(proposal)
    })
    .await
}

/// Confirms the pending proposal `id` as `actor` (a named admin, not its proposer) and applies
/// exactly its values, in one transaction with a `change.confirm` event and the change's own
/// event.
///
/// # Errors
/// [`DecideError::NotFound`], [`DecideError::Decided`], [`DecideError::OwnChange`],
/// [`DecideError::Stale`] (nothing written); database errors.
pub async fn confirm(conn: &mut AsyncPgConnection, actor: &Actor, id: Uuid) -> Result<Confirmed, DecideError> {
    // The rule counts people: a token without an operator row (the bootstrap
    // `OPERATOR_TOKEN`) cannot show that its holder is not the proposer.
    if actor.operator_id.is_none() {
        return Err(DecideError::OwnChange);
    }
    conn.transaction::<_, DecideError, _>(async |c| {
        let (proposal, base) = claim(c, actor, id, true).await?;
        let mut token = None;
        let gate = Gate::Confirmed(&base);
        let bad = |what: &str| DecideError::Admin(Invalid(format!("the stored change's {what} is unreadable")).into());
        match proposal.kind {
            ChangeKind::AgentUpdate | ChangeKind::AgentEnable => {
                let agent = Uuid::parse_str(&proposal.target).map_err(|_| bad("target"))?;
                let parsed;
                let write = match proposal.kind {
                    ChangeKind::AgentEnable => super::AgentWrite::Disabled(false),
                    _ => {
                        parsed = super::AgentChange::parse(&proposal.change).map_err(|_| bad("values"))?;
                        super::AgentWrite::Limits(&parsed)
                    }
                };
                super::changed(c, actor, agent, proposal.kind.as_str(), write, gate).await?;
            }
            ChangeKind::SettingsUpdate | ChangeKind::PaymentsResume => {
                super::confirmed_settings(c, actor, proposal.kind, &proposal.change, gate).await?;
            }
            ChangeKind::OperatorCreate => {
                let name = proposal.change["name"].as_str().ok_or_else(|| bad("name"))?;
                let new = NewOperator::new(name, Role::Admin.as_str()).map_err(|_| bad("name"))?;
                token = Some(super::confirmed_operator(c, actor, &new).await?);
            }
        }
        let after = serde_json::to_value(&proposal).ok();
        events::record(c, actor, "change.confirm", Some(&id.to_string()), None, after.as_ref()).await?;
        Ok(Confirmed { change: proposal, token })
    })
    .await
}
