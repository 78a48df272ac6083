//! Creating, listing and revoking operators: the one implementation behind
//! `/admin/operators` and `x402-router operators`, so both parse and refuse alike.
//!
//! Every change runs in one transaction with its `operator_events` row (`operator.create`,
//! `operator.revoke`; before and after as [`OperatorInfo`], which never holds the token or its
//! hash). A token is returned once, by [`create`], and stored only as its sha256.
//!
//! Revocation is idempotent: revoking a revoked operator answers it as it is (its first
//! `revoked_at`) and writes no second event. The last live admin is not revoked while no
//! bootstrap `OPERATOR_TOKEN` could take over ([`Bootstrap::Absent`]): the admins would lock
//! themselves out of the control plane. The count and the revocation are serialized by
//! [`store::lock_changes`], so two admins revoking each other at once cannot both succeed.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use super::store::{self, OperatorInfo};
use super::{Actor, Role, events, generate_token, hash_token};
use crate::idempotency::canonical::parse_strict;

/// The `action` of an operator's creation in `operator_events`.
pub const CREATE: &str = "operator.create";
/// The `action` of a revocation.
pub const REVOKE: &str = "operator.revoke";

/// Longest name, in characters.
pub const MAX_NAME_CHARS: usize = 200;

/// Why an operator change did not happen (nothing changed).
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    #[error("{0}")]
    Invalid(String),
    #[error("no such operator")]
    NotFound,
    #[error(
        "this is the last live admin operator and no bootstrap OPERATOR_TOKEN is configured: revoking it would \
         leave no one able to administer the router; create another admin first"
    )]
    LastAdmin,
    #[error("no randomness for a new token: {0}")]
    NoRandomness(getrandom::Error),
    #[error(transparent)]
    Database(#[from] diesel::result::Error),
}

/// Whether the bootstrap `OPERATOR_TOKEN` is there to administer the router without any
/// operator row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bootstrap {
    Configured,
    Absent,
}

/// The body of `POST /admin/operators`: both members required, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = NewOperator)]
pub struct NewOperator {
    /// 1 to 200 printable characters (no control, format or line-breaking characters);
    /// surrounding spaces are trimmed.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    pub role: Role,
}

impl NewOperator {
    /// From a request body: a JSON object with exactly `name` and `role` (a member repeated,
    /// unknown or of the wrong type is refused).
    ///
    /// # Errors
    /// [`OperatorError::Invalid`] saying what is wrong.
    pub fn from_json(body: &[u8]) -> Result<Self, OperatorError> {
        let invalid =
            |e: &dyn std::fmt::Display| OperatorError::Invalid(format!("the body must be {{\"name\", \"role\"}}: {e}"));
        // Strict JSON: a member given twice is refused, not silently the last one.
        let value = parse_strict(body).map_err(|e| invalid(&e))?;
        if !value.is_object() {
            return Err(invalid(&"not a JSON object"));
        }
        let parsed: Self = serde_json::from_value(value).map_err(|e| invalid(&e))?;
        Self::new(&parsed.name, parsed.role.as_str())
    }

    /// From a name and a role's name (`viewer` or `admin`).
    ///
    /// # Errors
    /// [`OperatorError::Invalid`] naming the field.
    pub fn new(name: &str, role: &str) -> Result<Self, OperatorError> {
        let name = name.trim_matches(' ');
        if name.is_empty() || name.chars().count() > MAX_NAME_CHARS || !name.chars().all(printable) {
            return Err(OperatorError::Invalid(format!(
                "name must be 1 to {MAX_NAME_CHARS} printable characters (no control, format or line-breaking characters)"
            )));
        }
        let role =
            Role::parse(role).ok_or_else(|| OperatorError::Invalid("role must be `viewer` or `admin`".into()))?;
        Ok(Self { name: name.to_owned(), role })
    }
}

/// Not a control character, an invisible format character (bidirectional overrides,
/// zero-width characters, soft hyphen, byte order mark), a noncharacter, or whitespace other
/// than the space: what could hide or disguise a name in a list or a log.
fn printable(c: char) -> bool {
    let format = matches!(
        c,
        '\u{ad}'
            | '\u{600}'..='\u{605}'
            | '\u{61c}'
            | '\u{6dd}'
            | '\u{70f}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    );
    let noncharacter = matches!(c, '\u{fdd0}'..='\u{fdef}') || (u32::from(c) & 0xfffe) == 0xfffe;
    !(c.is_control() || format || noncharacter || (c.is_whitespace() && c != ' '))
}

fn info_json(info: &OperatorInfo) -> Value {
    serde_json::to_value(info).unwrap_or(Value::Null)
}

/// Creates an operator; returns it and its token, shown this once.
///
/// # Errors
/// No randomness; database errors.
pub async fn create(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    new: &NewOperator,
) -> Result<(OperatorInfo, String), OperatorError> {
    let token = generate_token().map_err(OperatorError::NoRandomness)?;
    let hash = hash_token(&token);
    let id = Uuid::new_v4();
    let created = conn
        .transaction::<_, OperatorError, _>(async |c| {
            let created = store::create(c, id, &new.name, new.role, &hash).await?;
            events::record(c, actor, CREATE, Some(&id.to_string()), None, Some(&info_json(&created))).await?;
            Ok(created)
        })
        .await?;
    Ok((created, token))
}

/// Every operator, revoked ones included, oldest first (never a token or its hash).
///
/// # Errors
/// Database errors.
pub async fn list(conn: &mut AsyncPgConnection) -> Result<Vec<OperatorInfo>, OperatorError> {
    Ok(store::list(conn).await?)
}

/// Revokes an operator: its token is refused by every router from the commit on (tokens are
/// looked up in Postgres on every request). Answers the operator after the revocation.
///
/// # Errors
/// [`OperatorError::NotFound`]; [`OperatorError::LastAdmin`] for the last live admin while
/// `bootstrap` is [`Bootstrap::Absent`]; database errors.
pub async fn revoke(
    conn: &mut AsyncPgConnection,
    actor: &Actor,
    id: Uuid,
    bootstrap: Bootstrap,
) -> Result<OperatorInfo, OperatorError> {
    conn.transaction::<_, OperatorError, _>(async |c| {
        store::lock_changes(c).await?;
        let before = store::find(c, id).await?.ok_or(OperatorError::NotFound)?;
        if before.revoked_at.is_some() {
            return Ok(before);
        }
        if before.role == Role::Admin.as_str() && bootstrap == Bootstrap::Absent && store::live_admins(c).await? <= 1 {
            return Err(OperatorError::LastAdmin);
        }
        let after = store::mark_revoked(c, id).await?.ok_or(OperatorError::NotFound)?;
        let target = id.to_string();
        events::record(c, actor, REVOKE, Some(&target), Some(&info_json(&before)), Some(&info_json(&after))).await?;
        Ok(after)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_operator_is_parsed_strictly() {
        let ok = NewOperator::from_json(br#"{"name": "  alice ", "role": "admin"}"#).unwrap();
        assert_eq!(ok, NewOperator { name: "alice".into(), role: Role::Admin });
        let long = "é".repeat(200);
        assert_eq!(NewOperator::new(&long, "viewer").unwrap().name, long);
        for bad in [
            r#"{"name": "a", "role": "admin", "extra": 1}"#,
            r#"{"name": "a", "role": "admin", "role": "viewer"}"#,
            r#"{"name": "a"}"#,
            r#"{"role": "admin"}"#,
            r#"{"name": "a", "role": "Admin"}"#,
            r#"{"name": "a", "role": "root"}"#,
            r#"{"name": "a", "role": null}"#,
            r#"{"name": 5, "role": "admin"}"#,
            r#"{"name": null, "role": "admin"}"#,
            r#"{"name": "", "role": "admin"}"#,
            r#"{"name": "   ", "role": "admin"}"#,
            r#"{"name": "a\nb", "role": "admin"}"#,
            r#"{"name": "a\tb", "role": "admin"}"#,
            r#"{"name": "a\u0000", "role": "admin"}"#,
            r#"{"name": "admin\u202e", "role": "admin"}"#,
            r#"{"name": "a\u200bb", "role": "admin"}"#,
            r#"{"name": "a\u2028b", "role": "admin"}"#,
            r#"["a", "admin"]"#,
            r#"{"name": "a", "role": "admin"} x"#,
            "",
            "null",
        ] {
            assert!(matches!(NewOperator::from_json(bad.as_bytes()), Err(OperatorError::Invalid(_))), "{bad}");
        }
        assert!(NewOperator::new(&"a".repeat(201), "admin").is_err());
    }
}
