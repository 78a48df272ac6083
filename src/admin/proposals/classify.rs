//! Which changes raise spending power (docs/DESIGN.md §3, "The two-person rule"): a field's
//! value before and after, both in the API's JSON form, decide. Unknown fields raise (fail
//! closed), so a limit added later is held for a second admin until it is classified here.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::money::Amount;

/// One field of a change: its value now, the value proposed, and whether that raises what
/// an agent (or the wallet) may spend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldChange {
    pub field: String,
    /// The value now (JSON, as `GET /admin/agents/{id}` or `GET /admin/settings` show it).
    #[schema(value_type = Value)]
    pub before: Value,
    /// The value the change sets.
    #[schema(value_type = Value)]
    pub after: Value,
    /// Whether this field alone raises spending power.
    pub raises: bool,
}

/// How a field limits spending.
enum Shape {
    /// A cap (amounts, rates, the approval threshold): higher or removed raises.
    Cap,
    /// An allowlist: removed, or an entry not allowed before, raises.
    Allow,
    /// A block list: removed, or an entry no longer blocked, raises.
    Block,
    /// Budgets per host: removed, a pattern dropped or a budget higher raises.
    HostBudgets,
    /// `disabled`, `paused`, `pause_unpaid`: true → false raises.
    Stop,
    /// Spends nothing (the name).
    Neutral,
}

fn shape(field: &str) -> Option<Shape> {
    Some(match field {
        "max_per_call"
        | "daily_budget"
        | "month_budget"
        | "week_budget"
        | "lifetime_budget"
        | "approval_above"
        | "calls_per_minute"
        | "payments_per_minute"
        | "wallet_daily_cap" => Shape::Cap,
        "allowed_hosts" | "allowed_pay_to" => Shape::Allow,
        "blocked_pay_to" => Shape::Block,
        "host_budgets" => Shape::HostBudgets,
        "disabled" | "paused" | "pause_unpaid" => Shape::Stop,
        "name" => Shape::Neutral,
        _ => return None,
    })
}

/// Whether setting `field` from `before` to `after` raises spending power. Values that cannot
/// be read raise (fail closed).
pub fn raises(field: &str, before: &Value, after: &Value) -> bool {
    if before == after {
        return false;
    }
    match shape(field) {
        None => true,
        Some(Shape::Neutral) => false,
        Some(Shape::Stop) => before.as_bool() != Some(false) && after.as_bool() != Some(true),
        Some(Shape::Cap) => match (number(before), number(after)) {
            (_, None) if after.is_null() => !before.is_null(),
            (None, Some(_)) if before.is_null() => false,
            (Some(b), Some(a)) => a > b,
            _ => true,
        },
        Some(Shape::Allow) => match (set(before), set(after)) {
            (_, None) if after.is_null() => !before.is_null(),
            (None, Some(_)) if before.is_null() => false,
            (Some(b), Some(a)) => !a.is_subset(&b),
            _ => true,
        },
        Some(Shape::Block) => match (set(before), set(after)) {
            (None, _) if before.is_null() => false,
            (Some(_), None) if after.is_null() => true,
            (Some(b), Some(a)) => !b.is_subset(&a),
            _ => true,
        },
        Some(Shape::HostBudgets) => host_budgets_raise(before, after),
    }
}

fn host_budgets_raise(before: &Value, after: &Value) -> bool {
    match (before, after) {
        (Value::Null, Value::Object(_)) => false,
        (Value::Object(_), Value::Null) => true,
        (Value::Object(b), Value::Object(a)) => b.iter().any(|(pattern, old)| match (number(old), a.get(pattern)) {
            (Some(old), Some(new)) => number(new).is_none_or(|new| new > old),
            _ => true,
        }),
        _ => true,
    }
}

/// An amount (decimal string) or a rate (integer), as one comparable number.
fn number(v: &Value) -> Option<Amount> {
    match v {
        Value::String(s) => Amount::parse(s).ok(),
        Value::Number(n) => n.as_u64().map(Amount::from),
        _ => None,
    }
}

fn set(v: &Value) -> Option<BTreeSet<String>> {
    v.as_array()?.iter().map(|x| x.as_str().map(str::to_owned)).collect()
}

/// The fields of `change` (members and the values it sets) against `now` (the thing's JSON
/// now), in `change`'s order.
pub fn fields(now: &Value, change: &Map<String, Value>) -> Vec<FieldChange> {
    change
        .iter()
        .map(|(field, after)| {
            let before = now.get(field).cloned().unwrap_or(Value::Null);
            let raises = raises(field, &before, after);
            FieldChange { field: field.clone(), before, after: after.clone(), raises }
        })
        .collect()
}

/// What a confirmation compares: the members of `now` that the rule watches (every field
/// [`raises`] knows), not usage that moves with every payment.
pub fn base(now: &Value) -> Value {
    let watched = now
        .as_object()
        .map(|o| o.iter().filter(|(k, _)| shape(k).is_some()).map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    Value::Object(watched)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn higher_or_removed_caps_raise_lower_or_new_ones_do_not() {
        for field in ["max_per_call", "daily_budget", "lifetime_budget", "approval_above", "wallet_daily_cap"] {
            assert!(raises(field, &json!("100"), &json!("101")), "{field} up");
            assert!(raises(field, &json!("100"), &Value::Null), "{field} removed");
            assert!(!raises(field, &json!("100"), &json!("99")), "{field} down");
            assert!(!raises(field, &Value::Null, &json!("5")), "{field} set");
            assert!(!raises(field, &json!("100"), &json!("100")), "{field} same");
            assert!(raises(field, &json!("100"), &json!("not a number")), "{field} unreadable");
        }
        assert!(raises("calls_per_minute", &json!(5), &json!(6)));
        assert!(!raises("calls_per_minute", &json!(5), &json!(4)));
        // Amounts compare as numbers, not strings.
        assert!(raises("daily_budget", &json!("9"), &json!("10")));
        assert!(!raises("daily_budget", &json!("10"), &json!("9")));
    }

    #[test]
    fn wider_allowlists_and_narrower_block_lists_raise() {
        let (a, ab) = (json!(["a.example.com"]), json!(["a.example.com", "b.example.com"]));
        assert!(raises("allowed_hosts", &a, &ab));
        assert!(raises("allowed_hosts", &a, &Value::Null));
        assert!(raises("allowed_hosts", &a, &json!(["b.example.com"])), "swapped: one new entry");
        assert!(!raises("allowed_hosts", &ab, &a));
        assert!(!raises("allowed_pay_to", &Value::Null, &a));
        assert!(raises("blocked_pay_to", &ab, &a));
        assert!(raises("blocked_pay_to", &a, &Value::Null));
        assert!(!raises("blocked_pay_to", &a, &ab));
        assert!(!raises("blocked_pay_to", &Value::Null, &a));
    }

    #[test]
    fn host_budgets_stops_and_unknown_fields() {
        let b = json!({"a.example.com": "10"});
        assert!(raises("host_budgets", &b, &json!({"a.example.com": "11"})));
        assert!(raises("host_budgets", &b, &json!({"b.example.com": "1"})), "a.example.com's budget dropped");
        assert!(raises("host_budgets", &b, &Value::Null));
        assert!(!raises("host_budgets", &b, &json!({"a.example.com": "9", "b.example.com": "1"})));
        assert!(!raises("host_budgets", &Value::Null, &b));
        assert!(raises("disabled", &json!(true), &json!(false)), "enabling");
        assert!(!raises("disabled", &json!(false), &json!(true)), "disabling");
        assert!(raises("paused", &json!(true), &json!(false)), "resuming");
        assert!(!raises("name", &json!("a"), &json!("b")));
        assert!(raises("a_limit_added_later", &json!("1"), &json!("2")), "unknown: fail closed");
    }

    #[test]
    fn fields_and_base() {
        let now = json!({"name": "bot", "daily_budget": "100", "settled_24h": "7", "disabled": false});
        let change = json!({"name": "robot", "daily_budget": "200"});
        let f = fields(&now, change.as_object().unwrap());
        assert_eq!(
            f.iter().map(|f| (f.field.as_str(), f.raises)).collect::<Vec<_>>(),
            [("daily_budget", true), ("name", false)]
        );
        assert_eq!(
            base(&now),
            json!({"name": "bot", "daily_budget": "100", "disabled": false}),
            "usage is not watched"
        );
    }
}
