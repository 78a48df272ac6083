//! The limits of issue 42 (docs/DESIGN.md §6) on an agent: the rolling 7-day and lifetime
//! budgets, budgets per upstream host and the `payTo` block list; parsed with the others by
//! [`AgentChange::parse`] and written by the same change (one transaction, one event).

use std::collections::BTreeMap;

use diesel::QueryResult;
use diesel::sql_types::{Array, Bool, Jsonb, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;
use uuid::Uuid;

use super::{AgentChange, Invalid};
use crate::money::Amount;
use crate::payments::hosts::MAX_HOST_BUDGETS;
use crate::payments::limits;

/// `host_budgets`: an object of host patterns (as `allowed_hosts` takes them, lowercased) to
/// amounts (decimal strings of atomic units), at most [`MAX_HOST_BUDGETS`]; or null. Two
/// spellings of one pattern are refused (which amount was meant?).
///
/// # Errors
/// [`Invalid`] naming the entry.
pub(super) fn host_budgets(field: &str, v: &Value) -> Result<Option<BTreeMap<String, Amount>>, Invalid> {
    let entries = match v {
        Value::Null => return Ok(None),
        Value::Object(entries) => entries,
        _ => return Err(Invalid(format!("{field} must be an object of host patterns to amounts, or null"))),
    };
    if entries.len() > MAX_HOST_BUDGETS {
        return Err(Invalid(format!("{field} holds at most {MAX_HOST_BUDGETS} entries")));
    }
    let mut out = BTreeMap::new();
    for (raw, amount) in entries {
        let pattern = limits::parse_host_pattern(raw).map_err(|e| Invalid(format!("{field}: {e}")))?;
        let amount = amount.as_str().and_then(|a| Amount::parse(a).ok()).ok_or_else(|| {
            Invalid(format!(
                "{field}: the budget of {raw:?} must be a decimal string of atomic units (e.g. \"1000000\")"
            ))
        })?;
        if out.insert(pattern.clone(), amount).is_some() {
            return Err(Invalid(format!("{field}: {pattern:?} is given twice")));
        }
    }
    Ok(Some(out))
}

/// Writes the fields of issue 42 that `change` holds (inside the change's transaction).
pub(super) async fn apply(conn: &mut AsyncPgConnection, id: Uuid, change: &AgentChange) -> QueryResult<usize> {
    let amount = |a: &Option<Option<Amount>>| a.as_ref().map(|v| v.map(|x| x.to_string()));
    let (week, lifetime) = (amount(&change.week_budget), amount(&change.lifetime_budget));
    let approval = amount(&change.approval_above);
    let hosts = change.host_budgets.as_ref().map(|h| {
        h.as_ref().map(|h| Value::Object(h.iter().map(|(p, a)| (p.clone(), Value::String(a.to_string()))).collect()))
    });
    diesel::sql_query(
        "UPDATE agents SET \
            week_budget = CASE WHEN $2 THEN $3::numeric ELSE week_budget END, \
            lifetime_budget = CASE WHEN $4 THEN $5::numeric ELSE lifetime_budget END, \
            host_budgets = CASE WHEN $6 THEN $7 ELSE host_budgets END, \
            blocked_pay_to = CASE WHEN $8 THEN $9 ELSE blocked_pay_to END, \
            approval_above = CASE WHEN $10 THEN $11::numeric ELSE approval_above END \
          WHERE id = $1",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Bool, _>(week.is_some())
    .bind::<Nullable<Text>, _>(week.flatten())
    .bind::<Bool, _>(lifetime.is_some())
    .bind::<Nullable<Text>, _>(lifetime.flatten())
    .bind::<Bool, _>(hosts.is_some())
    .bind::<Nullable<Jsonb>, _>(hosts.flatten())
    .bind::<Bool, _>(change.blocked_pay_to.is_some())
    .bind::<Nullable<Array<Text>>, _>(change.blocked_pay_to.clone().flatten())
    .bind::<Bool, _>(approval.is_some())
    .bind::<Nullable<Text>, _>(approval.flatten())
    .execute(conn)
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_new_caps_are_parsed_strictly() {
        let c = AgentChange::parse(&json!({
            "week_budget": "70000", "lifetime_budget": null,
            "host_budgets": {"API.example.com": "50000", "*.example.org:443": "0"},
            "blocked_pay_to": ["0x00000000000000000000000000000000000000AA", "EmPfs5hbdp1FsvxQjan7TaNCp2KWZSQ79U8tX2zLKoTn"]
        }))
        .unwrap();
        assert_eq!(c.week_budget, Some(Some(Amount::from(70_000))));
        assert_eq!(c.lifetime_budget, Some(None));
        let hosts = c.host_budgets.unwrap().unwrap();
        assert_eq!(hosts.get("api.example.com"), Some(&Amount::from(50_000)));
        assert_eq!(hosts.get("*.example.org:443"), Some(&Amount::ZERO));
        let blocked = c.blocked_pay_to.unwrap().unwrap();
        assert_eq!(blocked[0], "0x00000000000000000000000000000000000000aa");
        assert_eq!(blocked[1], "EmPfs5hbdp1FsvxQjan7TaNCp2KWZSQ79U8tX2zLKoTn", "Solana kept as written");
        assert_eq!(AgentChange::parse(&json!({"host_budgets": null})).unwrap().host_budgets, Some(None));
        let many: serde_json::Map<String, Value> =
            (0..=MAX_HOST_BUDGETS).map(|i| (format!("h{i}.example.com"), json!("1"))).collect();
        for bad in [
            json!({"week_budget": 5}),
            json!({"lifetime_budget": "-1"}),
            json!({"host_budgets": ["api.example.com"]}),
            json!({"host_budgets": "api.example.com=5"}),
            json!({"host_budgets": {"exa mple.com": "5"}}),
            json!({"host_budgets": {"api.example.com": 5}}),
            json!({"host_budgets": {"api.example.com": "05"}}),
            json!({"host_budgets": {"api.example.com": "5", "API.example.com": "6"}}),
            json!({"host_budgets": Value::Object(many)}),
            json!({"blocked_pay_to": ["0x12"]}),
            json!({"blocked_pay_to": "0x00000000000000000000000000000000000000aa"}),
            json!({"weekly_budget": "5"}),
        ] {
            assert!(AgentChange::parse(&bad).is_err(), "{bad} accepted");
        }
    }
}
