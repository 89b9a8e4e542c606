//! The daemon as a service: its HTTP listener's metrics (scraped before and after deployments,
//! checked by `promtool`), health checks, push webhooks from each forge, and the token that
//! guards a listener other hosts can reach.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::daemon::{Daemon, wait_deployed};
use crate::util::Sandbox;

const ENVS: [&str; 2] = ["development", "production"];

/// A port nobody listens on now.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// A blocking HTTP client that hands back every status instead of failing on 4xx and 5xx.
pub(crate) fn client() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .max_redirects(0)
        .build()
        .into()
}

/// `GET url` with `headers`: the status and body.
pub(crate) fn get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = client().get(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut response = request.call().expect("the listener answers");
    let status = response.status().as_u16();
    (
        status,
        response.body_mut().read_to_string().unwrap_or_default(),
    )
}

/// `POST url` with `headers` and `body`: the status and body.
pub(crate) fn post(url: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut request = client().post(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let mut response = request.send(body).expect("the listener answers");
    let status = response.status().as_u16();
    (
        status,
        response.body_mut().read_to_string().unwrap_or_default(),
    )
}

/// Writes a host config for the sandbox's repository and state with `extra` appended.
pub(crate) fn host_config(sb: &Sandbox, extra: &str) -> PathBuf {
    let path = sb.root.join("host.yaml");
    let text = format!(
        "repo: {}\nstate: {}\n{extra}",
        sb.origin.display(),
        sb.state.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Every sample of a metrics text: `name{labels}` to value.
pub(crate) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub(crate) fn value(samples: &BTreeMap<String, f64>, name: &str) -> f64 {
    samples.get(name).copied().unwrap_or(0.0)
}

/// Runs `promtool check metrics` on `text`: `None` when promtool is not installed.
pub(crate) fn promtool_check(text: &str) -> Option<(bool, String)> {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(_) => return None,
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

/// The driver calls a deployment made, per driver type and operation (`put` or `delete`), from
/// the state: what the metrics must have counted.
fn calls_of(sb: &Sandbox, deployment: i64) -> BTreeMap<(String, String), f64> {
    let mut calls = BTreeMap::new();
    for row in sb.rows(&format!(
        "SELECT r.driver, o.action, o.attempts FROM operation o JOIN resource r USING (guresid) \
         WHERE o.deployment_id = {deployment}"
    )) {
        let operation = if row[1] == "delete" { "delete" } else { "put" };
        *calls
            .entry((row[0].clone(), operation.to_owned()))
            .or_insert(0.0) += row[2].parse::<f64>().unwrap();
    }
    calls
}

#[test]
fn metrics_move_by_what_each_deployment_did_and_pass_promtool() {
    let sb = Sandbox::template();
    let port = free_port();
    let config = host_config(&sb, &format!("http: {{listen: 127.0.0.1:{port}}}\n"));
    let _daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let url = format!("http://127.0.0.1:{port}/metrics");
    let (status, before_text) = get(&url, &[]);
    assert_eq!(status, 200, "{before_text}");
    let before = samples(&before_text);

    // One changed resource in each environment.
    sb.edit("definitions/redis.yaml", "port: 6379", "port: 6380");
    let changed = sb.commit("A new port");
    wait_deployed(&sb, &changed, &ENVS, Duration::from_secs(20));
    // A commit that does not load fails in both environments and calls no driver.
    sb.write("definitions/dns.yaml", "apiVersion: [broken\n");
    let broken = sb.commit("A broken commit");
    wait_deployed(&sb, &broken, &ENVS, Duration::from_secs(20));
    let (_, after_text) = get(&url, &[]);
    let after = samples(&after_text);
    let moved = |name: &str| value(&after, name) - value(&before, name);
    // The build that answers: the version and commit `gitplane --version` names.
    let version = sb.gitplane_raw(&["--version"], &[]).ok().stdout;
    let commit = version
        .split("(commit ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .unwrap_or_else(|| panic!("no commit in {version:?}"));
    assert_eq!(
        value(
            &after,
            &format!(
                "gitplane_build_info{{commit=\"{commit}\",version=\"{}\"}}",
                env!("CARGO_PKG_VERSION")
            )
        ),
        1.0,
        "{after_text}"
    );

    for env in ENVS {
        let succeeded = format!(
            "gitplane_deployments_total{{env=\"{env}\",kind=\"commit\",status=\"succeeded\"}}"
        );
        let failed = format!(
            "gitplane_deployments_total{{env=\"{env}\",kind=\"commit\",status=\"failed\"}}"
        );
        assert_eq!(moved(&succeeded), 1.0, "{env}: {after_text}");
        assert_eq!(moved(&failed), 1.0, "{env}: {after_text}");
        let durations =
            format!("gitplane_deployment_duration_seconds_count{{env=\"{env}\",kind=\"commit\"}}");
        assert_eq!(moved(&durations), 2.0, "{env}");

        // Gauges read from state: the same figures the state holds.
        let ready = sb.count(&format!(
            "SELECT COUNT(*) FROM resource WHERE env = '{env}' AND status = 'ready' AND orphan_since IS NULL"
        ));
        assert_eq!(
            value(
                &after,
                &format!("gitplane_resources{{env=\"{env}\",status=\"ready\"}}")
            ),
            ready as f64
        );
        assert_eq!(
            value(
                &after,
                &format!("gitplane_held_deployments{{env=\"{env}\"}}")
            ),
            0.0
        );
        let finished: f64 = sb.column(&format!(
            "SELECT (julianday(MAX(finished_at)) - 2440587.5) * 86400.0 FROM deployment \
             WHERE env = '{env}' AND status = 'succeeded'"
        ))[0]
            .parse()
            .unwrap();
        let last = value(
            &after,
            &format!("gitplane_last_success_timestamp_seconds{{env=\"{env}\"}}"),
        );
        assert!((last - finished).abs() < 0.01, "{last} vs {finished}");
    }
    // Every driver call the changed commit's deployments made, counted once, by driver.
    let mut expected: BTreeMap<(String, String), f64> = BTreeMap::new();
    for env in ENVS {
        let id: i64 = sb.column(&format!(
            "SELECT id FROM deployment WHERE env = '{env}' AND commit_id = '{changed}'"
        ))[0]
            .parse()
            .unwrap();
        for (key, n) in calls_of(&sb, id) {
            *expected.entry(key).or_insert(0.0) += n;
        }
    }
    assert!(!expected.is_empty(), "the change called no driver");
    for ((driver, operation), n) in &expected {
        let name = format!(
            "gitplane_driver_calls_total{{driver=\"{driver}\",operation=\"{operation}\",outcome=\"done\"}}"
        );
        assert_eq!(moved(&name), *n, "{name}");
    }
    // Two environments started deployments of each of the two commits.
    assert_eq!(moved("gitplane_push_to_start_seconds_count"), 2.0);

    match promtool_check(&after_text) {
        // Without promtool this check alone is left out (the metrics' values are checked
        // above); the documented rules have a test of their own, ignored without it.
        None => {
            #[cfg(promtool)]
            panic!("promtool was on PATH when the tests were built, but does not run");
        }
        Some((ok, said)) => {
            assert!(ok, "promtool check metrics: {said}\n{after_text}");
            assert!(promtool_check(&before_text).unwrap().0);
        }
    }
}

#[test]
fn health_checks_answer_and_the_page_is_read_only() {
    let sb = Sandbox::template();
    let port = free_port();
    let config = host_config(&sb, &format!("http: {{listen: 127.0.0.1:{port}}}\n"));
    let _daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(get(&format!("{base}/healthz"), &[]), (200, "ok\n".into()));
    assert_eq!(get(&format!("{base}/readyz"), &[]), (200, "ready\n".into()));
    // Nothing but the webhook takes a POST.
    let (status, _) = post(&format!("{base}/metrics"), &[], b"");
    assert_eq!(status, 405);
    // Webhooks are off without a secret.
    let (status, body) = post(&format!("{base}/hooks/git"), &[], b"{}");
    assert_eq!(status, 404);
    assert!(body.contains("webhook_secret_file"), "{body}");
}

/// A config whose repository is the sandbox's origin fetched every 10 minutes, and a daemon
/// that polls its mirror every 10 minutes too: only a webhook makes it see a push soon.
fn slow_remote_config(sb: &Sandbox, port: u16, secret_file: &Path) -> PathBuf {
    let state = sb.root.join("remote-state/state.db");
    let path = sb.root.join("host.yaml");
    std::fs::write(
        &path,
        format!(
            "repo: {{url: \"file://{}\", interval: 10m}}\nstate: {}\nwatch_interval: 10m\n\
             http: {{listen: 127.0.0.1:{port}, webhook_secret_file: {}}}\n",
            sb.origin.display(),
            state.display(),
            secret_file.display()
        ),
    )
    .unwrap();
    path
}

pub(crate) fn hmac_hex(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Waits for `commit` to be deployed to both environments of the state at `state`; returns how
/// long that took, or `None` past `limit`.
fn deployed_within(state: &Path, commit: &str, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    gitplane_testkit::poll(limit, || {
        let n: i64 = crate::util::rows(
            &crate::util::open_db(state.exists().then_some(state)?),
            &format!(
                "SELECT COUNT(*) FROM deployment WHERE commit_id = '{commit}' AND status = 'succeeded'"
            ),
        )[0][0]
            .parse()
            .unwrap();
        (n == 2).then(|| started.elapsed())
    })
}

#[test]
fn a_signed_push_webhook_deploys_at_once_and_an_unsigned_one_does_nothing() {
    let sb = Sandbox::template();
    let port = free_port();
    let secret = "whsec-7d1f0c2a9e";
    let secret_file = sb.root.join("webhook-secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    let config = slow_remote_config(&sb, port, &secret_file);
    let state = sb.root.join("remote-state/state.db");
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    assert!(deployed_within(&state, &sb.head(), Duration::from_secs(20)).is_some());
    let hook = format!("http://127.0.0.1:{port}/hooks/git");
    let body = br#"{"ref":"refs/heads/main","after":"0000"}"#;

    // Each forge's way of signing, one push each.
    let forges: [(&str, Vec<(&str, String)>); 3] = [
        (
            "github",
            vec![
                ("X-GitHub-Event", "push".into()),
                (
                    "X-Hub-Signature-256",
                    format!("sha256={}", hmac_hex(secret, body)),
                ),
            ],
        ),
        (
            "gitea",
            vec![
                ("X-Gitea-Event", "push".into()),
                ("X-Gitea-Signature", hmac_hex(secret, body)),
            ],
        ),
        (
            "gitlab",
            vec![
                ("X-Gitlab-Event", "Push Hook".into()),
                ("X-Gitlab-Token", secret.into()),
            ],
        ),
    ];
    for (i, (forge, headers)) in forges.iter().enumerate() {
        sb.edit(
            "definitions/redis.yaml",
            &format!("port: {}", 6379 + i),
            &format!("port: {}", 6380 + i),
        );
        let pushed = sb.commit(&format!("A push announced by {forge}"));

        // Unsigned, wrongly signed, signed with another secret: 401, and nothing is fetched.
        let wrong = [
            vec![("X-GitHub-Event", "push".to_owned())],
            vec![
                ("X-GitHub-Event", "push".to_owned()),
                (
                    "X-Hub-Signature-256",
                    format!("sha256={}", hmac_hex("guess", body)),
                ),
            ],
            vec![("X-Gitlab-Token", "guess".to_owned())],
            vec![("X-Gitea-Signature", "not-hex".to_owned())],
        ];
        for headers in &wrong {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let (status, _) = post(&hook, &h, body);
            assert_eq!(status, 401, "{forge}: {headers:?}");
        }
        assert_eq!(
            deployed_within(&state, &pushed, Duration::from_millis(1500)),
            None,
            "{forge}: a refused webhook made the daemon fetch"
        );

        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let sent = Instant::now();
        let (status, said) = post(&hook, &h, body);
        assert_eq!(status, 202, "{forge}: {said}");
        let took = deployed_within(&state, &pushed, Duration::from_secs(10))
            .map(|_| sent.elapsed())
            .unwrap_or_else(|| panic!("{forge}: not deployed:\n{}", daemon.log()));
        eprintln!("{forge}: webhook to both environments deployed in {took:?}");
        // Typically under 100 ms. The bound, far below the 10-minute fetch interval, leaves room
        // for a git fetch on a loaded CI machine (once 1.3 s).
        assert!(
            took < Duration::from_secs(3),
            "{forge}: the webhook's push took {took:?} to deploy"
        );
    }
    // The secret appears in no log line.
    assert!(!daemon.log().contains(secret));
}

#[test]
fn a_listener_other_hosts_can_reach_needs_a_token() {
    let sb = Sandbox::template();
    let port = free_port();

    // No token: the daemon refuses to start, says where and why, and changes nothing.
    let config = host_config(&sb, &format!("http:\n  listen: 0.0.0.0:{port}\n"));
    let out = Command::new(env!("CARGO_BIN_EXE_gitplane"))
        .args(["daemon", "--config", config.to_str().unwrap()])
        .env_remove("GITPLANE_CONFIG")
        .output()
        .expect("run the daemon");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{}:4", config.display())) && stderr.contains("token_file"),
        "{stderr}"
    );
    assert!(!sb.state.exists(), "a refused start created the state");
    // `validate` says the same, so a bad host config is caught before a restart.
    sb.gitplane(&["validate", "--config", config.to_str().unwrap()])
        .fails()
        .stderr_has("needs a token");

    // With a token: every route but the health checks and the webhook wants it.
    let token = "tok-3b9d27c4f1e8a6";
    let token_file = sb.root.join("http-token");
    std::fs::write(&token_file, token).unwrap();
    let config = host_config(
        &sb,
        &format!(
            "http:\n  listen: 0.0.0.0:{port}\n  token_file: {}\n",
            token_file.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    // The gauges below come from state: wait for the first deployment to record it.
    wait_deployed(&sb, &sb.head(), &ENVS, Duration::from_secs(20));
    let base = format!("http://127.0.0.1:{port}");
    let bearer = format!("Bearer {token}");
    assert_eq!(get(&format!("{base}/metrics"), &[]).0, 401);
    assert_eq!(
        get(
            &format!("{base}/metrics"),
            &[("Authorization", "Bearer guess")]
        )
        .0,
        401
    );
    let (status, text) = get(&format!("{base}/metrics"), &[("Authorization", &bearer)]);
    assert_eq!(status, 200);
    assert!(text.contains("gitplane_resources"));
    assert_eq!(get(&format!("{base}/"), &[]).0, 401);
    assert_eq!(get(&format!("{base}/healthz"), &[]).0, 200);
    assert_eq!(get(&format!("{base}/readyz"), &[]).0, 200);
    // A browser is sent to sign in, and the token becomes a cookie.
    let (status, _) = get(&format!("{base}/"), &[("Accept", "text/html")]);
    assert_eq!(status, 303);
    let mut response = client()
        .post(format!("{base}/login"))
        .header("Content-Type", "application/x-www-form-urlencoded")
        .send(format!("token={token}"))
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let set_cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a cookie")
        .to_owned();
    let _ = response.body_mut().read_to_string();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );
    let cookie = set_cookie.split(';').next().unwrap().to_owned();
    assert_eq!(get(&format!("{base}/"), &[("Cookie", &cookie)]).0, 200);
    let (status, _) = post(
        &format!("{base}/login"),
        &[("Content-Type", "application/x-www-form-urlencoded")],
        b"token=guess",
    );
    assert_eq!(status, 401);
    assert!(!daemon.log().contains(token));
}

#[test]
fn a_missing_token_file_is_a_config_error_at_its_line() {
    let sb = Sandbox::template();
    let config = host_config(
        &sb,
        "http:\n  listen: 127.0.0.1:9470\n  token_file: /nonexistent/gitplane-token\n",
    );
    sb.gitplane(&["validate", "--config", config.to_str().unwrap()])
        .fails()
        .stderr_has(&format!("{}:5", config.display()))
        .stderr_has("token_file /nonexistent/gitplane-token does not exist");
    let config = host_config(&sb, "http: {listen: \"localhost\"}\n");
    sb.gitplane(&["validate", "--config", config.to_str().unwrap()])
        .fails()
        .stderr_has(&format!("{}:3", config.display()))
        .stderr_has("is not an address and port");
    // Relative paths and both sources at once are refused too.
    let config = host_config(
        &sb,
        "http:\n  listen: 127.0.0.1:9470\n  webhook_secret_file: secret.txt\n",
    );
    sb.gitplane(&["validate", "--config", config.to_str().unwrap()])
        .fails()
        .stderr_has("must be an absolute path");
}

/// The scrape config docs/service.md gives is one Prometheus accepts (the alert rules it points
/// to have a test of their own: metrics.rs).
#[test]
#[cfg_attr(
    not(promtool),
    ignore = "promtool is not installed (Debian's prometheus package)"
)]
fn the_documented_scrape_config_passes_promtool() {
    if Command::new("promtool").arg("--version").output().is_err() {
        eprintln!("skipped: promtool is not installed (Debian's prometheus package)");
        return;
    }
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/service.md"))
        .expect("docs/service.md");
    let block_after = |marker: &str| -> String {
        let from = page
            .find(marker)
            .unwrap_or_else(|| panic!("{marker} in docs/service.md"));
        let rest = &page[from..];
        let start = rest.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
        let end = rest[start..].find("```").expect("the block's end");
        rest[start..start + end].to_owned()
    };
    let dir = tempfile::tempdir().unwrap();

    // The scrape config, with its token file where it says.
    let scrape = block_after("A scrape\nconfig:");
    let token = dir.path().join("gitplane-token");
    std::fs::write(&token, "t").unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        scrape.replace("/etc/prometheus/gitplane-token", token.to_str().unwrap()),
    )
    .unwrap();
    let out = Command::new("promtool")
        .args(["check", "config", "--syntax-only"])
        .arg(&config)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
}

#[test]
fn the_token_and_webhook_secret_come_from_a_store_and_rotate_on_sighup() {
    let sb = Sandbox::template();
    let port = free_port();
    let secrets = sb.root.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    std::fs::write(secrets.join("http-token"), "tok-first-81c2").unwrap();
    std::fs::write(secrets.join("webhook"), "hook-5e07a3").unwrap();
    let config = host_config(
        &sb,
        &format!(
            "secret_stores:\n  local: {{dir: {}}}\nhttp:\n  listen: 127.0.0.1:{port}\n  \
             token_secret: {{store: local, ref: http-token}}\n  \
             webhook_secret: {{store: local, ref: webhook}}\n",
            secrets.display()
        ),
    );
    let daemon = Daemon::start(&sb, &["--config", config.to_str().unwrap()]);
    let base = format!("http://127.0.0.1:{port}");
    let metrics = |token: &str| {
        get(
            &format!("{base}/metrics"),
            &[("Authorization", &format!("Bearer {token}"))],
        )
        .0
    };
    assert_eq!(metrics("tok-first-81c2"), 200);
    let hook = |secret: &str| {
        post(
            &format!("{base}/hooks/git"),
            &[("X-Gitlab-Event", "Push Hook"), ("X-Gitlab-Token", secret)],
            b"{}",
        )
        .0
    };
    assert_eq!(hook("hook-5e07a3"), 202);

    // Rotated in the store: SIGHUP makes the listener read both again.
    std::fs::write(secrets.join("http-token"), "tok-second-4d9f").unwrap();
    std::fs::write(secrets.join("webhook"), "hook-b41c66").unwrap();
    let status = Command::new("kill")
        .args(["-HUP", &daemon.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    daemon.wait_for_log("host config reloaded", Duration::from_secs(10));
    assert_eq!(metrics("tok-first-81c2"), 401);
    assert_eq!(metrics("tok-second-4d9f"), 200);
    assert_eq!(hook("hook-5e07a3"), 401);
    assert_eq!(hook("hook-b41c66"), 202);
    let log = daemon.log();
    for secret in [
        "tok-first-81c2",
        "tok-second-4d9f",
        "hook-5e07a3",
        "hook-b41c66",
    ] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
}
