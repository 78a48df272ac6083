//! Reading what upstreams advertise: a facilitator's `/discovery/resources` page and the
//! `bazaar` extension of a 402. Hostile content (docs/DESIGN.md §11): parsed strictly, every
//! string and structure bounded, NUL and control characters replaced, schemas kept as data and
//! never interpreted or resolved. An item that cannot be read whole is skipped; a piece of it
//! over its bound (a schema too deep or too large) is left out.

use serde_json::{Map, Value};
use url::Url;

use crate::x402::{PaymentRequired, X402Version};

/// Longest short text kept (description, MIME type, service name, tag, method, tool name), in
/// characters; longer text is cut.
pub const MAX_TEXT_CHARS: usize = 512;
/// Longest resource URL, in bytes.
pub const MAX_URL_BYTES: usize = 2048;
/// Most payment options kept per resource (the first ones).
pub const MAX_OPTIONS: usize = 8;
/// Largest payment option kept, serialized.
pub const MAX_OPTION_BYTES: usize = 4096;
/// Largest input, output or schema kept, serialized.
pub const MAX_DATA_BYTES: usize = 16 * 1024;
/// Deepest nesting kept in an input, output, schema or option.
pub const MAX_DEPTH: usize = 12;
/// Most tags kept per resource.
pub const MAX_TAGS: usize = 5;
/// Most items read from one catalogue page.
pub const MAX_PAGE_ITEMS: usize = 1000;

/// What a resource is called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Http,
    Mcp,
}

/// One advertised resource, as discovery keeps it: data only, never a price to pay.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub url: Url,
    pub kind: Kind,
    pub method: Option<String>,
    pub tool_name: Option<String>,
    pub description: Option<String>,
    pub mime_type: Option<String>,
    pub service_name: Option<String>,
    pub tags: Vec<String>,
    pub version: X402Version,
    /// The payment options as advertised (bounded; amounts checked to be decimal strings).
    pub accepts: Vec<Map<String, Value>>,
    /// The bazaar `info.input`, `info.output` and `schema`, when present and within bounds.
    pub input: Option<Value>,
    pub output: Option<Value>,
    pub schema: Option<Value>,
}

impl Resource {
    /// About how many bytes it holds (what the store's byte bound counts).
    pub fn bytes(&self) -> usize {
        let text = |s: &Option<String>| s.as_ref().map_or(0, String::len);
        let data = |v: &Option<Value>| v.as_ref().map_or(0, |v| serde_json::to_vec(v).map_or(0, |b| b.len()));
        let options: usize = self.accepts.iter().map(|o| serde_json::to_vec(o).map_or(0, |b| b.len())).sum();
        256 + self.url.as_str().len()
            + text(&self.method)
            + text(&self.tool_name)
            + text(&self.description)
            + text(&self.mime_type)
            + text(&self.service_name)
            + self.tags.iter().map(String::len).sum::<usize>()
            + options
            + data(&self.input)
            + data(&self.output)
            + data(&self.schema)
    }
}

/// Why a catalogue page could not be read at all (its items are then not replaced).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageError {
    #[error("the catalogue page is not JSON")]
    NotJson,
    #[error("the catalogue page has no `items` (or `resources`) array")]
    NoItems,
}

/// The readable items of one `GET /discovery/resources` page (at most [`MAX_PAGE_ITEMS`] are
/// looked at) and how many there were.
///
/// # Errors
/// [`PageError`] when the page is not a JSON object with an item array.
pub fn catalogue_page(body: &[u8]) -> Result<(Vec<Resource>, usize), PageError> {
    let page: Value = serde_json::from_slice(body).map_err(|_| PageError::NotJson)?;
    let items =
        ["items", "resources"].iter().find_map(|k| page.get(*k).and_then(Value::as_array)).ok_or(PageError::NoItems)?;
    let read = items.iter().take(MAX_PAGE_ITEMS).filter_map(catalogue_item).collect();
    Ok((read, items.len()))
}

/// One catalogue item (`resource`, `type`, `x402Version`, `accepts`, `description`, `mimeType`,
/// `serviceName`, `tags`, `extensions.bazaar`); `None` when it cannot be read whole.
fn catalogue_item(item: &Value) -> Option<Resource> {
    let obj = item.as_object()?;
    let url = resource_url(obj.get("resource")?.as_str()?)?;
    let version = match obj.get("x402Version")?.as_u64()? {
        1 => X402Version::V1,
        2 => X402Version::V2,
        _ => return None,
    };
    let bazaar = obj.get("extensions").and_then(|e| e.get("bazaar"));
    let kind = match obj.get("type").and_then(Value::as_str) {
        Some("http") => Kind::Http,
        Some("mcp") => Kind::Mcp,
        None if bazaar.is_some() => kind_of(bazaar)?,
        _ => return None,
    };
    let accepts = options(obj.get("accepts")?.as_array()?, version);
    if accepts.is_empty() {
        return None;
    }
    Some(with_bazaar(
        Resource {
            url,
            kind,
            method: None,
            tool_name: None,
            description: obj.get("description").and_then(text),
            mime_type: obj.get("mimeType").and_then(text),
            service_name: obj.get("serviceName").and_then(text),
            tags: tags(obj.get("tags")),
            version,
            accepts,
            input: None,
            output: None,
            schema: None,
        },
        bazaar,
    ))
}

/// The bazaar metadata of a 402 to a request for `called`, when the 402 declares it
/// (`extensions.bazaar`: the upstream asks to be catalogued). Recorded under the URL the
/// router called, without its query (which may carry the agent's secrets), or under the
/// declared `routeTemplate` when it is a valid one; never under the URL the 402 claims.
pub fn seen(called: &Url, required: &PaymentRequired) -> Option<Resource> {
    let bazaar = required.extensions.as_ref()?.get("bazaar")?;
    if !bazaar.is_object() {
        return None;
    }
    let mut url = called.clone();
    url.set_query(None);
    url.set_fragment(None);
    if let Some(template) = bazaar.get("routeTemplate").and_then(Value::as_str).filter(|t| route_template(t)) {
        url.set_path(template);
    }
    let url = resource_url(url.as_str())?;
    let accepts = options(&required.raw_accepts, required.version);
    let described = required.resource.as_ref().and_then(Value::as_object);
    let field = |name: &str| described.and_then(|r| r.get(name)).and_then(text);
    let resource = Resource {
        url,
        kind: kind_of(Some(bazaar))?,
        method: None,
        tool_name: None,
        description: field("description"),
        mime_type: field("mimeType"),
        service_name: field("serviceName"),
        tags: tags(described.and_then(|r| r.get("tags"))),
        version: required.version,
        accepts,
        input: None,
        output: None,
        schema: None,
    };
    (!resource.accepts.is_empty()).then(|| with_bazaar(resource, Some(bazaar)))
}

/// The resource's kind from the bazaar `info.input.type`.
fn kind_of(bazaar: Option<&Value>) -> Option<Kind> {
    match bazaar?.get("info")?.get("input")?.get("type")?.as_str()? {
        "http" => Some(Kind::Http),
        "mcp" => Some(Kind::Mcp),
        _ => None,
    }
}

/// Adds what the bazaar extension declares: method or tool name, input, output, schema.
fn with_bazaar(mut r: Resource, bazaar: Option<&Value>) -> Resource {
    let Some(bazaar) = bazaar else { return r };
    let info = bazaar.get("info");
    let input = info.and_then(|i| i.get("input"));
    r.method = input
        .and_then(|i| i.get("method"))
        .and_then(Value::as_str)
        .filter(|m| (1..=16).contains(&m.len()) && m.bytes().all(|b| b.is_ascii_uppercase()))
        .map(str::to_owned);
    r.tool_name = input.and_then(|i| i.get("toolName")).and_then(text);
    if r.description.is_none() {
        r.description = input.and_then(|i| i.get("description")).and_then(text);
    }
    r.input = input.and_then(|v| data(v, MAX_DATA_BYTES));
    r.output = info.and_then(|i| i.get("output")).and_then(|v| data(v, MAX_DATA_BYTES));
    r.schema = bazaar.get("schema").and_then(|v| data(v, MAX_DATA_BYTES));
    r
}

/// The first [`MAX_OPTIONS`] options that are objects within bounds whose amount is a decimal
/// string (a JSON number is refused, as the router's 402 parser does).
fn options(accepts: &[Value], version: X402Version) -> Vec<Map<String, Value>> {
    let field = amount_field(version);
    accepts
        .iter()
        .take(64)
        .filter(|o| o.get(field).and_then(Value::as_str).is_some_and(|a| crate::money::Amount::parse(a).is_ok()))
        .filter_map(|o| match data(o, MAX_OPTION_BYTES)? {
            Value::Object(map) => Some(map),
            _ => None,
        })
        .take(MAX_OPTIONS)
        .collect()
}

/// The name of an option's price: v1 `maxAmountRequired`, v2 `amount`.
pub fn amount_field(version: X402Version) -> &'static str {
    match version {
        X402Version::V1 => "maxAmountRequired",
        X402Version::V2 => "amount",
    }
}

/// An absolute `http(s)` URL with a host and without credentials or control characters.
fn resource_url(raw: &str) -> Option<Url> {
    if raw.len() > MAX_URL_BYTES || raw.chars().any(char::is_control) {
        return None;
    }
    let url = Url::parse(raw).ok()?;
    let plain = matches!(url.scheme(), "http" | "https")
        && url.host_str().is_some()
        && url.username().is_empty()
        && url.password().is_none();
    plain.then_some(url)
}

/// A bazaar `routeTemplate` that may stand for a path: `/` then `[A-Za-z0-9_/:.~-]` only, no
/// `..`, no `//` (percent signs refused outright: nothing to decode, nothing hidden).
fn route_template(t: &str) -> bool {
    t.starts_with('/')
        && (2..=256).contains(&t.len())
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b"_/:.~-".contains(&b))
        && !t.contains("..")
        && !t.contains("//")
}

/// Short text: a string, control characters (NUL included) replaced by spaces, trimmed, cut
/// at [`MAX_TEXT_CHARS`]; `None` when empty.
fn text(v: &Value) -> Option<String> {
    let s = v.as_str()?;
    let clean: String =
        s.chars().take(MAX_TEXT_CHARS).map(|c| if c.is_control() || c == '\u{FFFD}' { ' ' } else { c }).collect();
    let clean = clean.trim();
    (!clean.is_empty()).then(|| clean.to_owned())
}

/// At most [`MAX_TAGS`] tags, each short text of at most 32 characters, duplicates (any case)
/// dropped.
fn tags(v: Option<&Value>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for tag in v.and_then(Value::as_array).into_iter().flatten().take(64).filter_map(text) {
        if tag.chars().count() <= 32 && !out.iter().any(|t| t.eq_ignore_ascii_case(&tag)) {
            out.push(tag);
        }
        if out.len() == MAX_TAGS {
            break;
        }
    }
    out
}

/// `v` as data: at most [`MAX_DEPTH`] deep and `max_bytes` serialized, NUL and other control
/// characters (except tab, line feed and carriage return) replaced by U+FFFD in every string
/// and key; `None` when over a bound.
pub fn data(v: &Value, max_bytes: usize) -> Option<Value> {
    let clean = scrub(v, 0)?;
    let size = serde_json::to_vec(&clean).ok()?.len();
    (size <= max_bytes).then_some(clean)
}

fn scrub(v: &Value, depth: usize) -> Option<Value> {
    if depth > MAX_DEPTH {
        return None;
    }
    Some(match v {
        Value::String(s) => Value::String(scrub_str(s)),
        Value::Array(items) => Value::Array(items.iter().map(|i| scrub(i, depth + 1)).collect::<Option<_>>()?),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| Some((scrub_str(k), scrub(v, depth + 1)?))).collect::<Option<_>>()?)
        }
        other => other.clone(),
    })
}

fn scrub_str(s: &str) -> String {
    if !s.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r')) {
        return s.to_owned();
    }
    s.chars().map(|c| if c.is_control() && !matches!(c, '\t' | '\n' | '\r') { '\u{FFFD}' } else { c }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn option(amount: Value) -> Value {
        json!({"scheme": "exact", "network": "eip155:84532", "amount": amount, "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
               "payTo": "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "maxTimeoutSeconds": 60})
    }

    #[test]
    fn an_item_is_read_strictly_and_its_text_cleaned() {
        let page = json!({"x402Version": 2, "items": [
            {"resource": "https://api.example/weather", "type": "http", "x402Version": 2,
             "accepts": [option(json!(7)), option(json!("10000"))],
             "description": "Weather\u{0000} now\n", "tags": ["a", "A", "b\u{0007}", "x".repeat(40)],
             "extensions": {"bazaar": {"info": {"input": {"type": "http", "method": "GET", "queryParams": {"city": "P\u{0000}"}}},
                                       "schema": {"type": "object"}}}},
            {"resource": "javascript:alert(1)", "type": "http", "x402Version": 2, "accepts": [option(json!("1"))]},
            {"resource": "https://u:p@api.example/", "type": "http", "x402Version": 2, "accepts": [option(json!("1"))]},
            {"resource": "https://api.example/x", "type": "http", "x402Version": 3, "accepts": [option(json!("1"))]},
            {"resource": "https://api.example/y", "type": "http", "x402Version": 2, "accepts": [option(json!(1))]},
        ]});
        let (read, total) = catalogue_page(&serde_json::to_vec(&page).unwrap()).unwrap();
        assert_eq!((read.len(), total), (1, 5));
        let r = &read[0];
        assert_eq!(r.accepts.len(), 1, "the JSON-number price is not kept");
        assert_eq!(r.description.as_deref(), Some("Weather  now"));
        assert_eq!(r.tags, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(r.method.as_deref(), Some("GET"));
        assert_eq!(r.input.as_ref().unwrap()["queryParams"]["city"], "P\u{FFFD}");
    }

    #[test]
    fn deep_or_large_data_is_left_out_and_the_rest_kept() {
        let mut deep = json!("leaf");
        for _ in 0..40 {
            deep = json!({"a": deep});
        }
        assert!(data(&deep, MAX_DATA_BYTES).is_none());
        assert!(data(&json!({"s": "x".repeat(MAX_DATA_BYTES)}), MAX_DATA_BYTES).is_none());
        let item = json!({"resource": "https://api.example/z", "type": "http", "x402Version": 2, "accepts": [option(json!("5"))],
                          "extensions": {"bazaar": {"info": {"input": {"type": "http"}}, "schema": deep}}});
        let (read, _) = catalogue_page(&serde_json::to_vec(&json!({"items": [item]})).unwrap()).unwrap();
        assert_eq!(read.len(), 1);
        assert!(read[0].schema.is_none() && read[0].input.is_some());
    }

    #[test]
    fn route_templates_are_checked() {
        assert!(route_template("/users/:id"));
        for bad in ["users", "/a/../b", "//evil.example/x", "/a%2e%2e", "/a?b", "/"] {
            assert!(!route_template(bad), "{bad}");
        }
    }
}
