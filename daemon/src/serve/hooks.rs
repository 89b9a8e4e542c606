//! `POST /hooks/git`: a push webhook from GitHub, GitLab or Gitea/Forgejo makes the daemon
//! fetch the remote at once instead of at its next poll.
//!
//! The request must be signed with the shared secret (`http.webhook_secret_file`): GitHub's
//! and Gitea's `sha256=` HMAC of the body, or GitLab's token. Anything else gets 401 and
//! changes nothing. The payload itself is not trusted for anything: a verified push only says
//! "fetch now", and the daemon reads what the remote holds.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tracing::{info, warn};

use super::{Shared, same};

/// GitHub caps its payloads at 25 MB; a push payload is far smaller, and the body is only
/// hashed, never parsed.
const BODY_LIMIT: usize = 25 * 1024 * 1024;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/hooks/git", post(push))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// Who signed a request, and how.
#[derive(Debug, PartialEq, Eq)]
enum Signed {
    /// GitHub, Gitea or Forgejo: an HMAC-SHA256 of the body.
    Hmac,
    /// GitLab: the secret itself.
    Token,
}

async fn push(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let arrived = Instant::now();
    let secret = shared
        .secrets
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .webhook
        .clone();
    let Some(secret) = secret else {
        return (
            StatusCode::NOT_FOUND,
            "push webhooks are off: set http.webhook_secret_file in the host config\n",
        )
            .into_response();
    };
    let Some(signed) = verify(&headers, &body, &secret) else {
        warn!("push webhook refused: missing or wrong signature");
        return (
            StatusCode::UNAUTHORIZED,
            "missing or wrong signature (X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token)\n",
        )
            .into_response();
    };
    let event = event_of(&headers);
    match event.as_deref() {
        Some("ping") => return (StatusCode::OK, "pong\n").into_response(),
        Some("push" | "Push Hook" | "Tag Push Hook") | None => {}
        Some(other) => {
            return (
                StatusCode::OK,
                format!("event '{other}' ignored: only pushes\n"),
            )
                .into_response();
        }
    }
    info!(signed = ?signed, "push webhook: fetching now");
    // A full queue means a fetch is already due: it will see this push too.
    let _ = shared.hooks.try_send(arrived);
    (StatusCode::ACCEPTED, "fetching\n").into_response()
}

/// The event a webhook says it is, from whichever forge sent it.
fn event_of(headers: &HeaderMap) -> Option<String> {
    [
        "x-github-event",
        "x-gitea-event",
        "x-forgejo-event",
        "x-gitlab-event",
    ]
    .iter()
    .find_map(|h| headers.get(*h))
    .and_then(|v| v.to_str().ok())
    .map(str::to_owned)
}

/// How the request is signed, if it is, with `secret`.
fn verify(headers: &HeaderMap, body: &[u8], secret: &str) -> Option<Signed> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let hmac_hex = header("x-hub-signature-256")
        .and_then(|v| v.strip_prefix("sha256="))
        .or_else(|| header("x-gitea-signature"))
        .or_else(|| header("x-forgejo-signature"));
    if let Some(hex) = hmac_hex {
        let signature = decode_hex(hex.trim())?;
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).ok()?;
        mac.update(body);
        // verify_slice compares in constant time.
        return mac.verify_slice(&signature).ok().map(|()| Signed::Hmac);
    }
    header("x-gitlab-token")
        .filter(|token| same(token, secret))
        .map(|_| Signed::Token)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) || !hex.is_ascii() {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        mac.finalize()
            .into_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn each_forge_signature_is_checked() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let good = sign("s3cret", body);
        let github = headers(&[("x-hub-signature-256", format!("sha256={good}"))]);
        assert_eq!(verify(&github, body, "s3cret"), Some(Signed::Hmac));
        let gitea = headers(&[("x-gitea-signature", good.clone())]);
        assert_eq!(verify(&gitea, body, "s3cret"), Some(Signed::Hmac));
        let gitlab = headers(&[("x-gitlab-token", "s3cret".to_owned())]);
        assert_eq!(verify(&gitlab, body, "s3cret"), Some(Signed::Token));

        // Wrong secret, changed body, no signature, malformed hex, wrong token.
        assert_eq!(verify(&github, body, "other"), None);
        assert_eq!(verify(&github, b"{}", "s3cret"), None);
        assert_eq!(verify(&HeaderMap::new(), body, "s3cret"), None);
        let bad_hex = headers(&[("x-hub-signature-256", "sha256=zz".to_owned())]);
        assert_eq!(verify(&bad_hex, body, "s3cret"), None);
        let wrong = headers(&[("x-gitlab-token", "s3cre".to_owned())]);
        assert_eq!(verify(&wrong, body, "s3cret"), None);
        // A GitHub header without its `sha256=` prefix is not accepted as one.
        let bare = headers(&[("x-hub-signature-256", good)]);
        assert_eq!(verify(&bare, body, "s3cret"), None);
    }
}
