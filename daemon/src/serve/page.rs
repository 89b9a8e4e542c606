//! The status page: HTML, script and style embedded in the binary, so it works offline.
//!
//! The page is static; everything it shows comes from `/api/*` (see `api`). It loads nothing
//! from elsewhere, and its Content-Security-Policy says so to the browser too.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

use super::Shared;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Only the page's own files and API; no inline script, no other origin.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
                   img-src 'self' data:; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/assets/style.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            // The files change with the binary: a browser asks again rather than keep an old
            // script after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
}

/// `GET /login`: where a browser gives the token, and where to find it.
pub async fn login() -> Html<&'static str> {
    Html(
        "<!doctype html><meta charset=utf-8><title>gitplane: sign in</title>\
         <form method=post action=/login><label>Token <input name=token type=password \
         autofocus></label> <button>Sign in</button></form>\
         <p>The token is the one the daemon's host config names in <code>http.token_file</code> \
         (or <code>http.token_secret</code>). Signing in keeps a session for 12 hours; the \
         browser's cookie holds the session, not the token.</p>",
    )
}
