//! Headless Chromium for the status page's tests: chromedriver on a free port, and a blocking
//! client of the W3C WebDriver commands those tests use.
//!
//! Why not a WebDriver crate: the tests need a dozen commands, each one JSON request over HTTP,
//! and the client crates pull in `url`, `idna` and the ICU tables, whose derive macros change
//! `syn`'s features, so every crate built by `cargo run` would be built again by `cargo test`.
//! This client is `ureq` and `serde_json`, both already in the binary's build with the same
//! features.

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::eventually::poll;

/// Where Debian's `chromium` package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// The key under which WebDriver names an element (W3C WebDriver, "web element identifier").
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long one WebDriver command may take: a page load or a script included.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// chromedriver on a free port of 127.0.0.1, killed when dropped; each [`Browser`] it opens has
/// a profile of its own under a temporary directory removed with it.
pub struct Chromedriver {
    child: Child,
    url: String,
    profiles: tempfile::TempDir,
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Chromedriver {
    /// Starts chromedriver, or Err(why) when this machine has no Chromium or chromedriver, or it
    /// did not listen within 10 s.
    pub fn start() -> Result<Chromedriver, String> {
        if !Path::new(CHROMIUM).exists() {
            return Err(format!("{CHROMIUM} is not installed"));
        }
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("cannot find a free port: {e}"))?
            .port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start chromedriver: {e}"))?;
        let driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            profiles: tempfile::Builder::new()
                .prefix("gitplane-chromium-")
                .tempdir()
                .map_err(|e| format!("cannot create the browser's profile directory: {e}"))?,
        };
        poll(Duration::from_secs(10), || {
            TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()
        })
        .ok_or("chromedriver did not listen within 10 s")?;
        Ok(driver)
    }

    /// A headless Chromium session, `width`×`height` pixels; panics when Chromium does not start.
    pub fn browser(&self, width: u32, height: u32) -> Browser {
        let profile = tempfile::Builder::new()
            .prefix("profile-")
            .tempdir_in(self.profiles.path())
            .expect("a profile directory for the browser")
            .keep();
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    format!("--user-data-dir={}", profile.display()),
                    format!("--window-size={width},{height}"),
                ],
            },
        }}});
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(COMMAND_TIMEOUT))
            .build()
            .into();
        let session = send(
            &agent,
            "POST",
            &format!("{}/session", self.url),
            Some(capabilities),
        )
        .unwrap_or_else(|e| panic!("cannot start a Chromium session: {e}"));
        let id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("a new session without an id: {session}"))
            .to_owned();
        Browser {
            agent,
            session: format!("{}/session/{id}", self.url),
        }
    }
}

/// What chromedriver answered instead of a value: its error code (`no such element`,
/// `stale element reference`...) and message, or a transport failure.
#[derive(Debug)]
pub struct WebDriverError(pub String);

impl std::fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One browser session; closed when dropped.
pub struct Browser {
    agent: ureq::Agent,
    /// The session's URL, `http://127.0.0.1:PORT/session/ID`.
    session: String,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = send(&self.agent, "DELETE", &self.session, None);
    }
}

/// An element of the page, as long as the page keeps it (after that its commands fail with
/// `stale element reference`).
pub struct Element<'a> {
    browser: &'a Browser,
    id: String,
}

impl Browser {
    fn command(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WebDriverError> {
        send(
            &self.agent,
            method,
            &format!("{}{path}", self.session),
            body,
        )
    }

    /// Navigates to `url` and waits for the page to load.
    pub fn goto(&self, url: &str) -> Result<(), WebDriverError> {
        self.command("POST", "/url", Some(json!({ "url": url })))
            .map(drop)
    }

    /// Goes back one entry in the browser's history, as its back button does.
    pub fn back(&self) -> Result<(), WebDriverError> {
        self.command("POST", "/back", Some(json!({}))).map(drop)
    }

    /// The page's URL.
    pub fn current_url(&self) -> Result<String, WebDriverError> {
        string(self.command("GET", "/url", None)?)
    }

    /// The first element matching a CSS selector.
    pub fn find(&self, css: &str) -> Result<Element<'_>, WebDriverError> {
        let found = self.command("POST", "/element", Some(locator(css)))?;
        self.element(&found)
    }

    /// Every element matching a CSS selector, in document order.
    pub fn find_all(&self, css: &str) -> Result<Vec<Element<'_>>, WebDriverError> {
        match self.command("POST", "/elements", Some(locator(css)))? {
            Value::Array(found) => found.iter().map(|e| self.element(e)).collect(),
            other => Err(WebDriverError(format!("elements: not a list: {other}"))),
        }
    }

    /// How many elements match a CSS selector (0 when the query fails).
    pub fn count(&self, css: &str) -> usize {
        self.find_all(css).map_or(0, |found| found.len())
    }

    /// Runs `js` as a function body in the page and gives what it returns.
    pub fn execute(&self, js: &str) -> Result<Value, WebDriverError> {
        self.command(
            "POST",
            "/execute/sync",
            Some(json!({ "script": js, "args": [] })),
        )
    }

    /// The page's HTML as it is now (scripts' changes included).
    pub fn source(&self) -> Result<String, WebDriverError> {
        string(self.command("GET", "/source", None)?)
    }

    /// A PNG of the window.
    pub fn screenshot(&self) -> Result<Vec<u8>, WebDriverError> {
        use base64::Engine as _;
        let encoded = string(self.command("GET", "/screenshot", None)?)?;
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| WebDriverError(format!("screenshot: not base64: {e}")))
    }

    fn element(&self, found: &Value) -> Result<Element<'_>, WebDriverError> {
        match found[ELEMENT_KEY].as_str() {
            Some(id) => Ok(Element {
                browser: self,
                id: id.to_owned(),
            }),
            None => Err(WebDriverError(format!("not an element: {found}"))),
        }
    }
}

impl Element<'_> {
    fn command(
        &self,
        method: &str,
        what: &str,
        body: Option<Value>,
    ) -> Result<Value, WebDriverError> {
        self.browser
            .command(method, &format!("/element/{}{what}", self.id), body)
    }

    /// The value of an attribute, `None` when the element has no such attribute.
    pub fn attr(&self, name: &str) -> Result<Option<String>, WebDriverError> {
        match self.command("GET", &format!("/attribute/{name}"), None)? {
            Value::Null => Ok(None),
            value => string(value).map(Some),
        }
    }

    /// The text the element renders.
    pub fn text(&self) -> Result<String, WebDriverError> {
        string(self.command("GET", "/text", None)?)
    }

    pub fn click(&self) -> Result<(), WebDriverError> {
        self.command("POST", "/click", Some(json!({}))).map(drop)
    }

    /// A PNG of the element alone (scrolled into view), cropped to its box.
    pub fn screenshot(&self) -> Result<Vec<u8>, WebDriverError> {
        use base64::Engine as _;
        let encoded = string(self.command("GET", "/screenshot", None)?)?;
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| WebDriverError(format!("element screenshot: not base64: {e}")))
    }

    /// Types `text` into the element (an input).
    pub fn send_keys(&self, text: &str) -> Result<(), WebDriverError> {
        self.command("POST", "/value", Some(json!({ "text": text })))
            .map(drop)
    }
}

fn locator(css: &str) -> Value {
    json!({ "using": "css selector", "value": css })
}

fn string(value: Value) -> Result<String, WebDriverError> {
    match value {
        Value::String(s) => Ok(s),
        other => Err(WebDriverError(format!("not a string: {other}"))),
    }
}

/// One WebDriver command: the `value` of the answer, or the error it names.
fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<Value>,
) -> Result<Value, WebDriverError> {
    let fail = |e: &dyn std::fmt::Display| WebDriverError(format!("{method} {url}: {e}"));
    let started = Instant::now();
    let answer = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("DELETE", _) => agent.delete(url).call(),
        (_, Some(body)) => agent.post(url).send_json(body),
        (_, None) => agent.post(url).send_empty(),
    };
    let mut answer = answer.map_err(|e| fail(&e))?;
    let status = answer.status().as_u16();
    let body: Value = answer
        .body_mut()
        .with_config()
        .limit(64 << 20)
        .read_json()
        .map_err(|e| {
            fail(&format!(
                "{e} (HTTP {status} after {:?})",
                started.elapsed()
            ))
        })?;
    let value = body.get("value").cloned().unwrap_or(Value::Null);
    if (200..300).contains(&status) {
        return Ok(value);
    }
    Err(WebDriverError(format!(
        "{method} {url}: {}: {}",
        value["error"].as_str().unwrap_or("error"),
        value["message"].as_str().unwrap_or_default()
    )))
}
