//! The `operators` table. Every function takes the caller's connection (so that a change
//! and its [`super::events::record`] share one transaction).

use chrono::{DateTime, Utc};
use diesel::sql_types::{Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryResult, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

/// An operator as listed (never the token or its hash).
#[derive(Debug, Clone, Serialize, QueryableByName)]
pub struct OperatorInfo {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = Text)]
    pub name: String,
    /// `viewer` or `admin`.
    #[diesel(sql_type = Text)]
    pub role: String,
    #[diesel(sql_type = Timestamptz)]
    pub created_at: DateTime<Utc>,
    /// Set once revoked: the token is refused from then on.
    #[diesel(sql_type = Nullable<Timestamptz>)]
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

/// Revokes an operator: its row before and after, or `None` when there is no such
/// operator. Revoking a revoked operator changes nothing (its `revoked_at` stays).
///
/// # Errors
/// Database errors.
pub async fn revoke(conn: &mut AsyncPgConnection, id: Uuid) -> QueryResult<Option<(OperatorInfo, OperatorInfo)>> {
    let before: Option<OperatorInfo> =
        diesel::sql_query(format!("SELECT {COLUMNS} FROM operators WHERE id = $1 FOR UPDATE"))
            .bind::<SqlUuid, _>(id)
            .get_result(conn)
            .await
            .optional()?;
    let Some(before) = before else {
        return Ok(None);
    };
    let after: OperatorInfo = diesel::sql_query(format!(
        "UPDATE operators SET revoked_at = COALESCE(revoked_at, now()) WHERE id = $1 RETURNING {COLUMNS}"
    ))
    .bind::<SqlUuid, _>(id)
    .get_result(conn)
    .await?;
    Ok(Some((before, after)))
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
