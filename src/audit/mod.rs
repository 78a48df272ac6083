//! Operator queries (docs/DESIGN.md §8): receipts, idempotency rows, the payment ledger and agents'
//! spend, all read-only; [`reconcile`], which settles the fate of payment intents that no
//! live request owns any more; and [`verify_receipt`], the offline receipt check.
//!
//! This module turns query strings into typed filters ([`ReceiptQuery`], [`PaymentQuery`],
//! [`KeyQuery`]); [`store`] holds the SQL. The HTTP adaptation is `routes/audit.rs`, behind the
//! `Viewer` extractor (any operator token).
//!
//! Invariants:
//! - Bearer instruments are never served: payment rows are read through one column list
//!   ([`store`]) that leaves out `header_value` and `signed_authorization` (a signed
//!   authorization can be settled by anyone holding it until its `validBefore`).
//! - Lists are keyset-paginated on `(created_at, id)` ascending, with an opaque cursor naming
//!   the last row served. Rows are never skipped or served twice, whatever is inserted between
//!   two pages (an `OFFSET` would shift); rows inserted behind the cursor are simply not on
//!   later pages.
//! - Query strings are strict: an unknown or repeated parameter is a 400, so that a typo
//!   (`agent=` for `agent_id=`) can never silently widen a query.

pub mod balance;
pub mod csv;
pub mod cursor;
pub mod gauges;
pub mod overview;
pub mod reconcile;
pub mod store;
pub mod upto;
pub mod verify;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use cursor::Cursor;
pub use verify::verify_receipt;

use crate::payments::PaymentStatus;
use crate::x402::Network;

/// Rows per page when `limit` is absent.
pub const DEFAULT_LIMIT: i64 = 100;
/// The largest `limit` accepted.
pub const MAX_LIMIT: i64 = 500;
/// `older_than_secs` of `status=stuck` when absent.
pub const DEFAULT_STUCK_SECS: i64 = 120;

/// A malformed audit query; the message says which parameter and why (a 400).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadQuery(pub String);

/// Where a page starts and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    /// The last row of the previous page; `None` for the first page.
    pub after: Option<Cursor>,
    /// 1 ..= [`MAX_LIMIT`].
    pub limit: i64,
}

/// `GET /audit/receipts` filters. Time bounds: `from` inclusive, `to` exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptQuery {
    pub agent_id: Option<Uuid>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    /// `Some(true)`: only receipts with a payment; `Some(false)`: only unpaid ones.
    pub paid: Option<bool>,
    /// Canonical CAIP-2 id (`base-sepolia` is accepted and stored as `eip155:84532`).
    pub network: Option<String>,
    pub page: Page,
}

/// Which payment intents `GET /audit/payments` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaymentSelection {
    /// Every intent.
    All,
    /// Intents in one ledger status.
    Status(PaymentStatus),
    /// Money moved (`settled` or `settled_response_lost`) but the call was not served: no
    /// `completed` receipt and no `completed` idempotency row for its key.
    PaidNotServed,
    /// `signed` intents last written more than this many seconds ago: a router signed and
    /// then went away, or is taking very long. `x402-router reconcile` resolves them.
    Stuck { older_than_secs: i64 },
}

/// `GET /audit/payments` filters. Time bounds on `created_at`: `from` inclusive, `to`
/// exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentQuery {
    pub selection: PaymentSelection,
    pub agent_id: Option<Uuid>,
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub page: Page,
}

/// `GET /audit/idempotency?agent_id=&key=`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyQuery {
    pub agent_id: Uuid,
    pub key: String,
}

impl ReceiptQuery {
    /// Parses `agent_id`, `from`, `to` (RFC 3339), `paid` (`true`|`false`), `network`,
    /// `cursor`, `limit`.
    ///
    /// # Errors
    /// [`BadQuery`] naming the offending parameter.
    pub fn parse(query: &str) -> Result<Self, BadQuery> {
        let mut p = Params::parse(query, &["agent_id", "from", "to", "paid", "network", "cursor", "limit"])?;
        let from = p.take("from").map(|v| time("from", &v)).transpose()?;
        let to = p.take("to").map(|v| time("to", &v)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f > t
        {
            return Err(BadQuery("`from` must not be after `to`".into()));
        }
        let paid = match p.take("paid").as_deref() {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(_) => return Err(BadQuery("`paid` must be `true` or `false`".into())),
        };
        let network = p
            .take("network")
            .map(|v| Network::parse(v.trim()).map(|n| n.caip2()).map_err(|e| BadQuery(format!("`network`: {e}"))))
            .transpose()?;
        Ok(Self {
            agent_id: p.take("agent_id").map(|v| uuid("agent_id", &v)).transpose()?,
            from,
            to,
            paid,
            network,
            page: p.page()?,
        })
    }
}

impl PaymentQuery {
    /// Parses `status` (a ledger status, `paid_not_served` or `stuck`), `older_than_secs`
    /// (only with `stuck`), `agent_id`, `from`, `to` (RFC 3339), `cursor`, `limit`.
    ///
    /// # Errors
    /// [`BadQuery`] naming the offending parameter.
    pub fn parse(query: &str) -> Result<Self, BadQuery> {
        let mut p = Params::parse(query, &["status", "older_than_secs", "agent_id", "from", "to", "cursor", "limit"])?;
        let from = p.take("from").map(|v| time("from", &v)).transpose()?;
        let to = p.take("to").map(|v| time("to", &v)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f > t
        {
            return Err(BadQuery("`from` must not be after `to`".into()));
        }
        let older_than = p.take("older_than_secs");
        let selection = match p.take("status").as_deref() {
            None => PaymentSelection::All,
            Some("paid_not_served") => PaymentSelection::PaidNotServed,
            Some("stuck") => PaymentSelection::Stuck {
                older_than_secs: match older_than.as_deref() {
                    None => DEFAULT_STUCK_SECS,
                    Some(v) => v
                        .parse()
                        .ok()
                        .filter(|s| *s >= 0)
                        .ok_or_else(|| BadQuery("`older_than_secs` must be a non-negative integer".into()))?,
                },
            },
            Some(s) => match PaymentStatus::parse(s) {
                Some(st) => PaymentSelection::Status(st),
                None => {
                    let names: Vec<&str> = PaymentStatus::ALL.iter().map(|s| s.as_str()).collect();
                    return Err(BadQuery(format!(
                        "`status` must be one of {}, paid_not_served, stuck",
                        names.join(", ")
                    )));
                }
            },
        };
        if older_than.is_some() && !matches!(selection, PaymentSelection::Stuck { .. }) {
            return Err(BadQuery("`older_than_secs` only applies to `status=stuck`".into()));
        }
        Ok(Self {
            selection,
            agent_id: p.take("agent_id").map(|v| uuid("agent_id", &v)).transpose()?,
            from,
            to,
            page: p.page()?,
        })
    }
}

impl KeyQuery {
    /// Parses `agent_id` (uuid) and `key` (the Idempotency-Key as the agent sent it); both
    /// required.
    ///
    /// # Errors
    /// [`BadQuery`] naming the offending parameter.
    pub fn parse(query: &str) -> Result<Self, BadQuery> {
        let mut p = Params::parse(query, &["agent_id", "key"])?;
        let agent_id = p.take("agent_id").ok_or_else(|| BadQuery("`agent_id` is required".into()))?;
        let key = p.take("key").filter(|k| !k.is_empty()).ok_or_else(|| BadQuery("`key` is required".into()))?;
        Ok(Self { agent_id: uuid("agent_id", &agent_id)?, key })
    }
}

/// Query parameters by name: each at most once, only the allowed names.
pub(crate) struct Params(HashMap<String, String>);

impl Params {
    pub(crate) fn parse(query: &str, allowed: &[&str]) -> Result<Self, BadQuery> {
        let mut map = HashMap::new();
        for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                return Err(BadQuery(format!("unknown query parameter `{name}` (allowed: {})", allowed.join(", "))));
            }
            if map.insert(name.to_string(), value.into_owned()).is_some() {
                return Err(BadQuery(format!("`{name}` is given more than once")));
            }
        }
        Ok(Self(map))
    }

    pub(crate) fn take(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// `limit`: 1 to [`MAX_LIMIT`], [`DEFAULT_LIMIT`] when absent.
    pub(crate) fn limit(&mut self) -> Result<i64, BadQuery> {
        match self.take("limit") {
            None => Ok(DEFAULT_LIMIT),
            Some(v) => v
                .parse::<i64>()
                .ok()
                .filter(|l| (1..=MAX_LIMIT).contains(l))
                .ok_or_else(|| BadQuery(format!("`limit` must be an integer from 1 to {MAX_LIMIT}"))),
        }
    }

    fn page(&mut self) -> Result<Page, BadQuery> {
        let limit = self.limit()?;
        let after = self
            .take("cursor")
            .map(|c| Cursor::decode(&c).ok_or_else(|| BadQuery("`cursor` is not valid".into())))
            .transpose()?;
        Ok(Page { after, limit })
    }
}

pub(crate) fn uuid(name: &str, value: &str) -> Result<Uuid, BadQuery> {
    Uuid::parse_str(value.trim()).map_err(|_| BadQuery(format!("`{name}` must be a uuid")))
}

pub(crate) fn time(name: &str, value: &str) -> Result<DateTime<Utc>, BadQuery> {
    DateTime::parse_from_rfc3339(value.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| BadQuery(format!("`{name}` must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn receipt_query_parses_every_filter() {
        let id = Uuid::new_v4();
        let q = ReceiptQuery::parse(&format!(
            "agent_id={id}&from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00%2B01:00&paid=true&network=base-sepolia&limit=7"
        ))
        .unwrap();
        assert_eq!(q.agent_id, Some(id));
        assert_eq!(q.paid, Some(true));
        assert_eq!(q.network.as_deref(), Some("eip155:84532"));
        assert_eq!(q.page.limit, 7);
        assert_eq!(q.to.unwrap().to_rfc3339(), "2026-01-01T23:00:00+00:00");
        let empty = ReceiptQuery::parse("").unwrap();
        assert_eq!(empty.page.limit, DEFAULT_LIMIT);
        assert!(empty.page.after.is_none());
    }

    #[test]
    fn bad_values_are_refused_with_the_parameter_named() {
        for (q, name) in [
            ("limit=0", "limit"),
            ("limit=501", "limit"),
            ("limit=ten", "limit"),
            ("agent_id=nope", "agent_id"),
            ("from=yesterday", "from"),
            ("paid=yes", "paid"),
            ("network=solana", "network"),
            ("cursor=abc", "cursor"),
            ("agent=x", "agent"),
            ("paid=true&paid=false", "paid"),
            ("from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", "from"),
        ] {
            let e = ReceiptQuery::parse(q).unwrap_err();
            assert!(e.0.contains(name), "{q}: {e}");
        }
    }

    #[test]
    fn payment_query_knows_the_derived_selections() {
        assert_eq!(
            PaymentQuery::parse("status=stuck").unwrap().selection,
            PaymentSelection::Stuck { older_than_secs: DEFAULT_STUCK_SECS }
        );
        assert_eq!(
            PaymentQuery::parse("status=stuck&older_than_secs=5").unwrap().selection,
            PaymentSelection::Stuck { older_than_secs: 5 }
        );
        assert_eq!(PaymentQuery::parse("status=paid_not_served").unwrap().selection, PaymentSelection::PaidNotServed);
        for s in PaymentStatus::ALL {
            assert_eq!(PaymentQuery::parse(&format!("status={s}")).unwrap().selection, PaymentSelection::Status(s));
        }
        assert!(PaymentQuery::parse("status=paid").is_err());
        assert!(PaymentQuery::parse("status=signed&older_than_secs=5").is_err());
        assert!(PaymentQuery::parse("status=stuck&older_than_secs=-1").is_err());
    }

    #[test]
    fn key_query_requires_both_parts() {
        let id = Uuid::new_v4();
        let q = KeyQuery::parse(&format!("agent_id={id}&key=a%2Bb%20c")).unwrap();
        assert_eq!(q.key, "a+b c");
        assert!(KeyQuery::parse(&format!("agent_id={id}")).is_err());
        assert!(KeyQuery::parse("key=abc").is_err());
    }
}
