//! Budgets per upstream host (docs/DESIGN.md §6): what one agent may spend at one API in a
//! rolling 24 h. An operator names the API by a pattern of the host allowlist's form
//! (`api.example.com`, `*.example.org`, either with `:port`: [`limits::host_matches`]); a
//! pattern's budget counts every payment of the agent whose upstream host it matches
//! (`payments.upstream_host`, written at reservation), with the 24 h budget's rule (spent in
//! the window, plus every reservation). When several patterns match a host, each applies.
//! An intent of unknown host (written before the column) counts against every pattern.
//!
//! The sums per host are read in SQL with the agent's other sums (`spend`); the patterns are
//! matched here, by the allowlist's one matcher.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Schema, SchemaType, Type};

use super::Spend;
use super::limits::host_matches;
use crate::money::{Amount, BadAmount};

/// Most host budgets per agent.
pub const MAX_HOST_BUDGETS: usize = 100;

/// The stored form of an upstream host: `host` lowercase, with `:port` when the URL names
/// one (`payments.upstream_host`).
pub fn key(host: &str, port: Option<u16>) -> String {
    let host = host.to_ascii_lowercase();
    port.map_or_else(|| host.clone(), |p| format!("{host}:{p}"))
}

/// The host and the port of a stored [`key`] (an IPv6 literal keeps its colons in brackets).
pub fn split(key: &str) -> (&str, Option<u16>) {
    match key.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => match p.parse::<u16>() {
            Ok(port) => (h, Some(port)),
            Err(_) => (key, None),
        },
        _ => (key, None),
    }
}

/// One host budget as shown: the pattern, the budget, what it counts now and what is left.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct HostBudgetUse {
    /// The host pattern (`api.example.com`, `*.example.org`, either with `:port`).
    pub host: String,
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub budget: String,
    /// Spent at the matching hosts in the rolling 24 h, plus every reservation there.
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub used_24h: String,
    #[schema(schema_with = crate::schema_doc::amount_ref)]
    pub remaining_24h: String,
}

/// The budgets of `spend` by pattern, parsed (fail closed on anything unreadable).
fn budgets(spend: &Spend) -> Result<BTreeMap<&str, Amount>, BadAmount> {
    let Some(found) = &spend.host_budgets else { return Ok(BTreeMap::new()) };
    let object = found.as_object().ok_or(BadAmount)?;
    object.iter().map(|(pattern, v)| Ok((pattern.as_str(), Amount::parse(v.as_str().ok_or(BadAmount)?)?))).collect()
}

/// What each upstream host counts (`Spend::host_used_24h`), parsed.
fn used(spend: &Spend) -> Result<Vec<(&str, Amount)>, BadAmount> {
    match &spend.host_used_24h {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(hosts)) => {
            hosts.iter().map(|(h, v)| Ok((h.as_str(), Amount::parse(v.as_str().ok_or(BadAmount)?)?))).collect()
        }
        Some(_) => Err(BadAmount),
    }
}

/// What the hosts `pattern` matches count together (an unknown host, `""`, counts everywhere).
fn used_by(pattern: &str, used: &[(&str, Amount)]) -> Amount {
    let sum = used
        .iter()
        .filter(|(host, _)| {
            let (name, port) = split(host);
            host.is_empty() || host_matches(pattern, name, port)
        })
        .fold(alloy::primitives::U256::ZERO, |sum, (_, a)| sum.saturating_add(a.as_u256()));
    Amount::from_u256(sum)
}

/// What the budgets matching `host` (a stored [`key`]) have left, the smallest; `None`: no
/// budget matches it.
///
/// # Errors
/// [`BadAmount`] when a stored value is unreadable.
pub fn left_at(spend: &Spend, host: &str) -> Result<Option<Amount>, BadAmount> {
    let budgets = budgets(spend)?;
    if budgets.is_empty() {
        return Ok(None);
    }
    let used = used(spend)?;
    let (name, port) = split(host);
    Ok(budgets
        .into_iter()
        .filter(|(pattern, _)| host_matches(pattern, name, port))
        .map(|(pattern, budget)| Amount::from_u256(budget.as_u256().saturating_sub(used_by(pattern, &used).as_u256())))
        .min())
}

/// Every host budget of `spend` with what it counts and has left.
///
/// # Errors
/// [`BadAmount`] when a stored value is unreadable.
pub fn uses(spend: &Spend) -> Result<Vec<HostBudgetUse>, BadAmount> {
    let used = used(spend)?;
    Ok(budgets(spend)?
        .into_iter()
        .map(|(pattern, budget)| {
            let counted = used_by(pattern, &used);
            HostBudgetUse {
                host: pattern.to_owned(),
                budget: budget.to_string(),
                used_24h: counted.to_string(),
                remaining_24h: Amount::from_u256(budget.as_u256().saturating_sub(counted.as_u256())).to_string(),
            }
        })
        .collect())
}

/// The OpenAPI schema of a host budget map: `{"pattern": "amount"}` or null.
pub fn budgets_schema(description: &str) -> Schema {
    Schema::Object(
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
            .additional_properties(Some(AdditionalProperties::RefOr(crate::schema_doc::amount_ref())))
            .max_properties(Some(MAX_HOST_BUDGETS))
            .description(Some(description))
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn spend(budgets: Value, used: Value, host: Option<&str>) -> Spend {
        let mut s = blank();
        s.host_budgets = Some(budgets);
        s.host_used_24h = Some(used);
        s.upstream_host = host.map(str::to_owned);
        s
    }

    fn blank() -> Spend {
        Spend {
            agent_id: uuid::Uuid::nil(),
            disabled: false,
            max_per_call: None,
            daily_budget: None,
            settled_24h: "0".into(),
            reserved_24h: "0".into(),
            remaining_24h: None,
            month_budget: None,
            settled_month: "0".into(),
            remaining_month: None,
            allowed_hosts: None,
            allowed_pay_to: None,
            calls_per_minute: None,
            payments_per_minute: None,
            week_budget: None,
            settled_7d: "0".into(),
            remaining_7d: None,
            lifetime_budget: None,
            settled_lifetime: None,
            remaining_lifetime: None,
            host_budgets: None,
            blocked_pay_to: None,
            approval_above: None,
            host_used_24h: None,
            upstream_host: None,
            wallet_blocked_pay_to: None,
        }
    }

    #[test]
    fn stored_hosts_split_back_into_host_and_port() {
        assert_eq!(key("API.example.com", Some(8443)), "api.example.com:8443");
        assert_eq!(split("api.example.com:8443"), ("api.example.com", Some(8443)));
        assert_eq!(split("api.example.com"), ("api.example.com", None));
        assert_eq!(split("[::1]:80"), ("[::1]", Some(80)));
        assert_eq!(split("[::1]"), ("[::1]", None));
    }

    #[test]
    fn a_pattern_counts_every_host_it_matches_and_the_smallest_left_applies() {
        let budgets = json!({"*.example.org": "100", "a.example.org": "70", "api.example.com:8443": "50"});
        let used = json!({"a.example.org": "30", "b.example.org": "40", "api.example.com:8443": "10", "api.example.com": "99"});
        let a = |n: u64| Some(Amount::from(n));
        // a.example.org: *.example.org has 100 - (30 + 40) left, a.example.org 70 - 30: the smaller.
        assert_eq!(left_at(&spend(budgets.clone(), used.clone(), None), "a.example.org"), Ok(a(30)));
        assert_eq!(left_at(&spend(budgets.clone(), used.clone(), None), "b.example.org"), Ok(a(30)));
        assert_eq!(left_at(&spend(budgets.clone(), used.clone(), None), "api.example.com:8443"), Ok(a(40)));
        // Another port, another host: no budget.
        assert_eq!(left_at(&spend(budgets.clone(), used.clone(), None), "api.example.com"), Ok(None));
        assert_eq!(left_at(&spend(budgets.clone(), used.clone(), None), "example.org"), Ok(None));
        // An intent of unknown host counts against every pattern.
        let unknown = json!({"": "5"});
        assert_eq!(left_at(&spend(budgets.clone(), unknown, None), "api.example.com:8443"), Ok(a(45)));
        // Spent beyond the budget (a budget lowered): nothing left, never negative.
        assert_eq!(left_at(&spend(json!({"x.test": "5"}), json!({"x.test": "9"}), None), "x.test"), Ok(a(0)));
        let shown = spend(budgets, used, Some("a.example.org"));
        assert_eq!(shown.limits().unwrap().host_left, a(30));
        let uses = shown.host_budget_uses().unwrap();
        assert_eq!(uses.len(), 3);
        assert_eq!(
            (uses[0].host.as_str(), uses[0].used_24h.as_str(), uses[0].remaining_24h.as_str()),
            ("*.example.org", "70", "30")
        );
        // Unreadable stored values refuse (the caller fails closed).
        for (b, u) in [
            (json!({"x.test": 5}), json!({})),
            (json!(["x.test"]), json!({})),
            (json!({"x.test": "5"}), json!({"x.test": "-1"})),
        ] {
            assert!(left_at(&spend(b, u, None), "x.test").is_err());
        }
    }
}
