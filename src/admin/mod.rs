//! The operator's control plane (docs/DESIGN.md §8): agents (create, change limits,
//! disable, enable, rotate the key), the wallet-wide settings and the pause switch. The HTTP
//! API (`/admin/*`) and the command line (`x402-router agents …`) call these same functions
//! with the same [`AgentChange`], so both validate alike.
//!
//! Every change runs in one transaction with its `operator_events` row (who, what, before and
//! after): a change that fails leaves no event, and an event always names a change that
//! happened. Bad input is refused before the transaction opens and changes nothing.

use diesel::sql_types::{Array, Bool, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;
use uuid::Uuid;

use crate::keys::{generate_api_key, hash_api_key};
use crate::money::Amount;
use crate::operators::{Actor, events};
use crate::payments::limits;
use crate::payments::{Spend, store};

/// Input an operator got wrong; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

/// Why a change did not happen.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("no such agent")]
    NotFound,
    #[error("no randomness for a new key: {0}")]
    NoRandomness(getrandom::Error),
    /// A confirmed proposal's target changed since it was proposed; nothing written.
    #[error("the change's target changed since it was proposed")]
    Stale,
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
    /// A batch-settlement channel's chain could not be read, or the wallet's transaction failed.
    #[error(transparent)]
    Channel(#[from] crate::relay::pay::registry::channels::ChannelError),
}

/// Most entries in an allowlist.
pub const MAX_ALLOWLIST: usize = 100;
/// Highest per-minute rate an operator can set.
pub const MAX_PER_MINUTE: i64 = 1_000_000;

/// A change to an agent: each field absent (unchanged), `Some(None)` (limit removed, JSON
/// `null`) or `Some(Some(v))`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentChange {
    pub name: Option<String>,
    pub max_per_call: Option<Option<Amount>>,
    pub daily_budget: Option<Option<Amount>>,
    pub month_budget: Option<Option<Amount>>,
    pub allowed_hosts: Option<Option<Vec<String>>>,
    pub allowed_pay_to: Option<Option<Vec<String>>>,
    pub calls_per_minute: Option<Option<i32>>,
    pub payments_per_minute: Option<Option<i32>>,
    pub week_budget: Option<Option<Amount>>,
    pub lifetime_budget: Option<Option<Amount>>,
    /// Pattern (as `allowed_hosts`) → rolling 24 h budget at the hosts it matches.
    pub host_budgets: Option<Option<std::collections::BTreeMap<String, Amount>>>,
    pub blocked_pay_to: Option<Option<Vec<String>>>,
    /// A paid call above this price waits for an operator's approval (`crate::approvals`).
    pub approval_above: Option<Option<Amount>>,
}

impl AgentChange {
    /// Parses a JSON object: `name` (1–200 characters), amounts as decimal strings of atomic
    /// units, allowlists as arrays of strings (hosts: `host`, `*.domain`, optionally
    /// `:port`; payTo: `0x` or Solana addresses, the block list alike), rates as integers
    /// 1–1000000, `host_budgets` as an object of host patterns to amounts; `null` removes a limit.
    /// Unknown fields are refused (a typo must not pass as "no limit").
    ///
    /// # Errors
    /// [`Invalid`] naming the field.
    pub fn parse(body: &Value) -> Result<Self, Invalid> {
        let Some(obj) = body.as_object() else {
            return Err(Invalid("the body must be a JSON object".into()));
        };
        let mut change = Self::default();
        for (field, v) in obj {
            match field.as_str() {
                "name" => change.name = Some(name(v)?),
                "max_per_call" => change.max_per_call = Some(amount(field, v)?),
                "daily_budget" => change.daily_budget = Some(amount(field, v)?),
                "month_budget" => change.month_budget = Some(amount(field, v)?),
                "allowed_hosts" => change.allowed_hosts = Some(list(field, v, limits::parse_host_pattern)?),
                "allowed_pay_to" => change.allowed_pay_to = Some(list(field, v, limits::parse_pay_to)?),
                "calls_per_minute" => change.calls_per_minute = Some(rate(field, v)?),
                "payments_per_minute" => change.payments_per_minute = Some(rate(field, v)?),
                "week_budget" => change.week_budget = Some(amount(field, v)?),
                "lifetime_budget" => change.lifetime_budget = Some(amount(field, v)?),
                "host_budgets" => change.host_budgets = Some(caps::host_budgets(field, v)?),
                "blocked_pay_to" => change.blocked_pay_to = Some(list(field, v, limits::parse_pay_to)?),
                "approval_above" => change.approval_above = Some(amount(field, v)?),
                other => return Err(Invalid(format!("unknown field {other:?}"))),
            }
        }
        Ok(change)
    }

    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

fn name(v: &Value) -> Result<String, Invalid> {
    match v.as_str().map(str::trim) {
        Some(n) if !n.is_empty() && n.chars().count() <= 200 && !n.chars().any(char::is_control) => Ok(n.to_owned()),
        _ => Err(Invalid("name must be a string of 1 to 200 printable characters".into())),
    }
}

fn amount(field: &str, v: &Value) -> Result<Option<Amount>, Invalid> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Amount::parse(s).map(Some).map_err(|_| {
            Invalid(format!("{field} must be a decimal string of atomic units (no sign, no leading zeros), or null"))
        }),
        _ => Err(Invalid(format!("{field} must be a decimal string of atomic units (e.g. \"1000000\"), or null"))),
    }
}

fn list(
    field: &str,
    v: &Value,
    parse: fn(&str) -> Result<String, limits::BadEntry>,
) -> Result<Option<Vec<String>>, Invalid> {
    let items = match v {
        Value::Null => return Ok(None),
        Value::Array(items) => items,
        _ => return Err(Invalid(format!("{field} must be an array of strings, or null"))),
    };
    if items.len() > MAX_ALLOWLIST {
        return Err(Invalid(format!("{field} holds at most {MAX_ALLOWLIST} entries")));
    }
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        let s = item.as_str().ok_or_else(|| Invalid(format!("{field} must be an array of strings")))?;
        let parsed = parse(s).map_err(|e| Invalid(format!("{field}: {e}")))?;
        if !out.contains(&parsed) {
            out.push(parsed);
        }
    }
    Ok(Some(out))
}

fn rate(field: &str, v: &Value) -> Result<Option<i32>, Invalid> {
    match v {
        Value::Null => Ok(None),
        _ => v
            .as_i64()
            .filter(|n| (1..=MAX_PER_MINUTE).contains(n))
            .and_then(|n| i32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| Invalid(format!("{field} must be an integer from 1 to {MAX_PER_MINUTE}, or null"))),
    }
}

/// An agent as operators see it: name, limits and usage (never the key).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[schema(as = AdminAgent, description = "An agent's limits and usage as operators see them (never its key).")]
pub struct AgentView {
    pub name: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    #[serde(flatten)]
    pub spend: Spend,
    /// Each host budget with what it counts and has left in the rolling 24 h.
    pub host_budget_use: Vec<crate::payments::hosts::HostBudgetUse>,
}

impl AgentView {
    fn new(name: String, created_at: chrono::DateTime<chrono::Utc>, spend: Spend) -> Self {
        let host_budget_use = spend.host_budget_uses().unwrap_or_default();
        Self { name, created_at, spend, host_budget_use }
    }
}

#[derive(QueryableByName)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
    #[diesel(sql_type = Timestamptz)]
    created_at: chrono::DateTime<chrono::Utc>,
}

/// One agent, or None.
///
/// # Errors
/// Database errors.
pub async fn agent(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<AgentView>> {
    let row: Option<NameRow> = diesel::sql_query("SELECT name, created_at FROM agents WHERE id = $1")
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()?;
    let Some(row) = row else { return Ok(None) };
    let spend = store::agent_spend(conn, id, false).await?;
    Ok(spend.map(|spend| AgentView::new(row.name, row.created_at, spend)))
}

/// Every agent with its spend, oldest first, in one statement (500 agents are one query,
/// not a thousand).
///
/// # Errors
/// Database errors.
pub async fn agents(conn: &mut AsyncPgConnection) -> QueryResult<Vec<AgentView>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(embed)]
        named: NameRow,
        #[diesel(embed)]
        spend: Spend,
    }
    let rows: Vec<Row> = diesel::sql_query(format!(
        "SELECT s.*, ag.name, ag.created_at FROM ({}) s JOIN agents ag ON ag.id = s.agent_id \
          ORDER BY ag.created_at, ag.id",
        *crate::payments::spend::SPEND_OF_EVERY_AGENT
    ))
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| AgentView::new(r.named.name, r.named.created_at, r.spend)).collect())
}

fn view_json(v: &AgentView) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Creates an agent with `change` (its `name` is required); returns it and its key, shown
/// this once. Under the two-person rule the agent is created disabled, with a proposal to
/// enable it for a second admin.
///
/// # Errors
/// [`AdminError::Invalid`] without a name; database errors.
pub async fn create_agent(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    change: &AgentChange,
) -> Result<(AgentView, String, Option<Proposal>), AdminError> {
    let name = change.name.clone().ok_or_else(|| Invalid("name is required".into()))?;
    let key = generate_api_key().map_err(AdminError::NoRandomness)?;
    let id = Uuid::new_v4();
    let (view, proposal) = conn
        .transaction::<_, AdminError, _>(async |c| {
            diesel::sql_query("INSERT INTO agents (id, name, api_key_hash, disabled) VALUES ($1, $2, $3, $4)")
                .bind::<SqlUuid, _>(id)
                .bind::<Text, _>(&name)
                .bind::<Text, _>(hash_api_key(&key))
                .bind::<Bool, _>(rule.ttl.is_some())
                .execute(c)
                .await?;
            apply(c, id, change).await?;
            let view = agent(c, id).await?.ok_or(AdminError::NotFound)?;
            events::record(c, actor, "agent.create", Some(&id.to_string()), None, Some(&view_json(&view))).await?;
            let enable = serde_json::json!({ "disabled": false });
            let target = ("agent.enable", id.to_string());
            let proposal =
                proposals::gate(c, actor, &Gate::Rule(rule), (target.0, &target.1), &view_json(&view), &enable).await?;
            Ok((view, proposal))
        })
        .await?;
    Ok((view, key, proposal))
}

/// Changes an agent's name and limits.
///
/// # Errors
/// [`AdminError::Invalid`] for an empty change, [`AdminError::NotFound`]; database errors.
pub async fn update_agent(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    id: Uuid,
    change: &AgentChange,
) -> Result<Done<AgentView>, AdminError> {
    if change.is_empty() {
        return Err(Invalid("nothing to change: give at least one field".into()).into());
    }
    changed(conn, actor, id, "agent.update", AgentWrite::Limits(change), Gate::Rule(rule)).await
}

/// Disables (`true`) or enables an agent. A disabled agent's key is refused (403) by every
/// router within the auth cache's window (1 s).
///
/// # Errors
/// [`AdminError::NotFound`]; database errors.
pub async fn set_disabled(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    id: Uuid,
    disabled: bool,
) -> Result<Done<AgentView>, AdminError> {
    let action = if disabled { "agent.disable" } else { "agent.enable" };
    changed(conn, actor, id, action, AgentWrite::Disabled(disabled), Gate::Rule(rule)).await
}

/// Gives an agent a new key; the old one is refused (401) by every router within the auth
/// cache's window (1 s). Returns the new key, shown this once.
///
/// # Errors
/// [`AdminError::NotFound`]; database errors.
pub async fn rotate_key(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
) -> Result<(AgentView, String), AdminError> {
    let key = generate_api_key().map_err(AdminError::NoRandomness)?;
    let hash = hash_api_key(&key);
    match changed(conn, actor, id, "agent.rotate_key", AgentWrite::KeyHash(&hash), Gate::Rule(Rule::OFF)).await? {
        Done::Applied(view) => Ok((view, key)),
        Done::Proposed(_) => Err(Invalid("a key rotation is never proposed".into()).into()),
    }
}

/// What a change of an agent writes.
enum AgentWrite<'a> {
    Limits(&'a AgentChange),
    Disabled(bool),
    KeyHash(&'a str),
}

impl AgentWrite<'_> {
    /// The values it sets, in the API's JSON form (what the two-person rule classifies).
    fn wire(&self) -> Value {
        match self {
            Self::Limits(change) => change.to_wire(),
            Self::Disabled(disabled) => serde_json::json!({ "disabled": disabled }),
            Self::KeyHash(_) => serde_json::json!({}),
        }
    }
}

/// Runs `write` on agent `id` in one transaction: locks the row, reads it before, asks the
/// two-person rule ([`proposals::gate`]: a raising change is proposed instead), writes, reads
/// it after, and records the event.
async fn changed(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    action: &str,
    write: AgentWrite<'_>,
    gate: Gate<'_>,
) -> Result<Done<AgentView>, AdminError> {
    conn.transaction::<_, AdminError, _>(async |c| {
        let locked = diesel::sql_query("SELECT 1 FROM agents WHERE id = $1 FOR NO KEY UPDATE")
            .bind::<SqlUuid, _>(id)
            .execute(c)
            .await?;
        if locked == 0 {
            return Err(AdminError::NotFound);
        }
        let before = agent(c, id).await?.ok_or(AdminError::NotFound)?;
        let (target, now) = (id.to_string(), view_json(&before));
        if let Some(p) = proposals::gate(c, actor, &gate, (action, &target), &now, &write.wire()).await? {
            return Ok(Done::Proposed(Box::new(p)));
        }
        match write {
            AgentWrite::Limits(change) => apply(c, id, change).await?,
            AgentWrite::Disabled(disabled) => {
                diesel::sql_query("UPDATE agents SET disabled = $2 WHERE id = $1")
                    .bind::<SqlUuid, _>(id)
                    .bind::<Bool, _>(disabled)
                    .execute(c)
                    .await?
            }
            AgentWrite::KeyHash(hash) => {
                diesel::sql_query("UPDATE agents SET api_key_hash = $2 WHERE id = $1")
                    .bind::<SqlUuid, _>(id)
                    .bind::<Text, _>(hash)
                    .execute(c)
                    .await?
            }
        };
        let after = agent(c, id).await?.ok_or(AdminError::NotFound)?;
        events::record(c, actor, action, Some(&target), Some(&now), Some(&view_json(&after))).await?;
        Ok(Done::Applied(after))
    })
    .await
}

/// Applies a confirmed proposal of the settings (`proposals::confirm`, inside its
/// transaction) through the settings' one writer.
async fn confirmed_settings(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    kind: proposals::ChangeKind,
    change: &Value,
    gate: Gate<'_>,
) -> Result<(), AdminError> {
    let patch;
    let write = match kind {
        proposals::ChangeKind::PaymentsResume => settings::SettingsWrite::Paused { paused: false, unpaid: false },
        _ => {
            patch = parse_settings(change).map_err(|_| Invalid("the stored change's values are unreadable".into()))?;
            settings::SettingsWrite::Patch(&patch)
        }
    };
    settings::settings_change(conn, actor, kind.as_str(), write, gate).await.map(|_| ())
}

/// Creates the admin operator of a confirmed proposal (`proposals::confirm`, inside its
/// transaction): its token, shown once to the confirming admin.
async fn confirmed_operator(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    new: &crate::operators::manage::NewOperator,
) -> Result<String, AdminError> {
    use crate::operators::manage::{self, OperatorError};
    match manage::create(conn, actor, new).await {
        Ok((_, token)) => Ok(token),
        Err(OperatorError::NoRandomness(e)) => Err(AdminError::NoRandomness(e)),
        Err(OperatorError::Database(e)) => Err(AdminError::Database(e)),
        Err(e) => Err(Invalid(e.to_string()).into()),
    }
}

/// Writes the fields `change` holds.
async fn apply(conn: &mut AsyncPgConnection, id: Uuid, change: &AgentChange) -> QueryResult<usize> {
    caps::apply(conn, id, change).await?;
    let amount = |a: &Option<Option<Amount>>| a.as_ref().map(|v| v.map(|x| x.to_string()));
    let (max, day, month) = (amount(&change.max_per_call), amount(&change.daily_budget), amount(&change.month_budget));
    diesel::sql_query(
        "UPDATE agents SET \
            name = CASE WHEN $2 THEN $3 ELSE name END, \
            max_per_call = CASE WHEN $4 THEN $5::numeric ELSE max_per_call END, \
            daily_budget = CASE WHEN $6 THEN $7::numeric ELSE daily_budget END, \
            month_budget = CASE WHEN $8 THEN $9::numeric ELSE month_budget END, \
            allowed_hosts = CASE WHEN $10 THEN $11 ELSE allowed_hosts END, \
            allowed_pay_to = CASE WHEN $12 THEN $13 ELSE allowed_pay_to END, \
            calls_per_minute = CASE WHEN $14 THEN $15 ELSE calls_per_minute END, \
            payments_per_minute = CASE WHEN $16 THEN $17 ELSE payments_per_minute END \
          WHERE id = $1",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Bool, _>(change.name.is_some())
    .bind::<Nullable<Text>, _>(change.name.as_deref())
    .bind::<Bool, _>(max.is_some())
    .bind::<Nullable<Text>, _>(max.flatten())
    .bind::<Bool, _>(day.is_some())
    .bind::<Nullable<Text>, _>(day.flatten())
    .bind::<Bool, _>(month.is_some())
    .bind::<Nullable<Text>, _>(month.flatten())
    .bind::<Bool, _>(change.allowed_hosts.is_some())
    .bind::<Nullable<Array<Text>>, _>(change.allowed_hosts.clone().flatten())
    .bind::<Bool, _>(change.allowed_pay_to.is_some())
    .bind::<Nullable<Array<Text>>, _>(change.allowed_pay_to.clone().flatten())
    .bind::<Bool, _>(change.calls_per_minute.is_some())
    .bind::<Nullable<Integer>, _>(change.calls_per_minute.flatten())
    .bind::<Bool, _>(change.payments_per_minute.is_some())
    .bind::<Nullable<Integer>, _>(change.payments_per_minute.flatten())
    .execute(conn)
    .await
}

/// The body of `POST /admin/reconcile` (absent: every open payment).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileRequest {
    /// The one payment to reconcile; absent or null: every open one.
    pub payment_id: Option<Uuid>,
}

/// Reconciles one payment (`only`) or every open one now, as `x402-router reconcile` does
/// without its grace period (recovery of lost answers stays with the scheduled command), and
/// records that an operator ran it, with its report.
///
/// # Errors
/// [`AdminError::NotFound`] for an unknown payment id; database errors.
pub async fn reconcile(
    conn: &mut AsyncPgConnection,
    (chain, solana): (&crate::x402::Chain, Option<std::sync::Arc<crate::chains::solana::SolanaRpcs>>),
    abandon_after: std::time::Duration,
    actor: &Actor,
    only: Option<Uuid>,
) -> Result<crate::audit::reconcile::Report, AdminError> {
    use crate::audit::reconcile;
    if let Some(id) = only {
        let found =
            diesel::sql_query("SELECT 1 FROM payments WHERE id = $1").bind::<SqlUuid, _>(id).execute(conn).await?;
        if found == 0 {
            return Err(AdminError::NotFound);
        }
    }
    let settings = reconcile::Settings {
        older_than: std::time::Duration::ZERO,
        abandon_after,
        faults: None,
        only,
        solana,
        progress: None,
    };
    let report = reconcile::run(conn, chain, &settings, None).await?;
    let target = only.map(|id| id.to_string());
    let after = serde_json::to_value(report).ok();
    events::record(conn, actor, "payments.reconcile", target.as_deref(), None, after.as_ref()).await?;
    Ok(report)
}

pub mod approval_queue;
mod caps;
mod change_doc;
pub mod channels;
pub mod proposals;
mod settings;

use proposals::Gate;
pub use proposals::{Done, Proposal, Rule};

pub use settings::{
    PauseRequest, RouterSettings, SettingsChange, SettingsPatch, parse_settings, set_paused, settings, update_settings,
};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_change_is_parsed_strictly() {
        let c = AgentChange::parse(&json!({
            "name": " bot ", "month_budget": "5000000", "daily_budget": null,
            "allowed_hosts": ["API.example.com", "*.example.org:443", "api.example.com"],
            "allowed_pay_to": ["0x00000000000000000000000000000000000000AA"], "calls_per_minute": 60
        }))
        .unwrap();
        assert_eq!(c.name.as_deref(), Some("bot"));
        assert_eq!(c.daily_budget, Some(None));
        assert_eq!(c.allowed_hosts, Some(Some(vec!["api.example.com".into(), "*.example.org:443".into()])));
        assert_eq!(c.allowed_pay_to, Some(Some(vec!["0x00000000000000000000000000000000000000aa".into()])));
        assert_eq!(c.calls_per_minute, Some(Some(60)));
        assert_eq!(c.payments_per_minute, None);
        for bad in [
            json!([]),
            json!({"name": ""}),
            json!({"name": "a\u{0}b"}),
            json!({"month_budget": 5}),
            json!({"month_budget": "-5"}),
            json!({"month_budget": "1.5"}),
            json!({"max_per_call": "007"}),
            json!({"allowed_hosts": "example.com"}),
            json!({"allowed_hosts": ["exa mple.com"]}),
            json!({"allowed_pay_to": ["0x12"]}),
            json!({"calls_per_minute": 0}),
            json!({"calls_per_minute": 1.5}),
            json!({"calls_per_minute": 10_000_000}),
            json!({"dailyBudget": "5"}),
        ] {
            assert!(AgentChange::parse(&bad).is_err(), "{bad} accepted");
        }
        assert!(parse_settings(&json!({"wallet_daily_cap": "100"})).is_ok());
        let cleared = SettingsPatch { wallet_daily_cap: Some(None), blocked_pay_to: None };
        assert_eq!(parse_settings(&json!({"wallet_daily_cap": null})), Ok(cleared));
        let blocked = parse_settings(&json!({"blocked_pay_to": ["0x00000000000000000000000000000000000000AA"]}));
        assert_eq!(
            blocked.unwrap().blocked_pay_to,
            Some(Some(vec!["0x00000000000000000000000000000000000000aa".into()]))
        );
        for bad in
            [json!({"paused": true}), json!({}), json!({"blocked_pay_to": ["0x12"]}), json!({"blocked_pay_to": "x"})]
        {
            assert!(parse_settings(&bad).is_err(), "{bad} accepted");
        }
    }
}
