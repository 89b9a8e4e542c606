//! Drift runs that only detect (`drift: detect`, `gitplane drift --detect`): the real binary
//! reads each resource through a real HTTP driver (`GET`), records what differs, and changes
//! nothing; `drift: correct` still re-applies. The driver here keeps its resources in memory so
//! a test can change one "outside gitplane".

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gitplane_testkit::{HttpServer, Reply, eventually_or};
use serde_json::{Value, json};

use crate::daemon::Daemon;
use crate::util::{Definition, Sandbox, definitions, http_driver_config};

/// The secret output the driver gives, and the one it is changed to outside gitplane.
const PASSWORD: &str = "pw-original-5ecret";
const ROTATED: &str = "pw-rotated-outside-5ecret";

#[derive(Default)]
struct Resources {
    /// GUResID -> (values, secrets).
    live: HashMap<String, (Value, Value)>,
    /// Every request's method, in order.
    methods: Vec<String>,
    /// Reads still to answer with a 503 before answering.
    failing_reads: u32,
}

/// An HTTP driver that provisions into memory and answers `GET` with what it holds (or `405`
/// when it has no read path).
struct ReadingDriver {
    url: String,
    resources: Arc<Mutex<Resources>>,
    _server: HttpServer,
}

impl ReadingDriver {
    fn start(read_path: bool) -> ReadingDriver {
        let resources: Arc<Mutex<Resources>> = Arc::default();
        let shared = resources.clone();
        let server = HttpServer::start(move |request| {
            let method = request.method.as_str();
            let guresid = request.last_segment().to_owned();
            let body = request.json();
            let (status, answer) = {
                let mut r = shared.lock().unwrap_or_else(|e| e.into_inner());
                r.methods.push(method.to_owned());
                match method {
                    "PUT" => {
                        let values = json!({
                            "host": format!("db-{}", &guresid[..8]),
                            "port": 5432,
                            "echo": body["driver"]["values"],
                        });
                        let secrets = json!({"password": PASSWORD});
                        r.live
                            .insert(guresid.clone(), (values.clone(), secrets.clone()));
                        (200, answer(&guresid, &values, &secrets))
                    }
                    "GET" if !read_path => (405, json!({"message": "no read path"})),
                    "GET" if r.failing_reads > 0 => {
                        r.failing_reads -= 1;
                        (503, json!({"message": "busy: try again"}))
                    }
                    "GET" => match r.live.get(&guresid) {
                        Some((values, secrets)) => (200, answer(&guresid, values, secrets)),
                        None => (404, json!({"message": "no such resource"})),
                    },
                    "DELETE" => {
                        r.live.remove(&guresid);
                        (204, Value::Null)
                    }
                    _ => (405, json!({})),
                }
            };
            let text = if status == 204 {
                String::new()
            } else {
                answer.to_string()
            };
            Reply::text(status, text)
        });
        ReadingDriver {
            url: format!("{}/driver", server.url),
            resources,
            _server: server,
        }
    }

    fn methods(&self) -> Vec<String> {
        self.lock().methods.clone()
    }

    /// The next `n` reads fail with a 503, as a driver that is briefly unwell.
    fn fail_reads(&self, n: u32) {
        self.lock().failing_reads = n;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Resources> {
        self.resources.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Someone changes the one resource outside gitplane: its host and its password.
    fn tamper(&self) {
        let mut r = self.lock();
        assert_eq!(r.live.len(), 1, "one resource lives at the driver");
        for (values, secrets) in r.live.values_mut() {
            values["host"] = json!("db-moved-by-hand");
            secrets["password"] = json!(ROTATED);
        }
    }

    /// Someone puts the resource back as gitplane provisioned it.
    fn untamper(&self) {
        let mut r = self.lock();
        for (guresid, (values, secrets)) in r.live.iter_mut() {
            values["host"] = json!(format!("db-{}", &guresid[..8]));
            secrets["password"] = json!(PASSWORD);
        }
    }

    fn host(&self) -> Value {
        let r = self.lock();
        r.live
            .values()
            .next()
            .map(|(v, _)| v["host"].clone())
            .unwrap_or(Value::Null)
    }
}

fn answer(guresid: &str, values: &Value, secrets: &Value) -> Value {
    json!({"id": guresid, "type": "postgres", "resource": {"values": values, "secrets": secrets}})
}

/// A platform of one app: a workload (echo) reading a postgres the HTTP driver provisions.
fn platform(sb: &Sandbox, driver: &ReadingDriver, env_file: &str) -> String {
    sb.write(
        "host.yaml",
        &format!(
            "{}retry: {{attempts: 2, initial_delay: 10ms, max_delay: 20ms, poll_interval: 10ms}}\n",
            http_driver_config(&driver.url, "timeout: 2s")
        ),
    );
    sb.write("environments/test.yaml", env_file);
    sb.write(
        "definitions/platform.yaml",
        &definitions(&[
            Definition::http("pg")
                .of_type("postgres")
                .value("size: small"),
            Definition::new("wl", "echo")
                .of_type("workload")
                .value("namespace: shop"),
        ]),
    );
    sb.write(
        "workloads/shop/api.yaml",
        "apiVersion: score.dev/v1b1\nmetadata:\n  name: api\ncontainers:\n  main:\n    \
         image: x\n    variables:\n      DB_HOST: ${resources.db.host}\n      \
         DB_PASSWORD: ${resources.db.password}\nresources:\n  db:\n    type: postgres\n",
    );
    sb.commit("A platform with an HTTP-driven database")
}

fn config(sb: &Sandbox) -> String {
    sb.work.join("host.yaml").to_str().unwrap().to_owned()
}

/// A platform whose one environment detects drift, behind a driver that can read
/// (`reads`) or not, applied once: the sandbox, the driver, the host config and the commit.
fn applied_detecting(reads: bool) -> (Sandbox, ReadingDriver, String, String) {
    let sb = Sandbox::new();
    let driver = ReadingDriver::start(reads);
    let head = platform(
        &sb,
        &driver,
        "type: test\nimplicit_resources: []\ndrift: detect\n",
    );
    let c = config(&sb);
    sb.gitplane(&["apply", "--config", &c]).ok();
    (sb, driver, c, head)
}

/// Everything a person or a program can read of the state and the commands, for secrets.
fn everything_shown(sb: &Sandbox) -> String {
    let c = config(sb);
    let mut all = String::new();
    for args in [
        vec!["status", "--config", &c],
        vec!["status", "--config", &c, "--format", "json"],
        vec!["history", "--config", &c],
        vec!["history", "--config", &c, "--format", "json"],
        vec!["report", "drift-detected", "--config", &c],
        vec![
            "report",
            "drift-detected",
            "--config",
            &c,
            "--format",
            "json",
        ],
        vec![
            "report",
            "drift-detected",
            "--config",
            &c,
            "--format",
            "csv",
        ],
    ] {
        let run = sb.gitplane(&args).ok();
        all.push_str(&run.stdout);
        all.push_str(&run.stderr);
    }
    for row in sb.rows(
        "SELECT deployment_id || ' ' || guresid || ' ' || what || ' ' || source || ' ' || detail \
         FROM drift_finding",
    ) {
        all.push_str(&row.join(" "));
    }
    all
}

#[test]
fn detect_records_what_changed_outside_and_changes_nothing() {
    let (sb, driver, c, _) = applied_detecting(true);
    // As applied, nothing differs: exit 0.
    sb.gitplane(&["drift", "--config", &c, "--env", "test"])
        .ok()
        .stdout_has("0 resource(s) differ");

    driver.tamper();
    let outputs_before = sb.outputs("test", "modules.api.externals.db");
    let resources_before = sb.rows("SELECT * FROM resource ORDER BY guresid");
    let links_before = sb.rows("SELECT * FROM link ORDER BY consumer, provider");
    let bindings_before = sb.count("SELECT COUNT(*) FROM binding");
    let fingerprints_before = sb.rows("SELECT * FROM app_fingerprint");
    let calls_before = driver.methods().len();

    let run = sb.gitplane(&["drift", "--config", &c, "--env", "test"]);
    assert_eq!(run.code, Some(2), "drift found is exit code 2:{run}");
    run.stdout_has("modules.api.externals.db")
        .stdout_has("host: \"db-")
        .stdout_has("\"db-moved-by-hand\"")
        .stdout_has("secret outputs differ: password")
        .stdout_has("nothing was changed")
        .hides(&[PASSWORD, ROTATED]);

    // The driver was read, never written.
    let during: Vec<String> = driver.methods()[calls_before..].to_vec();
    assert!(during.iter().any(|m| m == "GET"), "{during:?}");
    assert!(
        during.iter().all(|m| m == "GET"),
        "a detect run only reads: {during:?}"
    );
    assert_eq!(driver.host(), json!("db-moved-by-hand"));
    // Nothing of what gitplane recorded moved.
    assert_eq!(
        sb.outputs("test", "modules.api.externals.db"),
        outputs_before
    );
    assert_eq!(
        sb.rows("SELECT * FROM resource ORDER BY guresid"),
        resources_before
    );
    assert_eq!(
        sb.rows("SELECT * FROM link ORDER BY consumer, provider"),
        links_before
    );
    assert_eq!(sb.count("SELECT COUNT(*) FROM binding"), bindings_before);
    assert_eq!(
        sb.rows("SELECT * FROM app_fingerprint"),
        fingerprints_before
    );

    // Recorded as a detect run with one finding per difference.
    let findings = sb.rows(
        "SELECT f.res_id, f.what, f.source, d.kind, d.drift_mode FROM drift_finding f \
         JOIN deployment d ON d.id = f.deployment_id ORDER BY f.deployment_id DESC, f.what",
    );
    assert_eq!(
        findings,
        [
            [
                "modules.api.externals.db",
                "outputs",
                "driver",
                "drift",
                "detect"
            ],
            [
                "modules.api.externals.db",
                "secret outputs",
                "driver",
                "drift",
                "detect"
            ],
        ]
        .map(|r| r.map(str::to_owned).to_vec())
    );
    let detail = sb.column("SELECT detail FROM drift_finding WHERE what = 'outputs'");
    assert!(
        detail[0].contains("host") && detail[0].contains("db-moved-by-hand"),
        "{detail:?}"
    );

    // status, history and the report say so.
    sb.gitplane(&["status", "--config", &c])
        .ok()
        .stdout_has("drift: 1 resource(s) differ (detected ")
        .stdout_has("not corrected");
    let status = sb
        .gitplane(&["status", "--config", &c, "--format", "json"])
        .ok()
        .json()[0]
        .clone();
    assert_eq!(status["drift"]["resources_differ"], json!(1), "{status}");
    assert_eq!(status["drift"]["corrected"], json!(false));
    sb.gitplane(&["history", "--config", &c])
        .ok()
        .stdout_has("drift run (detect): 2 finding(s), 1 resource(s) differ");
    let history = sb
        .gitplane(&["history", "--config", &c, "--format", "json"])
        .ok()
        .json();
    let newest = &history[0];
    assert_eq!(
        (&newest["kind"], &newest["drift_mode"], &newest["findings"]),
        (&json!("drift"), &json!("detect"), &json!(2)),
        "{history}"
    );
    sb.gitplane(&["report", "drift-detected", "--config", &c])
        .ok()
        .stdout_has("modules.api.externals.db")
        .stdout_has("secret outputs");
    let report = sb
        .gitplane(&[
            "report",
            "drift-detected",
            "--config",
            &c,
            "--format",
            "json",
        ])
        .ok()
        .json();
    assert_eq!(report.as_array().map(Vec::len), Some(2), "{report}");
    sb.gitplane(&[
        "report",
        "drift-detected",
        "--config",
        &c,
        "--format",
        "csv",
    ])
    .ok()
    .stdout_has("secret outputs");
    // The correcting runs' report is not confused by a detect run.
    let corrected = sb
        .gitplane(&["report", "drift", "--config", &c, "--format", "json"])
        .ok()
        .json();
    assert_eq!(corrected, json!([]));

    let shown = everything_shown(&sb);
    assert!(!shown.contains(PASSWORD) && !shown.contains(ROTATED));
    sb.assert_state_bytes_hide(&[PASSWORD, ROTATED]);

    // The next apply of a new commit is a normal deployment at the new commit, not a resumed
    // detect run, and the last good commit is still the applied one.
    sb.edit(
        "environments/test.yaml",
        "drift: detect\n",
        "drift: detect\n# a comment\n",
    );
    let next = sb.commit("A comment");
    sb.gitplane(&["apply", "--config", &c]).ok();
    let last = sb.last_deployment("test");
    assert_eq!(
        (last.commit.as_str(), last.status.as_str()),
        (next.as_str(), "succeeded")
    );
}

#[test]
fn drift_correct_still_re_applies() {
    let sb = Sandbox::new();
    let driver = ReadingDriver::start(true);
    platform(&sb, &driver, "type: test\nimplicit_resources: []\n");
    let c = config(&sb);
    sb.gitplane(&["apply", "--config", &c]).ok();
    driver.tamper();
    let before = driver.methods().len();
    sb.gitplane(&["drift", "--config", &c, "--env", "test"])
        .ok()
        .stdout_has("test: drift:");
    let during: Vec<String> = driver.methods()[before..].to_vec();
    assert!(during.iter().any(|m| m == "PUT"), "{during:?}");
    // The driver set the resource back; nothing was recorded as detected.
    assert_ne!(driver.host(), json!("db-moved-by-hand"));
    assert_eq!(sb.count("SELECT COUNT(*) FROM drift_finding"), 0);
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE drift_mode IS NOT NULL"),
        0
    );

    // --detect only looks, whatever the file says.
    driver.tamper();
    let before = driver.methods().len();
    let run = sb.gitplane(&["drift", "--config", &c, "--env", "test", "--detect"]);
    assert_eq!(run.code, Some(2), "{run}");
    assert!(driver.methods()[before..].iter().all(|m| m == "GET"));
}

#[test]
fn a_driver_without_read_path_falls_back_to_the_recorded_comparison() {
    let (sb, driver, c, _) = applied_detecting(false);
    driver.tamper();
    let before = driver.methods().len();
    // The driver cannot tell; what was recorded agrees with itself: nothing found, exit 0,
    // and no read is an error.
    sb.gitplane(&["drift", "--config", &c, "--env", "test"])
        .ok()
        .stdout_has("0 resource(s) differ, 2 as recorded, 0 not read");
    let during: Vec<String> = driver.methods()[before..].to_vec();
    assert_eq!(during, ["GET"], "asked once, answered 405, never written");
    assert_eq!(sb.count("SELECT COUNT(*) FROM drift_finding"), 0);
}

#[test]
fn a_bad_drift_mode_is_refused_with_its_line_and_changes_nothing() {
    let sb = Sandbox::new();
    let driver = ReadingDriver::start(true);
    platform(&sb, &driver, "type: test\nimplicit_resources: []\n");
    let c = config(&sb);
    sb.gitplane(&["apply", "--config", &c]).ok();
    let resources = sb.rows("SELECT * FROM resource ORDER BY guresid");
    let calls = driver.methods().len();
    sb.write(
        "environments/test.yaml",
        "type: test\nimplicit_resources: []\ndrift: sometimes\n",
    );
    sb.commit("A drift mode that does not exist");
    sb.gitplane(&["apply", "--config", &c])
        .fails()
        .stderr_has("environments/test.yaml:3: drift 'sometimes' is not a drift mode");
    sb.gitplane(&["validate", "--config", &c])
        .fails()
        .stderr_has("environments/test.yaml:3:");
    assert_eq!(
        sb.rows("SELECT * FROM resource ORDER BY guresid"),
        resources
    );
    assert_eq!(driver.methods().len(), calls);
}

#[test]
fn the_daemon_detects_on_its_schedule() {
    let sb = Sandbox::new();
    let driver = ReadingDriver::start(true);
    // Every second (six fields: with seconds).
    platform(
        &sb,
        &driver,
        "type: test\nimplicit_resources: []\ndrift: detect\nschedule: \"* * * * * *\"\n",
    );
    let c = config(&sb);
    let origin = sb.origin.to_str().unwrap().to_owned();
    let state = sb.state.to_str().unwrap().to_owned();
    let mut daemon = Daemon::start(&sb, &["--config", &c, "--repo", &origin, "--state", &state]);
    daemon.wait_for_log("deployment succeeded", Duration::from_secs(30));
    daemon.wait_for_log("drift detected (not corrected)", Duration::from_secs(30));
    let before = driver.methods().len();
    driver.tamper();
    eventually_or(
        "a drift finding recorded",
        Duration::from_secs(30),
        || (sb.count("SELECT COUNT(*) FROM drift_finding") > 0).then_some(()),
        || daemon.log(),
    );
    let (code, _) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    let during: Vec<String> = driver.methods()[before..].to_vec();
    assert!(
        during.iter().all(|m| m == "GET"),
        "scheduled detect runs only read: {during:?}"
    );
    assert_eq!(driver.host(), json!("db-moved-by-hand"));
    let found = sb.column("SELECT DISTINCT res_id || ' ' || what FROM drift_finding ORDER BY 1");
    assert_eq!(
        found,
        [
            "modules.api.externals.db outputs",
            "modules.api.externals.db secret outputs"
        ]
    );
    assert!(!daemon.log().contains(PASSWORD) && !daemon.log().contains(ROTATED));
}

/// A detect run's reads go through the driver-call engine: a read that fails transiently is
/// retried with the apply's `retry` settings, and the run still finds what changed.
#[test]
fn a_read_that_fails_transiently_is_retried_and_finds_the_drift() {
    let sb = Sandbox::new();
    let driver = ReadingDriver::start(true);
    platform(
        &sb,
        &driver,
        "type: test\nimplicit_resources: []\ndrift: detect\n",
    );
    sb.edit("host.yaml", "attempts: 2", "attempts: 3");
    let c = config(&sb);
    sb.gitplane(&["apply", "--config", &c]).ok();
    driver.tamper();
    driver.fail_reads(2);
    let before = driver.methods().len();
    let run = sb.gitplane(&["drift", "--config", &c, "--env", "test"]);
    assert_eq!(run.code, Some(2), "drift found:{run}");
    run.stdout_has("\"db-moved-by-hand\"")
        .stdout_has("0 not read")
        .hides(&[PASSWORD, ROTATED]);
    assert_eq!(
        driver.methods()[before..],
        ["GET", "GET", "GET"],
        "two 503s, then the answer"
    );
    assert_eq!(
        sb.column("SELECT what FROM drift_finding ORDER BY what"),
        ["outputs", "secret outputs"]
    );

    // Past `retry.attempts` the read is given up, named as the apply names it.
    driver.fail_reads(3);
    let run = sb.gitplane(&["drift", "--config", &c, "--env", "test"]);
    run.stdout_has("1 not read");
    let error = sb.column("SELECT error FROM deployment ORDER BY id DESC LIMIT 1");
    assert!(
        error[0].contains("(gave up after 3 attempts)"),
        "{error:?}:{run}"
    );
}

/// What a detect run found and a pin show in the daemon's metrics, read from the state the CLI
/// wrote while the daemon runs: `drifted` and the findings, then `pinned`; a detect run that
/// finds nothing clears `drifted`.
#[test]
fn detected_drift_and_a_pin_show_in_the_daemons_metrics() {
    use crate::metrics::{conditions_on, scrape, scrape_when_up};
    use crate::service::{free_port, samples, value};

    let (sb, driver, c, head) = applied_detecting(true);
    let port = free_port();
    let args = sb.host_config(&format!(
        "{}http: {{listen: 127.0.0.1:{port}}}\n",
        sb.read("host.yaml")
    ));
    let daemon = Daemon::start(&sb, &args.iter().map(String::as_str).collect::<Vec<_>>());
    scrape_when_up(port, &daemon);
    // The daemon's first pass over the environment may still be running when it first answers.
    let text = eventually_or(
        "the daemon's first pass to end",
        Duration::from_secs(30),
        || scrape(port).filter(|t| !conditions_on(t, "test").contains(&"running")),
        || daemon.log(),
    );
    assert_eq!(conditions_on(&text, "test"), ["ready"], "{text}");
    assert_eq!(
        samples(&text).get("gitplane_drift_findings{env=\"test\"}"),
        Some(&0.0),
        "{text}"
    );

    driver.tamper();
    let run = sb.gitplane(&["drift", "--config", &c, "--env", "test"]);
    assert_eq!(run.code, Some(2), "drift found:{run}");
    let text = scrape(port).expect("the listener answers");
    assert_eq!(conditions_on(&text, "test"), ["ready", "drifted"], "{text}");
    assert_eq!(
        value(&samples(&text), "gitplane_drift_findings{env=\"test\"}"),
        2.0,
        "outputs and secret outputs differ:\n{text}"
    );

    sb.gitplane(&[
        "pin", "--config", &c, "--env", "test", "--reason", "audit", "--by", "alice",
    ])
    .ok();
    let text = scrape(port).expect("the listener answers");
    assert_eq!(
        conditions_on(&text, "test"),
        ["ready", "drifted", "pinned"],
        "{text}"
    );
    // At the ref: nothing behind.
    assert_eq!(
        samples(&text).get("gitplane_environment_commit_behind_seconds{env=\"test\"}"),
        Some(&0.0),
        "{head}: {text}"
    );

    // A commit an hour later (by its committer time) is held back by the pin: the
    // environment's commit is an hour behind the watched ref's.
    sb.edit("workloads/shop/api.yaml", "image: x", "image: y");
    sb.git(&["add", "-A"]);
    let later = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    sb.git(&[
        "commit",
        "--quiet",
        "-m",
        "an hour later",
        &format!("--date=@{later}"),
    ]);
    sb.git(&[
        "rebase",
        "--quiet",
        "--committer-date-is-author-date",
        "HEAD~1",
    ]);
    sb.git(&["push", "--quiet", "origin", "main"]);
    let behind = |text: &str| {
        samples(text)
            .get("gitplane_environment_commit_behind_seconds{env=\"test\"}")
            .copied()
    };
    let text = scrape(port).expect("the listener answers");
    let seconds = behind(&text).unwrap_or_default();
    assert!((3500.0..=3700.0).contains(&seconds), "{seconds}:\n{text}");
    assert_eq!(
        conditions_on(&text, "test"),
        ["ready", "drifted", "pinned"],
        "{text}"
    );

    // Unpinned, the newest commit is applied: nothing behind. The daemon holds the environment
    // while it plans the pushed commit against the pin; an unpin meanwhile is told to wait for
    // it, and is run again, as a user would.
    daemon.wait_for_log("pinned by a rollback", Duration::from_secs(30));
    eventually_or(
        "the unpin to find the environment free",
        Duration::from_secs(30),
        || {
            let run = sb.gitplane(&["unpin", "--config", &c, "--env", "test", "--by", "alice"]);
            if run.code == Some(0) {
                return Some(());
            }
            assert!(
                run.stderr
                    .contains("is applying to environment test; wait for it to finish"),
                "{run}"
            );
            None
        },
        || daemon.log(),
    );
    let text = scrape(port).expect("the listener answers");
    assert_eq!(behind(&text), Some(0.0), "{text}");
    // Put back as recorded, the next detect run finds nothing: no longer drifted.
    driver.untamper();
    sb.gitplane(&["drift", "--config", &c, "--env", "test"])
        .ok();
    let text = scrape(port).expect("the listener answers");
    assert_eq!(conditions_on(&text, "test"), ["ready"], "{text}");
}

/// The status page's overview carries what a detect run found, as `status` does: which
/// resource, what differs (public values), a changed secret by name only.
#[test]
fn the_status_page_overview_shows_drift_found_without_secret_values() {
    let (sb, driver, c, _) = applied_detecting(true);
    driver.tamper();
    assert_eq!(
        sb.gitplane(&["drift", "--config", &c, "--env", "test"])
            .code,
        Some(2)
    );
    let db = sb.column("SELECT guresid FROM resource WHERE type = 'postgres'")[0].clone();

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let with_http = sb.root.join("host-http.yaml");
    std::fs::write(
        &with_http,
        format!(
            "{}http:\n  listen: 127.0.0.1:{port}\n",
            std::fs::read_to_string(&c).unwrap()
        ),
    )
    .unwrap();
    let mut args = crate::daemon::repo_args(&sb);
    args.extend(["--config".to_owned(), with_http.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _daemon = Daemon::start(&sb, &args);
    let url = format!("http://127.0.0.1:{port}/api/overview");
    let body = eventually_or(
        "the overview",
        Duration::from_secs(15),
        || {
            ureq::get(&url)
                .call()
                .ok()?
                .body_mut()
                .read_to_string()
                .ok()
        },
        String::new,
    );
    assert!(
        !body.contains(PASSWORD) && !body.contains(ROTATED),
        "a secret value in the overview: {body}"
    );
    let overview: Value = serde_json::from_str(&body).unwrap();
    let drift = &overview["environments"][0]["drift"];
    assert_eq!(drift["resources"], 1, "{drift}");
    assert_eq!(drift["findings_total"], 2, "{drift}");
    let findings = drift["findings"].as_array().unwrap();
    assert!(
        findings.iter().all(|f| f["guresid"] == db.as_str()),
        "{drift}"
    );
    let outputs = findings.iter().find(|f| f["what"] == "outputs").unwrap();
    assert!(
        outputs["detail"]
            .as_str()
            .is_some_and(|d| d.contains("host") && d.contains("db-moved-by-hand")),
        "{outputs}"
    );
    let secret = findings
        .iter()
        .find(|f| f["what"] == "secret outputs")
        .unwrap();
    assert!(
        secret["detail"]
            .as_str()
            .is_some_and(|d| d.contains("password")),
        "{secret}"
    );
    // Nothing else is claimed: no pin, no preview, nothing running.
    let env = &overview["environments"][0];
    assert_eq!(
        (&env["pin"], &env["preview"], &env["progress"]),
        (&Value::Null, &Value::Null, &Value::Null),
        "{env}"
    );
}
