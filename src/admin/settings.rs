//! The wallet-wide settings (`router_settings`): the daily cap across every agent, the
//! `payTo` block list of every agent, and the pause switch. Each change is one transaction
//! with its `operator_events` row, under the settings row's lock.

use diesel::QueryResult;
use diesel::sql_types::{Array, Bool, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use serde_json::Value;

use super::proposals::{self, Done, Gate, Rule};
use super::{AdminError, Invalid, amount, list};
use crate::money::Amount;
use crate::operators::{Actor, events};
use crate::payments::lanes;
use crate::payments::limits::{self, Settings};

/// A change to the wallet-wide settings: each field absent (unchanged), `Some(None)` (removed,
/// JSON `null`) or `Some(Some(v))`. The pause has its own calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettingsPatch {
    pub wallet_daily_cap: Option<Option<Amount>>,
    pub blocked_pay_to: Option<Option<Vec<String>>>,
}

/// Parses `PATCH /admin/settings`: `wallet_daily_cap` (a decimal string of atomic units, or
/// null) and `blocked_pay_to` (addresses as `allowed_pay_to` takes them, at most
/// [`super::MAX_ALLOWLIST`], or null); at least one. Unknown fields are refused.
///
/// # Errors
/// [`Invalid`] naming what is wrong.
pub fn parse_settings(body: &Value) -> Result<SettingsPatch, Invalid> {
    let obj = body.as_object().ok_or_else(|| Invalid("the body must be a JSON object".into()))?;
    let mut patch = SettingsPatch::default();
    for (field, v) in obj {
        match field.as_str() {
            "wallet_daily_cap" => patch.wallet_daily_cap = Some(amount(field, v)?),
            "blocked_pay_to" => patch.blocked_pay_to = Some(list(field, v, limits::parse_pay_to)?),
            other => return Err(Invalid(format!("unknown field {other:?} (pause with POST /admin/pause)"))),
        }
    }
    if patch == SettingsPatch::default() {
        return Err(Invalid("nothing to change: give wallet_daily_cap or blocked_pay_to".into()));
    }
    Ok(patch)
}

/// The settings and the wallet's rolling 24 h usage (what the cap counts).
///
/// # Errors
/// Database errors.
pub async fn settings(conn: &mut AsyncPgConnection) -> QueryResult<RouterSettings> {
    let s = limits::settings(conn, false).await?;
    let used = limits::wallet_used_24h(conn).await?;
    let locked = lanes::locked(conn).await?;
    Ok(RouterSettings::new(s, used, locked))
}

/// The wallet-wide settings as operators see them (`/admin/settings`, `/admin/pause`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct RouterSettings {
    /// Every new payment refused (503 `payments_paused`).
    pub paused: bool,
    /// Every new call refused too.
    pub pause_unpaid: bool,
    /// Most all agents together may spend and reserve in a rolling 24 h, atomic units.
    #[schema(required = true)]
    pub wallet_daily_cap: Option<String>,
    /// `payTo` addresses no agent may pay (402 `payment_not_allowed`, nothing signed); null:
    /// none.
    #[schema(required = true)]
    pub blocked_pay_to: Option<Vec<String>>,
    /// When the settings last changed.
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// What all agents spent and reserved in the rolling 24 h (the cap counts it).
    pub wallet_used_24h: String,
    /// The wallet's money locked in batch-settlement channels: deposited, not yet charged nor
    /// refunded (the cap counts it too, until refunded; never an agent's spend).
    pub wallet_locked_in_channels: String,
}

impl RouterSettings {
    fn new(s: Settings, wallet_used_24h: String, locked: Amount) -> Self {
        let Settings { paused, pause_unpaid, wallet_daily_cap, blocked_pay_to, updated_at } = s;
        let wallet_locked_in_channels = locked.to_string();
        Self {
            paused,
            pause_unpaid,
            wallet_daily_cap,
            blocked_pay_to,
            updated_at,
            wallet_used_24h,
            wallet_locked_in_channels,
        }
    }
}

/// The body of `PATCH /admin/settings` (parsed by `parse_settings`; at least one member).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsChange {
    /// Atomic units, decimal; null: no limit.
    #[schema(pattern = "^(0|[1-9][0-9]{0,77})$")]
    pub wallet_daily_cap: Option<String>,
    /// `payTo` addresses no agent may pay (`0x` + 40 hex digits, any case; or a Solana
    /// address, matched exactly), at most 100; null: none.
    #[schema(max_items = 100)]
    pub blocked_pay_to: Option<Vec<String>>,
}

/// The body of `POST /admin/pause` (what the handler accepts; absent: `{}`).
#[derive(Debug, Clone, serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// Refuse every new call too, not only payments.
    #[serde(default)]
    #[schema(default = false)]
    pub unpaid: bool,
}

/// Applies `patch` (the wallet-wide daily cap, the `payTo` block list) in one transaction
/// with its `settings.update` event.
///
/// # Errors
/// Database errors.
pub async fn update_settings(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    patch: &SettingsPatch,
) -> Result<Done<RouterSettings>, AdminError> {
    settings_change(conn, actor, "settings.update", SettingsWrite::Patch(patch), Gate::Rule(rule)).await
}

/// Pauses every new payment (and, with `unpaid`, every new call); `false`/`false` resumes
/// (under the two-person rule, a resume of a paused router is proposed). In-flight payments
/// finish.
///
/// # Errors
/// Database errors.
pub async fn set_paused(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    rule: Rule,
    paused: bool,
    unpaid: bool,
) -> Result<Done<RouterSettings>, AdminError> {
    let action = if paused { "payments.pause" } else { "payments.resume" };
    let write = SettingsWrite::Paused { paused, unpaid: paused && unpaid };
    settings_change(conn, actor, action, write, Gate::Rule(rule)).await
}

/// What a change of the settings writes.
pub(super) enum SettingsWrite<'a> {
    Patch(&'a SettingsPatch),
    Paused { paused: bool, unpaid: bool },
}

impl SettingsWrite<'_> {
    /// The values it sets, in the API's JSON form (what the two-person rule classifies).
    fn wire(&self) -> Value {
        let mut out = serde_json::Map::new();
        match self {
            Self::Patch(patch) => {
                if let Some(cap) = patch.wallet_daily_cap {
                    out.insert("wallet_daily_cap".into(), cap.map_or(Value::Null, |c| Value::String(c.to_string())));
                }
                if let Some(blocked) = &patch.blocked_pay_to {
                    out.insert("blocked_pay_to".into(), serde_json::to_value(blocked).unwrap_or(Value::Null));
                }
            }
            Self::Paused { paused, unpaid } => {
                out.insert("paused".into(), Value::Bool(*paused));
                out.insert("pause_unpaid".into(), Value::Bool(*unpaid));
            }
        }
        Value::Object(out)
    }
}

pub(super) async fn settings_change(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    action: &str,
    write: SettingsWrite<'_>,
    gate: Gate<'_>,
) -> Result<Done<RouterSettings>, AdminError> {
    conn.transaction::<_, AdminError, _>(async |c| {
        let before = limits::settings(c, true).await?;
        let now = serde_json::to_value(&before).unwrap_or(Value::Null);
        if let Some(p) = proposals::gate(c, actor, &gate, (action, "settings"), &now, &write.wire()).await? {
            return Ok(Done::Proposed(Box::new(p)));
        }
        match write {
            SettingsWrite::Patch(patch) => {
                let cap = patch.wallet_daily_cap.map(|cap| cap.map(|c| c.to_string()));
                diesel::sql_query(
                    "UPDATE router_settings SET \
                        wallet_daily_cap = CASE WHEN $1 THEN $2::numeric ELSE wallet_daily_cap END, \
                        blocked_pay_to = CASE WHEN $3 THEN $4 ELSE blocked_pay_to END, \
                        updated_at = now() WHERE id",
                )
                .bind::<Bool, _>(cap.is_some())
                .bind::<Nullable<Text>, _>(cap.flatten())
                .bind::<Bool, _>(patch.blocked_pay_to.is_some())
                .bind::<Nullable<Array<Text>>, _>(patch.blocked_pay_to.clone().flatten())
                .execute(c)
                .await?
            }
            SettingsWrite::Paused { paused, unpaid } => {
                diesel::sql_query(
                    "UPDATE router_settings SET paused = $1, pause_unpaid = $2, updated_at = now() WHERE id",
                )
                .bind::<Bool, _>(paused)
                .bind::<Bool, _>(unpaid)
                .execute(c)
                .await?
            }
        };
        let after = limits::settings(c, false).await?;
        let a = serde_json::to_value(&after).ok();
        events::record(c, actor, action, Some("settings"), Some(&now), a.as_ref()).await?;
        let used = limits::wallet_used_24h(c).await?;
        let locked = lanes::locked(c).await?;
        Ok(Done::Applied(RouterSettings::new(after, used, locked)))
    })
    .await
}
