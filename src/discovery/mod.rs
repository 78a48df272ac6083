//! What agents can buy (docs/DESIGN.md §11): the resources that facilitators' Bazaar
//! catalogues list (`X402_DISCOVERY_URLS`, read in the background by [`refresh`]) and that
//! the 402s this router saw declare (`extensions.bazaar`, recorded by [`Discovery::saw`]),
//! each with its advertised price options and input/output schema, and, per option, whether
//! the calling agent may pay it ([`judge`]).
//!
//! Upstream content, so hostile ([`parse`]): bounded and parsed strictly, kept as data, never
//! executed, never trusted for a price (a payment always goes through `/route`, which asks the
//! live 402). In memory, per router process, bounded in entries, bytes and age: each source (a
//! facilitator, or the 402s seen) has an equal share of `X402_DISCOVERY_MAX_ENTRIES` and
//! `X402_DISCOVERY_MAX_BYTES`, so a catalogue that floods cannot push the others out; within a
//! share the oldest entries go first, and nothing older than `X402_DISCOVERY_MAX_AGE_SECONDS`
//! is shown.

pub mod judge;
pub mod parse;
mod query;
mod refresh;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde_json::Value;
use url::Url;

pub use self::judge::{Judge, OptionView};
pub use self::parse::{Kind, Resource};
pub use self::query::{BadQuery, DiscoveryQuery};
pub use self::refresh::{refresh_all, spawn_refresh};
use crate::config::DiscoveryConfig;
use crate::x402::{Network, PaymentRequired};

/// One kept resource.
struct Entry {
    resource: Arc<Resource>,
    at: Instant,
    updated: DateTime<Utc>,
    bytes: usize,
}

/// One source's share: a facilitator's catalogue, or the 402s seen.
#[derive(Default)]
struct Shelf {
    entries: HashMap<String, Entry>,
    bytes: usize,
    fetched: Option<DateTime<Utc>>,
    error: Option<String>,
}

/// The discovered resources of this router process.
pub struct Discovery {
    config: DiscoveryConfig,
    /// One shelf per facilitator URL, in order, then the shelf of the 402s seen.
    shelves: Mutex<Vec<Shelf>>,
}

/// A page of `GET /discovery`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct DiscoveryPage {
    pub resources: Vec<ResourceView>,
    /// `null` on the last page.
    #[schema(required = true)]
    pub next_cursor: Option<String>,
    /// The configured catalogues: when each was last read, and why not when it failed.
    pub sources: Vec<SourceView>,
}

/// A resource as discovered, with what this agent may pay of it.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ResourceView {
    pub url: String,
    #[serde(rename = "type")]
    pub kind: Kind,
    /// The HTTP method the resource declares (bazaar `info.input.method`).
    pub method: Option<String>,
    /// An MCP tool's name (bazaar `info.input.toolName`).
    pub tool_name: Option<String>,
    pub description: Option<String>,
    pub mime_type: Option<String>,
    pub service_name: Option<String>,
    pub tags: Vec<String>,
    pub x402_version: u8,
    /// The advertised price options, each judged for this agent.
    pub accepts: Vec<OptionView>,
    /// Whether this agent may pay at least one option now.
    pub payable: bool,
    /// The bazaar `info.input` (how to call it: query parameters, body, tool arguments), as
    /// advertised: data, never interpreted.
    #[schema(value_type = Option<Object>)]
    pub input: Option<Value>,
    /// The bazaar `info.output` (e.g. an example answer), as advertised.
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
    /// The bazaar `schema` (JSON Schema of `input` and `output`), as advertised.
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    /// `facilitator` (its catalogue) or `seen` (a 402 this router received).
    pub source: String,
    /// The facilitator's base URL (for `source: facilitator`).
    pub facilitator: Option<String>,
    /// When the source last showed it.
    pub updated_at: DateTime<Utc>,
}

/// One configured catalogue.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct SourceView {
    pub url: String,
    /// When it was last read whole (`null`: not yet).
    pub fetched_at: Option<DateTime<Utc>>,
    /// Resources kept from it.
    pub resources: usize,
    /// Why the last read failed (its earlier resources are kept until they are too old).
    pub error: Option<String>,
}

/// A matching resource, before it is judged.
struct Found {
    key: String,
    resource: Arc<Resource>,
    shelf: usize,
    updated: DateTime<Utc>,
}

impl Discovery {
    pub fn new(config: DiscoveryConfig) -> Self {
        let shelves = (0..=config.urls.len()).map(|_| Shelf::default()).collect();
        Self { config, shelves: Mutex::new(shelves) }
    }

    /// The facilitators' base URLs.
    pub fn urls(&self) -> &[Url] {
        &self.config.urls
    }

    fn shelves(&self) -> MutexGuard<'_, Vec<Shelf>> {
        // A panic while holding the lock leaves shelves that are still valid.
        self.shelves.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Each shelf's share of the bounds: (entries, bytes).
    fn share(&self) -> (usize, usize) {
        let n = self.config.urls.len() + 1;
        ((self.config.max_entries / n).max(1), self.config.max_bytes / n)
    }

    /// Records the bazaar metadata of a 402 to a request for `called`, when it declares any.
    pub fn saw(&self, called: &Url, required: &PaymentRequired) {
        let Some(resource) = parse::seen(called, required) else { return };
        let (max_entries, max_bytes) = self.share();
        let bytes = resource.bytes();
        let entry = Entry { resource: Arc::new(resource), at: Instant::now(), updated: Utc::now(), bytes };
        let mut shelves = self.shelves();
        let Some(shelf) = shelves.last_mut() else { return };
        if let Some(old) = shelf.entries.insert(key_of(&entry.resource), entry) {
            shelf.bytes -= old.bytes;
        }
        shelf.bytes += bytes;
        let max_age = self.config.max_age;
        shelf.entries.retain(|_, e| e.at.elapsed() <= max_age);
        shelf.bytes = shelf.entries.values().map(|e| e.bytes).sum();
        while shelf.entries.len() > max_entries || shelf.bytes > max_bytes {
            let Some(oldest) = shelf.entries.iter().min_by_key(|(_, e)| e.at).map(|(k, _)| k.clone()) else { break };
            if let Some(gone) = shelf.entries.remove(&oldest) {
                shelf.bytes -= gone.bytes;
            }
        }
    }

    /// Replaces what facilitator `index` lists with `resources` (the first ones within its
    /// share are kept).
    fn replace(&self, index: usize, resources: Vec<Resource>) {
        let (max_entries, max_bytes) = self.share();
        let (at, updated) = (Instant::now(), Utc::now());
        let mut fresh = Shelf { fetched: Some(updated), ..Shelf::default() };
        for resource in resources {
            let bytes = resource.bytes();
            if fresh.entries.len() >= max_entries {
                break;
            }
            if fresh.bytes + bytes > max_bytes {
                continue;
            }
            let key = key_of(&resource);
            if fresh.entries.contains_key(&key) {
                continue;
            }
            fresh.bytes += bytes;
            fresh.entries.insert(key, Entry { resource: Arc::new(resource), at, updated, bytes });
        }
        if let Some(shelf) = self.shelves().get_mut(index) {
            *shelf = fresh;
        }
    }

    /// Notes that facilitator `index` could not be read; what it listed before is kept until
    /// it is too old.
    fn failed(&self, index: usize, why: String) {
        if let Some(shelf) = self.shelves().get_mut(index) {
            shelf.error = Some(why);
        }
    }

    /// Resources kept in all (fresh or not yet dropped), for tests and metrics.
    pub fn len(&self) -> usize {
        self.shelves().iter().map(|s| s.entries.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The page of resources `query` asks for, judged for one agent by `judge`.
    pub fn find(&self, query: &DiscoveryQuery, judge: &Judge<'_>) -> DiscoveryPage {
        let (mut found, sources) = self.matching(query);
        found.sort_by(|a, b| a.key.cmp(&b.key));
        let mut resources = Vec::new();
        let mut last_key: Option<String> = None;
        let mut next_cursor = None;
        for f in found.into_iter().filter(|f| query.after.as_ref().is_none_or(|after| f.key > *after)) {
            let view = self.view(&f, judge);
            if query.payable.is_some_and(|p| p != view.payable) {
                continue;
            }
            if resources.len() == query.limit {
                // There is more: the cursor names the last resource of this page.
                next_cursor = last_key.as_deref().map(query::encode_cursor);
                break;
            }
            resources.push(view);
            last_key = Some(f.key);
        }
        DiscoveryPage { resources, next_cursor, sources }
    }

    /// The fresh resources that match `query`'s filters (all but `payable`), and the sources.
    fn matching(&self, query: &DiscoveryQuery) -> (Vec<Found>, Vec<SourceView>) {
        let shelves = self.shelves();
        let max_age = self.config.max_age;
        let mut found = Vec::new();
        for (i, shelf) in shelves.iter().enumerate() {
            for (key, e) in &shelf.entries {
                if e.at.elapsed() <= max_age && matches(&e.resource, query) {
                    let key = format!("{key}\u{1f}{i:03}");
                    found.push(Found { key, resource: Arc::clone(&e.resource), shelf: i, updated: e.updated });
                }
            }
        }
        let sources = self
            .config
            .urls
            .iter()
            .zip(shelves.iter())
            .map(|(url, s)| SourceView {
                url: url.to_string(),
                fetched_at: s.fetched,
                resources: s.entries.len(),
                error: s.error.clone(),
            })
            .collect();
        (found, sources)
    }

    fn view(&self, f: &Found, judge: &Judge<'_>) -> ResourceView {
        let r = &f.resource;
        let accepts: Vec<OptionView> =
            r.accepts.iter().enumerate().map(|(i, raw)| judge.option(&r.url, r.version, i, raw)).collect();
        let facilitator = self.config.urls.get(f.shelf).map(Url::to_string);
        ResourceView {
            url: r.url.to_string(),
            kind: r.kind,
            method: r.method.clone(),
            tool_name: r.tool_name.clone(),
            description: r.description.clone(),
            mime_type: r.mime_type.clone(),
            service_name: r.service_name.clone(),
            tags: r.tags.clone(),
            x402_version: r.version.number(),
            payable: accepts.iter().any(|o| o.payable),
            accepts,
            input: r.input.clone(),
            output: r.output.clone(),
            schema: r.schema.clone(),
            source: if facilitator.is_some() { "facilitator" } else { "seen" }.to_owned(),
            facilitator,
            updated_at: f.updated,
        }
    }
}

/// The page `query` asks for, judged for `agent_id` by its limits as the ledger has them now
/// and by what the router pays with (`supported`, `solana`).
///
/// # Errors
/// Database errors reading the agent's limits.
pub async fn find_for(
    conn: &mut diesel_async::AsyncPgConnection,
    discovery: &Discovery,
    (supported, solana): (&crate::x402::Supported, Option<&crate::chains::solana::Solana>),
    agent_id: uuid::Uuid,
    query: &DiscoveryQuery,
) -> diesel::QueryResult<DiscoveryPage> {
    let spend = crate::payments::store::agent_spend(conn, agent_id, false).await?;
    let judge = Judge { spend: spend.as_ref(), supported, solana, max_price: query.max_price };
    Ok(discovery.find(query, &judge))
}

/// A resource's key within its shelf: URL, tool name and method.
fn key_of(r: &Resource) -> String {
    format!("{}\u{1f}{}\u{1f}{}", r.url, r.tool_name.as_deref().unwrap_or(""), r.method.as_deref().unwrap_or(""))
}

/// Whether `r` passes the filters of `query` (every word, the price, the network, the kind).
fn matches(r: &Resource, query: &DiscoveryQuery) -> bool {
    if query.kind.is_some_and(|k| k != r.kind) {
        return false;
    }
    let field = parse::amount_field(r.version);
    let price_ok = |o: &serde_json::Map<String, Value>| {
        query.max_price.is_none_or(|max| {
            o.get(field)
                .and_then(Value::as_str)
                .and_then(|a| crate::money::Amount::parse(a).ok())
                .is_some_and(|a| a <= max)
        })
    };
    let network_ok = |o: &serde_json::Map<String, Value>| {
        query
            .network
            .as_deref()
            .is_none_or(|want| o.get("network").and_then(Value::as_str).is_some_and(|n| same_network(n, want)))
    };
    if !r.accepts.iter().any(|o| price_ok(o) && network_ok(o)) {
        return false;
    }
    if query.words.is_empty() {
        return true;
    }
    let mut text = format!("{} {}", r.url, r.tags.join(" "));
    for s in [&r.description, &r.service_name, &r.tool_name, &r.method].into_iter().flatten() {
        text.push(' ');
        text.push_str(s);
    }
    let text = text.to_lowercase();
    query.words.iter().all(|w| text.contains(w.as_str()))
}

/// Two spellings of one network: equal, or the same EVM chain (CAIP-2 or v1 name).
fn same_network(a: &str, b: &str) -> bool {
    a == b || matches!((Network::parse(a), Network::parse(b)), (Ok(x), Ok(y)) if x == y)
}
