//! Reading the facilitators' catalogues in the background: every `X402_DISCOVERY_REFRESH_SECONDS`,
//! each `GET <url>/discovery/resources?limit=…&offset=…` page through the router's one upstream
//! client (its SSRF guard, timeouts and same-origin redirects), each page at most
//! [`PAGE_MAX_BYTES`], at most [`MAX_PAGES`] pages and the source's share of entries. The
//! catalogues are read side by side, so a slow or endless one delays only itself; an agent's
//! `GET /discovery` never waits for a read.

use std::time::Duration;

use reqwest::Method;
use reqwest::header::{ACCEPT, HeaderMap, HeaderValue};
use url::Url;

use super::Discovery;
use super::parse::{self, Resource};
use crate::upstream::{UpstreamClient, UpstreamError, UpstreamRequest};

/// Items asked per page.
const PAGE_LIMIT: usize = 100;
/// Most pages read from one catalogue per refresh.
const MAX_PAGES: usize = 10;
/// Largest catalogue page read (never more than `UPSTREAM_MAX_RESPONSE_BYTES`).
pub const PAGE_MAX_BYTES: usize = 1024 * 1024;

/// Why a catalogue could not be read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("{0}")]
    Upstream(#[from] UpstreamError),
    #[error("the catalogue answered HTTP {0}")]
    Status(u16),
    #[error("{0}")]
    Page(#[from] parse::PageError),
}

/// Starts reading the configured catalogues now and every refresh interval (nothing when none
/// is configured).
pub fn spawn_refresh(discovery: &std::sync::Arc<Discovery>, upstream: &UpstreamClient) {
    if discovery.urls().is_empty() {
        return;
    }
    let (discovery, upstream) = (std::sync::Arc::clone(discovery), upstream.clone());
    tokio::spawn(async move {
        loop {
            refresh_all(&discovery, &upstream).await;
            tokio::time::sleep(discovery.config.refresh).await;
        }
    });
}

/// Reads every catalogue once, side by side.
pub async fn refresh_all(discovery: &Discovery, upstream: &UpstreamClient) {
    let reads = discovery.urls().iter().enumerate().map(|(i, url)| async move {
        match read(discovery, upstream, url).await {
            Ok(resources) => {
                tracing::info!(discovery.source = i, discovery.resources = resources.len(), "discovery catalogue read");
                discovery.replace(i, resources);
            }
            Err(e) => {
                tracing::warn!(discovery.source = i, error = %e, "discovery catalogue not read; keeping what it listed");
                discovery.failed(i, e.to_string());
            }
        }
    });
    futures_util::future::join_all(reads).await;
}

/// The readable items of one catalogue, page after page.
async fn read(discovery: &Discovery, upstream: &UpstreamClient, base: &Url) -> Result<Vec<Resource>, ReadError> {
    let (share, _) = discovery.share();
    let mut all: Vec<Resource> = Vec::new();
    for page in 0..MAX_PAGES {
        let body = fetch(upstream, &page_url(base, page * PAGE_LIMIT)).await?;
        let (items, listed) = parse::catalogue_page(&body)?;
        let before = all.len();
        for item in items {
            if !all.iter().any(|r| r.url == item.url && r.tool_name == item.tool_name && r.method == item.method) {
                all.push(item);
            }
        }
        // The last page, a catalogue that ignores paging (nothing new), or enough kept.
        if listed < PAGE_LIMIT || all.len() == before || all.len() >= share {
            break;
        }
    }
    Ok(all)
}

fn page_url(base: &Url, offset: usize) -> Url {
    let mut url = base.clone();
    let path = format!("{}/discovery/resources", base.path().trim_end_matches('/'));
    url.set_path(&path);
    url.query_pairs_mut().append_pair("limit", &PAGE_LIMIT.to_string()).append_pair("offset", &offset.to_string());
    url
}

async fn fetch(upstream: &UpstreamClient, url: &Url) -> Result<Vec<u8>, ReadError> {
    let mut headers = HeaderMap::new();
    headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
    let req = UpstreamRequest::http(Method::GET, url.clone(), headers, None);
    let timeout = upstream.timeout().min(Duration::from_secs(60));
    let resp = upstream.send_capped(&req, timeout, PAGE_MAX_BYTES).await?;
    if resp.status != 200 {
        return Err(ReadError::Status(resp.status));
    }
    Ok(resp.body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_asked_under_the_base_path() {
        let base = Url::parse("https://fac.example/x402/").unwrap();
        assert_eq!(page_url(&base, 200).as_str(), "https://fac.example/x402/discovery/resources?limit=100&offset=200");
        let bare = Url::parse("http://127.0.0.1:4022").unwrap();
        assert_eq!(page_url(&bare, 0).as_str(), "http://127.0.0.1:4022/discovery/resources?limit=100&offset=0");
    }
}
