//! The answers many operations share (`#/components/responses/<Name>`): each an error code's
//! `Error_<code>` schema with a description, and a header where the answer carries one. An
//! operation lists them as `(status = 401, response = Unauthorized)`.

use utoipa::ToResponse;
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::{ContentBuilder, Header, Ref, RefOr, Response, ResponseBuilder};

use crate::codes::Code;

/// An answer with the `Error_<code>` body and `description`.
fn error(code: Code, description: &str) -> ResponseBuilder {
    let content = ContentBuilder::new().schema(Some(Ref::from_schema_name(format!("Error_{}", code.as_str())))).build();
    ResponseBuilder::new().description(description).content("application/json", content)
}

/// An answer whose body is the `Error_<code>` schema of one of `codes`.
fn either(codes: [Code; 2], description: &str) -> ResponseBuilder {
    let mut one_of = utoipa::openapi::schema::OneOfBuilder::new();
    for code in codes {
        one_of = one_of.item(Ref::from_schema_name(format!("Error_{}", code.as_str())));
    }
    let schema = RefOr::T(utoipa::openapi::Schema::OneOf(one_of.build()));
    let content = ContentBuilder::new().schema(Some(schema)).build();
    ResponseBuilder::new().description(description).content("application/json", content)
}

macro_rules! shared {
    ($($(#[$doc:meta])* $name:ident => $build:expr;)*) => {$(
        $(#[$doc])*
        pub struct $name;

        impl<'r> ToResponse<'r> for $name {
            fn response() -> (&'r str, RefOr<Response>) {
                (stringify!($name), RefOr::T($build.build()))
            }
        }
    )*};
}

shared! {
    /// 401 `unauthorized`, with `WWW-Authenticate: Bearer`.
    Unauthorized => error(Code::Unauthorized, "Missing or unknown credentials (with `WWW-Authenticate: Bearer`).")
        .header("WWW-Authenticate", Header::new(ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["Bearer"]))));
    /// 403 `operator_only` for an agent key on the operator API.
    ForbiddenAgentKey => error(Code::OperatorOnly, "An agent key was presented to the operator API.");
    /// 404 of the audit API (also when it is disabled).
    AuditDisabledOrNotFound => error(Code::NotFound, "Not found.");
    /// 503 `database_unavailable`, or `payment_network_unavailable` for a channel's chain.
    ChainUnavailable => either(
        [Code::DatabaseUnavailable, Code::PaymentNetworkUnavailable],
        "Postgres unreachable (`database_unavailable`, with `Retry-After: 1`), or the channel's chain cannot be read now (`payment_network_unavailable`); the channel is left as it was (or closing); retry.",
    );
    /// 404.
    NotFound => error(Code::NotFound, "Not found.");
    /// 400 for a query parameter.
    BadQuery => error(Code::BadRequest, "A malformed, unknown or repeated query parameter; the message names it.");
    /// 503 `database_unavailable`, with `Retry-After`.
    Unavailable => error(Code::DatabaseUnavailable, "Postgres unreachable; nothing was executed or paid (with `Retry-After: 1`).")
        .header("Retry-After", Header::new(ObjectBuilder::new().schema_type(Type::Integer)));
    /// 403 `agent_disabled`.
    AgentDisabled => error(Code::AgentDisabled, "The agent is disabled.");
    /// 403 `operator_only` for a change without an admin token.
    AdminOnly => error(Code::OperatorOnly, "A viewer token (`operator_only`, \"this needs an admin operator token\") or an agent key (`operator_only`).");
    /// 400 for a request body.
    BadInput => error(Code::BadRequest, "Malformed JSON, an unknown field or an invalid value (`bad_request`); nothing changed.");
    /// 413 `payload_too_large` for a request body.
    BodyTooLarge => error(Code::PayloadTooLarge, "The request body is larger than the endpoint takes; nothing changed.");
    /// 409 `approval_decided`.
    ApprovalDecided => error(Code::ApprovalDecided, "Already decided (by another operator, or twice) or expired (`approval_decided`, with `approval`); nothing changed.");
    /// 409 `change_decided`.
    ChangeDecided => error(Code::ChangeDecided, "Already confirmed, rejected or expired (`change_decided`); nothing changed.");
    /// 409 `last_admin`.
    LastAdmin => error(Code::LastAdmin, "The last live admin, and the router has no bootstrap `OPERATOR_TOKEN` (`last_admin`); nothing changed. Create another admin first.");
    /// 429 `auth_throttled`, with `Retry-After` (every operation that takes an operator token).
    AuthThrottled => error(Code::AuthThrottled, "Too many failed operator authentications from this client address (`auth_throttled`); the token was not looked up. Retry after `Retry-After` seconds.")
        .header("Retry-After", Header::new(ObjectBuilder::new().schema_type(Type::Integer)));
}

/// The `Error_not_found` schema, named by an operation as a body (its schema is written from
/// [`crate::codes::Code`] with the other `Error_<code>` schemas, replacing this placeholder).
pub struct ErrorNotFound;

impl utoipa::PartialSchema for ErrorNotFound {
    fn schema() -> RefOr<utoipa::openapi::schema::Schema> {
        RefOr::T(utoipa::openapi::schema::Schema::default())
    }
}

impl utoipa::ToSchema for ErrorNotFound {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("Error_not_found")
    }
}
