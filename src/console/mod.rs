//! The operator console (`/console`): a static single-page front end built from `console/`
//! (`npm run build` there) and embedded in the binary, so it needs no network, CDN or files on
//! disk. It holds no data of its own: the page signs in with an operator token kept in the
//! browser's session storage and calls the operator API (`/audit/*`) with a bearer header, so
//! there are no cookies and no CSRF surface.
//!
//! Every console response carries [`SECURITY_HEADERS`]: a Content-Security-Policy that allows
//! no inline script or style and no other origin, `frame-ancestors 'none'`, `no-store`,
//! `nosniff` and no referrer. `console/dist/` is committed; a test rebuilds it and fails when
//! the committed files differ from what the sources build.

/// The policy of every console response: same-origin scripts, styles and fetches only, no
/// inline code, no framing, no `<base>` or form targets.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'";

/// Headers set on every console response.
pub const SECURITY_HEADERS: &[(&str, &str)] = &[
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("X-Frame-Options", "DENY"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
];

/// One embedded file: its content type and bytes.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// The page itself (`GET /console`).
pub const INDEX: Asset =
    Asset { content_type: "text/html; charset=utf-8", body: include_bytes!("../../console/dist/index.html") };

/// The files under `/console/` by name; anything else is a 404.
pub fn asset(name: &str) -> Option<Asset> {
    match name {
        "app.js" => Some(Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!("../../console/dist/app.js"),
        }),
        "app.css" => {
            Some(Asset { content_type: "text/css; charset=utf-8", body: include_bytes!("../../console/dist/app.css") })
        }
        "favicon.svg" => {
            Some(Asset { content_type: "image/svg+xml", body: include_bytes!("../../console/dist/favicon.svg") })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_same_origin_files_and_has_no_inline_code() {
        let html = std::str::from_utf8(INDEX.body).unwrap();
        assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
        assert!(!html.contains("<script>") && !html.contains("<style") && !html.contains("style="), "inline code");
        let handler = html.split(" on").skip(1).any(|rest| {
            rest.split_once('=')
                .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase()))
        });
        assert!(!handler, "an inline event handler");
        assert!(!html.contains("http://") && !html.contains("https://"), "another origin");
        for name in ["app.js", "app.css", "favicon.svg"] {
            assert!(asset(name).is_some_and(|a| !a.body.is_empty()), "{name}");
        }
        assert!(asset("../Cargo.toml").is_none() && asset("").is_none());
    }
}
