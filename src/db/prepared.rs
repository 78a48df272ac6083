//! Server-side prepared statements for the hot-path queries.
//!
//! diesel prepares and caches a statement per connection only when it can prove that the
//! statement's type alone determines its SQL. `sql_query`, every `UPDATE` and every
//! `INSERT` with an `Option` column are refused, so diesel-async prepares them anew on
//! every call: a Parse/Describe round trip before the Bind/Execute one, plus a Close.
//! A fresh `/route` call paid that twice (receipt insert, idempotency finish) and a
//! Postgres-path replay once (BENCHMARKS.md).
//!
//! [`Prepared`] marks a statement as cacheable and drops its static query id, so that
//! the cache is keyed by the SQL text and the bind types, never by the Rust type. Two
//! statements cached under one key therefore always have the same SQL, whatever `Option`s
//! were `None`; each distinct text is one prepared statement per connection. Use it only
//! for statements with a bounded number of distinct texts (no variable-length `IN` lists).

use diesel::QueryResult;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};

/// A statement that diesel-async may keep prepared on the connection (see the module).
#[derive(Debug, Clone, Copy)]
pub struct Prepared<Q>(Q);

/// `.prepared()` on any Postgres statement.
pub trait PrepareExt: Sized {
    fn prepared(self) -> Prepared<Self> {
        Prepared(self)
    }
}

impl<Q: QueryFragment<Pg>> PrepareExt for Q {}

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}
