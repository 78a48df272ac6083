//! Values Postgres can store as TEXT and JSONB. Both refuse the NUL character (TEXT as a
//! byte, JSONB as the escape `\u0000`), and an upstream may put it anywhere: in a refusal
//! reason, a 402's strings. A refused write would leave a call unrecorded and in flight, to
//! be executed again after the abandonment window; so every upstream-supplied string is
//! made storable first. Exact copies, where they matter, are stored as bytes (BYTEA).

use std::borrow::Cow;

use serde_json::Value;

/// What NUL becomes: U+FFFD, the character that stands for one that could not be kept.
pub const NUL_REPLACEMENT: char = '\u{FFFD}';

/// `s` with every NUL replaced by [`NUL_REPLACEMENT`] (borrowed when there is none).
pub fn text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') { Cow::Owned(s.replace('\0', &NUL_REPLACEMENT.to_string())) } else { Cow::Borrowed(s) }
}

/// `v` with NUL replaced in every string and object key (borrowed when there is none).
pub fn json(v: &Value) -> Cow<'_, Value> {
    if has_nul(v) { Cow::Owned(replace_nul(v)) } else { Cow::Borrowed(v) }
}

fn has_nul(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn replace_nul(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(text(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(replace_nul).collect()),
        Value::Object(map) => Value::Object(map.iter().map(|(k, v)| (text(k).into_owned(), replace_nul(v))).collect()),
        Value::Null | Value::Bool(_) | Value::Number(_) => v.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn nul_is_replaced_everywhere_and_nothing_else_changes() {
        assert!(matches!(text("plain"), Cow::Borrowed("plain")));
        assert_eq!(text("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        let clean = json!({"a": [1, "x", {"b": null}]});
        assert!(matches!(json(&clean), Cow::Borrowed(_)));
        let dirty = json!({"k\u{0}": ["\u{0}", 2, {"n": "x\u{0}y"}], "ok": true});
        assert_eq!(*json(&dirty), json!({"k\u{FFFD}": ["\u{FFFD}", 2, {"n": "x\u{FFFD}y"}], "ok": true}));
    }
}
