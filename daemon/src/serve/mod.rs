//! The daemon's HTTP listener (`http:` in the host config): the status page and its data,
//! Prometheus metrics, health checks and push and pull-request webhooks, on the daemon's own
//! runtime.
//!
//! Everything but `POST /hooks/git` is read-only, and nothing it serves holds a secret value:
//! the page's data comes from the state's non-secret columns and views. A token, when set, is
//! required on every route but the webhook (which carries its own signature) and the health
//! checks.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use gitplane_state::{KeySource, Store};
use subtle::ConstantTimeEq;
use tokio::sync::{mpsc, watch};

use crate::config::{HostConfig, HttpConfig, SecretSourceError};
use crate::events::Events;

mod api;
mod hooks;
mod layout;
pub mod metrics;
mod page;

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
        }
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

/// Binds the listener: before the daemon's first reconcile, so a port in use stops it at once.
pub async fn bind(config: &HttpConfig) -> Result<tokio::net::TcpListener, ServeError> {
    tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })
}

/// Serves until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let app = router(shared);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await
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
        .merge(hooks::routes())
        .merge(guarded)
        .with_state(shared)
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
    let text = shared.events.metrics.render(&figures);
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

/// The cookie a browser carries the token in, set by `POST /login`.
const TOKEN_COOKIE: &str = "gitplane_token";

/// With a token configured, a request needs it: as `Authorization: Bearer TOKEN`, or from a
/// browser in the cookie `POST /login` sets.
async fn require_token(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(token) = shared.token() else {
        return next.run(request).await;
    };
    if presented(request.headers()).is_some_and(|p| same(&p, &token)) {
        return next.run(request).await;
    }
    let browser = request
        .headers()
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

/// The token a request carries, if any.
fn presented(headers: &HeaderMap) -> Option<String> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_owned());
    }
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == TOKEN_COOKIE)
        .map(|(_, value)| value.to_owned())
}

/// Compares secrets in time that does not depend on where they differ.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// `POST /login`: a browser trades the token for a cookie that carries it.
async fn login(
    State(shared): State<Arc<Shared>>,
    axum::Form(form): axum::Form<LoginForm>,
) -> Response {
    match shared.token() {
        Some(token) if same(form.token.trim(), &token) => (
            StatusCode::SEE_OTHER,
            [
                (header::LOCATION, "/".to_owned()),
                (
                    header::SET_COOKIE,
                    format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"),
                ),
            ],
        )
            .into_response(),
        Some(_) => (StatusCode::UNAUTHORIZED, "wrong token\n").into_response(),
        None => (StatusCode::SEE_OTHER, [(header::LOCATION, "/")]).into_response(),
    }
}
