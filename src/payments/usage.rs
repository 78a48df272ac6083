//! The budget arithmetic in SQL, written once (docs/DESIGN.md §6, "Operators' limits"): what a
//! payment counts against an agent's (or the wallet's) budgets, as aggregate expressions over a
//! `payments p` row set. The reservation's checks (`spend`, `limits`), the budget gauges, the
//! agent's own view and the admin API all build their queries from these, so a budget can
//! never be shown one way and enforced another.
//!
//! The rule: a payment counts from the moment its current authorization was signed while it
//! may still move money (every status but the releasing ones); once spent (settled) only within
//! the window ([`IN_WINDOW_24H`](super::IN_WINDOW_24H), [`IN_MONTH`](super::IN_MONTH)).

use std::sync::LazyLock;

use super::{IN_MONTH, IN_WINDOW_24H, PaymentStatus, sql_list};

/// `(…)` of the statuses whose money moved.
static SPENT: LazyLock<String> = LazyLock::new(|| sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent())));
/// `(…)` of the statuses that release their reservation.
static RELEASED: LazyLock<String> =
    LazyLock::new(|| sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.releases_reservation())));

/// Condition: `p` counts against some budget at all (not released; spent ones only in a window).
pub fn counted() -> String {
    format!(
        "p.status NOT IN {released} AND (p.status NOT IN {spent} OR {IN_WINDOW_24H} OR {IN_MONTH})",
        released = *RELEASED,
        spent = *SPENT
    )
}

/// Condition: `p` counts against the rolling 24 h budget (spent in the window, or reserved).
pub fn in_day() -> String {
    format!(
        "p.status NOT IN {released} AND (p.status NOT IN {spent} OR {IN_WINDOW_24H})",
        released = *RELEASED,
        spent = *SPENT
    )
}

/// Condition: `p` is spent (settled) in the rolling 24 h window.
pub fn spent_in_day() -> String {
    format!("p.status IN {spent} AND {IN_WINDOW_24H}", spent = *SPENT)
}

/// Condition: `p` is spent (settled) in the calendar month.
pub fn spent_in_month() -> String {
    format!("p.status IN {spent} AND {IN_MONTH}", spent = *SPENT)
}

/// Condition: `p` is reserved (signed, not known to be spent, not released).
pub fn reserved() -> String {
    format!("p.status NOT IN {released} AND p.status NOT IN {spent}", released = *RELEASED, spent = *SPENT)
}

/// Condition: `p` counts against the calendar-month budget (spent this month, or reserved).
pub fn in_month() -> String {
    format!(
        "p.status NOT IN {released} AND (p.status NOT IN {spent} OR {IN_MONTH})",
        released = *RELEASED,
        spent = *SPENT
    )
}

/// What a payment `p` counts against budgets, in budget units: its amount, or with a budget
/// currency its amount at the rate recorded at its reservation, rounded up (`money::Rate::charge`,
/// exact: numeric integer division). Every budget sum is of this.
pub const CHARGE: &str = "(CASE WHEN p.budget_den IS NULL THEN p.amount \
                          ELSE div(p.amount * p.budget_num + p.budget_den - 1, p.budget_den) END)";

/// `COALESCE(sum(charge) FILTER (WHERE cond), 0)` ([`CHARGE`]).
pub fn sum_where(cond: &str) -> String {
    format!("COALESCE(sum({CHARGE}) FILTER (WHERE {cond}), 0)")
}

/// SQL condition (on a `payments p` row) for "in the rolling 7-day window": the rule of
/// [`IN_WINDOW_24H`] over seven days (from the current authorization's signing until 7 days
/// after its `validBefore`).
pub const IN_WINDOW_7D: &str = "GREATEST(p.signed_at, to_timestamp(p.valid_before)) > now() - interval '7 days'";

/// Condition: `p` is spent (settled) in the rolling 7-day window.
pub fn spent_in_week() -> String {
    format!("p.status IN {spent} AND {IN_WINDOW_7D}", spent = *SPENT)
}

/// Condition: `p` counts against the rolling 7-day budget (spent in the window, or reserved).
pub fn in_week() -> String {
    format!(
        "p.status NOT IN {released} AND (p.status NOT IN {spent} OR {IN_WINDOW_7D})",
        released = *RELEASED,
        spent = *SPENT
    )
}

/// Condition: `p` is spent (settled), whenever.
pub fn spent_ever() -> String {
    format!("p.status IN {spent}", spent = *SPENT)
}

/// Condition: `p` counts against the lifetime budget (spent ever, or reserved): every payment
/// that did not release its reservation.
pub fn in_lifetime() -> String {
    format!("p.status NOT IN {released}", released = *RELEASED)
}
