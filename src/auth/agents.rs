//! The `agents` table as authentication reads it. Operators' changes are `crate::admin`.

use diesel::prelude::*;
use diesel::sql_types::{Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::schema::agents;

/// What authentication needs.
#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = agents)]
pub struct AgentAuth {
    pub id: Uuid,
    pub disabled: bool,
}

/// Looks an agent up by the sha256 of its key.
///
/// # Errors
/// Database errors.
pub async fn find_by_key_hash(conn: &mut AsyncPgConnection, key_hash: &str) -> QueryResult<Option<AgentAuth>> {
    agents::table.filter(agents::api_key_hash.eq(key_hash)).select(AgentAuth::as_select()).first(conn).await.optional()
}

/// Inserts an agent. Limits are decimal strings of atomic units.
///
/// # Errors
/// Database errors.
pub async fn insert(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    name: &str,
    key_hash: &str,
    max_per_call: Option<&str>,
    daily_budget: Option<&str>,
) -> QueryResult<()> {
    diesel::sql_query(
        "INSERT INTO agents (id, name, api_key_hash, max_per_call, daily_budget) \
         VALUES ($1, $2, $3, $4::numeric, $5::numeric)",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(name)
    .bind::<Text, _>(key_hash)
    .bind::<Nullable<Text>, _>(max_per_call)
    .bind::<Nullable<Text>, _>(daily_budget)
    .execute(conn)
    .await
    .map(|_| ())
}
