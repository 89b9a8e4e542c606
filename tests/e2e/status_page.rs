//! The daemon's status page in a real headless Chromium (through chromedriver): it follows a
//! `git push` without a reload, draws every resource of an environment, and a resource's
//! details show its outputs and never a secret value. And its JSON API at 5 000 resources.
//!
//! The browser tests need /usr/bin/chromium and chromedriver; without them they are reported
//! as ignored. `GITPLANE_SCREENSHOT=1` saves the page as docs/status-page.png.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gitplane_testkit::eventually;
use gitplane_testkit::webdriver::{Browser, Chromedriver};
use serde_json::{Value, json};

use crate::daemon::{Daemon, repo_args, wait_deployed};
use crate::util::{Definition, Sandbox};

/// A secret output of the redis definition below: it must never reach the page.
const REDIS_SECRET: &str = "page-secret-7f3a9c";
/// A secret of the template's base-env (echoed as a secret output).
const BASE_ENV_SECRET: &str = "dev-password-change-me";

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}

/// The daemon on the sandbox's bare repository, its HTTP listener on a free port.
fn start_daemon(sb: &Sandbox) -> (Daemon, String) {
    start_daemon_with(sb, "")
}

/// Like [`start_daemon`], with more `http:` settings (indented lines).
fn start_daemon_with(sb: &Sandbox, http: &str) -> (Daemon, String) {
    let port = free_port();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        format!("http:\n  listen: 127.0.0.1:{port}\n{http}"),
    )
    .unwrap();
    let mut args = repo_args(sb);
    args.extend(["--config".to_owned(), config.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(sb, &args);
    (daemon, format!("http://127.0.0.1:{port}"))
}

/// A GET: the status and the body as JSON (`Value::Null` when it is not JSON), and how long
/// the whole answer took.
fn get(url: &str) -> (u16, Value, Duration) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into();
    let started = Instant::now();
    let mut response = agent
        .get(url)
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let text = response
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_to_string()
        .unwrap_or_else(|e| panic!("GET {url}: reading the body: {e}"));
    let took = started.elapsed();
    (
        response.status().as_u16(),
        serde_json::from_str(&text).unwrap_or(Value::Null),
        took,
    )
}

/// The template, with redis provisioned by the `template` driver: a non-secret host and a
/// secret password among its outputs.
fn sandbox_with_secret_outputs() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    sb.write(
        "definitions/redis.yaml",
        &format!(
            "apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: redis
entity:
  name: redis
  type: redis
  driver_type: template
  driver_inputs:
    values:
      templates:
        outputs: |
          host: redis.page.internal
          port: 6379
    secrets:
      templates:
        outputs: |
          password: {REDIS_SECRET}
  criteria:
    - {{}}
"
        ),
    );
    sb.commit("Redis through the template driver, with a password");
    sb
}

// ---------------------------------------------------------------------------------------------
// The browser

/// chromedriver: the build found Chromium and chromedriver (`cfg(chromium)`), so one that does
/// not start is a failure, not a skip.
fn chromedriver() -> Chromedriver {
    Chromedriver::start().unwrap_or_else(|why| panic!("chromedriver: {why}"))
}

fn script(browser: &Browser, js: &str) -> Value {
    browser
        .execute(js)
        .unwrap_or_else(|e| panic!("script {js:?}: {e}"))
}

fn screenshot_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/status-page.png")
}

/// Whether this run saves screenshots into docs/ (`scripts/status-page-screenshots.sh`).
fn screenshots() -> bool {
    std::env::var_os("GITPLANE_SCREENSHOT").is_some_and(|v| v == "1")
}

/// Saves the element `css` (or the window, for `None`) as docs/`name`, when [`screenshots`].
fn save_screenshot(browser: &Browser, css: Option<&str>, name: &str) {
    if !screenshots() {
        return;
    }
    let png = eventually(
        format!("a screenshot for {name}"),
        Duration::from_secs(10),
        || match css {
            Some(css) => browser.find(css).ok()?.screenshot().ok(),
            None => browser.screenshot().ok(),
        },
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::write(&path, png).unwrap();
    println!("saved {}", path.display());
}

/// Clicks the first element matching `css`, finding it again when the page redrew it between
/// the finding and the click (a refresh replaces the lists it draws).
fn click(browser: &Browser, css: &str) {
    eventually(format!("a click on {css}"), Duration::from_secs(10), || {
        browser.find(css).ok()?.click().ok()
    });
}

/// The text of the first element matching `css`, or `None` while there is none.
fn text_of(browser: &Browser, css: &str) -> Option<String> {
    browser.find(css).ok()?.text().ok()
}

/// Billing: a worker reading a queue whose values read a secret output, which is refused before
/// any driver call: the queue fails before it is made, and the worker is blocked.
fn add_failing_billing_app(sb: &Sandbox) -> String {
    sb.write(
        "definitions/queue.yaml",
        &Definition::new("queue", "humanitec/echo")
            .value("url: amqp://${resources.base-env#base-env.outputs.pgpassword}@queue")
            .yaml(),
    );
    sb.write(
        "workloads/billing/worker.yaml",
        "apiVersion: score.dev/v1b1
metadata:
  name: worker
containers:
  main:
    image: registry.example.com/billing/worker:1
    variables:
      QUEUE_URL: ${resources.jobs.url}
resources:
  jobs:
    type: queue
",
    );
    sb.commit("Billing: a worker and its job queue")
}

#[test]
#[cfg_attr(not(chromium), ignore = "Chromium and chromedriver are not installed")]
fn the_page_follows_a_push_draws_every_resource_and_shows_no_secret() {
    let driver = chromedriver();
    let sb = sandbox_with_secret_outputs();
    let first = sb.head();
    let (daemon, base) = start_daemon(&sb);
    wait_deployed(
        &sb,
        &first,
        &["development", "production"],
        Duration::from_secs(30),
    );
    let resources: Vec<String> =
        sb.column("SELECT guresid FROM resource WHERE env = 'development' ORDER BY guresid");
    let redis = sb
        .column("SELECT guresid FROM resource WHERE env = 'development' AND type = 'redis'")[0]
        .clone();

    let browser = driver.browser(1400, 900);
    browser.goto(&format!("{base}/#env=development")).unwrap();
    eventually("the deployments table", Duration::from_secs(15), || {
        (browser.count("#deployments tr[data-deployment]") > 0).then_some(())
    });

    // Every resource of the environment is a node of the graph.
    let drawn: Vec<String> = eventually("every node", Duration::from_secs(15), || {
        let nodes = browser.find_all("#graph [data-guresid]").ok()?;
        let mut ids = Vec::new();
        for n in nodes {
            ids.push(n.attr("data-guresid").ok()??);
        }
        ids.sort();
        (ids.len() == resources.len()).then_some(ids)
    });
    assert_eq!(drawn, resources);

    // A push shows up without a reload: the marker set on this page survives.
    script(
        &browser,
        "window.gitplaneMarker = 'set before the push'; return true;",
    );
    sb.edit(
        "definitions/base-env.yaml",
        "pgport: 5432\n      redis_host: redis.dev.internal",
        "pgport: 6432\n      redis_host: redis.dev.internal",
    );
    let second = sb.commit("Move the development database port");
    wait_deployed(&sb, &second, &["development"], Duration::from_secs(30));
    let id = sb.column(&format!(
        "SELECT id FROM deployment WHERE env = 'development' AND commit_id = '{second}'"
    ))[0]
        .clone();
    let row = format!("#deployments tr[data-deployment=\"{id}\"]");
    let shown_after = Instant::now();
    // Within the poll's 10 s: the event stream brought it.
    eventually("the new deployment's row", Duration::from_secs(5), || {
        (browser.count(&row) == 1).then_some(())
    });
    println!(
        "the new deployment showed {} ms after it was recorded",
        shown_after.elapsed().as_millis()
    );
    let row_text = browser.find(&row).unwrap().text().unwrap();
    assert!(row_text.contains(&second[..7]), "{row_text}");
    assert!(
        row_text.contains("Move the development database port"),
        "{row_text}"
    );
    assert_eq!(
        script(&browser, "return window.gitplaneMarker;"),
        json!("set before the push"),
        "the page was reloaded"
    );

    // A node's details: outputs shown, the secret output by name only.
    browser
        .find(&format!("#graph [data-guresid=\"{redis}\"]"))
        .unwrap()
        .click()
        .unwrap();
    eventually("the details of redis", Duration::from_secs(30), || {
        let explain = browser.count("#details-explain");
        let text = browser.find("#details").ok()?.text().ok()?;
        (explain == 1 && text.contains("redis.page.internal")).then_some(())
    });
    let source = browser.source().unwrap();
    for secret in [REDIS_SECRET, BASE_ENV_SECRET] {
        assert!(!source.contains(secret), "secret {secret:?} in the page");
    }
    assert_eq!(
        browser.count("#details [data-secret-output=\"password\"]"),
        1
    );

    if std::env::var_os("GITPLANE_SCREENSHOT").is_some_and(|v| v == "1") {
        let png = browser.screenshot().unwrap();
        std::fs::write(screenshot_path(), png).unwrap();
        println!("saved {}", screenshot_path().display());
    }
    drop(browser);

    // The same through the API: the names of secret outputs, never their values.
    let (status, body, _) = get(&format!("{base}/api/envs/development/resources/{redis}"));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outputs"]["host"], "redis.page.internal");
    assert_eq!(body["secret_outputs"], json!(["password"]));
    assert!(
        body["explain"].as_str().is_some_and(|t| t.contains(&redis)),
        "{body}"
    );
    let text = body.to_string();
    assert!(!text.contains(REDIS_SECRET) && !text.contains(BASE_ENV_SECRET));
    drop(daemon);
}

/// With a token, a browser signs in once and the page (its event stream included) reads the
/// API through the cookie.
#[test]
#[cfg_attr(not(chromium), ignore = "Chromium and chromedriver are not installed")]
fn with_a_token_the_page_signs_in_and_streams_through_the_cookie() {
    let driver = chromedriver();
    let sb = Sandbox::template();
    let token = "page-token-5b1d0e";
    let token_file = sb.root.join("http.token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let (_daemon, base) =
        start_daemon_with(&sb, &format!("  token_file: {}\n", token_file.display()));
    assert_eq!(get(&format!("{base}/api/overview")).0, 401);

    let browser = driver.browser(1400, 900);
    browser.goto(&format!("{base}/")).unwrap();
    let url = browser.current_url().unwrap();
    let path = url.split(['?', '#']).next().unwrap_or_default();
    assert!(path.ends_with("/login"), "{url}");
    browser
        .find("form [name=\"token\"]")
        .unwrap()
        .send_keys(token)
        .unwrap();
    browser.find("form button").unwrap().click().unwrap();
    eventually("the signed-in page, live", Duration::from_secs(15), || {
        let rows = browser.count("#deployments tr[data-deployment]");
        let live = browser.count("#live[data-state=\"live\"]");
        (rows > 0 && live == 1).then_some(())
    });
    assert!(!browser.source().unwrap().contains(token));
}

// ---------------------------------------------------------------------------------------------
// The API at scale

const APPS: usize = 10;
const WORKLOADS_PER_APP: usize = 250;

/// `APPS` apps of `WORKLOADS_PER_APP` workloads, each with a private redis: 5 000 resources.
fn write_estate(sb: &Sandbox) {
    sb.write(
        "environments/development.yaml",
        "type: development\nimplicit_resources: []\n",
    );
    for (name, res_type, values) in [
        ("workload", "workload", "namespace: ${context.app.id}"),
        ("redis", "redis", "host: redis.${context.app.id}.internal"),
    ] {
        sb.write(
            &format!("definitions/{name}.yaml"),
            &format!(
                "apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: {name}
entity:
  name: {name}
  type: {res_type}
  driver_type: humanitec/echo
  driver_inputs:
    values:
      {values}
  criteria:
    - {{}}
"
            ),
        );
    }
    for app in 0..APPS {
        for w in 0..WORKLOADS_PER_APP {
            sb.write(
                &format!("workloads/app-{app:02}/web-{w:03}.yaml"),
                &format!(
                    "apiVersion: score.dev/v1b1
metadata:
  name: web-{w:03}
containers:
  main:
    image: registry.example.com/web:1
    variables:
      CACHE_HOST: ${{resources.cache.host}}
resources:
  cache:
    type: redis
"
                ),
            );
        }
    }
}

#[test]
fn the_graph_api_offers_apps_of_a_five_thousand_resource_environment() {
    let sb = Sandbox::new();
    write_estate(&sb);
    let commit = sb.commit("Ten apps of 250 workloads");
    let started = Instant::now();
    sb.gitplane(&["apply"]).ok();
    println!(
        "apply of {} resources: {} ms",
        APPS * WORKLOADS_PER_APP * 2,
        started.elapsed().as_millis()
    );
    let total = sb.count("SELECT COUNT(*) FROM resource WHERE env = 'development'");
    assert_eq!(total, 5_000);
    let (_daemon, base) = start_daemon(&sb);
    wait_deployed(&sb, &commit, &["development"], Duration::from_secs(30));
    let graph = format!("{base}/api/envs/development/graph");

    // Too many to draw at once: the apps to choose from.
    let (status, all, took) = get(&graph);
    println!("graph, no filter: {} ms", took.as_millis());
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["too_large"], true);
    assert_eq!(all["total"], 5_000);
    assert_eq!(all["nodes"], json!([]));
    let apps = all["apps"].as_array().unwrap();
    assert_eq!(apps.len(), APPS);
    assert!(
        apps.iter().all(|a| a["count"] == 2 * WORKLOADS_PER_APP),
        "{apps:?}"
    );
    assert_eq!(apps[3]["name"], "app-03");

    // One app, though over the limit, is drawn whole: every node placed.
    let (status, one, took) = get(&format!("{graph}?app=app-03"));
    println!(
        "graph of one app ({} nodes): {} ms",
        2 * WORKLOADS_PER_APP,
        took.as_millis()
    );
    assert_eq!(status, 200, "{one}");
    assert_eq!(one["too_large"], false);
    let nodes = one["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 2 * WORKLOADS_PER_APP);
    assert!(
        nodes
            .iter()
            .all(|n| n["app"] == "app-03" && n["x"].is_f64())
    );
    assert_eq!(one["edges"].as_array().unwrap().len(), WORKLOADS_PER_APP);
    let width = one["width"].as_f64().unwrap();
    assert!(nodes.iter().all(|n| n["x"].as_f64().unwrap() <= width));
    // One app's answer reads that app alone: the app list and types are asked apart.
    for key in ["apps", "types", "total"] {
        assert!(one.get(key).is_none(), "{key} in one app's answer");
    }
    let (status, census, took) = get(&format!("{base}/api/envs/development/apps"));
    println!("the environment's apps: {} ms", took.as_millis());
    assert_eq!(status, 200, "{census}");
    assert_eq!(census["total"], 5_000);
    assert_eq!(census["apps"], all["apps"]);
    assert_eq!(census["types"], all["types"]);
    let (status, redis, _) = get(&format!("{base}/api/envs/development/apps?type=redis"));
    assert_eq!(status, 200, "{redis}");
    assert!(
        redis["apps"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["count"] == WORKLOADS_PER_APP),
        "{redis}"
    );
    let (status, missing, _) = get(&format!("{base}/api/envs/staging/apps"));
    assert_eq!(status, 404, "{missing}");

    // Narrowed by type and text, no app is needed.
    let (status, found, took) = get(&format!("{graph}?type=workload&q=WEB-007"));
    println!("graph, type and search: {} ms", took.as_millis());
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["too_large"], false);
    assert_eq!(found["nodes"].as_array().unwrap().len(), APPS);

    let (status, overview, took) = get(&format!("{base}/api/overview"));
    println!("overview: {} ms", took.as_millis());
    assert_eq!(status, 200, "{overview}");
    let deployments = &overview["environments"][0]["deployments"];
    let applied = deployments
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["commit"] == commit.as_str() && d["created"] == 5_000)
        .unwrap_or_else(|| panic!("the apply's deployment: {deployments}"));
    assert_eq!(applied["calls"], 5_000, "one driver call per resource");
    assert_eq!(applied["summary"], "Ten apps of 250 workloads");
    assert_eq!(applied["author"], "t");

    let workload = sb
        .column("SELECT guresid FROM resource WHERE app = 'app-03' AND res_id = 'modules.web-007'")
        [0]
    .clone();
    let (status, resource, took) =
        get(&format!("{base}/api/envs/development/resources/{workload}"));
    println!("one resource with explain: {} ms", took.as_millis());
    assert_eq!(status, 200, "{resource}");
    assert_eq!(resource["links"].as_array().unwrap().len(), 1);
    assert!(resource["explain"].is_string(), "{resource}");
    // The record without explain, at once; explain apart.
    let (status, quick, took) = get(&format!(
        "{base}/api/envs/development/resources/{workload}?explain=false"
    ));
    println!("one resource without explain: {} ms", took.as_millis());
    assert_eq!(status, 200, "{quick}");
    assert_eq!(
        (&quick["explain"], &quick["explain_error"]),
        (&Value::Null, &Value::Null)
    );
    assert_eq!(
        quick["links"], resource["links"],
        "the other ends named as before"
    );
    assert_eq!(quick["links"][0]["other"]["type"], "redis", "{quick}");
    let (status, explained, _) = get(&format!(
        "{base}/api/envs/development/resources/{workload}/explain"
    ));
    assert_eq!(status, 200, "{explained}");
    assert_eq!(explained["explain"], resource["explain"]);

    let (status, missing, _) = get(&format!("{base}/api/envs/staging/graph"));
    assert_eq!(status, 404, "{missing}");
}

/// An open event stream ends when the daemon stops, so SIGTERM does not wait on the page.
#[test]
fn an_open_event_stream_ends_when_the_daemon_stops() {
    let sb = Sandbox::template();
    let (mut daemon, base) = start_daemon(&sb);
    let address = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET /api/events HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("event: hello") {
        let n = stream.read(&mut buf).expect("the hello event");
        assert!(
            n > 0,
            "the stream closed early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&seen).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");

    let (code, took) = daemon.terminate();
    assert_eq!(code, Some(0), "{}", daemon.log());
    // The listener gives open requests 2 s before it is cut off: a stream that did not end
    // would hold the exit that long.
    assert!(
        took < Duration::from_millis(1_500),
        "the daemon took {took:?} to stop"
    );
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
            Err(e) => panic!("the stream did not end: {e}"),
        }
    }
    // The last chunk of a chunked body: the response ended, not the connection alone.
    assert!(String::from_utf8_lossy(&seen).ends_with("0\r\n\r\n"));
}

/// What the CLI knows and the page used to hide: an environment pinned with a commit held back
/// names that commit in a banner; an app whose new resources failed is marked failed in the app
/// list (a colour and a word); its blocked workload, never recorded, is drawn as a ghost with
/// the reason; the list view sorts; back returns to the view before.
#[test]
#[cfg_attr(not(chromium), ignore = "Chromium and chromedriver are not installed")]
fn the_page_shows_a_pin_a_failed_app_and_its_blocked_workload() {
    let driver = chromedriver();
    let sb = Sandbox::applied();
    sb.gitplane(&[
        "pin",
        "--env",
        "production",
        "--reason",
        "audit freeze",
        "--by",
        "alice",
    ])
    .ok();
    let pinned_at = sb.head();
    let held_back = add_failing_billing_app(&sb);
    sb.gitplane(&["apply"]).fails();
    // What state says, which the page must show.
    assert_eq!(
        sb.rows(
            "SELECT o.type, o.status FROM operation o JOIN deployment d ON d.id = o.deployment_id
             WHERE d.env = 'development' AND o.app = 'billing' AND o.type != 'base-env'
             ORDER BY o.type"
        ),
        [["queue", "failed"], ["workload", "skipped"]]
    );
    assert_eq!(
        sb.count(
            "SELECT COUNT(*) FROM resource WHERE app = 'billing' AND type IN ('queue', 'workload')"
        ),
        0,
        "neither is recorded"
    );
    assert_eq!(
        sb.column("SELECT waiting_commit FROM env_pin WHERE env = 'production'"),
        std::slice::from_ref(&held_back)
    );
    let worker = sb.column(
        "SELECT o.guresid FROM operation o WHERE o.app = 'billing' AND o.type = 'workload' \
         AND o.status = 'skipped' LIMIT 1",
    )[0]
    .clone();

    let (_daemon, base) = start_daemon(&sb);
    let browser = driver.browser(1200, 760);

    // The pin banner names who, why and the held-back commit.
    browser.goto(&format!("{base}/#env=production")).unwrap();
    let banner = eventually("the pin banner", Duration::from_secs(15), || {
        text_of(&browser, "[data-banner=\"pin\"]")
    });
    assert!(banner.contains("Pinned"), "{banner}");
    assert!(banner.contains(&pinned_at[..7]), "{banner}");
    assert!(
        banner.contains("alice") && banner.contains("audit freeze"),
        "{banner}"
    );
    assert!(banner.contains(&held_back[..7]), "{banner}");
    assert!(
        banner.contains("Billing: a worker and its job queue"),
        "the held-back commit's message: {banner}"
    );
    assert_eq!(browser.count(&format!("[data-waiting=\"{held_back}\"]")), 1);
    save_screenshot(&browser, Some("#side"), "status-page-pin.png");

    // Development: billing is failed in the app list, first, with the word; shop is ready.
    click(&browser, "#envs button[data-env=\"development\"]");
    let apps = eventually("the app list", Duration::from_secs(15), || {
        let buttons = browser.find_all("#apps [data-app]").ok()?;
        let mut apps = Vec::new();
        for b in buttons {
            apps.push((
                b.attr("data-app").ok()??,
                b.attr("data-status").ok()??,
                b.text().ok()?,
            ));
        }
        (apps.len() == 2).then_some(apps)
    });
    assert_eq!(apps[0].0, "billing", "failed first: {apps:?}");
    assert_eq!(apps[0].1, "failed", "{apps:?}");
    assert!(
        apps[0].2.contains("failed"),
        "a word, not colour alone: {apps:?}"
    );
    assert_eq!((apps[1].0.as_str(), apps[1].1.as_str()), ("shop", "ready"));
    save_screenshot(&browser, Some("#apps-section"), "status-page-apps.png");

    // Its graph: the blocked worker is a ghost, with the reason.
    click(&browser, "#apps [data-app=\"billing\"]");
    let ghost = format!("#graph [data-guresid=\"{worker}\"]");
    let (reason, status) = eventually("the ghost of the worker", Duration::from_secs(15), || {
        let node = browser.find(&ghost).ok()?;
        (node.attr("data-ghost").ok()?? == "true").then_some(())?;
        Some((
            node.attr("data-reason").ok()??,
            node.attr("data-status").ok()??,
        ))
    });
    assert_eq!(status, "blocked");
    let recorded_reason = sb.column(&format!(
        "SELECT error FROM operation WHERE guresid = '{worker}' AND status = 'skipped'"
    ));
    assert_eq!(
        Some(&reason),
        recorded_reason.first(),
        "the reason state records"
    );
    let said = script(
        &browser,
        &format!("return document.querySelector('{ghost} text.reason').textContent;"),
    );
    assert!(
        said.as_str().is_some_and(|t| t.starts_with("blocked: ")),
        "the box says it is blocked, and why: {said}"
    );
    // The failed queue is drawn too, and the link between them.
    assert_eq!(browser.count("#graph .node.ghost"), 2);
    assert_eq!(
        browser.count(&format!("#graph .edge[data-consumer=\"{worker}\"]")),
        1
    );
    // One app drawn, the environment still listed: both apps (billing chosen), the filters,
    // and how many of the environment's resources are drawn (its ghosts counted).
    let total = sb.count("SELECT COUNT(*) FROM resource WHERE env = 'development'") as usize + 2;
    let environment_listed = |what: &str| {
        eventually(what, Duration::from_secs(10), || {
            let listed = browser.count("#apps [data-app]") == 2
                && browser.count("#apps [data-app=\"billing\"].chosen") == 1
                && browser.count("#filter-app option") == 3
                && browser.count("#filter-type option[value=\"queue\"]") == 1;
            let info = text_of(&browser, "#graph-info")?;
            (listed && info == format!("3 of {total} resources")).then_some(())
        })
    };
    environment_listed("billing chosen among the environment's apps");
    click(&browser, &ghost);
    let details = eventually("the ghost's details", Duration::from_secs(10), || {
        text_of(&browser, "#details [data-error]")
    });
    assert_eq!(details, reason);
    save_screenshot(&browser, None, "status-page-ghost.png");
    click(&browser, "#details-close");

    // The list view of every app, sorted by status (worst first), then by app descending.
    click(&browser, "#apps [data-app=\"billing\"]");
    eventually("all apps again", Duration::from_secs(10), || {
        (!browser.current_url().ok()?.contains("app=")).then_some(())
    });
    click(&browser, "#mode-list");
    let column = |n: usize| -> Vec<String> {
        eventually("the list's rows", Duration::from_secs(10), || {
            let cells = browser
                .find_all(&format!("#list tbody tr td:nth-child({n})"))
                .ok()?;
            let mut out = Vec::new();
            for c in cells {
                out.push(c.text().ok()?);
            }
            (out.len() == total).then_some(out)
        })
    };
    let statuses = column(4);
    assert!(statuses[0].starts_with("failed"), "{statuses:?}");
    assert!(statuses[1].starts_with("blocked"), "{statuses:?}");
    assert!(statuses[2..].iter().all(|s| s == "ready"), "{statuses:?}");
    save_screenshot(&browser, None, "status-page-list.png");
    click(&browser, "#list th[data-sort=\"app\"]");
    let by_app = eventually("sorted by app", Duration::from_secs(10), || {
        let apps = column(1);
        (apps[0] == "billing").then_some(apps)
    });
    let mut sorted = by_app.clone();
    sorted.sort();
    assert_eq!(by_app, sorted);
    click(&browser, "#list th[data-sort=\"app\"]");
    let descending = eventually("sorted by app, descending", Duration::from_secs(10), || {
        let apps = column(1);
        (apps[0] == "shop").then_some(apps)
    });
    sorted.reverse();
    assert_eq!(descending, sorted);

    // Back: the list by app ascending, then by status, then the graph.
    browser.back().unwrap();
    eventually("back to the list by app", Duration::from_secs(10), || {
        (browser.count("#list th[data-sort=\"app\"][aria-sort=\"ascending\"]") == 1).then_some(())
    });
    browser.back().unwrap();
    browser.back().unwrap();
    eventually("back to the graph", Duration::from_secs(10), || {
        let graph_shown = browser
            .find("#graph-box")
            .ok()?
            .attr("hidden")
            .ok()?
            .is_none();
        (graph_shown && browser.count("#graph .node") == total).then_some(())
    });
    assert!(!browser.current_url().unwrap().contains("view=list"));
    // And back once more: billing's graph, as it was.
    browser.back().unwrap();
    eventually("back to billing's graph", Duration::from_secs(10), || {
        (browser.count("#graph .node") == 3 && browser.count(&ghost) == 1).then_some(())
    });
    // Opened at billing's graph, the page lists the environment as well.
    browser
        .goto(&format!("{base}/?again#env=development&app=billing"))
        .unwrap();
    eventually("billing's graph, opened", Duration::from_secs(10), || {
        (browser.count("#graph .node") == 3 && browser.count(&ghost) == 1).then_some(())
    });
    environment_listed("billing's graph opened among the environment's apps");
}

/// The sign-in page is styled (its own stylesheet, served without the token) and says where
/// the token comes from; a wrong token shows the page again, saying so.
#[test]
#[cfg_attr(not(chromium), ignore = "Chromium and chromedriver are not installed")]
fn the_login_page_names_the_token_file() {
    let driver = chromedriver();
    let sb = Sandbox::template();
    let token_file = sb.root.join("http.token");
    std::fs::write(&token_file, "page-token-0c44e1\n").unwrap();
    let (_daemon, base) =
        start_daemon_with(&sb, &format!("  token_file: {}\n", token_file.display()));
    let browser = driver.browser(900, 620);
    browser.goto(&format!("{base}/")).unwrap();
    let text = eventually("the login page", Duration::from_secs(10), || {
        text_of(&browser, "main")
    });
    assert!(text.contains(&token_file.display().to_string()), "{text}");
    assert!(text.contains("http.token_file"), "{text}");
    let styled = script(
        &browser,
        "return getComputedStyle(document.querySelector('main')).borderRadius;",
    );
    assert_eq!(styled, json!("10px"), "the stylesheet applies");
    save_screenshot(&browser, None, "status-page-login.png");
    browser
        .find("form [name=\"token\"]")
        .unwrap()
        .send_keys("a-wrong-token")
        .unwrap();
    click(&browser, "form button");
    let problem = eventually("the wrong token said", Duration::from_secs(10), || {
        text_of(&browser, ".problem")
    });
    assert_eq!(problem, "Wrong token.");
}
