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
use crate::util::Sandbox;

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
