//! `POST /hooks/git`: a push webhook from GitHub, GitLab or Gitea/Forgejo makes the daemon
//! fetch the remote at once instead of at its next poll; a pull-request webhook makes it plan
//! the request's head commit and POST the plan to `http.plan_hook`.
//!
//! The request must be signed with the shared secret (`http.webhook_secret_file`): GitHub's
//! and Gitea's `sha256=` HMAC of the body, or GitLab's token. Anything else gets 401 and
//! changes nothing. The headers are checked before the body is read: a request without a
//! well-formed signature, or with GitLab's token wrong, is refused after its headers, and a
//! declared length over `http.max_body` gets 413; the body is then read within
//! `http.body_timeout` and that size, a few requests at a time. A verified push only says
//! "fetch now", and the daemon reads what the remote holds; of a verified pull request only its
//! number, head commit and branches are read, and the head commit is planned only once it is
//! in the repository.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tracing::{info, warn};

use super::{Shared, closing, read_body, same};

/// Webhook bodies read at once, at most: each may take `http.max_body` of memory before its
/// signature can be checked. More wait for a turn, up to `http.body_timeout`.
pub const MAX_BODIES: usize = 8;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/hooks/git", post(push))
}

/// Who signed a request, and how.
#[derive(Debug, PartialEq, Eq)]
enum Signed {
    /// GitHub, Gitea or Forgejo: an HMAC-SHA256 of the body.
    Hmac,
    /// GitLab: the secret itself.
    Token,
}

/// What a request's headers claim, before its body is read.
#[derive(Debug, PartialEq, Eq)]
enum Claim {
    /// An HMAC-SHA256 of the body, to check once it is read.
    Hmac(Vec<u8>),
    /// GitLab's token, already checked.
    Token,
}

const REFUSED: &str =
    "missing or wrong signature (X-Hub-Signature-256, X-Gitea-Signature or X-Gitlab-Token)\n";

async fn push(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let arrived = Instant::now();
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let secret = shared
        .secrets
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .webhook
        .clone();
    let Some(secret) = secret else {
        return closing(
            StatusCode::NOT_FOUND,
            "push webhooks are off: set http.webhook_secret_file in the host config\n",
        );
    };
    // Refused after the headers: an unsigned request's body is never read.
    let Some(claim) = claim(&headers, &secret) else {
        warn!("push webhook refused: missing or wrong signature");
        return closing(StatusCode::UNAUTHORIZED, REFUSED);
    };
    let limits = shared.limits();
    let Ok(Ok(turn)) = tokio::time::timeout(limits.body_timeout, shared.bodies.acquire()).await
    else {
        warn!("push webhook refused: {MAX_BODIES} webhook bodies are being read already");
        let mut busy = closing(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many webhooks at once: send it again later\n",
        );
        busy.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
        return busy;
    };
    let body = match read_body(body, limits.max_body, limits.body_timeout).await {
        Ok(body) => body,
        Err(e) => {
            warn!("push webhook refused: {e}");
            return e.into_response();
        }
    };
    drop(turn);
    let Some(signed) = claim.verify(&body, &secret) else {
        warn!("push webhook refused: missing or wrong signature");
        return (StatusCode::UNAUTHORIZED, REFUSED).into_response();
    };
    let event = event_of(&headers);
    match event.as_deref() {
        Some("ping") => return (StatusCode::OK, "pong\n").into_response(),
        Some("push" | "Push Hook" | "Tag Push Hook") | None => {}
        Some("pull_request" | "Merge Request Hook") => {
            return pull_request(shared, forge_of(&headers), &body);
        }
        Some(other) => {
            return (
                StatusCode::OK,
                format!("event '{other}' ignored: only pushes and pull requests\n"),
            )
                .into_response();
        }
    }
    info!(signed = ?signed, "push webhook: fetching now");
    // A full queue means a fetch is already due: it will see this push too.
    let _ = shared.hooks.try_send(arrived);
    (StatusCode::ACCEPTED, "fetching\n").into_response()
}

/// Which forge sent a webhook, as the plan hook's body names it.
fn forge_of(headers: &HeaderMap) -> &'static str {
    // Gitea and Forgejo send GitHub's header too, for compatibility: theirs decides.
    if headers.contains_key("x-gitea-event") || headers.contains_key("x-forgejo-event") {
        "gitea"
    } else if headers.contains_key("x-gitlab-event") {
        "gitlab"
    } else {
        "github"
    }
}

/// What a pull-request webhook says, as far as the daemon reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PullRequest {
    pub number: u64,
    /// The head commit's id (40 or 64 hex digits).
    pub head: String,
    pub head_ref: String,
    pub base_ref: String,
}

/// Why a pull-request payload is refused or passed over.
#[derive(Debug, PartialEq, Eq)]
enum Payload {
    /// An action that does not change the head (closed, labelled...): nothing to plan.
    Ignored(String),
    /// Not the shape the forge sends: 400.
    Malformed(String),
}

#[derive(serde::Deserialize)]
struct GithubPayload {
    action: String,
    pull_request: GithubPr,
}

#[derive(serde::Deserialize)]
struct GithubPr {
    number: u64,
    head: GithubEnd,
    base: GithubEnd,
}

#[derive(serde::Deserialize)]
struct GithubEnd {
    sha: Option<String>,
    #[serde(rename = "ref")]
    reference: String,
}

#[derive(serde::Deserialize)]
struct GitlabPayload {
    object_attributes: GitlabMr,
}

#[derive(serde::Deserialize)]
struct GitlabMr {
    iid: u64,
    action: Option<String>,
    source_branch: String,
    target_branch: String,
    last_commit: GitlabCommit,
}

#[derive(serde::Deserialize)]
struct GitlabCommit {
    id: String,
}

/// The pull request a verified payload of `forge` describes, when its head may have changed
/// (opened, new commits, reopened).
fn parse_pull_request(forge: &str, body: &[u8]) -> Result<PullRequest, Payload> {
    // serde_json bounds nesting (128 levels); the body is bounded by the route's limit.
    let malformed = |e: serde_json::Error| {
        Payload::Malformed(format!(
            "not a {forge} pull-request payload (line {}, column {}: {})",
            e.line(),
            e.column(),
            match e.classify() {
                serde_json::error::Category::Data => "a field is missing or of the wrong type",
                _ => "not JSON",
            }
        ))
    };
    let pr = if forge == "gitlab" {
        let p: GitlabPayload = serde_json::from_slice(body).map_err(malformed)?;
        let action = p.object_attributes.action.unwrap_or_default();
        if !matches!(action.as_str(), "open" | "update" | "reopen") {
            return Err(Payload::Ignored(format!(
                "merge request action '{}'",
                short_text(&action)
            )));
        }
        PullRequest {
            number: p.object_attributes.iid,
            head: p.object_attributes.last_commit.id,
            head_ref: p.object_attributes.source_branch,
            base_ref: p.object_attributes.target_branch,
        }
    } else {
        let p: GithubPayload = serde_json::from_slice(body).map_err(malformed)?;
        // Gitea says `synchronized` where GitHub says `synchronize`.
        if !matches!(
            p.action.as_str(),
            "opened" | "synchronize" | "synchronized" | "reopened"
        ) {
            return Err(Payload::Ignored(format!(
                "pull request action '{}'",
                short_text(&p.action)
            )));
        }
        PullRequest {
            number: p.pull_request.number,
            head: p.pull_request.head.sha.unwrap_or_default(),
            head_ref: p.pull_request.head.reference,
            base_ref: p.pull_request.base.reference,
        }
    };
    let hex =
        |s: &str| (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(&pr.head) {
        return Err(Payload::Malformed(
            "the head commit is not a commit id (40 or 64 hex digits)".to_owned(),
        ));
    }
    for (what, name) in [("head", &pr.head_ref), ("base", &pr.base_ref)] {
        if name.is_empty() || name.len() > 255 || name.chars().any(char::is_control) {
            return Err(Payload::Malformed(format!(
                "the {what} branch is not a branch name"
            )));
        }
    }
    Ok(pr)
}

/// At most 40 characters of `text` a payload gave, for a message.
fn short_text(text: &str) -> String {
    text.chars().filter(|c| !c.is_control()).take(40).collect()
}

/// Plans waiting or running at once, at most; more get 503 until some are done.
const MAX_PLANS: usize = 8;
/// How long fetching the mirror of a remote may take before a plan.
const FETCH_LIMIT: Duration = Duration::from_secs(120);

/// The pull-request plans under way: a bounded number, one running at a time (each reads and
/// builds the whole commit).
pub struct PlanQueue {
    slots: Arc<tokio::sync::Semaphore>,
    running: Arc<tokio::sync::Semaphore>,
}

impl Default for PlanQueue {
    fn default() -> Self {
        PlanQueue {
            slots: Arc::new(tokio::sync::Semaphore::new(MAX_PLANS)),
            running: Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }
}

/// A verified pull-request webhook: answered at once; the plan is made and posted in the
/// background.
fn pull_request(shared: Arc<Shared>, forge: &'static str, body: &[u8]) -> Response {
    let pr = match parse_pull_request(forge, body) {
        Ok(pr) => pr,
        Err(Payload::Ignored(what)) => {
            info!(forge, "pull-request webhook: {what}: nothing to plan");
            return (
                StatusCode::ACCEPTED,
                format!("{what} ignored: nothing to plan\n"),
            )
                .into_response();
        }
        Err(Payload::Malformed(why)) => {
            warn!(forge, "pull-request webhook refused: {why}");
            return (StatusCode::BAD_REQUEST, format!("{why}\n")).into_response();
        }
    };
    let hook = shared
        .host
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .http
        .as_ref()
        .and_then(|h| h.plan_hook.clone());
    if hook.is_none() {
        info!(
            forge,
            pull_request = pr.number,
            "pull-request webhook ignored: no http.plan_hook to post its plan to"
        );
        return (
            StatusCode::ACCEPTED,
            "ignored: set http.plan_hook to have pull requests planned\n",
        )
            .into_response();
    }
    let Ok(slot) = shared.plans.slots.clone().try_acquire_owned() else {
        warn!(
            forge,
            pull_request = pr.number,
            "pull-request webhook refused: {MAX_PLANS} plans already waiting"
        );
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many plans under way: send it again later\n",
        )
            .into_response();
    };
    info!(forge, pull_request = pr.number, head = %pr.head, "pull-request webhook: planning its head");
    tokio::spawn(async move {
        let _slot = slot;
        let Ok(_running) = shared.plans.running.clone().acquire_owned().await else {
            return;
        };
        let number = pr.number;
        let task = tokio::task::spawn_blocking(move || plan_and_post(&shared, forge, &pr));
        match task.await {
            Ok(Ok(status)) => info!(
                forge,
                pull_request = number,
                "plan posted: the plan hook answered {status}"
            ),
            Ok(Err(why)) => warn!(forge, pull_request = number, "plan not posted: {why}"),
            Err(e) => warn!(
                forge,
                pull_request = number,
                "plan not posted: the task failed: {e}"
            ),
        }
    });
    (StatusCode::ACCEPTED, "planning\n").into_response()
}

/// Makes sure the head commit is here (fetching the mirror of a remote), plans it against
/// the state and POSTs the plan: the hook's status, or why not. No message quotes the URL
/// or the token.
fn plan_and_post(shared: &Shared, forge: &str, pr: &PullRequest) -> Result<u16, String> {
    let host = shared
        .host
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let hook = host
        .http
        .as_ref()
        .and_then(|h| h.plan_hook.clone())
        .ok_or("http.plan_hook is no longer set")?;
    if let Some(crate::config::RepoSource::Remote { url, .. }) = &host.repo
        && let Err(e) = crate::watch::fetch_mirror(url, &shared.repo, FETCH_LIMIT)
    {
        // The head may be here already (an earlier fetch); planning says if it is not.
        warn!(pull_request = pr.number, "fetching before the plan: {e}");
    }
    let token = hook
        .token
        .as_ref()
        .map(|t| t.read("http.plan_hook.token_file", &host.secret_stores()))
        .transpose()
        .map_err(|e| e.to_string())?;
    let ctx =
        crate::app::Context::of_daemon(shared.repo.clone(), shared.state.clone(), Vec::new(), host);
    let mut review = crate::app::plan_ref(&ctx, Some(&pr.head))
        .map_err(|e| format!("cannot plan commit {}: {e}", pr.head))?;
    review.reference = Some(pr.head_ref.clone());
    let body = serde_json::json!({
        "pull_request": pr.number,
        "head": pr.head,
        "head_ref": pr.head_ref,
        "base_ref": pr.base_ref,
        "provider": forge,
        "markdown": review.to_markdown(),
        "plan": review.to_json(),
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(hook.timeout))
        // A redirect would send the plan somewhere the host config does not name.
        .max_redirects(0)
        .build()
        .into();
    let mut request = agent
        .post(&hook.url)
        .header("Content-Type", "application/json");
    if let Some(token) = &token {
        request = request.header("Authorization", &format!("Bearer {token}"));
    }
    let text = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    match request.send(&text[..]) {
        // The answer's body is never read: nothing in it matters, and it could be large.
        Ok(response) if response.status().is_success() => Ok(response.status().as_u16()),
        Ok(response) => Err(format!(
            "the plan hook answered {}",
            response.status().as_u16()
        )),
        // In fixed words: some of ureq's messages quote the URL.
        Err(ureq::Error::Timeout(_)) => Err(format!(
            "the plan hook did not answer within {:?}",
            hook.timeout
        )),
        Err(ureq::Error::ConnectionFailed | ureq::Error::HostNotFound) => {
            Err("the plan hook cannot be reached".to_owned())
        }
        Err(_) => Err("the POST to the plan hook failed".to_owned()),
    }
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

/// What the headers claim of a request signed with `secret`, if they are well formed: a
/// GitHub or Gitea HMAC header of 64 hex digits (checked once the body is read), or GitLab's
/// token, compared now.
fn claim(headers: &HeaderMap, secret: &str) -> Option<Claim> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let hmac_hex = header("x-hub-signature-256")
        .and_then(|v| v.strip_prefix("sha256="))
        .or_else(|| header("x-gitea-signature"))
        .or_else(|| header("x-forgejo-signature"));
    if let Some(hex) = hmac_hex {
        let signature = decode_hex(hex.trim())?;
        // SHA-256: anything else can never match.
        return (signature.len() == 32).then_some(Claim::Hmac(signature));
    }
    header("x-gitlab-token")
        .filter(|token| same(token, secret))
        .map(|_| Claim::Token)
}

impl Claim {
    /// How the request is signed, if its `body` matches what its headers claim.
    fn verify(&self, body: &[u8], secret: &str) -> Option<Signed> {
        match self {
            Claim::Token => Some(Signed::Token),
            Claim::Hmac(signature) => {
                let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).ok()?;
                mac.update(body);
                // verify_slice compares in constant time.
                mac.verify_slice(signature).ok().map(|()| Signed::Hmac)
            }
        }
    }
}

/// How the request is signed, if it is, with `secret`.
#[cfg(test)]
fn verify(headers: &HeaderMap, body: &[u8], secret: &str) -> Option<Signed> {
    claim(headers, secret)?.verify(body, secret)
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
    fn pull_request_payloads_are_read_or_refused() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        let github = format!(
            r#"{{"action":"synchronize","number":7,"pull_request":{{"number":7,
            "head":{{"sha":"{sha}","ref":"feature"}},"base":{{"sha":"{sha}","ref":"main"}}}}}}"#
        );
        let pr = parse_pull_request("github", github.as_bytes()).unwrap();
        assert_eq!(
            pr,
            PullRequest {
                number: 7,
                head: sha.into(),
                head_ref: "feature".into(),
                base_ref: "main".into()
            }
        );
        let closed = github.replace("synchronize", "closed");
        assert!(matches!(
            parse_pull_request("github", closed.as_bytes()),
            Err(Payload::Ignored(_))
        ));
        let gitlab = format!(
            r#"{{"object_kind":"merge_request","object_attributes":{{"iid":3,"action":"open",
            "source_branch":"feature","target_branch":"main","last_commit":{{"id":"{sha}"}}}}}}"#
        );
        assert_eq!(
            parse_pull_request("gitlab", gitlab.as_bytes())
                .unwrap()
                .number,
            3
        );
        for bad in [
            "{".to_owned(),
            "[]".to_owned(),
            github.replace(sha, "not-a-sha"),
            github.replace(r#""ref":"feature""#, r#""ref":"""#),
            github.replace("\"number\":7,\n", "\"number\":-1,\n"),
        ] {
            assert!(
                matches!(
                    parse_pull_request("github", bad.as_bytes()),
                    Err(Payload::Malformed(_))
                ),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_pull_request("gitlab", github.as_bytes()),
            Err(Payload::Malformed(_))
        ));
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
        // Before the body: a token is checked, an HMAC header must be 64 hex digits.
        assert_eq!(claim(&gitlab, "s3cret"), Some(Claim::Token));
        assert_eq!(claim(&wrong, "s3cret"), None);
        assert!(matches!(claim(&github, "other"), Some(Claim::Hmac(_))));
        let short = headers(&[("x-hub-signature-256", format!("sha256={}", &good[..62]))]);
        assert_eq!(claim(&short, "s3cret"), None);
        assert_eq!(claim(&HeaderMap::new(), "s3cret"), None);
        // A GitHub header without its `sha256=` prefix is not accepted as one.
        let bare = headers(&[("x-hub-signature-256", good)]);
        assert_eq!(verify(&bare, body, "s3cret"), None);
    }
}
