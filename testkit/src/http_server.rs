//! A real HTTP server on 127.0.0.1 for tests: a handler closure answers each request on a thread
//! of its own, and the server keeps a log of every request it answered.
//!
//! Fake drivers ([`crate::DriverServer`]), webhook receivers and API stand-ins (Vault) are built
//! on it, so that each test server is only what it answers. A server that must send what
//! tiny_http cannot (a malformed response, a connection cut mid-body) stays a raw
//! `TcpListener` in its test.

use std::io::Read as _;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::eventually::eventually_or;

/// The largest request body a server reads; what a test sends is far smaller.
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// One request as the handler sees it: read whole, headers by name.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// The path and query, as sent (`/driver/0123abcd`, `/v1/secret/data/db?version=2`).
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// When the server had read the request, on the test's monotonic clock and by the wall
    /// clock (to compare with a daemon's log).
    pub arrived: Instant,
    pub arrived_at: SystemTime,
}

impl Request {
    /// The value of header `name` (any case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(field, _)| field.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The last segment of the path (a driver's GUResID), without the query.
    pub fn last_segment(&self) -> &str {
        let path = self.url.split('?').next().unwrap_or_default();
        path.rsplit('/').next().unwrap_or_default()
    }

    /// The body parsed as JSON; `Null` when empty or not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// What the handler answers.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// How long to wait before sending it (a slow server).
    pub delay: Duration,
    /// Send `Connection: close` and so end the connection after this answer: a client's next
    /// request then never meets a keep-alive connection the server is still reading.
    pub close: bool,
}

impl Reply {
    /// `status` with an empty body.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body: String::new(),
            delay: Duration::ZERO,
            close: false,
        }
    }

    /// `status` with `body` as text.
    pub fn text(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            body: body.into(),
            ..Reply::status(status)
        }
    }

    /// `status` with `body` as `application/json`.
    pub fn json(status: u16, body: &serde_json::Value) -> Reply {
        Reply::text(status, body.to_string()).header("Content-Type", "application/json")
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Reply {
        self.headers.push((name.to_owned(), value.into()));
        self
    }

    pub fn delay(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }

    pub fn close(mut self) -> Reply {
        self.close = true;
        self
    }
}

/// One request the server answered, with its answer.
#[derive(Debug, Clone)]
pub struct Logged {
    pub request: Request,
    pub status: u16,
    pub reply: Reply,
    /// When the answer was ready to send (after the handler and the reply's delay), taken
    /// before it leaves: a client may send its next request the moment it reads this one.
    pub answered: Instant,
}

type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// A tiny_http server on 127.0.0.1 (a free port) answering with a handler, one thread per
/// request (so a handler may block, and others still get answers); stops when dropped.
pub struct HttpServer {
    /// `http://127.0.0.1:PORT`, without a trailing slash.
    pub url: String,
    server: Arc<tiny_http::Server>,
    log: Arc<Log>,
}

/// The requests answered, and a condition variable told of each new one.
#[derive(Default)]
struct Log {
    answered: Mutex<Vec<Logged>>,
    grew: Condvar,
}

impl HttpServer {
    /// Starts a server answering every request with `handler`.
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> HttpServer {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0"));
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let log: Arc<Log> = Arc::default();
        let handler: Arc<Handler> = Arc::new(handler);
        let (incoming, shared_log) = (server.clone(), log.clone());
        thread::spawn(move || {
            // Ends when `drop` unblocks the server.
            for request in incoming.incoming_requests() {
                let (handler, log) = (handler.clone(), shared_log.clone());
                thread::spawn(move || answer(request, &*handler, &log));
            }
        });
        HttpServer {
            url: format!("http://127.0.0.1:{port}"),
            server,
            log,
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.server
            .server_addr()
            .to_ip()
            .expect("an IP address")
            .port()
    }

    /// Every request answered so far, in the order of the answers (each logged as it is sent).
    pub fn requests(&self) -> Vec<Logged> {
        lock(&self.log.answered).clone()
    }

    /// Blocks until `n` requests have been answered (or `within` passes); returns whether they
    /// were. Woken by each answer, not by a poll: for a test that must act the moment the `n`th
    /// answer goes (kill a client mid-deployment), where a poll's pause would come too late.
    pub fn wait_for_answers(&self, n: usize, within: Duration) -> bool {
        let answered = lock(&self.log.answered);
        let (answered, _) = self
            .log
            .grew
            .wait_timeout_while(answered, within, |a| a.len() < n)
            .unwrap_or_else(PoisonError::into_inner);
        answered.len() >= n
    }

    /// Waits until the log holds a request `matches` accepts, and returns it; fails the test
    /// after `within`, listing what it did receive.
    #[track_caller]
    pub fn wait_for_request(
        &self,
        what: &str,
        within: Duration,
        matches: impl Fn(&Logged) -> bool,
    ) -> Logged {
        eventually_or(
            what,
            within,
            || {
                lock(&self.log.answered)
                    .iter()
                    .find(|l| matches(l))
                    .cloned()
            },
            || self.describe_log(),
        )
    }

    /// The log, one line per request, for a failure message.
    pub fn describe_log(&self) -> String {
        let lines: Vec<String> = lock(&self.log.answered)
            .iter()
            .map(|l| format!("{} {} -> {}", l.request.method, l.request.url, l.status))
            .collect();
        format!("the server at {} received:\n{}", self.url, lines.join("\n"))
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn answer(mut incoming: tiny_http::Request, handler: &Handler, log: &Log) {
    let mut body = String::new();
    let _ = incoming
        .as_reader()
        .take(MAX_BODY)
        .read_to_string(&mut body);
    let request = Request {
        method: incoming.method().as_str().to_owned(),
        url: incoming.url().to_owned(),
        headers: incoming
            .headers()
            .iter()
            .map(|h| (h.field.as_str().as_str().to_owned(), h.value.to_string()))
            .collect(),
        body,
        arrived: Instant::now(),
        arrived_at: SystemTime::now(),
    };
    let reply = handler(&request);
    thread::sleep(reply.delay);
    let mut response =
        tiny_http::Response::from_string(reply.body.clone()).with_status_code(reply.status);
    for (name, value) in &reply.headers {
        let header = tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes())
            .expect("a valid header");
        response = response.with_header(header);
    }
    if reply.close {
        response = response.with_header(
            tiny_http::Header::from_bytes("Connection", "close").expect("a valid header"),
        );
    }
    // Logged before it is sent, so that whatever a client has read is in the log when the
    // client (a gitplane command that exits) is done.
    lock(&log.answered).push(Logged {
        request,
        status: reply.status,
        reply,
        answered: Instant::now(),
    });
    log.grew.notify_all();
    // The client may have given up (a time-out test): its answer goes nowhere.
    let _ = incoming.respond(response);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An agent that hands back 4xx and 5xx answers instead of errors.
    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .into()
    }

    #[test]
    fn the_handler_answers_and_the_log_keeps_the_request_and_the_answer() {
        let server = HttpServer::start(|request| {
            Reply::text(201, format!("got {}", request.body))
                .header("X-Seen", request.method.clone())
        });
        let mut response = agent()
            .post(&format!("{}/a/b?c=1", server.url))
            .header("X-Token", "t0k")
            .send("hello")
            .expect("an answer");
        assert_eq!(response.status().as_u16(), 201);
        assert_eq!(response.headers()["X-Seen"], "POST");
        assert_eq!(response.body_mut().read_to_string().unwrap(), "got hello");
        let log = server.requests();
        assert_eq!(log.len(), 1);
        let request = &log[0].request;
        assert_eq!(
            (
                request.method.as_str(),
                request.url.as_str(),
                request.last_segment()
            ),
            ("POST", "/a/b?c=1", "b")
        );
        assert_eq!(
            (request.header("x-token"), request.body.as_str()),
            (Some("t0k"), "hello")
        );
        assert_eq!(log[0].status, 201);
        assert!(log[0].answered >= request.arrived);
    }

    #[test]
    #[should_panic(expected = "waiting for a DELETE")]
    fn waiting_for_a_request_that_never_comes_names_it() {
        let server = HttpServer::start(|_| Reply::status(204));
        server.wait_for_request("a DELETE", Duration::from_millis(50), |l| {
            l.request.method == "DELETE"
        });
    }

    #[test]
    fn a_driver_polls_provisions_and_deletes() {
        let driver = crate::DriverServer::start();
        driver.behave(
            "postgres",
            crate::Behavior {
                polls: 1,
                ..crate::Behavior::default()
            },
        );
        let put = |cookie: Option<&str>| {
            let mut request = agent().put(&format!("{}/abc123", driver.url));
            if let Some(cookie) = cookie {
                request = request.header("Humanitec-Driver-Cookie", cookie);
            }
            let mut response = request
                .send(r#"{"type": "postgres", "driver": {"values": {"size": 1}}}"#)
                .expect("an answer");
            let status = response.status().as_u16();
            let body = response.body_mut().read_to_string().unwrap();
            (
                status,
                serde_json::from_str::<serde_json::Value>(&body).unwrap(),
            )
        };
        assert_eq!(put(None).0, 202);
        let (status, body) = put(Some("polls=1"));
        assert_eq!(status, 200);
        assert_eq!(
            body["resource"]["values"]["echo"],
            serde_json::json!({"size": 1})
        );
        assert_eq!(driver.instances().len(), 1);
        let deleted = agent()
            .delete(&format!("{}/abc123", driver.url))
            .call()
            .expect("an answer");
        assert_eq!(deleted.status().as_u16(), 204);
        assert!(driver.instances().is_empty());
        let received = driver.received();
        let seen: Vec<(&str, u16, Option<&str>)> = received
            .iter()
            .map(|r| (r.method.as_str(), r.status, r.cookie.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("PUT", 202, None),
                ("PUT", 200, Some("polls=1")),
                ("DELETE", 204, None)
            ]
        );
        assert_eq!(received[0].set_cookie.as_deref(), Some("polls=1"));
        assert!(driver.wait_for_requests(3, Duration::ZERO));
        assert!(driver.wait_for_arrivals(3, Duration::ZERO));
    }
}
