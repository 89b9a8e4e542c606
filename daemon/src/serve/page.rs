//! The status page: HTML, script and style embedded in the binary, so it works offline.
//!
//! The page is static; everything it shows comes from `/api/*` (see `api`). It loads nothing
//! from elsewhere, and its Content-Security-Policy says so to the browser too.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::{Html, IntoResponse};
use axum::routing::get;

use super::Shared;
use crate::config::SecretSource;

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

/// The login page's own style: served without a token, like the page itself.
const LOGIN_CSS: &str = include_str!("assets/login.css");

/// `GET /assets/login.css`.
pub async fn login_css() -> impl IntoResponse {
    asset("text/css; charset=utf-8", LOGIN_CSS)
}

/// Where the token of the host config in force comes from, in words (a path or a secret's
/// name, never the token).
fn token_source(shared: &Shared) -> String {
    let host = shared.host.read().unwrap_or_else(|e| e.into_inner());
    match host.http.as_ref().and_then(|h| h.token.as_ref()) {
        Some(SecretSource::File(path)) => format!(
            "the file <code>{}</code>, named by <code>http.token_file</code> in the daemon's \
             host config",
            escape(&path.display().to_string())
        ),
        Some(SecretSource::Store { store, reference }) => format!(
            "the secret <code>{}</code> of the secret store <code>{}</code>, named by \
             <code>http.token_secret</code> in the daemon's host config",
            escape(reference),
            escape(store)
        ),
        None => "the daemon's host config (<code>http.token_file</code> or \
                 <code>http.token_secret</code>); this daemon has none set"
            .to_owned(),
    }
}

/// `text` safe inside HTML.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The login page, with `problem` (a wrong token) above the form when given.
pub fn login_page(shared: &Shared, problem: Option<&str>) -> String {
    let problem = problem
        .map(|p| format!("<p class=problem role=alert>{}</p>", escape(p)))
        .unwrap_or_default();
    format!(
        "<!doctype html><html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">\
         <title>gitplane: sign in</title><link rel=stylesheet href=/assets/login.css></head>\
         <body><main><h1>gitplane</h1><p class=lead>Sign in to the status page.</p>{problem}\
         <form method=post action=/login><label for=token>Token</label>\
         <input id=token name=token type=password autocomplete=current-password autofocus \
         required><button>Sign in</button></form>\
         <p class=where>The token is the text of {source}.</p>\
         <p class=note>Signing in keeps a session for 12 hours; the browser's cookie holds the \
         session, not the token. Scripts send <code>Authorization: Bearer TOKEN</code> \
         instead.</p></main></body></html>",
        source = token_source(shared)
    )
}

/// `GET /login`: where a browser gives the token, and where to find it.
pub async fn login(State(shared): State<Arc<Shared>>) -> Html<String> {
    Html(login_page(&shared, None))
}
