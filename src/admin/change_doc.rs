//! The OpenAPI schema of [`AgentChange`]'s wire form (`POST`/`PATCH /admin/agents…`), next to
//! its parser: the members, their limits ([`MAX_ALLOWLIST`], [`MAX_PER_MINUTE`]) and
//! `additionalProperties: false` are the ones [`AgentChange::parse`] enforces (a test holds
//! the member list equal to what the parser accepts).

use std::borrow::Cow;

use serde_json::{Map, Value};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};

use super::{AgentChange, MAX_ALLOWLIST, MAX_PER_MINUTE};

/// A decimal amount of atomic units, or null.
const AMOUNT: &str = "^(0|[1-9][0-9]{0,77})$";

/// The members of the wire form, with their schemas, in the parser's order.
pub(super) fn members() -> Vec<(&'static str, Schema)> {
    let nullable = |t: Type| SchemaType::from_iter([t, Type::Null]);
    let amount = |description: &str| {
        Schema::Object(
            ObjectBuilder::new()
                .schema_type(nullable(Type::String))
                .pattern(Some(AMOUNT))
                .description(Some(description))
                .build(),
        )
    };
    let list = |item: ObjectBuilder, description: &str| {
        Schema::Array(
            ArrayBuilder::new()
                .schema_type(nullable(Type::Array))
                .max_items(Some(MAX_ALLOWLIST))
                .items(item)
                .description(Some(description))
                .build(),
        )
    };
    let rate = |description: &str| {
        Schema::Object(
            ObjectBuilder::new()
                .schema_type(nullable(Type::Integer))
                .minimum(Some(1))
                .maximum(Some(MAX_PER_MINUTE))
                .description(Some(description))
                .build(),
        )
    };
    vec![
        ("name", Schema::Object(ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).max_length(Some(200)).build())),
        ("max_per_call", amount("Atomic units, decimal; null: no limit.")),
        ("daily_budget", amount("Atomic units, decimal; null: no limit.")),
        ("month_budget", amount("Spent and reserved in the calendar month (UTC), atomic units; null: no limit.")),
        (
            "allowed_hosts",
            list(
                ObjectBuilder::new().schema_type(Type::String).description(Some(
                    "`api.example.com`, `*.example.com` (any host below, not the domain itself), either optionally with `:port`.",
                )),
                "Upstream hosts the agent may call; null: any host the SSRF guard allows. A call to another host: 403 `upstream_not_allowed`, nothing written.",
            ),
        ),
        (
            "allowed_pay_to",
            list(
                ObjectBuilder::new().schema_type(Type::String).pattern(Some("^0[xX][0-9a-fA-F]{40}$")),
                "`payTo` addresses the agent may pay; null: any. Otherwise 402 `payment_not_allowed`, nothing signed.",
            ),
        ),
        ("calls_per_minute", rate("/route calls per minute (paid or not); over: 429 `rate_limited`, nothing written.")),
        ("payments_per_minute", rate("Payments signed per minute; over: 429 `rate_limited`, nothing recorded.")),
        ("week_budget", amount("Spent in a rolling 7 days plus every reservation, atomic units; null: no limit.")),
        ("lifetime_budget", amount("Spent ever plus every reservation, atomic units; null: no limit.")),
        (
            "host_budgets",
            crate::payments::hosts::budgets_schema(
                "Rolling 24 h budgets per upstream host: `{\"api.example.com\": \"50000\", \"*.example.org\": \"1000\"}` (patterns as `allowed_hosts`; a pattern's budget counts every host it matches; several matching patterns all apply); null: none. Over: 402 `payment_over_budget`, nothing signed.",
            ),
        ),
        (
            "blocked_pay_to",
            list(
                ObjectBuilder::new().schema_type(Type::String),
                "`payTo` addresses the agent may never pay (`0x` + 40 hex digits, any case; Solana addresses exactly), wins over `allowed_pay_to`; null: none. Blocked: 402 `payment_not_allowed`, nothing signed.",
            ),
        ),
        (
            "approval_above",
            amount(
                "A paid call whose price is above this (atomic units) is not signed until an operator approves it (202 `approval_pending`); `\"0\"`: every paid call; null: none.",
            ),
        ),
    ]
}

impl AgentChange {
    /// The change in its wire form (what [`AgentChange::parse`] reads back to the same
    /// change): the members it sets, `null` for a removed limit.
    pub fn to_wire(&self) -> Value {
        fn put<T: serde::Serialize>(out: &mut Map<String, Value>, name: &str, v: Option<&T>) {
            if let Some(v) = v {
                out.insert(name.to_owned(), serde_json::to_value(v).unwrap_or(Value::Null));
            }
        }
        let amount = |a: &Option<Option<crate::money::Amount>>| a.map(|v| v.map(|x| x.to_string()));
        let mut out = Map::new();
        put(&mut out, "name", self.name.as_ref());
        put(&mut out, "max_per_call", amount(&self.max_per_call).as_ref());
        put(&mut out, "daily_budget", amount(&self.daily_budget).as_ref());
        put(&mut out, "month_budget", amount(&self.month_budget).as_ref());
        put(&mut out, "allowed_hosts", self.allowed_hosts.as_ref());
        put(&mut out, "allowed_pay_to", self.allowed_pay_to.as_ref());
        put(&mut out, "calls_per_minute", self.calls_per_minute.as_ref());
        put(&mut out, "payments_per_minute", self.payments_per_minute.as_ref());
        put(&mut out, "week_budget", amount(&self.week_budget).as_ref());
        put(&mut out, "lifetime_budget", amount(&self.lifetime_budget).as_ref());
        let hosts = self.host_budgets.as_ref().map(|h| {
            h.as_ref().map(|h| {
                h.iter().map(|(p, a)| (p.clone(), a.to_string())).collect::<std::collections::BTreeMap<_, _>>()
            })
        });
        put(&mut out, "host_budgets", hosts.as_ref());
        put(&mut out, "blocked_pay_to", self.blocked_pay_to.as_ref());
        put(&mut out, "approval_above", amount(&self.approval_above).as_ref());
        Value::Object(out)
    }
}

impl utoipa::PartialSchema for AgentChange {
    fn schema() -> RefOr<Schema> {
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(false)))
            .description(Some(
                "Fields to change (absent: unchanged; null: limit removed). Unknown fields are refused with 400.",
            ));
        for (name, schema) in members() {
            object = object.property(name, schema);
        }
        object.into()
    }
}

impl utoipa::ToSchema for AgentChange {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("AgentChange")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// A valid value of each member, as the parser wants it.
    fn valid(name: &str) -> Value {
        match name {
            "name" => json!("bot"),
            "allowed_hosts" => json!(["api.example.com"]),
            "allowed_pay_to" => json!(["0x1111111111111111111111111111111111111111"]),
            "calls_per_minute" | "payments_per_minute" => json!(5),
            "host_budgets" => json!({"api.example.com": "1000"}),
            "blocked_pay_to" => json!(["0x1111111111111111111111111111111111111111"]),
            _ => json!("1000"),
        }
    }

    #[test]
    fn the_wire_form_parses_back_to_the_same_change() {
        let all = json!({
            "name": "bot", "max_per_call": "1", "daily_budget": null, "month_budget": "3",
            "allowed_hosts": ["API.example.com"], "allowed_pay_to": null, "calls_per_minute": 5, "payments_per_minute": null,
            "week_budget": "1", "lifetime_budget": null, "host_budgets": {"a.example.com": "7"}, "blocked_pay_to": [],
            "approval_above": "0",
        });
        let change = AgentChange::parse(&all).unwrap();
        let wire = change.to_wire();
        assert_eq!(AgentChange::parse(&wire).unwrap(), change);
        assert_eq!(wire["allowed_hosts"], json!(["api.example.com"]), "normalized");
        assert_eq!(wire.as_object().unwrap().len(), all.as_object().unwrap().len());
        assert_eq!(AgentChange::parse(&json!({"daily_budget": "5"})).unwrap().to_wire(), json!({"daily_budget": "5"}));
    }

    #[test]
    fn the_schema_lists_exactly_what_the_parser_accepts() {
        for (name, _) in members() {
            let body = json!({ name: valid(name) });
            assert!(AgentChange::parse(&body).is_ok(), "the parser refuses the documented member {name}");
        }
        // Every member the parser knows is documented: the parser's match arms, one by one.
        let documented: Vec<&str> = members().into_iter().map(|(n, _)| n).collect();
        let all = json!({
            "name": "bot", "max_per_call": "1", "daily_budget": "1", "month_budget": "1",
            "allowed_hosts": null, "allowed_pay_to": null, "calls_per_minute": null, "payments_per_minute": null,
            "week_budget": "1", "lifetime_budget": "1", "host_budgets": null, "blocked_pay_to": null,
            "approval_above": "1",
        });
        for name in all.as_object().unwrap().keys() {
            assert!(documented.contains(&name.as_str()), "{name} is accepted but not documented");
        }
        assert_eq!(documented.len(), all.as_object().unwrap().len());
        assert!(AgentChange::parse(&all).is_ok());
        assert!(AgentChange::parse(&json!({"not_a_member": 1})).is_err());
    }
}
