//! PostgreSQL states through the binary: every command answers as it does on SQLite, `state
//! copy` moves a state there and back unchanged, bad settings fail fast with a clear message and
//! change nothing, `status` shows who holds each environment's lease, and no secret is stored
//! in plain text.
//!
//! Each test uses a fresh database of this process's own PostgreSQL server (started by the
//! test kit); on a machine without PostgreSQL the tests say why and return.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitplane_testkit::Postgres;
use regex::Regex;

use crate::util::{Run, Sandbox, open_db, rows};

/// The template's secret values.
const SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

/// A fresh database of the shared server, or None after saying why there is none here.
fn database(test: &str) -> Option<(&'static Postgres, String)> {
    let server = gitplane_testkit::shared_or_skip(test)?;
    Some((server, server.database()))
}

/// A host config in `dir` that names a state key file (which PostgreSQL states need), and more.
fn host_config(dir: &Path, name: &str, key: &Path, more: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(
        &path,
        format!("state_key: {{file: {}}}\n{more}", key.display()),
    )
    .unwrap();
    path
}

/// `gitplane ARGS --repo origin.git --state STATE --config CONFIG`.
fn gitplane(sb: &Sandbox, state: &str, config: &Path, args: &[&str]) -> Run {
    let mut all = args.to_vec();
    all.extend([
        "--repo",
        sb.origin.to_str().unwrap(),
        "--state",
        state,
        "--config",
        config.to_str().unwrap(),
    ]);
    sb.gitplane_raw(&all, &[])
}

/// Output with what may differ between two states of the same history taken out: the
/// states' names, times, durations and sizes, and the spaces that align table columns around
/// them.
fn normalized(text: &str, states: &[&str]) -> String {
    static TIME: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?Z?").unwrap()
    });
    static NUMBER: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"\b\d+\.\d+\b").unwrap());
    static DURATION_ROW: std::sync::LazyLock<Regex> = std::sync::LazyLock::new(|| {
        Regex::new(r"(<time>[ ,]+<time>(?:[ ,]+\d+){5}[ ,]+)\d+(\.\d+)?").unwrap()
    });
    static DURATION_JSON: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r#"("duration_s": )\d+(\.\d+)?"#).unwrap());
    static NO_LEASE: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r#"\n *"lease": null,"#).unwrap());
    static COPY_ACTION: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"(?m)^.* state copy by .*\n").unwrap());
    static SPACES: std::sync::LazyLock<Regex> =
        std::sync::LazyLock::new(|| Regex::new(r"[ \t]+").unwrap());
    let mut text = text.to_owned();
    for state in states {
        text = text.replace(state, "<state>");
    }
    let text = TIME.replace_all(&text, "<time>");
    // A deployment's duration, which may be a whole 0: after its two times and five counts in
    // a table or CSV row, or under its name in JSON.
    let text = DURATION_ROW.replace_all(&text, "${1}<n>");
    let text = DURATION_JSON.replace_all(&text, "${1}<n>");
    let text = NUMBER.replace_all(&text, "<n>");
    // A PostgreSQL state's status says that no daemon holds an environment's lease; a SQLite
    // state has no leases to speak of.
    let text = NO_LEASE.replace_all(&text, "");
    // A copy records itself in the state it fills: `history` lists that action there alone.
    let text = COPY_ACTION.replace_all(&text, "");
    SPACES.replace_all(&text, " ").into_owned()
}

/// Runs `args` on each state and asserts the same exit code and the same output (normalized);
/// returns the runs.
#[track_caller]
fn same_on_each(
    sb: &Sandbox,
    states: &[(&str, &Path)],
    args: &[&str],
    compare_stderr: bool,
) -> Vec<Run> {
    let names: Vec<&str> = states.iter().map(|(s, _)| *s).collect();
    // The links view orders by consumer, provider and needed path: the bindings of one input
    // to two outputs of one provider (a URL of host and port) tie, in any order.
    let ties = args.first() == Some(&"report") && args.get(1) == Some(&"links");
    let shown = |text: &str| {
        let text = normalized(text, &names);
        if !ties {
            return text;
        }
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Array(items)) => {
                let mut items: Vec<String> = items.iter().map(|i| i.to_string()).collect();
                items.sort();
                items.join("\n")
            }
            _ => {
                let mut lines: Vec<&str> = text.lines().collect();
                if lines.len() > 1 {
                    lines[1..].sort();
                }
                lines.join("\n")
            }
        }
    };
    let runs: Vec<Run> = states
        .iter()
        .map(|(state, config)| gitplane(sb, state, config, args))
        .collect();
    let first = &runs[0];
    for run in &runs[1..] {
        assert_eq!(
            first.code,
            run.code,
            "`{}` ended differently:{first}{run}",
            args.join(" ")
        );
        assert_eq!(
            shown(&first.stdout),
            shown(&run.stdout),
            "`{}` printed differently:{first}{run}",
            args.join(" ")
        );
        if compare_stderr {
            let errors = |r: &Run| normalized(&r.error_lines().join("\n"), &names);
            assert_eq!(errors(first), errors(run), "errors differ:{first}{run}");
        }
    }
    for run in &runs {
        run.hides(&SECRETS);
        assert!(!run.stderr.contains("panicked"), "{run}");
    }
    runs
}

/// What people read from a state: status, history, every report in every format, explain and
/// manifests.
const READS: &[&[&str]] = &[
    &["status"],
    &["status", "--format", "json"],
    &["history"],
    &["history", "--format", "json"],
    &["report", "resources"],
    &["report", "resources", "--format", "json"],
    &["report", "resources", "--format", "csv"],
    &["report", "deployments"],
    &["report", "deployments", "--format", "json"],
    &["report", "deployments", "--format", "csv"],
    &["report", "failures", "--format", "json"],
    &["report", "links"],
    &["report", "links", "--format", "json"],
    &["report", "links", "--format", "csv"],
    &[
        "report",
        "consumers",
        "shop/base-env.default#base-env",
        "--env",
        "development",
        "--format",
        "json",
    ],
    &["report", "orphans", "--format", "json"],
    &["report", "drift", "--format", "json"],
    &[
        "explain",
        "shop/postgres.default#modules.backend.externals.db",
        "--env",
        "development",
    ],
    &[
        "explain",
        "shop/postgres.default#modules.backend.externals.db",
        "--env",
        "production",
        "--format",
        "json",
    ],
    &["manifests", "--env", "development"],
];

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn every_command_answers_on_postgresql_as_on_sqlite() {
    let Some((_, url)) = database("every_command_answers_on_postgresql_as_on_sqlite") else {
        return;
    };
    let sb = Sandbox::template();
    // A key each: `state rekey` replaces it.
    let sqlite_config = host_config(&sb.root, "sqlite.yaml", &sb.root.join("sqlite.key"), "");
    let pg_config = host_config(&sb.root, "pg.yaml", &sb.root.join("pg.key"), "");
    let sqlite = sb.state.to_str().unwrap().to_owned();
    let states = [
        (sqlite.as_str(), sqlite_config.as_path()),
        (url.as_str(), pg_config.as_path()),
    ];
    let reads = |states: &[(&str, &Path)]| {
        for args in READS {
            same_on_each(&sb, states, args, true);
        }
    };

    same_on_each(&sb, &states, &["plan"], true);
    let applied = same_on_each(&sb, &states, &["apply"], true);
    applied[0].stdout_has("development: deployment 1 succeeded");
    reads(&states);
    // Nothing changed: a deployment that writes its own row and nothing else.
    same_on_each(&sb, &states, &["apply"], true);

    // A commit that deletes the app is held by the deletion guard, then approved.
    sb.git(&["mv", "workloads/shop", "workloads/store"]);
    sb.commit("Rename the app");
    let held = same_on_each(&sb, &states, &["apply", "--env", "development"], true);
    held[1].stdout_has("held by the deletion guard");
    let id = Regex::new(r"deployment (\d+) held")
        .unwrap()
        .captures(&held[1].stdout)
        .map(|c| c[1].to_owned())
        .unwrap_or_else(|| panic!("no held deployment:{}", held[1]));
    same_on_each(
        &sb,
        &states,
        &["report", "deployments", "--format", "json"],
        true,
    );
    let approved = same_on_each(&sb, &states, &["approve", "--yes", &id], true);
    assert_eq!(approved[1].code, Some(0), "{}", approved[1]);
    reads(&states[..]);
    same_on_each(&sb, &states, &["report", "orphans"], true);

    // History pruned alike (the space comes back by each database's own means).
    let vacuumed = same_on_each(&sb, &states, &["state", "vacuum", "--keep", "1"], true);
    vacuumed[1].stdout_has("pruned ");
    same_on_each(&sb, &states, &["history", "--format", "json"], true);
    same_on_each(&sb, &states, &["report", "links", "--format", "csv"], true);

    // A new state key: every secret sealed again, and read back by the next apply.
    for (state, config) in &states {
        gitplane(&sb, state, config, &["state", "rekey"])
            .ok()
            .stdout_has("secret value(s) sealed with the new key");
    }
    sb.edit(
        "definitions/base-env.yaml",
        "redis_host: redis.dev.internal",
        "redis_host: redis2.dev.internal",
    );
    sb.commit("Move the development cache");
    same_on_each(&sb, &states, &["plan", "--env", "development"], true);
    same_on_each(&sb, &states, &["apply", "--env", "development"], true)[1]
        .stdout_has("succeeded: 0 created, 4 updated");
    same_on_each(
        &sb,
        &states,
        &["report", "resources", "--format", "json"],
        true,
    );

    // Wrong names fail alike.
    same_on_each(&sb, &states, &["status", "--env", "staging"], true);
    same_on_each(&sb, &states, &["approve", "--yes", "999"], true);
}

/// `dump` without the actions `state copy` recorded (a copy records itself in the state it
/// fills, so a copy has those rows and its source does not).
fn without_copy_actions(
    mut dump: BTreeMap<String, Vec<Vec<String>>>,
) -> BTreeMap<String, Vec<Vec<String>>> {
    if let Some(actions) = dump.get_mut("action") {
        actions.retain(|row| row[1] != "state copy");
    }
    dump
}

/// Every row of each table of a SQLite state that `state copy` moves, sorted.
fn sqlite_dump(path: &Path) -> BTreeMap<String, Vec<Vec<String>>> {
    let conn = open_db(path);
    let tables = rows(
        &conn,
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' \
         AND name NOT IN ('env_lock', 'env_lease', 'daemon') ORDER BY name",
    );
    tables
        .into_iter()
        .map(|t| {
            let mut all = rows(&conn, &format!("SELECT * FROM {}", t[0]));
            all.sort();
            (t[0].clone(), all)
        })
        .collect()
}

/// How many rows each table of the PostgreSQL state at `url` has.
fn postgres_counts(server: &Postgres, url: &str, tables: &[&String]) -> BTreeMap<String, usize> {
    tables
        .iter()
        .map(|t| {
            let n = server
                .psql(url, &format!("SELECT COUNT(*) FROM {t}"))
                .unwrap_or_else(|e| panic!("{t}: {e}"));
            (t.to_string(), n.trim().parse().unwrap())
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn state_copy_moves_a_state_to_postgresql_and_back_unchanged() {
    let Some((server, url)) = database("state_copy_moves_a_state_to_postgresql_and_back_unchanged")
    else {
        return;
    };
    // A SQLite state with history: two commits, a change and a deletion.
    let sb = Sandbox::applied();
    sb.edit(
        "definitions/base-env.yaml",
        "redis_host: redis.dev.internal",
        "redis_host: redis2.dev.internal",
    );
    sb.commit("Move the development cache");
    sb.gitplane(&["apply"]).ok();
    let source = sb.state.to_str().unwrap().to_owned();
    let key = PathBuf::from(format!("{source}.key"));
    let plain = sb.root.join("plain.yaml");
    std::fs::write(&plain, "").unwrap();

    let to_pg = sb
        .gitplane_raw(
            &[
                "state",
                "copy",
                "--from",
                &format!("sqlite:{source}"),
                "--to",
                &url,
                "--config",
                plain.to_str().unwrap(),
            ],
            &[],
        )
        .ok();
    let dump = sqlite_dump(&sb.state);
    let deployments = dump["deployment"].len();
    let resources = dump["resource"].len();
    to_pg
        .stdout_has(&format!(
            "copied {deployments} deployments, {resources} resources and "
        ))
        .stdout_has(&format!("from {source} to {url}"))
        .stdout_has(&format!("state_key: {{file: {}}}", key.display()));
    to_pg.hides(&SECRETS);

    let tables: Vec<&String> = dump.keys().collect();
    let mut expected: BTreeMap<String, usize> =
        dump.iter().map(|(t, r)| (t.clone(), r.len())).collect();
    // The copy's own action, recorded in the state it filled.
    *expected.entry("action".to_owned()).or_default() += 1;
    assert_eq!(postgres_counts(server, &url, &tables), expected);

    // Back into a new SQLite file, with the source's key named in the host config.
    let config = host_config(&sb.root, "host.yaml", &key, "");
    let back = sb.root.join("back.db");
    sb.gitplane_raw(
        &[
            "state",
            "copy",
            "--from",
            &url,
            "--to",
            back.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    )
    .ok()
    .stdout_has(&format!("copied {deployments} deployments"));
    let back_dump = sqlite_dump(&back);
    assert_eq!(
        back_dump["action"]
            .iter()
            .filter(|row| row[1] == "state copy")
            .count(),
        2,
        "each copy recorded itself: {:?}",
        back_dump["action"]
    );
    assert_eq!(
        without_copy_actions(back_dump),
        dump,
        "the round trip changed rows"
    );

    // The three answer alike, secrets included (explain opens none, manifests hide them).
    let back = back.to_str().unwrap().to_owned();
    let states = [
        (source.as_str(), plain.as_path()),
        (url.as_str(), config.as_path()),
        (back.as_str(), config.as_path()),
    ];
    for args in READS {
        same_on_each(&sb, &states, args, true);
    }
    // Applying goes on from the copied ids on each (PostgreSQL's sequences moved past them),
    // and reads the copied secrets with the shared key.
    sb.edit(
        "definitions/base-env.yaml",
        "redis_host: redis2.dev.internal",
        "redis_host: redis3.dev.internal",
    );
    sb.commit("Move it again");
    let applied = same_on_each(&sb, &states, &["apply"], true);
    applied[1].stdout_has(&format!(
        "development: deployment {} succeeded",
        deployments + 1
    ));
    same_on_each(&sb, &states, &["history", "--format", "json"], true);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn state_copy_into_a_state_that_holds_one_is_refused_and_changes_nothing() {
    let Some((server, url)) =
        database("state_copy_into_a_state_that_holds_one_is_refused_and_changes_nothing")
    else {
        return;
    };
    let sb = Sandbox::applied();
    let source = sb.state.to_str().unwrap().to_owned();
    let key = PathBuf::from(format!("{source}.key"));
    let config = host_config(&sb.root, "host.yaml", &key, "");
    let copy = |from: &str, to: &str| {
        sb.gitplane_raw(
            &[
                "state",
                "copy",
                "--from",
                from,
                "--to",
                to,
                "--config",
                config.to_str().unwrap(),
            ],
            &[],
        )
    };
    copy(&source, &url).ok();
    let dump = sqlite_dump(&sb.state);
    let tables: Vec<&String> = dump.keys().collect();
    let before = postgres_counts(server, &url, &tables);

    copy(&source, &url)
        .fails()
        .stderr_has("the destination already holds a state (table deployment has rows)")
        .stderr_has("nothing was written");
    assert_eq!(postgres_counts(server, &url, &tables), before);

    // The other way: a SQLite state that holds deployments is left as it was.
    let back = sb.root.join("back.db");
    let back_name = back.to_str().unwrap();
    copy(&url, back_name).ok();
    let back_dump = sqlite_dump(&back);
    copy(&url, back_name)
        .fails()
        .stderr_has("the destination already holds a state (table deployment has rows)");
    assert_eq!(sqlite_dump(&back), back_dump);

    // A source that is not there is not made.
    let missing = sb.root.join("missing.db");
    copy(
        missing.to_str().unwrap(),
        sb.root.join("new.db").to_str().unwrap(),
    )
    .fails()
    .stderr_has("no such state file");
    assert!(!missing.exists() && !sb.root.join("new.db").exists());

    // A copy onto itself is refused before anything is opened.
    copy(&format!("sqlite:{source}"), &source)
        .fails()
        .stderr_has("name the same state");
}

/// Asserts that the database at `url` has no table: nothing was created or written.
#[track_caller]
fn assert_untouched(server: &Postgres, url: &str) {
    let tables = server
        .psql(
            url,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
        .unwrap();
    assert_eq!(tables.trim(), "0", "the database was written to");
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn bad_postgresql_settings_fail_fast_with_a_clear_message_and_change_nothing() {
    let Some((server, url)) =
        database("bad_postgresql_settings_fail_fast_with_a_clear_message_and_change_nothing")
    else {
        return;
    };
    let sb = Sandbox::template();
    let key = sb.root.join("state.key");
    let config = host_config(&sb.root, "host.yaml", &key, "");
    let plain = sb.root.join("plain.yaml");
    std::fs::write(&plain, "").unwrap();

    // A URL that does not parse.
    gitplane(
        &sb,
        "postgres://gp@127.0.0.1:notaport/db",
        &config,
        &["status"],
    )
    .fails()
    .stderr_has("not a PostgreSQL URL")
    .stderr_has("port");
    // Something that looks like one but is not: never a SQLite file of that name.
    gitplane(&sb, "postgres:db.example/state", &config, &["apply"])
        .fails()
        .stderr_has("starts like a PostgreSQL URL but is not one");
    assert!(!sb.root.join("postgres:db.example").exists());

    // A server that is not there: a clear message at once, naming the URL but not the password.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("postgres://gp:pw-s3cret@127.0.0.1:{port}/state");
    for args in [&["apply"][..], &["status"], &["history"]] {
        let started = Instant::now();
        let run = gitplane(&sb, &nowhere, &config, args).fails();
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "took {:?}:{run}",
            started.elapsed()
        );
        run.stderr_has(&format!("postgres://gp@127.0.0.1:{port}/state"))
            .hides(&["pw-s3cret"]);
    }
    // With GITPLANE_STATE too.
    let run = sb
        .gitplane_raw(
            &[
                "status",
                "--config",
                config.to_str().unwrap(),
                "--repo",
                sb.origin.to_str().unwrap(),
            ],
            &[("GITPLANE_STATE", &nowhere)],
        )
        .fails();
    run.stderr_has(&format!("127.0.0.1:{port}"))
        .hides(&["pw-s3cret"]);

    // No state key: refused before the database is touched, saying why.
    gitplane(&sb, &url, &plain, &["apply"])
        .fails()
        .stderr_has("needs state_key")
        .stderr_has("the same on every host");
    assert_untouched(server, &url);
    sb.gitplane_raw(
        &[
            "state",
            "copy",
            "--from",
            &url,
            "--to",
            sb.root.join("x.db").to_str().unwrap(),
            "--config",
            plain.to_str().unwrap(),
        ],
        &[],
    )
    .fails()
    .stderr_has("state_key");
    assert_untouched(server, &url);
    assert!(!sb.root.join("x.db").exists());
}

/// The shared server lets `role` in only with `password` (the test kit trusts everyone else).
fn require_password(server: &Postgres, url: &str, role: &str, password: &str) {
    server
        .psql(
            url,
            &format!("CREATE ROLE {role} LOGIN PASSWORD '{password}' CREATEDB"),
        )
        .unwrap();
    let hba = server.psql(url, "SHOW hba_file").unwrap();
    let hba = hba.trim();
    let rules = std::fs::read_to_string(hba).unwrap();
    std::fs::write(
        hba,
        format!("host all {role} 127.0.0.1/32 scram-sha-256\n{rules}"),
    )
    .unwrap();
    server.psql(url, "SELECT pg_reload_conf()").unwrap();
    // Whoever owns the database lets its new owner in.
    let database = url.rsplit('/').next().unwrap();
    server
        .psql(url, &format!("ALTER DATABASE {database} OWNER TO {role}"))
        .unwrap();
    server
        .psql(url, &format!("GRANT ALL ON SCHEMA public TO {role}"))
        .unwrap();
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn a_password_comes_from_a_secret_store_and_a_wrong_one_is_refused_without_showing_it() {
    let Some((server, url)) = database(
        "a_password_comes_from_a_secret_store_and_a_wrong_one_is_refused_without_showing_it",
    ) else {
        return;
    };
    const RIGHT: &str = "right-Pw-s3cret";
    const WRONG: &str = "wrong-Pw-s3cret";
    require_password(server, &url, "gp_pw", RIGHT);
    let as_role = url.replace("postgres://postgres@", "postgres://gp_pw@");
    let sb = Sandbox::template();
    let key = sb.root.join("state.key");
    let secrets = sb.root.join("secrets");
    std::fs::create_dir_all(secrets.join("pg")).unwrap();
    std::fs::write(secrets.join("pg/password"), format!("{RIGHT}\n")).unwrap();
    let stores = format!("secret_stores:\n  files: {{dir: {}}}\n", secrets.display());
    let config = host_config(
        &sb.root,
        "host.yaml",
        &key,
        &format!("state: {as_role}\nstate_password: {{store: files, ref: pg/password}}\n{stores}"),
    );
    let no_password = host_config(&sb.root, "bare.yaml", &key, "");

    // The wrong password, in the URL or in PGPASSWORD: refused, and never shown.
    let wrong_url = as_role.replace("gp_pw@", &format!("gp_pw:{WRONG}@"));
    for run in [
        gitplane(&sb, &wrong_url, &no_password, &["apply"]),
        sb.gitplane_raw(
            &[
                "apply",
                "--repo",
                sb.origin.to_str().unwrap(),
                "--state",
                &as_role,
                "--config",
                no_password.to_str().unwrap(),
            ],
            &[("PGPASSWORD", WRONG)],
        ),
    ] {
        run.fails()
            .stderr_has("password authentication failed")
            .hides(&[WRONG, RIGHT]);
    }
    assert_untouched(server, &url);

    // The host config's state and state_password: the right one, from the store.
    let run = sb
        .gitplane_raw(
            &[
                "apply",
                "--repo",
                sb.origin.to_str().unwrap(),
                "--config",
                config.to_str().unwrap(),
            ],
            &[],
        )
        .ok();
    run.hides(&[RIGHT]).stdout_has("deployment 1 succeeded");
    sb.gitplane_raw(&["status", "--config", config.to_str().unwrap()], &[])
        .ok()
        .stdout_has("development @ ");

    // The right password in the URL works too, and no message naming the state shows it.
    let right_url = as_role.replace("gp_pw@", &format!("gp_pw:{RIGHT}@"));
    gitplane(&sb, &right_url, &no_password, &["status"]).ok();
    for args in [
        &["report", "resources", "--env", "staging"][..],
        &["manifests", "--env", "staging"],
        &["status", "--env", "staging"],
    ] {
        gitplane(&sb, &right_url, &no_password, args)
            .fails()
            .stderr_has(&format!("{as_role}: no environment 'staging'"))
            .hides(&[RIGHT]);
    }
}

#[test]
fn host_config_errors_about_the_state_name_their_line() {
    let sb = Sandbox::template();
    let key = sb.root.join("state.key");
    let validate = |name: &str, text: &str| {
        let path = sb.root.join(name);
        std::fs::write(&path, text).unwrap();
        let run = sb.gitplane_raw(
            &[
                "validate",
                "--repo",
                sb.origin.to_str().unwrap(),
                "--config",
                path.to_str().unwrap(),
            ],
            &[],
        );
        (path.display().to_string(), run.fails())
    };
    let (file, run) = validate(
        "bad-url.yaml",
        &format!(
            "state_key: {{file: {}}}\nstate: postgres://gp:pw-s3cret@db:notaport/x\n",
            key.display()
        ),
    );
    run.stderr_has(&format!("{file}:2: state: not a PostgreSQL URL"))
        .hides(&["pw-s3cret"]);
    let (file, run) = validate("no-key.yaml", "# shared\nstate: postgres://gp@db/x\n");
    run.stderr_has(&format!("{file}:2: a PostgreSQL state needs state_key"))
        .stderr_has("every host that shares the database must seal secrets with the same key");
    let (file, run) = validate(
        "password-for-sqlite.yaml",
        "state: /var/lib/gitplane/state.db\nsecret_stores:\n  files: {dir: /srv}\n\
         state_password: {store: files, ref: pg}\n",
    );
    run.stderr_has(&format!(
        "{file}:4: state_password is only for a PostgreSQL state"
    ));
    let (file, run) = validate(
        "ttl.yaml",
        &format!(
            "state_key: {{file: {}}}\nstate: postgres://gp@db/x\nleases:\n  ttl: 1s\n",
            key.display()
        ),
    );
    run.stderr_has(&format!("{file}:4: leases.ttl '1s' is out of range"));
    let (file, run) = validate(
        "store.yaml",
        &format!(
            "state_key: {{file: {}}}\nstate: postgres://gp@db/x\n\
             state_password: {{store: vault, ref: pg}}\n",
            key.display()
        ),
    );
    run.stderr_has(&format!(
        "{file}:3: state_password: secret store 'vault' is not configured"
    ));
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn status_shows_who_holds_each_environment() {
    let Some((server, url)) = database("status_shows_who_holds_each_environment") else {
        return;
    };
    let sb = Sandbox::template();
    let config = host_config(&sb.root, "host.yaml", &sb.root.join("state.key"), "");
    gitplane(&sb, &url, &config, &["apply"]).ok();
    // Without leases (a state no daemon shares, and any SQLite state) status is as it was.
    let before = gitplane(&sb, &url, &config, &["status"]).ok();
    assert!(!before.stdout.contains("lease:"), "{before}");
    let json = gitplane(&sb, &url, &config, &["status", "--format", "json"])
        .ok()
        .json();
    assert!(
        json.as_array()
            .unwrap()
            .iter()
            .all(|e| e["lease"].is_null())
    );
    sb.gitplane(&["apply"]).ok();
    let sqlite = sb.gitplane(&["status"]).ok();
    assert!(!sqlite.stdout.contains("lease:"), "{sqlite}");
    let sqlite = sb.gitplane(&["status", "--format", "json"]).ok().json();
    assert!(
        sqlite
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.get("lease").is_none()),
        "{sqlite}"
    );

    server
        .psql(
            &url,
            "INSERT INTO env_lease (env, daemon, generation, acquired_at, expires_at) VALUES
             ('development', 'host-a:41', 3, '2026-01-01T00:00:00.000Z', '2999-01-01T00:00:00.000Z'),
             ('production', 'host-b:7', 1, '2026-01-01T00:00:00.000Z', '2001-01-01T00:00:00.000Z')",
        )
        .unwrap();
    let table = gitplane(&sb, &url, &config, &["status"]).ok();
    let lines: Vec<&str> = table.stdout.lines().collect();
    let after = |env: &str| {
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("{env} @ ")))
            .unwrap_or_else(|| panic!("no {env}:{table}"));
        lines[at + 1]
    };
    assert_eq!(
        after("development"),
        "  lease: held by host-a:41 (generation 3) until 2999-01-01T00:00:00.000Z"
    );
    assert_eq!(
        after("production"),
        "  lease: free (expired 2001-01-01T00:00:00.000Z)"
    );
    let json = gitplane(&sb, &url, &config, &["status", "--format", "json"])
        .ok()
        .json();
    let lease = |env: &str| {
        json.as_array()
            .unwrap()
            .iter()
            .find(|e| e["env"] == env)
            .unwrap()["lease"]
            .clone()
    };
    assert_eq!(
        lease("development"),
        serde_json::json!({"daemon": "host-a:41", "generation": 3,
                           "expires_at": "2999-01-01T00:00:00.000Z", "current": true})
    );
    assert_eq!(lease("production")["current"], false);
}

#[test]
#[cfg_attr(
    not(postgres),
    ignore = "PostgreSQL (initdb, pg_ctl, psql) is not installed"
)]
fn no_secret_is_stored_in_plain_text_in_postgresql() {
    let Some((server, url)) = database("no_secret_is_stored_in_plain_text_in_postgresql") else {
        return;
    };
    let sb = Sandbox::template();
    let config = host_config(&sb.root, "host.yaml", &sb.root.join("state.key"), "");
    gitplane(&sb, &url, &config, &["apply"]).ok();
    // The secrets are there, sealed: the apply's resources read them.
    let sealed = server
        .psql(
            &url,
            "SELECT COUNT(*) FROM resource_secret WHERE outputs LIKE 'gp1:%'",
        )
        .unwrap();
    assert_ne!(
        sealed.trim(),
        "0",
        "no sealed secret: the test proves nothing"
    );
    let tables = server
        .psql(
            &url,
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' \
             AND table_type = 'BASE TABLE' ORDER BY 1",
        )
        .unwrap();
    let mut dumped = 0;
    for table in tables.lines().filter(|t| !t.is_empty()) {
        let text = server
            .psql(&url, &format!("SELECT t::text FROM {table} AS t"))
            .unwrap();
        dumped += text.len();
        for secret in SECRETS {
            assert!(
                !text.contains(secret),
                "{secret:?} in table {table} in plain text"
            );
        }
    }
    assert!(dumped > 1000, "the dump is too small to mean anything");
}

#[test]
fn commands_that_never_open_the_state_need_no_state_password() {
    let sb = Sandbox::template();
    let secrets = sb.root.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    // The store holds no such secret (a pushing user may not see the real one).
    let config = host_config(
        &sb.root,
        "host.yaml",
        &sb.root.join("state.key"),
        &format!(
            "state: postgres://gp@127.0.0.1:9/state\n\
             secret_stores:\n  files: {{dir: {}}}\n\
             state_password: {{store: files, ref: pg/password}}\n",
            secrets.display()
        ),
    );
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend([
            "--repo",
            sb.origin.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ]);
        sb.gitplane_raw(&all, &[])
    };
    run(&["validate"]).ok().stdout_has("is valid");
    run(&["graph", "--env", "development"]).ok();
    run(&["status"])
        .fails()
        .stderr_has("state_password: ")
        .stderr_has("pg/password");
}
