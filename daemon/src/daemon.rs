//! `gitplane daemon`: watches the config repository and reconciles every new commit, each
//! environment in its own worker, until SIGTERM.
//!
//! The shape is kube-rs's controller: level-triggered (every wake-up re-resolves the watched
//! ref; a periodic check covers lost events), at most one reconcile per environment at a time,
//! and requests that arrive meanwhile merge (a worker always takes the newest commit).
//! One task owns shutdown: on SIGTERM it stops new work, lets in-flight driver calls finish for
//! up to the drain deadline, and leaves what it could not finish recorded for the next start.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use gitplane_state::{ApplyLock, DeploymentStatus, PreviewPush, StateError, Store};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch as latest};
use tokio::task::Id as TaskId;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::app;
use crate::asked;
use crate::config::{HostConfig, PreviewTrust, RepoSource};
use crate::deploy::{self, Reach, Target};
use crate::drivers::Registry;
use crate::events::{DeploymentEvent, Events};
use crate::model::LoadCache;
use crate::previews::{self, PreviewAction};
use crate::reconcile::{self, ApplyOptions, Settings};
use crate::repo::{ConfigRepo, RepoError};
use crate::requests::{Ended, RequestQueue, Work};
use crate::serve::{self, ServeError};
use crate::shard::{self, LeaseEvent, Shard};
use crate::stores::SecretStores;
use crate::watch;

/// How long one fetch of a remote may take before git is stopped.
const FETCH_LIMIT: Duration = Duration::from_secs(120);
/// How often the watched ref is resolved even without a file event.
const DEFAULT_POLL: Duration = Duration::from_secs(30);
/// How long a preview's removal that did not finish waits before it is tried again.
const PREVIEW_REMOVAL_RETRY: Duration = Duration::from_secs(300);

/// What `gitplane daemon` runs with.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub source: RepoSource,
    pub state: PathBuf,
    /// Only these environments; empty: every environment of each commit.
    pub envs: Vec<String>,
    /// The host config file, re-read on SIGHUP.
    pub config_path: Option<PathBuf>,
    pub host: HostConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error("cannot install the signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("refusing to start, no lease taken: {0}")]
    Trust(#[from] crate::trust::TrustError),
    /// The state key does not open the state's key canary (or, before there is one, its
    /// sealed values).
    #[error("refusing to start, no lease taken: {0}")]
    Key(StateError),
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(options: DaemonOptions) -> Result<(), DaemonError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(DaemonError::Runtime)?;
    // SIGUSR1 (`gitplane reconcile`) is caught from before the daemon can be found in the
    // state: its default action would end the process.
    let result = runtime.block_on(async {
        let usr1 = signal(SignalKind::user_defined1()).map_err(DaemonError::Signals)?;
        Daemon::start(options)?.run(usr1).await
    });
    // Driver calls still running past the stop timeout were recorded as interrupted: the
    // process does not wait for them (a runtime waits for its blocking threads when dropped).
    runtime.shutdown_timeout(Duration::from_millis(500));
    result
}

/// Work for one environment's worker.
#[derive(Debug, Clone)]
struct Job {
    commit: String,
    drift: bool,
    /// When the daemon noticed the commit (a webhook, a ref change, a poll): `None` for drift
    /// runs.
    noticed: Option<Instant>,
    /// What the main loop built when it checked the commit: the worker takes it if the
    /// environment's fingerprints still give the same scope once it holds the lock.
    prebuilt: Arc<Mutex<Option<Target>>>,
    /// Set for a preview environment's job: deploy a branch head, or remove it all.
    preview: Option<PreviewJob>,
}

/// What the looks at the preview branches remember, so a look that finds nothing new reads
/// neither the watched ref's trees nor any branch's history.
#[derive(Default)]
struct PreviewMemo {
    /// Whether a branch head may be previewed with a watched commit's platform (`None`) or
    /// why not, by (head, watched commit).
    verdicts: HashMap<(String, String), Option<String>>,
    /// The watched ref's newest commit as last read.
    platform: Option<Platform>,
}

/// The watched ref's commit as previews see it.
#[derive(Clone)]
struct Platform {
    commit: String,
    /// The environments it declares: never a preview.
    declared: std::collections::BTreeSet<String>,
    /// What a preview takes from it, as text (see [`platform_print`]).
    print: String,
}

/// What a preview environment's job does.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PreviewJob {
    /// Deploy the branch head, built as an environment of this type; with `platform`, only the
    /// branch's `workloads/` are read, everything else from that commit of the watched ref.
    Deploy {
        env_type: String,
        platform: Option<String>,
    },
    /// Delete every resource of the environment.
    Remove,
}

impl Shared {
    /// The drivers and settings in force (SIGHUP replaces them).
    fn current(&self) -> Arc<Runtime> {
        self.runtime
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What workers share: the settings (replaced on SIGHUP) and the stop flag.
struct Shared {
    state: PathBuf,
    /// Where the key that seals the state's secrets comes from (`state_key`).
    state_key: Option<gitplane_state::KeySource>,
    /// The local repository: the one people push to, or the mirror of a remote.
    repo: PathBuf,
    /// The watched ref (`ref:`; `None`: the repository's HEAD).
    git_ref: Option<String>,
    /// Parsed files of the last commit read: a new commit parses only what it changed.
    cache: Arc<Mutex<LoadCache>>,
    runtime: RwLock<Arc<Runtime>>,
    stop: Arc<AtomicBool>,
    /// Metrics, the status page's live updates and notifications.
    events: Arc<Events>,
    /// The environments this daemon holds, when daemons share a PostgreSQL state; `None`:
    /// every environment is this daemon's.
    shard: Option<Arc<Shard>>,
    /// Deployment slots: `parallel_environments` runs at once, across environments.
    slots: Arc<tokio::sync::Semaphore>,
    /// How many slots there are now (SIGHUP may change it).
    slot_count: AtomicUsize,
}

struct Daemon {
    options: DaemonOptions,
    shared: Arc<Shared>,
    /// The local repository: the one people push to, or the mirror of a remote.
    repo_path: PathBuf,
    /// The commit last dispatched, to skip wake-ups that changed nothing.
    last_commit: Option<String>,
    /// A commit held back because a secret store could not give its secrets, with the errors
    /// last reported: it is tried again on every wake-up, and reported again only when the
    /// errors change.
    waiting: Option<(String, Vec<String>)>,
    /// Each environment's queue, which its worker takes work from.
    workers: HashMap<String, Arc<EnvQueue>>,
    tasks: JoinSet<()>,
    /// Which environment and queue each worker task serves: a worker that ends takes its
    /// queue along, so the next request starts a new one.
    task_envs: HashMap<TaskId, (String, Arc<EnvQueue>)>,
    /// Drift schedules of the environments, from the newest good commit.
    schedules: HashMap<String, crate::model::Schedule>,
    /// The main loop's connection to the state, shared with the commit checks it runs on
    /// blocking threads (one connection for the daemon's life, not one per wake-up).
    store: Arc<Mutex<Store>>,
    /// The HTTP listener's shared part, when `http:` is set.
    served: Option<Arc<serve::Shared>>,
    /// A push webhook that came while a fetch was running: fetch again once it ends, since
    /// the push may have landed after the running fetch read the remote.
    fetch_again: Option<Instant>,
    /// Leases gained and lost, from the lease thread.
    lease_events: Option<mpsc::UnboundedReceiver<LeaseEvent>>,
    /// The lease thread: it gives the leases up when the daemon stops.
    lease_thread: Option<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>,
    /// Preview environments: the branch head and the platform each was last handed to its
    /// worker with, and when a removal was last handed over (one that fails is tried again
    /// after a while).
    preview_heads: HashMap<String, (String, String)>,
    /// Whether a branch head may be previewed with the watched ref's platform (`None`) or not
    /// (why), by (head, watched commit): judged once per pair, not at every look.
    preview_memo: Arc<Mutex<PreviewMemo>>,
    preview_removals: HashMap<String, Instant>,
    /// When the next preview's time runs out.
    preview_due: Option<Instant>,
    /// Branches that match `previews.branches` but get no preview, as last reported.
    preview_skipped: Vec<String>,
    /// `host:pid`: this daemon in the `daemon` table and in its answers.
    id: String,
    /// `gitplane reconcile` requests taken and not yet answered: answered once the repository
    /// was looked at (after a fetch, for a remote).
    asked: Vec<gitplane_state::ReconcileRequest>,
    /// Requests left to the daemons holding their environments: not taken again until this
    /// daemon gains a lease.
    left_to_others: HashSet<String>,
}

impl Daemon {
    /// Runs `f` with the main loop's connection on a blocking thread: the loop never waits on
    /// the database on the runtime's threads. `None` when the task failed (logged).
    async fn with_store<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> T + Send + 'static,
    ) -> Option<T> {
        let store = self.store.clone();
        let done = tokio::task::spawn_blocking(move || {
            f(&store.lock().unwrap_or_else(|e| e.into_inner()))
        })
        .await;
        done.map_err(|e| error!(error = %e, "a state task failed"))
            .ok()
    }

    fn start(options: DaemonOptions) -> Result<Daemon, DaemonError> {
        let store = Store::open_keyed(&options.state, options.host.state_key.as_ref())?;
        let (repo_path, remote) = match &options.source {
            RepoSource::Local(path) => (path.clone(), None),
            RepoSource::Remote { url, .. } => {
                let mirror = crate::config::mirror_path(&options.state);
                watch::fetch_mirror(url, &mirror, FETCH_LIMIT)?;
                (mirror, Some(url.as_str()))
            }
        };
        // Before any lease: a daemon of another repository, or with a key that does not open
        // this state, would take its share of the environments and deploy or fail there.
        crate::trust::check_repository(
            &store,
            &ConfigRepo::open(&repo_path)?,
            &crate::trust::shown_location(&repo_path, remote),
            options.host.git_ref.as_deref(),
            true,
        )?;
        store.check_key().map_err(DaemonError::Key)?;
        let events = Arc::new(Events::new(&options.host.notify));
        if remote.is_some() {
            // The daemon starts only once its first fetch succeeded.
            events.metrics.fetched(true);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (shard, lease_events, lease_thread) =
            if store.backend() == gitplane_state::db::Backend::Postgres {
                let ttl = lease_ttl(&options.host);
                let quit = Arc::new(AtomicBool::new(false));
                let keeper = shard::start(&options.state, ttl, quit.clone())?;
                (
                    Some(keeper.shard),
                    Some(keeper.events),
                    Some((keeper.thread, quit)),
                )
            } else {
                (None, None, None)
            };
        let id = format!("{}:{}", gitplane_state::this_host(), std::process::id());
        if shard.is_none() {
            // Daemons sharing a state report themselves with each heartbeat; this one says it
            // runs once, so that `gitplane reconcile` on this host finds it.
            store.register_daemon(&id)?;
        }
        let shared = Arc::new(Shared {
            state: options.state.clone(),
            state_key: options.host.state_key.clone(),
            repo: repo_path.clone(),
            git_ref: options.host.git_ref.clone(),
            cache: Arc::default(),
            runtime: RwLock::new(Arc::new(runtime_of(&options.host, &events))),
            stop,
            events,
            shard,
            slots: Arc::new(tokio::sync::Semaphore::new(
                options.host.parallel_environments,
            )),
            slot_count: AtomicUsize::new(options.host.parallel_environments),
        });
        Ok(Daemon {
            options,
            shared,
            repo_path,
            last_commit: None,
            waiting: None,
            workers: HashMap::new(),
            tasks: JoinSet::new(),
            task_envs: HashMap::new(),
            schedules: HashMap::new(),
            store: Arc::new(Mutex::new(store)),
            served: None,
            fetch_again: None,
            lease_events,
            lease_thread,
            preview_heads: HashMap::new(),
            preview_memo: Arc::default(),
            preview_removals: HashMap::new(),
            preview_due: None,
            preview_skipped: Vec::new(),
            id,
            asked: Vec::new(),
            left_to_others: HashSet::new(),
        })
    }

    async fn run(mut self, mut usr1: tokio::signal::unix::Signal) -> Result<(), DaemonError> {
        let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
        let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
        // SIGTERM stops new driver calls at once, from a task of its own: the main loop may be
        // busy reading a commit when it comes, and must not let a worker start a call meanwhile.
        let (stopped_tx, mut stop_requested) = latest::channel(false);
        let stop = self.shared.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            stop.store(true, Ordering::SeqCst);
            let _ = stopped_tx.send(true);
        });
        let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;
        let (wake_tx, mut wake_rx) = mpsc::channel::<()>(1);
        // Verified push webhooks, with when each arrived.
        let (hook_tx, mut hook_rx) = mpsc::channel::<Instant>(1);
        let (stop_serving, stopped) = latest::channel(false);
        let mut server = None;
        if let Some(http) = self.options.host.http.clone() {
            let secrets =
                serve::Secrets::read(&http, &self.options.host).map_err(ServeError::from)?;
            let listener = serve::bind(&http).await?;
            let served = Arc::new(serve::Shared::new(
                (
                    self.options.state.clone(),
                    self.options.host.state_key.clone(),
                    self.repo_path.clone(),
                ),
                self.options.host.clone(),
                self.shared.events.clone(),
                (hook_tx, stopped.clone()),
                secrets,
            ));
            info!(listen = %http.listen, "http listener ready");
            server = Some(tokio::spawn(serve::serve(
                listener,
                served.clone(),
                stopped,
            )));
            self.served = Some(served);
        }
        let git_dir = git_dir(&self.repo_path)?;
        let _watcher = watch::watch_refs(&git_dir, wake_tx.clone())?;
        let poll = self.options.host.watch_interval.unwrap_or(DEFAULT_POLL);
        let mut poll_timer = tokio::time::interval(poll);
        let fetch = match &self.options.source {
            RepoSource::Remote { url, interval } => Some((url.clone(), *interval)),
            RepoSource::Local(_) => None,
        };
        let mut fetch_timer =
            tokio::time::interval(fetch.as_ref().map_or(Duration::from_secs(3600), |f| f.1));
        // A fetch runs on a thread of its own and reports here, so a remote that stops
        // answering never holds up signals, the heartbeat or the environments' work.
        let (fetched_tx, mut fetched_rx) =
            mpsc::channel::<(Result<(), watch::WatchError>, Instant)>(1);
        let mut fetching = false;
        // The heartbeat says the runtime's threads are free: nothing blocking runs on them (the
        // state and git are read on blocking threads), so it beats while a database hangs, and
        // stops if a task ever blocks a worker thread for good.
        let heartbeat = sd_notify::watchdog_enabled().map(|every| {
            tokio::spawn(async move {
                let mut beat = tokio::time::interval(every / 2);
                loop {
                    beat.tick().await;
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Watchdog]);
                }
            })
        });

        self.check(Instant::now()).await;
        // Requests made while no daemon ran (or before this one could be signalled).
        if self.take_requests().await {
            self.look_for_requests(&fetch, &mut fetching, &fetched_tx)
                .await;
        }
        if let Some(served) = &self.served {
            served.ready.store(true, Ordering::SeqCst);
        }
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status("watching"),
        ]);
        info!(repo = %self.repo_path.display(), state = %self.options.state.display(), "gitplane daemon ready");
        loop {
            let drift_at = self.next_drift();
            tokio::select! {
                _ = stop_requested.changed() => break,
                _ = hup.recv() => {
                    self.reload();
                    self.check(Instant::now()).await;
                }
                Some(()) = wake_rx.recv() => self.check(Instant::now()).await,
                _ = poll_timer.tick() => {
                    self.check(Instant::now()).await;
                    // Requests from another host (or a user who cannot signal this daemon)
                    // are taken at the next look.
                    if self.take_requests().await {
                        self.look_for_requests(&fetch, &mut fetching, &fetched_tx).await;
                    }
                }
                _ = usr1.recv() => {
                    if self.take_requests().await {
                        self.look_for_requests(&fetch, &mut fetching, &fetched_tx).await;
                    }
                }
                Some(arrived) = hook_rx.recv() => match &fetch {
                    Some((url, _)) if !fetching => {
                        fetching = true;
                        self.start_fetch(url, arrived, &fetched_tx);
                    }
                    Some(_) => self.fetch_again = Some(self.fetch_again.unwrap_or(arrived)),
                    None => self.check(arrived).await,
                },
                _ = fetch_timer.tick(), if fetch.is_some() && !fetching => {
                    if let Some((url, _)) = &fetch {
                        fetching = true;
                        self.start_fetch(url, Instant::now(), &fetched_tx);
                    }
                }
                Some((result, noticed)) = fetched_rx.recv() => {
                    fetching = false;
                    self.shared.events.metrics.fetched(result.is_ok());
                    if let Err(e) = result {
                        warn!(error = %e, "fetch failed; the last fetched commit stays in force");
                    }
                    self.check(noticed).await;
                    if let (Some(arrived), Some((url, _))) = (self.fetch_again.take(), &fetch) {
                        fetching = true;
                        self.start_fetch(url, arrived, &fetched_tx);
                    } else if !self.asked.is_empty() {
                        // The fetch that ended began after the requests came.
                        self.answer_requests().await;
                    }
                }
                _ = tokio::time::sleep(drift_at.as_ref().map_or(Duration::from_secs(3600), |(d, _)| *d)), if drift_at.is_some() => {
                    if let Some((_, envs)) = &drift_at {
                        self.drift(envs);
                    }
                }
                Some(event) = recv_lease(&mut self.lease_events) => self.lease_changed(event).await,
                _ = sleep_until(self.preview_due), if self.preview_due.is_some() => {
                    self.preview_due = None;
                    self.check_previews(Instant::now()).await;
                }
                Some(done) = self.tasks.join_next_with_id() => {
                    let id = match &done {
                        Ok((id, ())) => *id,
                        Err(e) => {
                            error!(error = %e, "an environment worker stopped");
                            e.id()
                        }
                    };
                    // The next request for its environment starts a new worker.
                    if let Some((env, queue)) = self.task_envs.remove(&id)
                        && self.workers.get(&env).is_some_and(|q| Arc::ptr_eq(q, &queue))
                    {
                        self.workers.remove(&env);
                    }
                }
            }
        }
        if let Some(served) = &self.served {
            served.ready.store(false, Ordering::SeqCst);
        }
        self.shutdown().await;
        if let Some(heartbeat) = heartbeat {
            heartbeat.abort();
        }
        let _ = stop_serving.send(true);
        if let Some(server) = server {
            // Open event streams end with the stop signal; a request still running gets a moment.
            let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
        }
        Ok(())
    }

    /// Makes `wanted` deployment slots (`parallel_environments` reloaded): more are added at
    /// once; fewer are taken away as running deployments give theirs back.
    fn resize_slots(&self, wanted: usize) {
        let had = self.shared.slot_count.swap(wanted, Ordering::SeqCst);
        if wanted > had {
            self.shared.slots.add_permits(wanted - had);
        } else if wanted < had {
            let slots = self.shared.slots.clone();
            tokio::spawn(async move {
                if let Ok(taken) = slots.acquire_many_owned((had - wanted) as u32).await {
                    taken.forget();
                }
            });
        }
    }

    /// Takes the `gitplane reconcile` requests no daemon answered yet, adding those not taken
    /// before to [`Daemon::asked`]; whether any wait for an answer.
    async fn take_requests(&mut self) -> bool {
        match self
            .with_store(|store| store.open_reconcile_requests())
            .await
        {
            Some(Ok(open)) => {
                // Answered or expired ones are forgotten.
                self.left_to_others
                    .retain(|id| open.iter().any(|r| &r.id == id));
                for request in open {
                    if !self.left_to_others.contains(&request.id)
                        && !self.asked.iter().any(|a| a.id == request.id)
                    {
                        self.asked.push(request);
                    }
                }
            }
            Some(Err(e)) => warn!(error = %e, "cannot read the reconcile requests"),
            None => {}
        }
        !self.asked.is_empty()
    }

    /// Looks at the repository for the requests taken, then answers them: a remote is fetched
    /// first (again, when a fetch began before they came), a local repository read now.
    async fn look_for_requests(
        &mut self,
        fetch: &Option<(String, Duration)>,
        fetching: &mut bool,
        fetched_tx: &mpsc::Sender<(Result<(), watch::WatchError>, Instant)>,
    ) {
        match fetch {
            Some((url, _)) if !*fetching => {
                *fetching = true;
                self.start_fetch(url, Instant::now(), fetched_tx);
            }
            Some(_) => self.fetch_again = Some(self.fetch_again.unwrap_or_else(Instant::now)),
            None => {
                self.check(Instant::now()).await;
                self.answer_requests().await;
            }
        }
    }

    /// Answers the requests taken (see [`asked::answer`]) and queues the deployments they ask
    /// for, of the commit last dispatched.
    async fn answer_requests(&mut self) {
        let requests = std::mem::take(&mut self.asked);
        let repo = self.repo_path.clone();
        let id = self.id.clone();
        let commit = self.last_commit.clone();
        let waiting = self.waiting.as_ref().map(|(c, _)| c.clone());
        let only = self.options.envs.clone();
        let held = self.shared.shard.as_ref().map(|s| s.held());
        let answered = self
            .with_store(move |store| {
                let looked = asked::Looked {
                    daemon: &id,
                    commit: commit.as_deref(),
                    waiting: waiting.as_deref(),
                    only: &only,
                    held: held.as_ref(),
                };
                asked::answer(store, &repo, &looked, &requests)
            })
            .await;
        let deploy = match answered {
            Some(Ok(answered)) => {
                self.left_to_others.extend(answered.left);
                answered.deploy
            }
            Some(Err(e)) => {
                warn!(error = %e, "cannot answer the reconcile requests: they are taken again at the next look");
                return;
            }
            None => return,
        };
        let Some(commit) = self.last_commit.clone() else {
            return;
        };
        for env in deploy {
            self.dispatch(
                env,
                Job {
                    commit: commit.clone(),
                    drift: false,
                    noticed: None,
                    prebuilt: Arc::default(),
                    preview: None,
                },
            );
        }
    }

    /// Fetches the remote into the mirror on a thread of its own; the result comes back on
    /// `report` with `noticed`, when the push that asked for it was noticed.
    fn start_fetch(
        &self,
        url: &str,
        noticed: Instant,
        report: &mpsc::Sender<(Result<(), watch::WatchError>, Instant)>,
    ) {
        let (url, mirror, report) = (url.to_owned(), self.repo_path.clone(), report.clone());
        tokio::task::spawn_blocking(move || {
            let fetched = watch::fetch_mirror(&url, &mirror, FETCH_LIMIT);
            let _ = report.blocking_send((fetched, noticed));
        });
    }

    /// SIGTERM: no new driver calls; in-flight ones finish for up to the stop timeout, and
    /// those still running then are cancelled (exec programs killed) and recorded as
    /// interrupted, for the next start to resume.
    async fn shutdown(mut self) {
        let limit = self.options.host.stop_timeout;
        info!("stopping: finishing driver calls in flight");
        let _ = sd_notify::notify(&[
            sd_notify::NotifyState::Stopping,
            sd_notify::NotifyState::Status("stopping: finishing driver calls in flight"),
        ]);
        self.shared.stop.store(true, Ordering::SeqCst);
        // Workers waiting for a slot end too.
        self.shared.slots.close();
        // Closing the queues lets idle workers end.
        for queue in self.workers.values() {
            queue.close();
        }
        let drained = tokio::time::timeout(limit, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            // Killed and journalled before the leases go: another daemon may start these
            // resources the moment it takes a lease, and must not while they still run.
            let killed = crate::drivers::kill_running();
            let store = self.store.clone();
            let interrupted = tokio::task::spawn_blocking(move || {
                let store = store.lock().unwrap_or_else(|e| e.into_inner());
                store.interrupt_own_operations(std::process::id())
            })
            .await;
            match interrupted {
                Ok(Ok(n)) => warn!(
                    operations = n,
                    programs_killed = killed,
                    "stopped with driver calls still running after {:?} (stop_timeout): they \
                     are recorded as interrupted, and the next start resumes them",
                    limit
                ),
                Ok(Err(e)) => {
                    error!(error = %e, "cannot record the interrupted driver calls; the next start finds them")
                }
                Err(e) => error!(error = %e, "the task recording the interrupted calls failed"),
            }
        }
        if self.shared.shard.is_none() {
            let id = self.id.clone();
            if let Some(Err(e)) = self.with_store(move |store| store.forget_daemon(&id)).await {
                warn!(error = %e, "cannot remove this daemon from the state's daemon table");
            }
        }
        if let Some((thread, quit)) = self.lease_thread.take() {
            // Given up once nothing of ours runs, rather than left to expire: the other
            // daemons take them at once.
            quit.store(true, Ordering::SeqCst);
            let released = tokio::task::spawn_blocking(move || thread.join());
            let _ = tokio::time::timeout(Duration::from_secs(3), released).await;
        }
        if drained.is_ok() {
            info!("stopped");
        }
    }

    /// SIGHUP: re-reads the host config; drivers, accounts, limits and retries take effect for
    /// the next reconcile. The repository and state paths need a restart. The current commit is
    /// deployed again only when what a deployment does changed ([`deploys_differently`]): a
    /// reload that changed a limit, a token or the notification targets starts no deployment.
    fn reload(&mut self) {
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Reloading]);
        match HostConfig::load(self.options.config_path.as_deref()) {
            Ok(host) => {
                // A rotated database password is used by the next connection made.
                if let Err(e) = crate::config::apply_state_password(&host) {
                    error!(error = %e, "cannot read the state's password; the previous one stays in force");
                }
                if host.repo != self.options.host.repo || host.state != self.options.host.state {
                    warn!("the host config's repo or state changed: restart gitplane to use them");
                }
                *self
                    .shared
                    .runtime
                    .write()
                    .unwrap_or_else(|e| e.into_inner()) =
                    Arc::new(runtime_of(&host, &self.shared.events));
                self.shared.events.set_targets(&host.notify);
                if let Some(served) = &self.served {
                    self.reload_listener(served, &host);
                }
                self.resize_slots(host.parallel_environments);
                let redeploy = deploys_differently(&self.options.host, &host);
                self.options.host = host;
                if redeploy {
                    // The current commit is looked at again with the new drivers: one rejected
                    // for a driver that is now registered goes through.
                    self.last_commit = None;
                    info!(
                        "host config reloaded: drivers, accounts or secret stores changed; the current commit is deployed again"
                    );
                } else {
                    info!(
                        "host config reloaded: no driver, account or secret store changed; no deployment started"
                    );
                }
            }
            Err(errors) => {
                for e in errors {
                    error!(error = %e, "host config not reloaded; the previous one stays in force");
                }
            }
        }
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
    }

    /// SIGHUP with a listener: its token and webhook secret are read again (rotated without a
    /// restart); a changed address needs a restart.
    fn reload_listener(&self, served: &serve::Shared, host: &HostConfig) {
        let (Some(old), Some(new)) = (&self.options.host.http, &host.http) else {
            warn!("the host config's http section changed: restart gitplane to apply it");
            return;
        };
        if old.listen != new.listen {
            warn!("http.listen changed: restart gitplane to listen there");
        }
        match serve::Secrets::read(new, host) {
            Ok(secrets) => *served.secrets.write().unwrap_or_else(|e| e.into_inner()) = secrets,
            Err(e) => {
                error!(error = %e, "the listener keeps its previous token and webhook secret")
            }
        }
        *served.host.write().unwrap_or_else(|e| e.into_inner()) = host.clone();
    }

    /// A commit that is not applied, with why, and a failed deployment for each environment.
    async fn record_rejected(&self, commit: &str, rejected: &deploy::Rejected) {
        let (commit, rejected) = (commit.to_owned(), rejected.clone());
        let (repo, events) = (self.repo_path.clone(), self.shared.events.clone());
        self.with_store(move |store| {
            let errors = rejected.errors.join("\n");
            if let Err(e) = store.commit_seen(&commit, "rejected", Some(&errors)) {
                error!(error = %e, "cannot record the rejected commit");
                return;
            }
            let info = commit_info(&repo, &commit);
            for env in &rejected.envs {
                match store.failed_deployment(env, Some(&commit), &errors) {
                    Ok(deployment) => {
                        let mut event = DeploymentEvent::not_built(
                            (env, deployment),
                            &commit,
                            info.clone(),
                            rejected.errors.clone(),
                        );
                        event.previous = previous_condition(store, env, deployment);
                        events.finished(event);
                    }
                    Err(e) => {
                        error!(error = %e, "cannot record the rejected commit");
                        return;
                    }
                }
            }
        })
        .await;
    }

    /// Looks at the repository: the watched ref, then the preview branches.
    async fn check(&mut self, noticed: Instant) {
        self.check_ref(noticed).await;
        self.check_previews(noticed).await;
    }

    /// Resolves the watched ref; a new commit is loaded, built, and handed to the workers.
    ///
    /// Only the apps a commit changed are read and built (see [`deploy::target`]); the
    /// fingerprints this judges by are read without the environments' locks, which is enough to
    /// accept or reject the commit (an app skipped here is one that was deployed before with the
    /// same files and definitions), and each worker judges again under its lock.
    async fn check_ref(&mut self, noticed: Instant) {
        let path = self.repo_path.clone();
        let rev = self.options.host.git_ref.clone();
        let last = self.last_commit.clone();
        let envs = self.options.envs.clone();
        let runtime = self.shared.current();
        let shared = self.shared.clone();
        let store = self.store.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            let repo = ConfigRepo::open(&path)?;
            let commit = repo.resolve(rev.as_deref())?;
            if last.as_deref() == Some(commit.as_str()) {
                return Ok(None);
            }
            let layout = repo.layout(&commit)?;
            let store = store.lock().unwrap_or_else(|e| e.into_inner());
            // Another process may have rekeyed the state since the last look.
            store.refresh_key()?;
            let mut envs: Vec<String> = if envs.is_empty() {
                deploy::environments_to_deploy(&layout, Some(&store))?
                    .into_iter()
                    .collect()
            } else {
                envs
            };
            // Daemons sharing the state share its environments out: this one builds those it
            // holds; one it gains later is built by its worker.
            if let Some(shard) = &shared.shard {
                shard.set_envs(envs.iter().cloned());
                let held = shard.held();
                envs.retain(|env| held.contains(env));
            }
            let mut cache = shared.cache.lock().unwrap_or_else(|e| e.into_inner());
            let built = deploy::targets(
                &repo,
                &layout,
                &envs,
                (Some(&store), Reach::Changes),
                runtime.host(),
                &mut cache,
            )?;
            cache.forget_workloads();
            drop(cache);
            let mut targets = match built {
                Ok(targets) => targets,
                Err(rejected) => return Ok(Some((commit, Loaded::Rejected(rejected)))),
            };
            let loaded = match deploy::read_target_secrets(&mut targets, &runtime.stores) {
                Ok(()) => Loaded::Ready(targets),
                Err(unread) => Loaded::Waiting(unread),
            };
            Ok::<_, deploy::DeployError>(Some((commit, loaded)))
        })
        .await;
        let (commit, built) = match loaded {
            Ok(Ok(Some(found))) => found,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot read the watched ref");
                return;
            }
            Err(e) => {
                error!(error = %e, "the load task failed");
                return;
            }
        };
        let built = match built {
            // The commit is fine; the host cannot give its secrets yet. Left undispatched, it is
            // tried again on the next wake-up, so a store that comes back needs no new push.
            Loaded::Waiting(unread) => {
                let report = (commit.clone(), unread.errors.clone());
                if self.waiting.as_ref() != Some(&report) {
                    warn!(commit = %commit, "secrets cannot be read: waiting for the secret stores; nothing changes");
                    for e in &unread.errors {
                        warn!(commit = %commit, "{e}");
                    }
                    self.record_rejected(&commit, &unread).await;
                    self.waiting = Some(report);
                }
                return;
            }
            Loaded::Ready(targets) => Ok(targets),
            Loaded::Rejected(rejected) => Err(rejected),
        };
        self.waiting = None;
        self.last_commit = Some(commit.clone());
        match built {
            Err(rejected) => {
                warn!(commit = %commit, errors = rejected.errors.len(), "commit rejected: nothing changes");
                for e in &rejected.errors {
                    warn!(commit = %commit, "{e}");
                }
                self.record_rejected(&commit, &rejected).await;
            }
            Ok(targets) => {
                info!(commit = %commit, "new commit: reconciling");
                let seen = commit.clone();
                self.with_store(move |store| {
                    if let Err(e) = store.commit_seen(&seen, "dispatched", None) {
                        error!(error = %e, "cannot record the commit");
                    }
                })
                .await;
                for target in targets {
                    let env = target.graph.env.clone();
                    // A graph of some apps has the environment's schedule too: it comes from
                    // the environment's file.
                    match &target.graph.schedule {
                        Some(s) => {
                            self.schedules.insert(env.clone(), s.clone());
                        }
                        None => {
                            self.schedules.remove(&env);
                        }
                    }
                    self.dispatch(
                        env,
                        Job {
                            commit: commit.clone(),
                            drift: false,
                            noticed: Some(noticed),
                            prebuilt: Arc::new(Mutex::new(Some(target))),
                            preview: None,
                        },
                    );
                }
            }
        }
    }

    /// Makes, deploys and removes preview environments (`previews:`): each branch the pattern
    /// matches gets one, deployed at its head on every push; a branch deleted, or not pushed
    /// within `ttl`, has its environment's resources deleted.
    async fn check_previews(&mut self, noticed: Instant) {
        let Some(config) = self.options.host.previews.clone() else {
            return;
        };
        let path = self.repo_path.clone();
        let rev = self.options.host.git_ref.clone();
        let store = self.store.clone();
        let memo = self.preview_memo.clone();
        let looked = tokio::task::spawn_blocking(move || {
            let repo = ConfigRepo::open(&path)?;
            let branches = repo.branches()?;
            let watched = rev.clone().or_else(|| repo.head_ref());
            // The watched ref's newest commit: the environments it declares never get a
            // preview, and its platform is what previews run with (unless trust: branch).
            let mut memo = memo.lock().unwrap_or_else(|e| e.into_inner());
            let platform = match repo.resolve(rev.as_deref()) {
                Ok(commit) => match &memo.platform {
                    Some(p) if p.commit == commit => Some(p.clone()),
                    _ => {
                        let layout = repo.layout(&commit)?;
                        Some(Platform {
                            declared: deploy::environments_in(&layout),
                            print: platform_print(&layout),
                            commit,
                        })
                    }
                },
                Err(e) => {
                    warn!(error = %e, "previews: the watched ref does not resolve");
                    None
                }
            };
            memo.platform = platform.clone();
            let declared = platform
                .as_ref()
                .map(|p| p.declared.clone())
                .unwrap_or_default();
            let store = store.lock().unwrap_or_else(|e| e.into_inner());
            let recorded = store.previews()?;
            // Nor a preview over an environment with resources recorded outside the live
            // previews. Only a branch without a live preview needs to know, so the common
            // look (no new branch) does not read them.
            let live: std::collections::BTreeSet<&str> = recorded
                .iter()
                .filter(|r| r.live())
                .map(|r| r.env.as_str())
                .collect();
            let new_branch = branches.iter().any(|(branch, _)| {
                branch
                    .strip_prefix("refs/heads/")
                    .filter(|name| config.branches.matches(name))
                    .and_then(previews::env_of_branch)
                    .is_some_and(|env| !live.contains(env.as_str()))
            });
            let mut taken = std::collections::BTreeSet::new();
            if new_branch {
                taken.extend(store.environments_with_resources()?);
            }
            // Removed previews stay recorded for history; only the others have a time to run.
            let mut ages = std::collections::BTreeMap::new();
            for r in recorded.iter().filter(|r| r.removed_at.is_none()) {
                ages.insert(r.env.clone(), store.seconds_since(&r.pushed_at)?);
            }
            let decisions = previews::decide(
                &config,
                &branches,
                &recorded,
                &ages,
                (&declared, &taken),
                watched.as_deref(),
            );
            let mut judged = HashMap::new();
            let mut jobs = Vec::new();
            for action in &decisions.actions {
                match action {
                    PreviewAction::Deploy {
                        env,
                        branch,
                        commit,
                    } => {
                        let with_platform = match (config.trust, &platform) {
                            (PreviewTrust::Branch, _) => None,
                            (PreviewTrust::Workloads, Some(platform)) => {
                                let watched = &platform.commit;
                                let key = (commit.clone(), watched.clone());
                                let verdict = match memo.verdicts.get(&key) {
                                    Some(v) => v.clone(),
                                    None => trust_verdict(&repo, commit, watched)?,
                                };
                                judged.insert(key, verdict.clone());
                                if let Some(why) = verdict {
                                    if store.preview_refused(
                                        env,
                                        branch,
                                        &config.env_type,
                                        (commit, &why),
                                    )? {
                                        warn!(env, branch, commit, "no preview deployed: {why}");
                                    }
                                    continue;
                                }
                                Some((watched.clone(), platform.print.clone()))
                            }
                            // Without the watched ref there is no platform to run it with.
                            (PreviewTrust::Workloads, None) => continue,
                        };
                        let push = store.preview_pushed(
                            env,
                            branch,
                            &config.env_type,
                            (commit, with_platform.as_ref().map(|(c, _)| c.as_str())),
                        )?;
                        if push != PreviewPush::Same {
                            info!(
                                env,
                                branch,
                                commit,
                                "preview environment {}",
                                match push {
                                    PreviewPush::Created => "made",
                                    _ => "pushed",
                                }
                            );
                        }
                        let (platform, print) = with_platform.unzip();
                        let job = PreviewJob::Deploy {
                            env_type: config.env_type.clone(),
                            platform,
                        };
                        jobs.push((
                            env.clone(),
                            (commit.clone(), print.unwrap_or_default()),
                            job,
                        ));
                    }
                    PreviewAction::Remove { env, why } => {
                        if store.preview_removing(env, why)? {
                            info!(
                                env,
                                "preview environment removed ({why}): deleting its resources"
                            );
                        }
                        let last = recorded
                            .iter()
                            .find(|r| &r.env == env)
                            .and_then(|r| r.commit_id.clone())
                            .unwrap_or_default();
                        jobs.push((env.clone(), (last, String::new()), PreviewJob::Remove));
                    }
                    PreviewAction::Close { env } => {
                        if store.preview_closed(env, previews::DECLARED)? {
                            warn!(
                                env,
                                "the watched ref declares environment {env}: its preview record \
                                 is closed and the watched ref's deployments own it"
                            );
                        }
                    }
                }
            }
            // Only the pairs still in question are kept.
            memo.verdicts = judged;
            Ok::<_, deploy::DeployError>((decisions, jobs))
        })
        .await;
        let (decisions, jobs) = match looked {
            Ok(Ok(found)) => found,
            Ok(Err(e)) => {
                warn!(error = %e, "cannot look at the preview branches");
                return;
            }
            Err(e) => {
                error!(error = %e, "the preview task failed");
                return;
            }
        };
        if decisions.skipped != self.preview_skipped {
            for why in &decisions.skipped {
                warn!("previews: {why}");
            }
            self.preview_skipped = decisions.skipped;
        }
        self.preview_due = decisions
            .next_expiry
            // A moment after the time runs out, so the state's clock agrees it has.
            .map(|left| Instant::now() + left + Duration::from_millis(200));
        if let Some(shard) = &self.shared.shard {
            shard.set_previews(jobs.iter().map(|(env, _, _)| env.clone()));
        }
        let held = self.shared.shard.as_ref().map(|s| s.held());
        for (env, (commit, print), job) in jobs {
            if held.as_ref().is_some_and(|h| !h.contains(&env)) {
                continue;
            }
            match &job {
                PreviewJob::Deploy { .. } => {
                    // A new platform (definitions, settings) deploys a preview again too;
                    // a commit of the watched ref that changed only its own workloads does not.
                    let key = (commit.clone(), print);
                    if self.preview_heads.get(&env) == Some(&key) {
                        continue;
                    }
                    self.preview_removals.remove(&env);
                    self.preview_heads.insert(env.clone(), key);
                }
                PreviewJob::Remove => {
                    let recent = self
                        .preview_removals
                        .get(&env)
                        .is_some_and(|at| at.elapsed() < PREVIEW_REMOVAL_RETRY);
                    if recent {
                        continue;
                    }
                    self.preview_heads.remove(&env);
                    self.preview_removals.insert(env.clone(), Instant::now());
                }
            }
            self.dispatch(
                env,
                Job {
                    commit,
                    drift: false,
                    noticed: Some(noticed),
                    prebuilt: Arc::default(),
                    preview: Some(job),
                },
            );
        }
    }

    /// Hands `job` to `env`'s worker, starting one if needed: a worker busy with an older job
    /// takes this one next, and a deployment it never started is superseded (see
    /// [`RequestQueue`]).
    fn dispatch(&mut self, env: String, job: Job) {
        let commit = job.commit.clone();
        self.queue(env).push(|q| q.deploy(commit, job));
    }

    /// `env`'s queue, with a worker taking from it.
    fn queue(&mut self, env: String) -> Arc<EnvQueue> {
        if let Some(queue) = self.workers.get(&env) {
            return queue.clone();
        }
        let queue = Arc::new(EnvQueue::new(&env, self.shared.events.metrics.clone()));
        self.workers.insert(env.clone(), queue.clone());
        let task = self
            .tasks
            .spawn(worker(env.clone(), queue.clone(), self.shared.clone()));
        self.task_envs.insert(task.id(), (env, queue.clone()));
        queue
    }

    /// A lease gained: the environment's worker deploys the newest commit (resuming what its
    /// previous holder left running). A lease lost: its worker ends once its reconcile stops
    /// (the lease's hold stops its driver calls, the fence its writes). The database back after
    /// failing: the repository is looked at now, not at the next poll.
    async fn lease_changed(&mut self, event: LeaseEvent) {
        match event {
            LeaseEvent::Gained(env) => {
                // A request left to the environment's previous holder may be this one's now.
                self.left_to_others.clear();
                let (looked, last) = (env.clone(), self.last_commit.clone());
                let seen = self
                    .with_store(move |store| {
                        let preview = matches!(store.preview(&looked), Ok(Some(_)));
                        // An environment its last holder left deployed at the newest commit
                        // needs nothing: no deployment row for a lease that moved.
                        let done = match (&last, store.latest_deployment(&looked)) {
                            (Some(commit), Ok(Some(d))) => {
                                d.status == DeploymentStatus::Succeeded
                                    && d.commit_id.as_deref() == Some(commit.as_str())
                            }
                            _ => false,
                        };
                        (preview, done)
                    })
                    .await;
                let Some((preview, done)) = seen else {
                    return;
                };
                // A preview is deployed from its branch, never from the watched ref.
                if preview {
                    self.preview_heads.remove(&env);
                    self.preview_removals.remove(&env);
                    self.check_previews(Instant::now()).await;
                    return;
                }
                if let Some(commit) = self.last_commit.clone().filter(|_| !done) {
                    self.dispatch(
                        env,
                        Job {
                            commit,
                            drift: false,
                            noticed: None,
                            prebuilt: Arc::default(),
                            preview: None,
                        },
                    );
                }
            }
            LeaseEvent::Lost(env) => {
                if let Some(queue) = self.workers.remove(&env) {
                    queue.close();
                }
                self.schedules.remove(&env);
            }
            LeaseEvent::Recovered => {
                // What the outage cut short is retried now, not after its backoff.
                let now = Instant::now();
                for queue in self.workers.values() {
                    queue.push(|q| q.retry_now(now));
                }
                self.check(now).await;
            }
        }
    }

    /// The next drift run: how long until it, and the environments due then.
    fn next_drift(&self) -> Option<(Duration, Vec<String>)> {
        let now = Utc::now();
        let mut next: Option<(chrono::DateTime<Utc>, Vec<String>)> = None;
        for (env, schedule) in &self.schedules {
            let Some(at) = watch::next_fire(&schedule.cron, now) else {
                continue;
            };
            match &mut next {
                Some((t, envs)) if at == *t => envs.push(env.clone()),
                Some((t, _)) if at > *t => {}
                _ => next = Some((at, vec![env.clone()])),
            }
        }
        next.map(|(at, envs)| ((at - now).to_std().unwrap_or_default(), envs))
    }

    /// Re-applies the last good commit of each environment, calling every driver; the worker
    /// builds the whole environment.
    fn drift(&mut self, envs: &[String]) {
        for env in envs {
            // Behind any deployment waiting; the worker reads the last good commit when it
            // runs it.
            self.queue(env.clone()).push(RequestQueue::drift);
        }
    }
}

/// One environment's queue, shared by the main loop (which adds requests) and the
/// environment's worker (which takes them).
struct EnvQueue {
    env: String,
    requests: Mutex<RequestQueue<Job>>,
    /// Told when a request arrives or the queue closes.
    wake: tokio::sync::Notify,
    /// Told how many requests wait after each change (`gitplane_queue_jobs`).
    metrics: Arc<crate::metrics::Metrics>,
}

impl EnvQueue {
    fn new(env: &str, metrics: Arc<crate::metrics::Metrics>) -> EnvQueue {
        metrics.queued(env, 0);
        EnvQueue {
            env: env.to_owned(),
            requests: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            metrics,
        }
    }

    fn requests(&self) -> std::sync::MutexGuard<'_, RequestQueue<Job>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the requests with `change` and reports how many wait now; its result back.
    fn update<T>(&self, change: impl FnOnce(&mut RequestQueue<Job>) -> T) -> T {
        let mut requests = self.requests();
        let out = change(&mut requests);
        // A closed queue's series is gone: a worker winding down must not bring it back.
        if !requests.is_closed() {
            self.metrics.queued(&self.env, requests.pending());
        }
        out
    }

    /// Adds a request (under the queue's merge rules) and wakes the worker.
    fn push(&self, add: impl FnOnce(&mut RequestQueue<Job>)) {
        self.update(add);
        self.wake.notify_one();
    }

    /// No more requests: the worker ends once its run ends.
    fn close(&self) {
        self.requests().close();
        self.metrics.unqueued(&self.env);
        self.wake.notify_one();
    }
}

/// One environment's deployments, one at a time, in the order its queue gives (see
/// [`RequestQueue`]). Each run, from the lock to pruning, is one blocking section: the state
/// and git are read, and the reconcile's database writes made, on a blocking thread, never on
/// the runtime's workers. A run that did not finish is retried by the queue's policy.
async fn worker(env: String, queue: Arc<EnvQueue>, shared: Arc<Shared>) {
    // Opened by the first run that needs it, on its blocking thread, and kept between runs.
    let mut store: Option<Store> = None;
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some((has_work, due)) = queue.update(|requests| {
            (!requests.is_closed()).then(|| (requests.has_work(Instant::now()), requests.due()))
        }) else {
            return;
        };
        if !has_work {
            tokio::select! {
                _ = queue.wake.notified() => {}
                _ = sleep_until(due) => {}
            }
            continue;
        }
        // A deployment slot (`parallel_environments`) before the work is taken: requests that
        // arrive while it waits merge into what it then takes. Closed when the daemon stops.
        let Ok(slot) = shared.slots.clone().acquire_owned().await else {
            return;
        };
        let Some(work) = queue.update(|requests| requests.next(Instant::now())) else {
            continue;
        };
        let (this_env, this_work, this_shared) = (env.clone(), work.clone(), shared.clone());
        let handle = tokio::runtime::Handle::current();
        let ran = tokio::task::spawn_blocking(move || {
            let ended = run_work(&this_env, &this_work, &mut store, &this_shared, &handle);
            // Given back when the run ends, even if this task is no longer awaited.
            drop(slot);
            (store, ended)
        })
        .await;
        let ended = match ran {
            Ok((kept, ended)) => {
                store = kept;
                ended
            }
            Err(e) => {
                error!(env, error = %e, "a deployment's task failed");
                store = None;
                Ended::Unfinished
            }
        };
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let policy = shared.current().deployment_retry;
        let salt = std::collections::hash_map::RandomState::new().hash_one(&env);
        let retry =
            queue.update(|requests| requests.ended(&work, ended, &policy, (Instant::now(), salt)));
        if let (
            Some(delay),
            Work::Deploy {
                commit, attempt, ..
            },
        ) = (retry, &work)
        {
            warn!(
                env, commit = %commit, attempt,
                "the deployment did not finish: retried in {}s (retry.deployments)",
                delay.as_secs()
            );
        }
    }
}

/// Runs `work` on `env`, on a blocking thread: the state opened if it is not yet, a drift run
/// given the last good commit, then [`reconcile_one`].
fn run_work(
    env: &str,
    work: &Work<Job>,
    store: &mut Option<Store>,
    shared: &Shared,
    handle: &tokio::runtime::Handle,
) -> Ended {
    let store = match store {
        Some(store) => store,
        None => match Store::open_keyed(&shared.state, shared.state_key.as_ref()) {
            Ok(opened) => store.insert(opened),
            Err(e) => {
                error!(env, error = %e, "cannot open the state");
                return Ended::Unfinished;
            }
        },
    };
    let (job, attempt) = match work {
        Work::Deploy {
            commit,
            job,
            attempt,
        } => {
            let mut job = job.clone();
            if *attempt > 1 {
                // A retry was not noticed: it is not a push's latency.
                job.noticed = None;
                info!(env, commit = %commit, attempt, "retrying the deployment");
            }
            (job, *attempt)
        }
        Work::Drift => match store.last_good_commit(env) {
            Ok(Some(commit)) => {
                info!(env, commit = %commit, "drift run");
                (
                    Job {
                        commit,
                        drift: true,
                        noticed: None,
                        prebuilt: Arc::default(),
                        preview: None,
                    },
                    1,
                )
            }
            // Nothing deployed yet: nothing to compare. The retries of its deployments run.
            Ok(None) => return Ended::Done,
            Err(e) => {
                error!(error = %e, env, "cannot read the last good commit");
                return Ended::Unfinished;
            }
        },
    };
    reconcile_one(env, &job, attempt, store, shared, handle)
}

/// One run of `job` on `env`: the environment claimed ([`claim`]), its target built
/// ([`built`]), deployed (or a drift run made) through the application layer, and the outcome
/// recorded and reported ([`ran`]). Blocking: called on a blocking thread, it drives the
/// reconcile's async parts on `handle`.
fn reconcile_one(
    env: &str,
    job: &Job,
    attempt: u32,
    store: &mut Store,
    shared: &Shared,
    handle: &tokio::runtime::Handle,
) -> Ended {
    let claimed = match claim(env, job, store, shared) {
        Ok(claimed) => claimed,
        Err(ended) => return ended,
    };
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status(&format!(
        "reconciling {env}"
    ))]);
    let target = match built(env, job, store, shared, &claimed.runtime) {
        Ok(target) => target,
        Err(ended) => return ended,
    };
    let runtime = &claimed.runtime;
    let engine = app::Engine {
        drivers: &runtime.drivers,
        settings: &runtime.settings,
        history: runtime.history,
        runtime: handle,
    };
    let lease = claimed.hold.as_ref().map(|(h, _)| h.clone());
    let lock = Some(claimed.lock.hold());
    let mut observer = Observed {
        env,
        events: &shared.events,
        noticed: job.noticed,
    };
    let started = Instant::now();
    let outcome = if job.drift {
        let halt = crate::drift::DetectOptions {
            stop: Some(shared.stop.clone()),
            lease,
            lock,
        };
        let drifted = app::drift_env(
            store,
            &engine,
            &target,
            &job.commit,
            false,
            &halt,
            &mut observer,
        );
        match drifted {
            Ok(app::DriftOutcome::Detected(report)) => {
                drop(observer);
                drop(claimed);
                detected(env, job, shared, &report, started.elapsed());
                return Ended::Done;
            }
            Ok(app::DriftOutcome::Corrected { outcome, .. }) => Ok(outcome),
            Err(e) => Err(e),
        }
    } else {
        let options = ApplyOptions {
            stop: Some(shared.stop.clone()),
            lease,
            lock,
            removing_env: job.preview == Some(PreviewJob::Remove),
            ..ApplyOptions::default()
        };
        app::deploy_env(
            store,
            &engine,
            &target,
            &job.commit,
            &options,
            &mut observer,
        )
    };
    let took = started.elapsed();
    // Its progress ends before the page hears that the deployment did.
    drop(observer);
    drop(target);
    let ended = ran(env, (job, attempt), store, shared, (outcome, took), claimed);
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Status("watching")]);
    ended
}

/// What a run holds while it works on an environment: the lease (and the mark that keeps
/// the lease thread from giving it away), the apply lock, and the settings in force.
struct Claimed {
    hold: Option<(Arc<gitplane_state::LeaseHold>, shard::BusyGuard)>,
    lock: ApplyLock,
    runtime: Arc<Runtime>,
}

/// Claims `env` for `job`: its lease (when daemons share the state), its apply lock (waiting
/// for a command that holds it), the lease's fence on every write, the current state key; and
/// checks that a preview or the watched ref may run there. `Err` is how the run ends instead.
fn claim(env: &str, job: &Job, store: &mut Store, shared: &Shared) -> Result<Claimed, Ended> {
    let hold = match &shared.shard {
        Some(shard) => match hold_of(shard, env, &shared.stop) {
            Some(hold) => Some((hold, shard.busy(env))),
            // Lapsed by this daemon's clock and not renewed since (the database does not
            // answer): retried by the policy, or at once when the database answers again.
            None if shard.held().contains(env) => {
                warn!(
                    env,
                    "the environment's lease lapsed (the state's database did not answer in \
                     time): the deployment waits for it"
                );
                return Err(Ended::Unfinished);
            }
            // Another daemon holds it now.
            None => return Err(Ended::Done),
        },
        None => None,
    };
    let fence = hold.as_ref().map(|(h, _)| h.fence().clone());
    // A CLI apply or approve may hold the environment: wait for it.
    let locked = match &fence {
        Some(fence) => ApplyLock::acquire_leased(&shared.state, fence),
        None => ApplyLock::acquire(&shared.state, env, true),
    };
    let lock = locked.map_err(|e| {
        error!(env, error = %e, "cannot lock the environment");
        Ended::Unfinished
    })?;
    // Every write of this run checks the lease; none lands once another daemon took it.
    store.set_fences(fence.into_iter().collect());
    if let Err(e) = store.refresh_key() {
        error!(env, error = %e, "cannot read the state");
        return Err(Ended::Unfinished);
    }
    match preview_allowed(env, job, store, shared) {
        Ok(true) => {}
        Ok(false) => return Err(Ended::Done),
        Err(e) => {
            error!(env, error = %e, "cannot read the repository or the state");
            return Err(Ended::Unfinished);
        }
    }
    if job.preview == Some(PreviewJob::Remove) && matches!(store.resource_count(env), Ok(0)) {
        match store.preview_removed(env) {
            Ok(()) => info!(env, "preview environment removed: it has no resources left"),
            Err(e) => error!(env, error = %e, "cannot record the preview's removal"),
        }
        return Err(Ended::Done);
    }
    Ok(Claimed {
        hold,
        lock,
        runtime: shared.current(),
    })
}

/// What `job` deploys on `env` (see [`target_under_lock`]). A commit that does not build is
/// recorded as a failed deployment and not retried (the next commit is its fix); a drift run
/// of a last good commit that no longer builds is skipped.
fn built(
    env: &str,
    job: &Job,
    store: &mut Store,
    shared: &Shared,
    runtime: &Runtime,
) -> Result<Target, Ended> {
    let rejected = match target_under_lock(env, job, store, shared, runtime) {
        Ok(Ok(target)) => return Ok(target),
        Ok(Err(rejected)) => rejected,
        Err(e) => {
            error!(env, commit = %job.commit, error = %e, "cannot read the commit or the state");
            return Err(Ended::Unfinished);
        }
    };
    let errors = rejected.errors.join("; ");
    if job.drift {
        warn!(env, commit = %job.commit, "drift run skipped: the last good commit does not build now: {errors}");
        return Err(Ended::Done);
    }
    warn!(env, commit = %job.commit, "the commit does not build now: {errors}");
    match store.failed_deployment(env, Some(&job.commit), &rejected.errors.join("\n")) {
        Ok(deployment) => {
            let mut event = DeploymentEvent::not_built(
                (env, deployment),
                &job.commit,
                commit_info(&shared.repo, &job.commit),
                rejected.errors,
            );
            event.previous = previous_condition(store, env, deployment);
            shared.events.finished(event);
            Err(Ended::Done)
        }
        Err(e) => {
            error!(env, error = %e, "cannot record the failed deployment");
            Err(Ended::Unfinished)
        }
    }
}

/// Records and reports how a deployment of `job` ran (`attempt` is its try at the commit): a
/// pin that held it, a state error, or its report (the retry it was, a preview's removal, the
/// event, the log line); the claim is let go once the state is written. How it ended, for the
/// retry policy.
fn ran(
    env: &str,
    (job, attempt): (&Job, u32),
    store: &mut Store,
    shared: &Shared,
    (outcome, took): (Result<app::EnvOutcome, app::AppError>, Duration),
    claimed: Claimed,
) -> Ended {
    let (r, prune_error) = match outcome {
        // A rollback's pin holds the environment at its commit: a newer one is planned and the
        // plan recorded for `gitplane status`, not applied.
        Ok(app::EnvOutcome::Pinned { pin, plan }) => {
            warn!(
                env, commit = %job.commit, pinned_at = %pin.commit_id, pinned_by = %pin.pinned_by,
                "pinned by a rollback ({}): the commit is planned, not applied ({plan}); \
                 `gitplane unpin --env {env}` releases it", pin.reason
            );
            return Ended::Done;
        }
        Ok(app::EnvOutcome::Ran {
            report,
            prune_error,
        }) => (report, prune_error),
        Err(e) => {
            error!(env, error = %e, "state error during the deployment");
            return Ended::Unfinished;
        }
    };
    if let Some(e) = prune_error {
        warn!(env, error = %e, "cannot prune the history (history.keep)");
    }
    if attempt > 1
        && let Err(e) = store.mark_attempt(r.deployment, i64::from(attempt))
    {
        warn!(env, error = %e, "cannot record the deployment as a retry");
    }
    if job.preview == Some(PreviewJob::Remove) && matches!(store.resource_count(env), Ok(0)) {
        match store.preview_removed(env) {
            Ok(()) => info!(
                env,
                "preview environment removed: its resources are deleted"
            ),
            Err(e) => error!(env, error = %e, "cannot record the preview's removal"),
        }
    }
    drop(claimed);
    let drifted = if job.drift {
        store.outputs_changed(r.deployment).unwrap_or_else(|e| {
            warn!(env, error = %e, "cannot read what the drift run found");
            Vec::new()
        })
    } else {
        Vec::new()
    };
    shared.events.finished(DeploymentEvent {
        env: env.to_owned(),
        deployment: r.deployment,
        kind: if job.drift { "drift" } else { "commit" },
        commit: Some(job.commit.clone()),
        commit_info: commit_info(&shared.repo, &job.commit),
        status: r.status,
        counts: r.counts,
        duration_seconds: took.as_secs_f64(),
        failures: r.failures.clone(),
        drifted,
        previous: if job.drift {
            store
                .drift_condition_before(env, r.deployment)
                .unwrap_or_else(|e| {
                    warn!(env, error = %e, "cannot read the previous drift run: the notification is sent as if there were none");
                    None
                })
        } else {
            previous_condition(store, env, r.deployment)
        },
    });
    let c = r.counts;
    match r.status {
        DeploymentStatus::Held => {
            warn!(
                env, commit = %job.commit, deployment = r.deployment,
                "held by the deletion guard: {}; approve with `gitplane approve {}`",
                r.failures.join("; "), r.deployment
            );
            Ended::Done
        }
        DeploymentStatus::Succeeded => {
            info!(
                env, commit = %job.commit, deployment = r.deployment, drift = job.drift,
                created = c.created, updated = c.updated, deleted = c.deleted, unchanged = c.unchanged,
                "deployment succeeded"
            );
            Ended::Done
        }
        _ => {
            warn!(
                env, commit = %job.commit, deployment = r.deployment, failed = c.failed,
                "deployment failed: {}", r.failures.join("; ")
            );
            Ended::Unfinished
        }
    }
}

/// The lease of `env` if this daemon holds it. One that lapsed by this daemon's clock while
/// it still holds the row (the database was slow to answer a renewal) is waited for a while:
/// the next renewal makes it valid again.
fn hold_of(shard: &Shard, env: &str, stop: &AtomicBool) -> Option<Arc<gitplane_state::LeaseHold>> {
    const LAPSE_WAIT: Duration = Duration::from_secs(10);
    let deadline = Instant::now() + LAPSE_WAIT;
    loop {
        if let Some(hold) = shard.hold(env) {
            return Some(hold);
        }
        if !shard.held().contains(env) || Instant::now() >= deadline || stop.load(Ordering::SeqCst)
        {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the daemon hears of a deployment as it runs: when it starts (a push's latency) and the
/// steps that change what the status page shows.
struct Observed<'e> {
    env: &'e str,
    events: &'e Events,
    noticed: Option<Instant>,
}

impl Drop for Observed<'_> {
    /// However the run ended, its progress is over.
    fn drop(&mut self) {
        self.events.run_over(self.env);
    }
}

impl app::Observer for Observed<'_> {
    fn starting(&mut self) {
        if let Some(noticed) = self.noticed {
            self.events.push_started(noticed.elapsed());
        }
    }

    fn event(&mut self, event: &reconcile::Event<'_>) {
        match event {
            reconcile::Event::Planned { total } => self.events.planned(self.env, *total),
            reconcile::Event::Started { label, .. } => {
                self.events.step_started(self.env, label);
                return;
            }
            reconcile::Event::Finished { label, .. } => self.events.step_finished(self.env, label),
            reconcile::Event::Waiting => return,
        }
        self.events.changed();
    }
}

/// Logs and reports a drift run of an environment whose file says `drift: detect`: it read and
/// recorded, and changed nothing.
fn detected(env: &str, job: &Job, shared: &Shared, r: &crate::drift::DetectReport, took: Duration) {
    let mut drifted: Vec<String> = r
        .findings
        .iter()
        .map(|f| format!("{} ({})", f.label, f.finding.what.as_str()))
        .collect();
    drifted.dedup();
    let status = if r.failures.is_empty() {
        DeploymentStatus::Succeeded
    } else {
        DeploymentStatus::Failed
    };
    info!(
        env, commit = %job.commit, deployment = r.deployment,
        differ = r.resources(), findings = r.findings.len(), failed = r.failures.len(),
        "drift detected (not corrected)"
    );
    shared.events.finished(DeploymentEvent {
        env: env.to_owned(),
        deployment: r.deployment,
        kind: "drift",
        commit: Some(job.commit.clone()),
        commit_info: commit_info(&shared.repo, &job.commit),
        status,
        counts: gitplane_state::Counts {
            unchanged: r.unchanged as i64,
            failed: r.failures.len() as i64,
            ..Default::default()
        },
        duration_seconds: took.as_secs_f64(),
        failures: r.failures.clone(),
        drifted,
        previous: None,
    });
}

/// The condition `env` was in before `deployment` (see [`DeploymentEvent::previous`]). A state
/// that cannot tell is logged and taken as none: the deployment is announced rather than lost.
fn previous_condition(
    store: &Store,
    env: &str,
    deployment: i64,
) -> Option<(DeploymentStatus, Option<String>)> {
    store
        .condition_before(env, deployment)
        .unwrap_or_else(|e| {
            warn!(env, error = %e, "cannot read the previous deployment: the notification is sent as if there were none");
            None
        })
}

fn lease_ttl(host: &HostConfig) -> Duration {
    host.lease_ttl
}

/// Waits until `at` (never when `None`).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// The next lease change, when daemons share the state (never, otherwise).
async fn recv_lease(
    events: &mut Option<mpsc::UnboundedReceiver<LeaseEvent>>,
) -> Option<LeaseEvent> {
    match events {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// What `env`'s worker applies for `job`, decided while it holds the environment's lock: the
/// target the main loop built when the fingerprints still give the same scope, else one built
/// now (a drift run builds the whole environment).
fn target_under_lock(
    env: &str,
    job: &Job,
    store: &Store,
    shared: &Shared,
    runtime: &Runtime,
) -> Result<Result<Target, deploy::Rejected>, deploy::DeployError> {
    let prebuilt = job
        .prebuilt
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    let repo = match &job.preview {
        Some(PreviewJob::Remove) => {
            return Ok(Ok(Target {
                graph: crate::graph::ResourceGraph::removed(env),
                scope: deploy::Scope::whole(Default::default()),
            }));
        }
        Some(PreviewJob::Deploy { env_type, platform }) => {
            let repo = ConfigRepo::open(&shared.repo)?.with_file(
                &previews::environment_path(env),
                &previews::environment_file(env_type),
            );
            match platform {
                Some(platform) => repo.with_platform(platform)?,
                None => repo,
            }
        }
        None => ConfigRepo::open(&shared.repo)?,
    };
    let layout = repo.layout(&job.commit)?;
    let reach = if job.drift {
        Reach::Whole
    } else {
        Reach::Changes
    };
    if let Some(target) = prebuilt
        && !job.drift
    {
        let fingerprints = deploy::fingerprints(&layout, env, &deploy::host_print(runtime.host()));
        let now = deploy::Scope::of_changes_in(store, env, fingerprints)?;
        // The main loop may have fallen back to the whole environment; that stays right.
        if target.scope.is_whole() || now == target.scope {
            return Ok(Ok(target));
        }
    }
    let mut cache = shared.cache.lock().unwrap_or_else(|e| e.into_inner());
    let mut target = match deploy::target(
        &repo,
        &layout,
        env,
        (Some(store), reach),
        runtime.host(),
        &mut cache,
    )? {
        Ok(t) => t,
        Err(rejected) => return Ok(Err(rejected)),
    };
    cache.forget_workloads();
    drop(cache);
    let read = deploy::read_target_secrets(std::slice::from_mut(&mut target), &runtime.stores);
    Ok(read.map(|()| target))
}

/// Whether `job` may run on `env` as far as previews go. A preview is deployed from its branch
/// alone: a job of the watched ref that reaches it (a lease moved, say) leaves it be, unless
/// the watched ref's commit declares the environment: the declaration always wins, and the
/// preview's record is closed. For the same reason a preview job never runs on an environment
/// the watched ref's newest commit declares.
fn preview_allowed(
    env: &str,
    job: &Job,
    store: &Store,
    shared: &Shared,
) -> Result<bool, deploy::DeployError> {
    let declares = |commit: &str| -> Result<bool, RepoError> {
        let layout = ConfigRepo::open(&shared.repo)?.layout(commit)?;
        Ok(deploy::environments_in(&layout).contains(env))
    };
    let close = || -> Result<bool, deploy::DeployError> {
        if store.preview_closed(env, previews::DECLARED)? {
            warn!(
                env,
                "the watched ref declares environment {env}: its preview record is closed and \
                 the watched ref's deployments own it"
            );
        }
        Ok(true)
    };
    if job.preview.is_none() {
        return match store.preview(env)? {
            Some(p) if p.removed_at.is_none() => {
                if declares(&job.commit)? {
                    return close();
                }
                warn!(env, branch = %p.branch, "a preview environment: the watched ref does not deploy it");
                Ok(false)
            }
            _ => Ok(true),
        };
    }
    let repo = ConfigRepo::open(&shared.repo)?;
    let watched = match repo.resolve(shared.git_ref.as_deref()) {
        Ok(commit) => commit,
        // With nothing to declare it, the environment is the preview's.
        Err(RepoError::Unborn { .. } | RepoError::Revision { .. }) => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    if declares(&watched)? {
        close()?;
        warn!(env, commit = %job.commit, "not deployed as a preview: the watched ref declares the environment");
        return Ok(false);
    }
    Ok(true)
}

/// Whether branch head `head` may be previewed with the platform of the watched ref's
/// `watched`: `None` when it changes nothing outside `workloads/` since the two histories met,
/// else why not.
fn trust_verdict(
    repo: &ConfigRepo,
    head: &str,
    watched: &str,
) -> Result<Option<String>, RepoError> {
    const SHOWN: usize = 5;
    let Some(base) = repo.merge_base(head, watched)? else {
        return Ok(Some(
            "its history never meets the watched ref's: previews run only branches of it \
             (previews.trust: branch runs any)"
                .to_owned(),
        ));
    };
    let changed = repo.changed_outside_workloads(&base, head, SHOWN + 1)?;
    if changed.is_empty() {
        return Ok(None);
    }
    let mut list = changed
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if changed.len() > SHOWN {
        list.push_str(", ...");
    }
    Ok(Some(format!(
        "it changes files outside workloads/ ({list}); a preview runs a branch's workloads \
         with the watched ref's platform, so changes to definitions, environments or \
         gitplane.yaml are planned, not deployed, until merged (previews.trust: branch \
         deploys whole branches)"
    )))
}

/// What a preview takes from the watched ref's commit of `layout`, as text: two commits with
/// the same print give previews the same platform.
fn platform_print(layout: &crate::repo::Layout) -> String {
    layout
        .shared
        .iter()
        .filter(|(path, _)| !path.starts_with("environments/"))
        .map(|(path, id)| format!("{path}={id}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A new commit, loaded.
enum Loaded {
    Ready(Vec<Target>),
    /// It does not load or build: nothing changes until a new commit.
    Rejected(deploy::Rejected),
    /// It builds, but a secret store cannot give its secrets now.
    Waiting(deploy::Rejected),
}

/// Whether a deployment under `new` may do something else than under `old`: the drivers,
/// their accounts, the secret stores or Terraform's settings differ. The rest (limits, retries,
/// history, the listener, the notification targets) applies to what runs next, with nothing to
/// deploy again for it.
fn deploys_differently(old: &HostConfig, new: &HostConfig) -> bool {
    old.drivers != new.drivers
        || old.accounts != new.accounts
        || old.secret_stores != new.secret_stores
        || old.primary_secret_store != new.primary_secret_store
        || old.terraform != new.terraform
}

/// What a host config gives the daemon; replaced whole on SIGHUP.
struct Runtime {
    drivers: Registry,
    settings: Settings,
    stores: SecretStores,
    /// `history.keep`: pruned after each deployment.
    history: Option<gitplane_state::Retention>,
    /// `retry.deployments`: how a deployment that did not finish is retried.
    deployment_retry: crate::requests::DeploymentRetry,
}

impl Runtime {
    fn host(&self) -> deploy::Host<'_> {
        deploy::Host {
            drivers: &self.drivers,
            stores: &self.stores,
        }
    }
}

fn runtime_of(host: &HostConfig, events: &Events) -> Runtime {
    let mut settings = Settings::from_config(host);
    settings.calls = Some(events.metrics.clone());
    Runtime {
        drivers: host.registry(),
        settings,
        stores: host.secret_stores(),
        history: host.history,
        deployment_retry: host.deployment_retry,
    }
}

/// Who made `commit` and what it says, for events; `None` when the repository cannot tell.
fn commit_info(repo: &Path, commit: &str) -> Option<crate::repo::CommitInfo> {
    ConfigRepo::open(repo)
        .and_then(|r| r.commit_info(commit))
        .ok()
}

fn git_dir(repo: &Path) -> Result<PathBuf, DaemonError> {
    let r = gix::discover_opts(repo, Default::default(), gix::open::Options::isolated())
        .map_err(|e| crate::repo::open_error(repo, &e))?;
    Ok(r.git_dir().to_owned())
}
