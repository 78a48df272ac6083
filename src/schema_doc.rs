//! Schemas of members that refer to the OpenAPI document's shared schemas (`Amount`,
//! `Address`) or are stricter than their Rust types, for `#[schema(schema_with = …)]` on the
//! types the handlers serialize. Depends on nothing of the router.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, RefBuilder, Schema, SchemaType, Type};

/// `$ref: Amount`.
pub fn amount_ref() -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name("Amount"))
}

/// `$ref: Amount`, with a description.
pub fn amount(description: &str) -> RefOr<Schema> {
    RefOr::Ref(RefBuilder::new().ref_location_from_schema_name("Amount").description(Some(description)).build())
}

/// An `Amount` or null, with a description.
pub fn amount_or_null(description: &str) -> RefOr<Schema> {
    OneOfBuilder::new()
        .item(amount_ref())
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some(description))
        .into()
}

/// `$ref: Address`.
pub fn address() -> RefOr<Schema> {
    RefOr::Ref(utoipa::openapi::Ref::from_schema_name("Address"))
}

/// A string or null, with a description.
pub fn string_or_null(description: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .description(Some(description))
        .into()
}

/// An array of strings or null, with a description.
pub fn strings_or_null(description: &str) -> RefOr<Schema> {
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(ObjectBuilder::new().schema_type(Type::String))
        .description(Some(description))
        .into()
}
