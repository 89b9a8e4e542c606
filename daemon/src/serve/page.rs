//! The status page: HTML, script and style embedded in the binary, so it works offline.

use std::sync::Arc;

use axum::Router;
use axum::response::Html;
use axum::routing::get;

use super::Shared;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new().route(
        "/",
        get(|| async { Html("<!doctype html><title>gitplane</title>") }),
    )
}

/// `GET /login`: where a browser gives the token.
pub async fn login() -> Html<&'static str> {
    Html(
        "<!doctype html><meta charset=utf-8><title>gitplane: sign in</title>\
         <form method=post action=/login><label>Token <input name=token type=password \
         autofocus></label> <button>Sign in</button></form>",
    )
}
