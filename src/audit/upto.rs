//! `GET /audit/upto`: per upstream (the origin of the paid URL), how the `upto` payments it
//! settled compare with what the router signed. An upstream that always takes the whole
//! signed maximum (`at_max == settled`) is charging a flat price through a metered scheme.
//!
//! Read-only. Counted from the ledger: an intent counts once the chain showed it used
//! (`settled`, `settled_response_lost`); `charged` is the ledger's `amount` (what the
//! settling transaction's logs showed moved, or the maximum when that transaction could not
//! be found), `maximum` the signed `permitted.amount`.

use diesel::QueryResult;
use diesel::prelude::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;

use crate::payments::{self, PaymentStatus};

/// One upstream's `upto` settlements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, QueryableByName, utoipa::ToSchema)]
pub struct UptoUpstream {
    /// `scheme://host[:port]` of the paid URL.
    #[diesel(sql_type = Text)]
    pub upstream: String,
    /// `upto` payments settled on-chain.
    #[diesel(sql_type = BigInt)]
    pub settled: i64,
    /// Of those, the ones that took the whole signed maximum.
    #[diesel(sql_type = BigInt)]
    pub at_max: i64,
    /// Sum charged (atomic units, decimal string).
    #[diesel(sql_type = Text)]
    pub charged: String,
    /// Sum of the signed maximums (atomic units, decimal string).
    #[diesel(sql_type = Text)]
    pub maximum: String,
}

/// Every upstream with settled `upto` payments, most settlements at the maximum first.
///
/// # Errors
/// Database errors.
pub async fn upto_upstreams(conn: &mut AsyncPgConnection) -> QueryResult<Vec<UptoUpstream>> {
    let spent = payments::sql_list(PaymentStatus::ALL.into_iter().filter(|s| s.is_spent()));
    diesel::sql_query(format!(
        "SELECT u.upstream, count(*) AS settled, count(*) FILTER (WHERE u.amount >= u.maximum) AS at_max, \
                sum(u.amount)::text AS charged, sum(u.maximum)::text AS maximum \
           FROM (SELECT coalesce(substring(p.request_url from '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]+'), '') AS upstream, \
                        p.amount, \
                        (p.signed_authorization->'permit2Authorization'->'permitted'->>'amount')::numeric AS maximum \
                   FROM payments p \
                  WHERE p.scheme = 'upto' AND p.status IN {spent}) u \
          GROUP BY u.upstream \
          ORDER BY at_max DESC, settled DESC, u.upstream"
    ))
    .load(conn)
    .await
}
