//! The `operators` table. Every function takes the caller's connection (so that a change
//! and its [`super::events::record`] share one transaction).

use chrono::{DateTime, Utc};
use diesel::sql_types::{Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

/// An operator as listed (never the token or its hash).
#[derive(Debug, Clone, Serialize, QueryableByName, utoipa::ToSchema)]
#[schema(as = Operator, description = "An operator as listed: never its token or the token's hash.")]
pub struct OperatorInfo {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub name: String,
    /// `viewer` or `admin`.
    #[diesel(sql_type = Text)]
    #[schema(value_type = super::Role)]
    pub role: String,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// Set once revoked: the token is refused from then on (null: live).
    #[diesel(sql_type = Nullable<Timestamptz>)]
    #[schema(required = true)]
    pub revoked_at: Option<DateTime<Utc>>,
}

const COLUMNS: &str = "id, name, role, created_at, revoked_at";

/// Inserts an operator with the hash of its token.
///
/// # Errors
/// Database errors (a duplicate hash included).
pub async fn create(
    conn: &mut AsyncPgConnection,
    id: Uuid,
    name: &str,
    role: super::Role,
    token_hash: &str,
) -> QueryResult<OperatorInfo> {
    diesel::sql_query(format!(
        "INSERT INTO operators (id, name, role, token_hash) VALUES ($1, $2, $3, $4) RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(id)
    .bind::<Text, _>(name)
    .bind::<Text, _>(role.as_str())
    .bind::<Text, _>(token_hash)
    .get_result(conn)
    .await
}

/// Every operator, revoked ones included, oldest first.
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection) -> QueryResult<Vec<OperatorInfo>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM operators ORDER BY created_at, id")).load(conn).await
}

/// Serializes the changes of operators: until the transaction ends, no other transaction
/// may insert, revoke or lock them (reads, and so every token lookup, go on). A revocation
/// that counts the live admins takes it first, so that two admins revoking each other at
/// once cannot both see the other as the one left.
///
/// # Errors
/// Database errors (`lock_timeout` included).
pub async fn lock_changes(conn: &mut AsyncPgConnection) -> QueryResult<()> {
    diesel::sql_query("LOCK TABLE operators IN SHARE ROW EXCLUSIVE MODE").execute(conn).await.map(|_| ())
}

/// One operator, revoked or not.
///
/// # Errors
/// Database errors.
pub async fn find(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<OperatorInfo>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM operators WHERE id = $1"))
        .bind::<SqlUuid, _>(id)
        .get_result(conn)
        .await
        .optional()
}

/// Live (not revoked) admins.
///
/// # Errors
/// Database errors.
pub async fn live_admins(conn: &mut AsyncPgConnection) -> QueryResult<i64> {
    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    let c: Count = diesel::sql_query("SELECT count(*) AS n FROM operators WHERE role = 'admin' AND revoked_at IS NULL")
        .get_result(conn)
        .await?;
    Ok(c.n)
}

/// Sets `revoked_at` (kept when already set); the row after, `None` when there is no such
/// operator.
///
/// # Errors
/// Database errors.
pub async fn mark_revoked(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<OperatorInfo>> {
    diesel::sql_query(format!(
        "UPDATE operators SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(id)
    .get_result(conn)
    .await
    .optional()
}

/// The live (not revoked) operator whose token hashes to `token_hash`.
///
/// # Errors
/// Database errors.
pub async fn find_by_hash(conn: &mut AsyncPgConnection, token_hash: &str) -> QueryResult<Option<OperatorInfo>> {
    diesel::sql_query(format!("SELECT {COLUMNS} FROM operators WHERE token_hash = $1 AND revoked_at IS NULL"))
        .bind::<Text, _>(token_hash)
        .get_result(conn)
        .await
        .optional()
}
