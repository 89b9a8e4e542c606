//! The daemon's HTTP listener (`http:` in the host config): the status page and its data,
//! Prometheus metrics, health checks and push and pull-request webhooks, on the daemon's own
//! runtime.
//!
//! Everything but `POST /hooks/git` is read-only, and nothing it serves holds a secret value:
//! the page's data comes from the state's non-secret columns and views. A token, when set, is
//! required on every route but the webhook (which carries its own signature) and the health
//! checks. What any client may hold of the listener, token or not, is bounded (`listener`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::StreamExt;
use gitplane_state::{KeySource, Store};
use subtle::ConstantTimeEq;
use tokio::sync::{Semaphore, mpsc, watch};

use crate::config::{HostConfig, HttpConfig, HttpLimits, SecretSourceError};
use crate::events::Events;

mod api;
mod hooks;
mod layout;
mod listener;
mod page;
mod session;

pub use listener::{Bound, bind, serve};

/// Why the listener cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("http.listen {addr}: cannot listen: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}; the listener does not start without it")]
    Secret(#[from] SecretSourceError),
    /// The connection cap does not fit in the open-file limit.
    #[error("{0}")]
    OpenFiles(String),
}

/// The secrets requests are checked against, read from the host config's sources.
#[derive(Default)]
pub struct Secrets {
    pub token: Option<String>,
    pub webhook: Option<String>,
}

impl Secrets {
    /// Reads the token and webhook secret `config` names, now.
    pub fn read(config: &HttpConfig, host: &HostConfig) -> Result<Secrets, SecretSourceError> {
        let stores = host.secret_stores();
        Ok(Secrets {
            token: config
                .token
                .as_ref()
                .map(|s| s.read("http.token", &stores))
                .transpose()?,
            webhook: config
                .webhook_secret
                .as_ref()
                .map(|s| s.read("http.webhook_secret", &stores))
                .transpose()?,
        })
    }
}

/// What the handlers share.
pub struct Shared {
    pub state: PathBuf,
    pub state_key: Option<KeySource>,
    /// The local repository: the one people push to, or the mirror of a remote.
    pub repo: PathBuf,
    /// The host config in force, for `explain` (replaced on SIGHUP).
    pub host: RwLock<HostConfig>,
    pub events: Arc<Events>,
    /// Told of each verified push webhook, with when it arrived.
    pub hooks: mpsc::Sender<Instant>,
    pub secrets: RwLock<Secrets>,
    /// Set once the daemon has looked at the watched ref; cleared when it stops.
    pub ready: AtomicBool,
    /// Turns true when the daemon stops: long-lived responses (event streams) end then.
    pub stop: watch::Receiver<bool>,
    /// One connection for the page's reads, opened on first use.
    store: Mutex<Option<Store>>,
    /// The pull-request plans under way.
    plans: hooks::PlanQueue,
    /// Webhook bodies being read at once, at most [`hooks::MAX_BODIES`]: each may be
    /// `http.max_body` in memory until its signature is checked.
    bodies: Semaphore,
    /// The browsers signed in with the token.
    sessions: session::Sessions,
}

impl Shared {
    pub fn new(
        (state, state_key, repo): (PathBuf, Option<KeySource>, PathBuf),
        host: HostConfig,
        events: Arc<Events>,
        (hooks, stop): (mpsc::Sender<Instant>, watch::Receiver<bool>),
        secrets: Secrets,
    ) -> Shared {
        Shared {
            state,
            state_key,
            repo,
            host: RwLock::new(host),
            events,
            hooks,
            secrets: RwLock::new(secrets),
            ready: AtomicBool::new(false),
            stop,
            store: Mutex::new(None),
            plans: hooks::PlanQueue::default(),
            bodies: Semaphore::new(hooks::MAX_BODIES),
            sessions: session::Sessions::default(),
        }
    }

    /// The limits on requests in force (re-read on SIGHUP).
    fn limits(&self) -> HttpLimits {
        self.host
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .http
            .as_ref()
            .map(|h| h.limits)
            .unwrap_or_default()
    }

    /// Runs `read` on the page's state connection, on a blocking thread.
    pub async fn read<T: Send + 'static>(
        self: &Arc<Self>,
        read: impl FnOnce(&Store) -> Result<T, gitplane_state::StateError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let shared = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut slot = shared.store.lock().unwrap_or_else(|e| e.into_inner());
            if slot.is_none() {
                *slot = Some(Store::open_keyed(&shared.state, shared.state_key.as_ref())?);
            }
            let store = slot.as_ref().expect("opened above");
            let result = read(store);
            if result.is_err() {
                // A connection that failed once is not trusted again.
                *slot = None;
            }
            Ok(result?)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("the read task failed: {e}")))?
    }

    fn token(&self) -> Option<String> {
        self.secrets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .token
            .clone()
    }
}

/// An error a handler answers with.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    State(#[from] gitplane_state::StateError),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self {
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::State(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (
            status,
            axum::Json(serde_json::json!({"error": self.to_string()})),
        )
            .into_response()
    }
}

/// Every route.
pub fn router(shared: Arc<Shared>) -> Router {
    let guarded = Router::new()
        .route("/metrics", get(metrics_text))
        .merge(page::routes())
        .merge(api::routes())
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            require_token,
        ));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/login", get(page::login).post(login))
        .route("/assets/login.css", get(page::login_css))
        .merge(hooks::routes())
        .merge(guarded)
        // What extractors read of a body (the login form) at most; webhooks read theirs with
        // `http.max_body`.
        .layer(DefaultBodyLimit::max(FORM_LIMIT))
        .with_state(shared)
}

/// The largest form body (`POST /login`).
const FORM_LIMIT: usize = 16 * 1024;

/// Why a request's body was not read whole.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BodyError {
    #[error("the body is larger than {0} bytes (http.max_body)")]
    TooLarge(usize),
    #[error("the body did not arrive within {0:?} (http.body_timeout)")]
    Slow(Duration),
    #[error("the body could not be read")]
    Broken,
}

impl IntoResponse for BodyError {
    fn into_response(self) -> Response {
        let status = match self {
            BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::Slow(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Broken => StatusCode::BAD_REQUEST,
        };
        closing(status, format!("{self}\n"))
    }
}

/// Reads `body` whole: at most `limit` bytes (a larger declared length is refused before a
/// byte is read), within `within`.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    within: Duration,
) -> Result<Bytes, BodyError> {
    if body.size_hint().lower() > limit as u64 {
        return Err(BodyError::TooLarge(limit));
    }
    let read = async {
        let mut bytes = Vec::new();
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|_| BodyError::Broken)?;
            if bytes.len() + chunk.len() > limit {
                return Err(BodyError::TooLarge(limit));
            }
            bytes.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(bytes))
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or(Err(BodyError::Slow(within)))
}

/// An answer after which the connection is closed: sent before a body was read, so the rest
/// of it is not waited for.
pub(crate) fn closing(status: StatusCode, text: impl Into<String>) -> Response {
    (status, [(header::CONNECTION, "close")], text.into()).into_response()
}

async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if !shared.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "starting or stopping\n").into_response();
    }
    match shared.read(|s| s.environments().map(drop)).await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot read the state: {e}\n"),
        )
            .into_response(),
    }
}

async fn metrics_text(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    let figures = shared.read(|s| s.figures()).await?;
    // Git is read on a blocking thread too: a few commit objects, whatever the estate's size.
    let (repo, commits) = (shared.repo.clone(), figures.commits.clone());
    let git_ref = shared
        .host
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .git_ref
        .clone();
    let behind = tokio::task::spawn_blocking(move || {
        crate::metrics::commits_behind(&repo, git_ref.as_deref(), &commits)
    })
    .await
    .unwrap_or_default();
    let text = shared.events.metrics.render(&figures, &behind);
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// The cookie a browser carries its session in, set by `POST /login`.
const SESSION_COOKIE: &str = "gitplane_session";

/// With a token configured, a request needs it, as `Authorization: Bearer TOKEN`, or the
/// session cookie `POST /login` sets in a browser.
async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = shared.token() else {
        return next.run(request).await;
    };
    let headers = request.headers();
    let bearer = bearer(headers).is_some_and(|b| same(b, &token));
    if bearer || session_of(headers).is_some_and(|id| shared.sessions.check(id, &token)) {
        return next.run(request).await;
    }
    let browser = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/html"));
    if browser {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a token is required: send Authorization: Bearer <token>\n",
    )
        .into_response()
}

/// The bearer token a request carries, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The session id a request's cookie carries, if any.
fn session_of(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value)
}

/// Compares secrets in time that does not depend on where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Whether the request reached a TLS proxy in front of the listener: its cookie may then
/// travel over HTTPS alone.
fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("https"))
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /login`: a browser that gives the token gets a session, in a cookie that holds the
/// session's id, never the token.
async fn login(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let Some(token) = shared.token() else {
        return (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response();
    };
    let secure = behind_tls(request.headers());
    let within = shared.limits().body_timeout;
    let form = match tokio::time::timeout(
        within,
        axum::Form::<LoginForm>::from_request(request, &shared),
    )
    .await
    {
        Ok(Ok(axum::Form(form))) => form,
        Ok(Err(rejection)) => return rejection.into_response(),
        Err(_) => return BodyError::Slow(within).into_response(),
    };
    if !same(form.token.trim(), &token) {
        return (
            StatusCode::UNAUTHORIZED,
            axum::response::Html(page::login_page(&shared, Some("Wrong token."))),
        )
            .into_response();
    }
    let id = match shared.sessions.open(&token) {
        Ok(id) => id,
        Err(e) => {
            tracing::error!("{e}");
            return (StatusCode::INTERNAL_SERVER_ERROR, "cannot make a session\n").into_response();
        }
    };
    let cookie = format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{}",
        session::LIFETIME.as_secs(),
        if secure { "; Secure" } else { "" }
    );
    let Ok(cookie) = HeaderValue::from_str(&cookie) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "cannot make a session\n").into_response();
    };
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, HeaderValue::from_static("/")),
            (header::SET_COOKIE, cookie),
        ],
    )
        .into_response()
}
