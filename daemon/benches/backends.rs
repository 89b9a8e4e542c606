//! PostgreSQL beside SQLite: the first apply and the no-op apply of one repository, through the
//! real release binary, on each state backend.
//!
//! `cargo bench --bench backends` measures 10 000 resources; `-- 1000 10000` picks the sizes, in
//! resources (rounded up to whole apps of five). Per size it generates the repository of
//! `scale.rs` once (`shape/`: per app a workload, a postgres reading the base-env, a redis and an
//! app-shared dns, with the echo driver), then per backend runs the first apply [`RUNS`] times,
//! each on an empty state (SQLite: a new file; PostgreSQL: a new database), and the no-op apply
//! [`RUNS`] times on the last of them, each checked by its summary line. It prints medians with
//! their min–max, the CLI's peak RSS (its own `ru_maxrss`, from `wait4`), the state's size and
//! the ratio PostgreSQL / SQLite, as a Markdown table.
//!
//! The PostgreSQL server is the testkit's (initdb into a temporary directory, 127.0.0.1 on a free
//! port), started once and stopped at the end, with PostgreSQL's default durability put back
//! (the testkit turns fsync off for tests); SQLite runs as gitplane opens it (WAL,
//! `synchronous=NORMAL`). When no server can start, the bench says why and measures SQLite alone.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[allow(dead_code, reason = "each bench uses part of the shared helpers")]
mod cli;
mod shape;

use cli::{
    Cli, Run, Summary, duration, git, load_average, mb, median, mib, say, state_bytes, write,
};
use gitplane_testkit::Postgres;

const RESOURCES_PER_APP: usize = 5;
/// First applies (each on an empty state) and no-op applies (on the last one) per backend.
const RUNS: usize = 3;
/// The size measured when none is given, in resources.
const DEFAULT_RESOURCES: usize = 10_000;

/// A state backend, as the bench sets it up.
enum Backend<'s> {
    /// A new file in the size's temporary directory for each first apply.
    Sqlite,
    /// A new database on the bench's server for each first apply.
    Postgres(&'s Postgres),
}

impl Backend<'_> {
    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres(_) => "PostgreSQL",
        }
    }

    /// An empty state for first apply number `run`.
    fn empty_state(&self, dir: &Path, run: usize) -> PathBuf {
        match self {
            Backend::Sqlite => dir.join(format!("state-{run}.db")),
            Backend::Postgres(server) => PathBuf::from(server.database()),
        }
    }

    /// What `state` takes: the SQLite file (with its WAL, after a checkpoint), or
    /// `pg_database_size` of the database.
    fn size(&self, state: &Path) -> u64 {
        match self {
            Backend::Sqlite => state_bytes(state),
            Backend::Postgres(server) => database_size(server, state),
        }
    }

    /// Lets go of a state that is no longer measured, so a size's disk use stays that of one.
    fn discard(&self, state: &Path) {
        match self {
            Backend::Sqlite => {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(cli::with_suffix(state, suffix));
                }
            }
            Backend::Postgres(server) => {
                let name = database_name(state);
                if let Err(why) = server.psql(
                    &postgres_url_of(state, "postgres"),
                    &format!("DROP DATABASE IF EXISTS {name}"),
                ) {
                    say(&format!("  (could not drop database {name}: {why})"));
                }
            }
        }
    }
}

/// The database's name: the last segment of its URL (the testkit's are `gitplane_N`).
fn database_name(url: &Path) -> String {
    let url = url.to_string_lossy();
    url.rsplit('/').next().unwrap_or_default().to_owned()
}

/// The URL of `database` on the server of `url`.
fn postgres_url_of(url: &Path, database: &str) -> String {
    let url = url.to_string_lossy();
    let (server, _) = url.rsplit_once('/').unwrap_or((&url, ""));
    format!("{server}/{database}")
}

fn database_size(server: &Postgres, url: &Path) -> u64 {
    let url = url.to_string_lossy();
    let answer = server
        .psql(&url, "SELECT pg_database_size(current_database())")
        .unwrap_or_else(|why| panic!("cannot read the size of {url}: {why}"));
    answer
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("pg_database_size of {url} answered `{answer}`"))
}

/// Puts back what an installed server does by default and the testkit turns off for speed, so
/// that PostgreSQL pays for durable commits like a production server.
fn durable(server: &Postgres) -> Result<(), String> {
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    for sql in [
        "ALTER SYSTEM SET fsync = on",
        "ALTER SYSTEM SET full_page_writes = on",
        "SELECT pg_reload_conf()",
    ] {
        server.psql(&url, sql)?;
    }
    let fsync = server.psql(&url, "SHOW fsync")?;
    if fsync.trim() == "on" {
        Ok(())
    } else {
        Err(format!("fsync is still `{}` after a reload", fsync.trim()))
    }
}

/// What one backend measured at one size.
struct Figures {
    backend: &'static str,
    first_s: Vec<f64>,
    noop_s: Vec<f64>,
    first_rss_kib: u64,
    noop_rss_kib: u64,
    /// The state after the first apply and the no-op applies.
    state_bytes: u64,
    /// What an empty state of this backend takes (an empty database; 0 for a file that does not
    /// exist yet).
    empty_bytes: u64,
}

/// Runs the first and the no-op applies of `resources` resources in `work` on `backend`.
fn measure(
    backend: &Backend<'_>,
    work: &Path,
    dir: &Path,
    config: &Path,
    resources: u64,
) -> Figures {
    let mut cli = Cli {
        repo: work.to_owned(),
        state: PathBuf::new(),
        config: Some(config.to_owned()),
        out: dir.join("command.out"),
        err: dir.join("command.err"),
    };
    let mut figures = Figures {
        backend: backend.name(),
        first_s: Vec::new(),
        noop_s: Vec::new(),
        first_rss_kib: 0,
        noop_rss_kib: 0,
        state_bytes: 0,
        empty_bytes: 0,
    };
    for run in 1..=RUNS {
        if run > 1 {
            backend.discard(&cli.state);
        }
        cli.state = backend.empty_state(dir, run);
        if run == 1 && matches!(backend, Backend::Postgres(_)) {
            figures.empty_bytes = backend.size(&cli.state);
        }
        let (first, _) = cli.apply(|s| {
            if s.deployment != "1" {
                return Err(format!("expected deployment 1, got `{}`", s.line));
            }
            s.succeeded()?;
            s.expect("created", resources)?;
            s.expect("updated", 0)?;
            s.expect("deleted", 0)
        });
        record(&mut figures.first_s, &mut figures.first_rss_kib, &first);
    }
    for _ in 0..RUNS {
        let (noop, _) = cli.apply(|s: &Summary| {
            s.succeeded()?;
            s.expect("created", 0)?;
            s.expect("updated", 0)?;
            s.expect("deleted", 0)?;
            s.expect("unchanged", resources)
        });
        record(&mut figures.noop_s, &mut figures.noop_rss_kib, &noop);
    }
    figures.state_bytes = backend.size(&cli.state);
    backend.discard(&cli.state);
    say(&format!(
        "  {}: first apply {}, peak RSS {}; no-op apply {}, peak RSS {}; state {}",
        figures.backend,
        spread(&figures.first_s),
        mib(figures.first_rss_kib),
        spread(&figures.noop_s),
        mib(figures.noop_rss_kib),
        state_size(&figures),
    ));
    figures
}

fn record(times: &mut Vec<f64>, peak_kib: &mut u64, run: &Run) {
    times.push(run.secs);
    *peak_kib = (*peak_kib).max(run.max_rss_kib);
}

/// `median (min–max)` of durations in seconds.
fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(0.0, f64::max);
    format!(
        "{} ({}–{})",
        duration(median(v)),
        duration(min),
        duration(max)
    )
}

fn state_size(f: &Figures) -> String {
    if f.empty_bytes == 0 {
        mb(f.state_bytes)
    } else {
        format!(
            "{} ({} above an empty database)",
            mb(f.state_bytes),
            mb(f.state_bytes.saturating_sub(f.empty_bytes))
        )
    }
}

fn ratio(postgres: f64, sqlite: f64) -> String {
    if sqlite > 0.0 {
        format!("{:.1}×", postgres / sqlite)
    } else {
        "–".to_owned()
    }
}

/// One size: the repository generated and committed once, then each backend in turn.
fn run_size(resources: usize, server: Option<&Postgres>) -> (usize, Vec<Figures>) {
    let apps = resources.div_ceil(RESOURCES_PER_APP);
    let resources = apps * RESOURCES_PER_APP;
    let total = u64::try_from(resources).expect("a count fits in u64");
    let tmp = tempfile::tempdir().expect("a temp dir for the repository and the state files");
    let root = tmp.path();

    let started = Instant::now();
    let work = root.join("work");
    std::fs::create_dir_all(&work).expect("the bench can write its temp dir");
    git(&work, &["init", "--quiet", "--initial-branch=main"]);
    for (path, text) in shape::repository(apps) {
        write(&work, &path, &text);
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", &format!("{apps} apps")]);
    let config = root.join("host.yaml");
    write(
        root,
        "host.yaml",
        &format!(
            "state_key: {{file: {}}}\n",
            root.join("state.key").display()
        ),
    );
    say(&format!(
        "{resources} resources ({apps} apps): repository generated and committed in {:.1} s \
         (load average {})",
        started.elapsed().as_secs_f64(),
        load_average()
    ));

    let mut backends = vec![Backend::Sqlite];
    backends.extend(server.map(Backend::Postgres));
    let figures = backends
        .iter()
        .map(|backend| measure(backend, &work, root, &config, total))
        .collect();
    (resources, figures)
}

fn table(sizes: &[(usize, Vec<Figures>)]) -> String {
    let mut t = format!(
        "| resources | state | first apply (median of {RUNS}; min–max) | no-op apply (median of \
         {RUNS}; min–max) | peak RSS: first / no-op | state size |\n\
         |---:|---|---:|---:|---:|---:|\n"
    );
    for (resources, all) in sizes {
        for f in all {
            let _ = writeln!(
                t,
                "| {resources} | {} | {} | {} | {} / {} | {} |",
                f.backend,
                spread(&f.first_s),
                spread(&f.noop_s),
                mib(f.first_rss_kib),
                mib(f.noop_rss_kib),
                state_size(f),
            );
        }
        if let [sqlite, postgres] = all.as_slice() {
            let _ = writeln!(
                t,
                "| {resources} | PostgreSQL / SQLite | {} | {} | {} / {} | {} |",
                ratio(median(&postgres.first_s), median(&sqlite.first_s)),
                ratio(median(&postgres.noop_s), median(&sqlite.noop_s)),
                ratio(postgres.first_rss_kib as f64, sqlite.first_rss_kib as f64),
                ratio(postgres.noop_rss_kib as f64, sqlite.noop_rss_kib as f64),
                ratio(
                    postgres.state_bytes.saturating_sub(postgres.empty_bytes) as f64,
                    sqlite.state_bytes as f64
                ),
            );
        }
    }
    t
}

fn main() {
    // `cargo bench` passes `--bench`; every number is a size in resources.
    let mut sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    if sizes.is_empty() {
        sizes = vec![DEFAULT_RESOURCES];
    }
    assert!(
        sizes.iter().all(|s| *s > 0),
        "sizes are numbers of resources, > 0"
    );

    let started = Instant::now();
    let server = Postgres::start()
        .map_err(|why| format!("no server could start: {why}"))
        .and_then(|server| match durable(&server) {
            Ok(()) => Ok(server),
            Err(why) => Err(format!("its durability could not be put back: {why}")),
        });
    match &server {
        Ok(_) => say(&format!(
            "PostgreSQL server started in {:.1} s",
            started.elapsed().as_secs_f64()
        )),
        Err(why) => say(&format!("PostgreSQL not measured: {why}")),
    }

    let all: Vec<_> = sizes
        .iter()
        .map(|resources| run_size(*resources, server.as_ref().ok()))
        .collect();
    let postgres = match server {
        Ok(server) => {
            // Stops the server and removes its directory before the table is printed.
            drop(server);
            "PostgreSQL: a local server (127.0.0.1) with fsync and full_page_writes on; its state \
             size is pg_database_size, and the ratio compares what it holds above an empty \
             database with the SQLite file."
                .to_owned()
        }
        Err(why) => format!("PostgreSQL not measured: {why}."),
    };
    println!(
        "\nEach apply is the release binary as a child process against a git clone, timed from \
         spawn to exit; peak RSS is its own ru_maxrss. SQLite: WAL, synchronous=NORMAL; its size \
         is the file after a checkpoint. {postgres}\n"
    );
    print!("{}", table(&all));
}
