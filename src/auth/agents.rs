//! The `agents` table.

use diesel::prelude::*;
use diesel::sql_types::{Bool, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

use crate::db::schema::agents;

/// What authentication needs.
#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = agents)]
pub struct AgentAuth {
    pub id: Uuid,
    pub disabled: bool,
}

/// An agent as operators see it (never the key).
#[derive(Debug, Serialize, QueryableByName)]
pub struct AgentInfo {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub name: String,
    #[diesel(sql_type = Bool)]
    pub disabled: bool,
    #[diesel(sql_type = Nullable<Text>)]
    pub max_per_call: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    pub daily_budget: Option<String>,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: chrono::DateTime<chrono::Utc>,
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

/// Updates name and/or limits. `Some(None)` clears a limit. `false`: no such agent.
///
/// # Errors
/// Database errors.
pub async fn update(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    name: Option<&str>,
    max_per_call: Option<Option<String>>,
    daily_budget: Option<Option<String>>,
) -> QueryResult<bool> {
    let n = diesel::sql_query(
        "UPDATE agents SET \
            name = COALESCE($2, name), \
            max_per_call = CASE WHEN $3 THEN $4::numeric ELSE max_per_call END, \
            daily_budget = CASE WHEN $5 THEN $6::numeric ELSE daily_budget END \
          WHERE id = $1",
    )
    .bind::<SqlUuid, _>(id)
    .bind::<Nullable<Text>, _>(name)
    .bind::<Bool, _>(max_per_call.is_some())
    .bind::<Nullable<Text>, _>(max_per_call.flatten())
    .bind::<Bool, _>(daily_budget.is_some())
    .bind::<Nullable<Text>, _>(daily_budget.flatten())
    .execute(conn)
    .await?;
    Ok(n == 1)
}

/// Every agent, oldest first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection) -> QueryResult<Vec<AgentInfo>> {
    diesel::sql_query(
        "SELECT id, name, disabled, max_per_call::text AS max_per_call, daily_budget::text AS daily_budget, created_at \
         FROM agents ORDER BY created_at, id",
    )
    .load(conn)
    .await
}

/// Disables an agent; `false` if there is no such agent.
///
/// # Errors
/// Database errors.
pub async fn disable(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<bool> {
    let n = diesel::update(agents::table.find(id)).set(agents::disabled.eq(true)).execute(conn).await?;
    Ok(n == 1)
}
