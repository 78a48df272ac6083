//! The payment intent ledger (`payments`): one row per signed authorization, its status and
//! the agent's spend computed from it. Storage and state only; the flow that signs, sends
//! and confirms payments is `relay::pay`. Depends on nothing above `db`.
//!
//! A row is written (status `signed`) *before* the paid request leaves, and finalised in the
//! same transaction as the call's receipt and idempotency transition.

pub mod channels;
pub mod hosts;
pub mod kept;
pub mod lanes;
pub mod limits;
pub mod reprice;
pub mod sealed;
pub mod spend;
pub mod store;
pub mod usage;

use diesel::deserialize::{self, FromSql, FromSqlRow};
use diesel::expression::AsExpression;
use diesel::pg::{Pg, PgValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::Text;
use uuid::Uuid;

/// Every state a payment intent can be in; the `payments.status` CHECK constraint allows
/// exactly these (a test holds the two together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, AsExpression, FromSqlRow)]
#[diesel(sql_type = Text)]
pub enum PaymentStatus {
    /// Signed and committed; the paid request may have left. Counts against the budget.
    Signed,
    /// The chain shows the authorization consumed.
    Settled,
    /// The upstream claimed settlement, but the chain does not show it.
    Unconfirmed,
    /// The upstream answered without settling (e.g. a 5xx before settlement).
    NotSettled,
    /// The upstream refused the payment.
    Rejected,
    /// Consumed on-chain, but the upstream's answer never reached us.
    SettledResponseLost,
    /// The chain could not be read, or the answer was lost before settlement.
    Unknown,
    /// Unused on-chain after `validBefore` (found by `reconcile`): can no longer move money.
    Expired,
}

impl PaymentStatus {
    /// Every status, in the order the database lists them.
    pub const ALL: [Self; 8] = [
        Self::Signed,
        Self::Settled,
        Self::Unconfirmed,
        Self::NotSettled,
        Self::Rejected,
        Self::SettledResponseLost,
        Self::Unknown,
        Self::Expired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Signed => "signed",
            Self::Settled => "settled",
            Self::Unconfirmed => "unconfirmed",
            Self::NotSettled => "not_settled",
            Self::Rejected => "rejected",
            Self::SettledResponseLost => "settled_response_lost",
            Self::Unknown => "unknown",
            Self::Expired => "expired",
        }
    }

    /// The status named `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Money has provably moved (counted as spent).
    pub fn is_spent(self) -> bool {
        matches!(self, Self::Settled | Self::SettledResponseLost)
    }

    /// States that release their reservation (counted neither as spent nor as reserved):
    /// only a fact of the chain (unused past `validBefore`), never an upstream's word.
    pub fn releases_reservation(self) -> bool {
        matches!(self, Self::Expired)
    }
}

impl std::fmt::Display for PaymentStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromSql<Text, Pg> for PaymentStatus {
    fn from_sql(bytes: PgValue<'_>) -> deserialize::Result<Self> {
        let s = <String as FromSql<Text, Pg>>::from_sql(bytes)?;
        Self::parse(&s).ok_or_else(|| format!("unknown payment status {s:?}").into())
    }
}

impl ToSql<Text, Pg> for PaymentStatus {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
        <str as ToSql<Text, Pg>>::to_sql(self.as_str(), out)
    }
}

/// SQL condition (on a `payments p` row) for "in the rolling 24 h window": a payment counts
/// from the moment its current authorization was signed (`signed_at`, set again by every
/// re-signing) until 24 h after the last moment it could have moved money (`valid_before`),
/// never by the row's creation. A payment first signed long ago, expired unused and re-signed
/// now is spent now.
pub const IN_WINDOW_24H: &str = "GREATEST(p.signed_at, to_timestamp(p.valid_before)) > now() - interval '24 hours'";

/// SQL condition (on a `payments p` row) for "signed in the current calendar month (UTC)":
/// what a month budget counts as spent.
pub const IN_MONTH: &str = "p.signed_at >= date_trunc('month', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'";

/// What `amount` of an asset counts against budgets and caps: with a budget `rate`, its
/// charge in budget units (rounded up); without, the amount itself. `None`: too large.
pub fn charge(rate: Option<crate::money::Rate>, amount: crate::money::Amount) -> Option<crate::money::Amount> {
    rate.map_or(Some(amount), |r| r.charge(amount))
}

/// SQL list of `statuses`, e.g. `('a', 'b')`, for queries built from the enum.
pub fn sql_list(statuses: impl IntoIterator<Item = PaymentStatus>) -> String {
    let names: Vec<String> = statuses.into_iter().map(|s| format!("'{}'", s.as_str())).collect();
    format!("({})", names.join(", "))
}

/// An agent's limits and rolling 24 h usage, amounts as decimal strings of atomic units.
#[derive(Debug, Clone, serde::Serialize, diesel::QueryableByName, utoipa::ToSchema)]
pub struct Spend {
    #[diesel(sql_type = diesel::sql_types::Uuid)]
    pub agent_id: Uuid,
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub disabled: bool,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::max_per_call, required = true)]
    pub max_per_call: Option<String>,
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::daily_budget, required = true)]
    pub daily_budget: Option<String>,
    /// Spent (settled, or settled with the response lost) in the last 24 h.
    #[diesel(sql_type = Text)]
    #[schema(schema_with = doc::settled_24h, required = true)]
    pub settled_24h: String,
    /// Signed authorizations that may still move money, however old: every intent that is
    /// neither spent nor `expired` (an upstream's "rejected" or "not settled" releases nothing).
    #[diesel(sql_type = Text)]
    #[schema(schema_with = doc::reserved_24h, required = true)]
    pub reserved_24h: String,
    /// What the budget still allows (None: no budget).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::remaining_24h, required = true)]
    pub remaining_24h: Option<String>,
    /// The calendar-month budget (UTC months), if any.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::month_budget, required = false)]
    pub month_budget: Option<String>,
    /// Spent by payments signed this calendar month (UTC).
    #[diesel(sql_type = Text)]
    pub settled_month: String,
    /// What the month budget still allows: the budget less this month's spend and every
    /// reservation (None: no month budget).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::remaining_month, required = false)]
    pub remaining_month: Option<String>,
    /// Upstream hosts this agent may call (None: any the SSRF guard allows).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Array<Text>>)]
    #[schema(schema_with = doc::allowed_hosts, required = false)]
    pub allowed_hosts: Option<Vec<String>>,
    /// `payTo` addresses this agent may pay, lowercase (None: any).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Array<Text>>)]
    #[schema(schema_with = doc::allowed_pay_to, required = false)]
    pub allowed_pay_to: Option<Vec<String>>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    #[schema(required = false)]
    pub calls_per_minute: Option<i32>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
    #[schema(required = false)]
    pub payments_per_minute: Option<i32>,
    /// The rolling 7-day budget, if any.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::week_budget, required = true)]
    pub week_budget: Option<String>,
    /// Spent in the rolling 7 days (the 24 h window's rule over seven days).
    #[diesel(sql_type = Text)]
    #[schema(schema_with = doc::settled_7d)]
    pub settled_7d: String,
    /// What the week budget still allows: the budget less the week's spend and every
    /// reservation (None: no week budget).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::remaining_7d, required = true)]
    pub remaining_7d: Option<String>,
    /// The lifetime budget, if any.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::lifetime_budget, required = true)]
    pub lifetime_budget: Option<String>,
    /// Spent ever (None without a lifetime budget: not summed).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::settled_lifetime, required = true)]
    pub settled_lifetime: Option<String>,
    /// What the lifetime budget still allows, reservations included (None without one).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::remaining_lifetime, required = true)]
    pub remaining_lifetime: Option<String>,
    /// Rolling 24 h budgets per upstream host pattern, `{"pattern": "amount"}` (None: none).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
    #[schema(schema_with = doc::host_budgets, required = true)]
    pub host_budgets: Option<serde_json::Value>,
    /// `payTo` addresses this agent may never pay (None: none).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Array<Text>>)]
    #[schema(schema_with = doc::blocked_pay_to, required = true)]
    pub blocked_pay_to: Option<Vec<String>>,
    /// A paid call above this price waits for an operator's approval (None: never).
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[schema(schema_with = doc::approval_above, required = true)]
    pub approval_above: Option<String>,
    /// With host budgets: what each upstream host counts in the rolling 24 h (spent and
    /// reserved), `{"host[:port]": "amount"}`, `""` for intents of unknown host. Shown per
    /// pattern by [`Spend::host_budget_uses`].
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Jsonb>)]
    #[serde(skip)]
    pub host_used_24h: Option<serde_json::Value>,
    /// The upstream host this spend was read for (`payments.upstream_host`'s form), whose host
    /// budgets [`Spend::limits`] applies; None: none.
    #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
    #[serde(skip)]
    pub upstream_host: Option<String>,
    /// The wallet-wide `payTo` block list (`router_settings.blocked_pay_to`), read with the
    /// agent's limits; shown with the settings.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Array<Text>>)]
    #[serde(skip)]
    pub wallet_blocked_pay_to: Option<Vec<String>>,
}

/// The schemas of [`Spend`]'s members as the OpenAPI document states them.
mod doc {
    use utoipa::openapi::RefOr;
    use utoipa::openapi::schema::Schema;

    use crate::schema_doc as s;

    pub fn max_per_call() -> RefOr<Schema> {
        s::amount_or_null("Per-call cap; null: none.")
    }
    pub fn daily_budget() -> RefOr<Schema> {
        s::amount_or_null("Rolling 24 h budget; null: none.")
    }
    pub fn settled_24h() -> RefOr<Schema> {
        s::amount("Settled (or settled, response lost) in the last 24 h.")
    }
    pub fn reserved_24h() -> RefOr<Schema> {
        s::amount("Reserved, not known to have settled: signed, unknown, unconfirmed.")
    }
    pub fn remaining_24h() -> RefOr<Schema> {
        s::amount_or_null("What the budget still allows; null: no budget.")
    }
    pub fn month_budget() -> RefOr<Schema> {
        s::string_or_null("The calendar-month budget (UTC), atomic units; null: none.")
    }
    pub fn remaining_month() -> RefOr<Schema> {
        s::string_or_null("What the month budget still allows (reservations included); null without one.")
    }
    pub fn allowed_hosts() -> RefOr<Schema> {
        s::strings_or_null("Upstream hosts this agent may call (null: any).")
    }
    pub fn allowed_pay_to() -> RefOr<Schema> {
        s::strings_or_null("payTo addresses this agent may pay (null: any).")
    }
    pub fn week_budget() -> RefOr<Schema> {
        s::amount_or_null("Rolling 7-day budget; null: none.")
    }
    pub fn settled_7d() -> RefOr<Schema> {
        s::amount("Settled (or settled, response lost) in the last 7 days.")
    }
    pub fn remaining_7d() -> RefOr<Schema> {
        s::amount_or_null("What the week budget still allows (reservations included); null without one.")
    }
    pub fn lifetime_budget() -> RefOr<Schema> {
        s::amount_or_null("Lifetime budget; null: none.")
    }
    pub fn settled_lifetime() -> RefOr<Schema> {
        s::amount_or_null("Settled ever; null without a lifetime budget (not summed).")
    }
    pub fn remaining_lifetime() -> RefOr<Schema> {
        s::amount_or_null("What the lifetime budget still allows (reservations included); null without one.")
    }
    pub fn host_budgets() -> RefOr<Schema> {
        RefOr::T(super::hosts::budgets_schema("Rolling 24 h budgets per upstream host pattern (null: none)."))
    }
    pub fn approval_above() -> RefOr<Schema> {
        s::amount_or_null("A paid call above this price waits for an operator's approval; null: none.")
    }
    pub fn blocked_pay_to() -> RefOr<Schema> {
        s::strings_or_null("payTo addresses this agent may never pay (null: none).")
    }
}

impl Spend {
    /// The agent's spending limits, parsed once from the stored amounts.
    ///
    /// # Errors
    /// [`BadAmount`](crate::money::BadAmount) when a stored value is unreadable: callers fail closed.
    pub fn limits(&self) -> Result<Limits, crate::money::BadAmount> {
        let parse = |v: &Option<String>| v.as_deref().map(crate::money::Amount::parse).transpose();
        Ok(Limits {
            per_call: parse(&self.max_per_call)?,
            day_left: parse(&self.remaining_24h)?,
            month_left: parse(&self.remaining_month)?,
            week_left: parse(&self.remaining_7d)?,
            lifetime_left: parse(&self.remaining_lifetime)?,
            host_left: self.upstream_host.as_deref().map(|host| hosts::left_at(self, host)).transpose()?.flatten(),
        })
    }

    /// Each host budget with what it counts and has left in the rolling 24 h (empty without
    /// host budgets).
    ///
    /// # Errors
    /// [`BadAmount`](crate::money::BadAmount) when a stored value is unreadable.
    pub fn host_budget_uses(&self) -> Result<Vec<hosts::HostBudgetUse>, crate::money::BadAmount> {
        hosts::uses(self)
    }
}

/// What one payment of an agent may be now: its per-call cap and what its budgets have left
/// (each `None`: no such limit), in atomic units of the router's one unit. Built by
/// [`Spend::limits`], the one parser of the stored amounts; [`Limits::headroom`] is the one
/// place that takes the smallest of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub per_call: Option<crate::money::Amount>,
    pub day_left: Option<crate::money::Amount>,
    pub month_left: Option<crate::money::Amount>,
    pub week_left: Option<crate::money::Amount>,
    pub lifetime_left: Option<crate::money::Amount>,
    /// What the host budgets matching the call's upstream host have left (the smallest).
    pub host_left: Option<crate::money::Amount>,
}

impl Limits {
    /// The most one payment may be now: the smallest of the per-call cap and what the
    /// budgets have left (`None`: no limit).
    pub fn headroom(&self) -> Option<crate::money::Amount> {
        [self.per_call, self.budget_left()].into_iter().flatten().min()
    }

    /// What the budgets (day, month, week, lifetime, the call's host) have left together
    /// (`None`: no budget).
    pub fn budget_left(&self) -> Option<crate::money::Amount> {
        [self.day_left, self.month_left, self.week_left, self.lifetime_left, self.host_left].into_iter().flatten().min()
    }

    /// Why `amount` may not be paid under these limits (the first one it exceeds), if any.
    pub fn exceeded_by(&self, amount: crate::money::Amount) -> Option<String> {
        if let Some(cap) = self.per_call.filter(|c| amount > *c) {
            return Some(format!("the price {amount} exceeds the agent's per-call cap {cap}"));
        }
        if let Some(left) = self.day_left.filter(|l| amount > *l) {
            return Some(format!("the price {amount} exceeds what remains of the agent's daily budget ({left})"));
        }
        if let Some(left) = self.month_left.filter(|l| amount > *l) {
            return Some(format!("the price {amount} exceeds what remains of the agent's month budget ({left})"));
        }
        if let Some(left) = self.week_left.filter(|l| amount > *l) {
            return Some(format!("the price {amount} exceeds what remains of the agent's weekly budget ({left})"));
        }
        if let Some(left) = self.lifetime_left.filter(|l| amount > *l) {
            return Some(format!("the price {amount} exceeds what remains of the agent's lifetime budget ({left})"));
        }
        if let Some(left) = self.host_left.filter(|l| amount > *l) {
            return Some(format!(
                "the price {amount} exceeds what remains of the agent's daily budget for this upstream host ({left})"
            ));
        }
        None
    }
}

/// What the recording transaction writes to the intent.
#[derive(Debug, Clone)]
pub struct Final {
    pub id: Uuid,
    pub status: PaymentStatus,
    pub tx_hash: Option<String>,
    pub error: Option<String>,
    /// What recovery of a lost answer did (only for a takeover that found the payment used).
    pub recovery: Option<RecoveryNote>,
}

/// How recovering a paid answer that was lost ended (the `payments.recovery` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryKind {
    /// The upstream gave back the original answer (a byte-identical re-send).
    Recovered,
    /// A new execution, reached by signing in as the payer (SIWX).
    Reaccessed,
    /// Nothing could be recovered: settled, response lost.
    Lost,
}

impl RecoveryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Recovered => "recovered",
            Self::Reaccessed => "reaccessed",
            Self::Lost => "lost",
        }
    }
}

/// The ledger's record of a recovery: its ending and every attempt.
#[derive(Debug, Clone)]
pub struct RecoveryNote {
    pub kind: RecoveryKind,
    /// One entry per attempt, oldest first.
    pub log: Vec<RecoveryStep>,
}

impl RecoveryNote {
    /// The `payments.recovery` value: `{"outcome", "attempts": [{"action": …}, …]}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "outcome": self.kind.as_str(), "attempts": self.log })
    }
}

/// One attempt of a recovery, as stored in `payments.recovery.attempts` (`{"action": …}`).
/// Written and read only through this type, never as hand-built JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum RecoveryStep {
    /// Nothing could be tried, and why (nothing stored to re-send, not advertised, refused
    /// by the upstream policy, disabled).
    None { why: String },
    /// Cut short by the deadline, while the upstream might still answer.
    Stop { why: String },
    /// A byte-identical re-send of the paid request (`payment-identifier`).
    Resend(Exchange),
    /// The unpaid request that fetches a sign-in challenge (SIWX).
    Challenge(Exchange),
    /// Signing in as the payer to run the request again (SIWX).
    SignIn(Exchange),
    /// A later round of recovery began (`reconcile`).
    Round { by: String, at: String },
    /// An entry this version does not know (kept as it was, never rewritten).
    #[serde(untagged)]
    Unknown(serde_json::Value),
}

/// What one request of a recovery did. Absent fields did not apply.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Exchange {
    /// When it was sent (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    /// The upstream's HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The transport error, when no answer came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What came of it, in words (`recovered`, `refused: …`, `not tried: …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The transaction the chain shows used the payment (a recovered answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transaction: Option<String>,
    /// The transaction an answer claimed when it was refused for naming the wrong one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_transaction: Option<String>,
    /// The upstream's `Retry-After`, when it said "still in flight".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The sign-in challenge's nonce (SIWX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

impl RecoveryStep {
    /// Nothing tried, because `why`.
    pub fn none(why: impl Into<String>) -> Self {
        Self::None { why: why.into() }
    }

    /// The attempts stored in a `payments.recovery` value (none when absent or unreadable).
    pub fn stored(recovery: Option<&serde_json::Value>) -> Vec<Self> {
        recovery
            .and_then(|r| r.get("attempts"))
            .and_then(|a| serde_json::from_value(a.clone()).ok())
            .unwrap_or_default()
    }
}

impl Exchange {
    /// A request sent at `at` (RFC 3339).
    pub fn at(at: &str) -> Self {
        Self { at: Some(at.to_owned()), ..Self::default() }
    }

    /// Nothing sent: only what came of it.
    pub fn result(result: impl Into<String>) -> Self {
        Self { result: Some(result.into()), ..Self::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_steps_keep_the_stored_shape_and_unknown_entries() {
        use serde_json::json;
        let step = RecoveryStep::Resend(Exchange { status: Some(503), ..Exchange::at("2026-12-04T00:00:00Z") });
        let stored = json!({"action": "resend", "at": "2026-12-04T00:00:00Z", "status": 503});
        assert_eq!(serde_json::to_value(&step).unwrap(), stored);
        let log = json!([
            {"action": "none", "why": "not advertised"},
            {"action": "sign-in", "result": "reaccessed", "status": 200},
            {"action": "round", "by": "reconcile", "at": "t"},
            {"action": "teleport", "to": "mars"},
        ]);
        let steps = RecoveryStep::stored(Some(&json!({"outcome": "lost", "attempts": log})));
        assert_eq!(steps[0], RecoveryStep::none("not advertised"));
        assert!(matches!(&steps[1], RecoveryStep::SignIn(e) if e.status == Some(200)));
        assert!(matches!(&steps[2], RecoveryStep::Round { .. }));
        assert!(matches!(&steps[3], RecoveryStep::Unknown(_)));
        assert_eq!(serde_json::to_value(&steps).unwrap(), log, "written back as read");
    }

    #[test]
    fn names_round_trip() {
        for s in PaymentStatus::ALL {
            assert_eq!(PaymentStatus::parse(s.as_str()), Some(s));
        }
        assert_eq!(PaymentStatus::parse("paid"), None);
        assert_eq!(sql_list([PaymentStatus::Signed, PaymentStatus::Expired]), "('signed', 'expired')");
    }

    #[test]
    fn headroom_is_the_smallest_limit_and_each_limit_is_named_when_exceeded() {
        use crate::money::Amount;
        let a = |n: u64| Some(Amount::from(n));
        let limits = Limits { per_call: a(50), day_left: a(30), month_left: a(40), ..Limits::default() };
        assert_eq!((limits.headroom(), limits.budget_left()), (a(30), a(30)));
        assert_eq!(Limits::default().headroom(), None);
        assert_eq!(Limits { per_call: a(5), month_left: a(9), ..Limits::default() }.headroom(), a(5));
        assert_eq!(limits.exceeded_by(Amount::from(30)), None);
        assert!(limits.exceeded_by(Amount::from(31)).unwrap().contains("daily budget"));
        assert!(limits.exceeded_by(Amount::from(51)).unwrap().contains("per-call cap"));
        let month = Limits { day_left: a(100), month_left: a(40), ..Limits::default() };
        assert!(month.exceeded_by(Amount::from(41)).unwrap().contains("month budget"));
        // Each newer budget narrows the headroom and is named when exceeded.
        for (limits, name) in [
            (Limits { day_left: a(100), week_left: a(20), ..Limits::default() }, "weekly budget"),
            (Limits { month_left: a(100), lifetime_left: a(20), ..Limits::default() }, "lifetime budget"),
            (Limits { per_call: a(100), host_left: a(20), ..Limits::default() }, "for this upstream host"),
        ] {
            assert_eq!((limits.headroom(), limits.budget_left()), (a(20), a(20)));
            assert_eq!(limits.exceeded_by(Amount::from(20)), None);
            assert!(limits.exceeded_by(Amount::from(21)).unwrap().contains(name), "{name}");
        }
    }
}
