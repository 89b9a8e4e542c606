//! The `http` driver: a remote driver implementing the Humanitec Driver Interface.
//!
//! `PUT <url>/<GUResID>` creates or updates a resource and `DELETE <url>/<GUResID>` deletes it.
//! One call is one HTTP request: a `202` is handed back as in progress, and the reconciler owns
//! every poll, retry and backoff. What the remote driver must remember between calls travels in
//! the `Humanitec-Driver-Cookie` request header and the `Set-Humanitec-Driver-Cookie` response
//! header.
//!
//! Error messages name the method, the URL and the status, plus the start of the response body
//! (the driver's explanation). They never carry the request body, the cookie or the secrets:
//! string values of the secrets, the account and the cookie are masked in the explanation too,
//! in case the remote driver echoes them back.

use std::fmt::Write as _;
use std::io::Read;
use std::time::Duration;

use serde_json::{Map, Value};

use gitplane_core::model::template::kind_of;
use ureq::http::{Response, StatusCode};
use ureq::{Agent, Body};

use super::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, ErrorKind, MAX_COOKIE_BYTES,
    Manifest, PutOutcome, ReadOutcome,
};

/// The request header that gives the cookie back to the remote driver.
const COOKIE_HEADER: &str = "Humanitec-Driver-Cookie";
/// The response header with which the remote driver sets (or, empty, clears) its cookie.
const SET_COOKIE_HEADER: &str = "Set-Humanitec-Driver-Cookie";
/// How much of an error response's body goes into the message, in characters.
const MAX_EXPLANATION_CHARS: usize = 300;
/// How much of an error response's body is read at all, in bytes.
const MAX_EXPLANATION_READ: u64 = 16 * 1024;
/// The largest `200` body accepted from a `PUT`, in bytes.
const MAX_RESPONSE_BYTES: u64 = 10 * 1024 * 1024;
/// What replaces a secret value found in a driver's explanation.
const MASK: &str = "***";
/// The shape a `200` answer to a `PUT` must have, for error messages.
const RESPONSE_SHAPE: &str = r#"{"id", "type", "resource": {"values", "secrets"}}"#;

/// Calls `PUT` and `DELETE <url>/<GUResID>` on a remote driver.
#[derive(Debug, Clone)]
pub struct HttpDriver {
    url: String,
    timeout: Duration,
    agent: Agent,
}

impl HttpDriver {
    /// A driver for the remote driver at `url`; `timeout` bounds one whole call (connect, send,
    /// wait, read). An invalid `url` shows up as a final error on the first call.
    pub fn new(url: &str, timeout: Duration) -> Self {
        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            // A redirect would resend the cookie (and perhaps the secrets) somewhere the host
            // config does not name; a 3xx is an unexpected answer instead.
            .max_redirects(0)
            .build()
            .into();
        HttpDriver {
            url: url.to_owned(),
            timeout,
            agent,
        }
    }

    /// `<url>/<guresid>`, with exactly one `/` between them.
    fn resource_url(&self, guresid: &str) -> String {
        format!(
            "{}/{}",
            self.url.trim_end_matches('/'),
            encode_path_segment(guresid)
        )
    }

    fn call<'a>(&self, method: &'static str, request: &'a DriverRequest<'a>) -> Call<'a> {
        let url = self.resource_url(request.guresid);
        Call {
            method,
            shown_url: without_userinfo(&url),
            url,
            timeout: self.timeout,
            request,
        }
    }
}

impl Driver for HttpDriver {
    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let call = self.call("PUT", request);
        let body = put_body(request).map_err(|message| call.error(ErrorKind::Final, message))?;
        let mut builder = self
            .agent
            .put(&call.url)
            .header("Content-Type", "application/json");
        if let Some(cookie) = request.cookie {
            builder = builder.header(COOKIE_HEADER, cookie);
        }
        let mut response = builder
            .send_json(&body)
            .map_err(|e| call.transport_error(e))?;
        let status = response.status();
        match status.as_u16() {
            200 => {
                let cookie = call.cookie(&response)?;
                let bytes = call.read_body(&mut response)?;
                let (outputs, secret_outputs, manifests) =
                    parse_put_response(&bytes).map_err(|why| {
                        call.error(
                            ErrorKind::Final,
                            format!(
                                "{}: the response is not {RESPONSE_SHAPE}: {why}",
                                status_text(status)
                            ),
                        )
                    })?;
                Ok(PutOutcome::Done {
                    outputs,
                    secret_outputs,
                    cookie,
                    manifests,
                })
            }
            202 => Ok(PutOutcome::InProgress {
                cookie: call.cookie(&response)?,
            }),
            _ => Err(call.status_error(&mut response, "200 or 202")),
        }
    }

    fn delete(&self, request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        let call = self.call("DELETE", request);
        let mut builder = self.agent.delete(&call.url);
        if let Some(cookie) = request.cookie {
            builder = builder.header(COOKIE_HEADER, cookie);
        }
        let mut response = builder.call().map_err(|e| call.transport_error(e))?;
        match response.status().as_u16() {
            // 404: already gone. A 204 for an unknown resource is success too.
            200 | 204 | 404 => Ok(DeleteOutcome::Done),
            202 => Ok(DeleteOutcome::InProgress {
                cookie: call.cookie(&response)?,
            }),
            _ => Err(call.status_error(&mut response, "204, 202 or 404")),
        }
    }

    /// `GET <url>/<GUResID>`: `200` with a put's answer is the resource now, `404` or `410`
    /// says it is gone, `405` or `501` that the remote driver has no read path.
    fn read(&self, request: &DriverRequest<'_>) -> Result<ReadOutcome, DriverError> {
        let call = self.call("GET", request);
        let mut builder = self.agent.get(&call.url);
        if let Some(cookie) = request.cookie {
            builder = builder.header(COOKIE_HEADER, cookie);
        }
        let mut response = builder.call().map_err(|e| call.transport_error(e))?;
        let status = response.status();
        match status.as_u16() {
            200 => {
                let bytes = call.read_body(&mut response)?;
                let (outputs, secret_outputs, _) = parse_put_response(&bytes).map_err(|why| {
                    call.error(
                        ErrorKind::Final,
                        format!(
                            "{}: the response is not {RESPONSE_SHAPE}: {why}",
                            status_text(status)
                        ),
                    )
                })?;
                Ok(ReadOutcome::Found {
                    outputs,
                    secret_outputs,
                })
            }
            404 | 410 => Ok(ReadOutcome::Missing),
            405 | 501 => Ok(ReadOutcome::NoReadPath),
            _ => Err(call.status_error(&mut response, "200, 404, 405 or 501")),
        }
    }
}

/// One HTTP call, for building its error messages.
struct Call<'a> {
    method: &'static str,
    url: String,
    /// `url` without any `user:password@`.
    shown_url: String,
    timeout: Duration,
    request: &'a DriverRequest<'a>,
}

impl Call<'_> {
    fn error(&self, kind: ErrorKind, message: impl std::fmt::Display) -> DriverError {
        DriverError {
            kind,
            message: format!("{} {}: {message}", self.method, self.shown_url),
            cookie: Cookie::Unchanged,
        }
    }

    /// No answer: a bad URL is final, everything else (refused, reset, time-out, DNS, TLS) is
    /// worth another try.
    fn transport_error(&self, error: ureq::Error) -> DriverError {
        match error {
            ureq::Error::Timeout(_) => self.error(
                ErrorKind::Transient,
                format!("no answer within {:?}", self.timeout),
            ),
            ureq::Error::BadUri(_) | ureq::Error::Http(_) | ureq::Error::RequireHttpsOnly(_) => {
                self.error(ErrorKind::Final, error)
            }
            _ => self.error(ErrorKind::Transient, error),
        }
    }

    /// An answer that is not success: 409, 429 and 5xx are transient, every other status final.
    fn status_error(&self, response: &mut Response<Body>, expected: &str) -> DriverError {
        let status = response.status();
        let code = status.as_u16();
        let kind = if matches!(code, 409 | 429 | 500..=599) {
            ErrorKind::Transient
        } else {
            ErrorKind::Final
        };
        if code < 400 {
            // A success-like answer may carry outputs, secret ones included: leave its body out.
            return self.error(
                kind,
                format!(
                    "{}: unexpected status (expected {expected})",
                    status_text(status)
                ),
            );
        }
        let explanation = self.explanation(response);
        if explanation.is_empty() {
            self.error(kind, status_text(status))
        } else {
            self.error(kind, format!("{}: {explanation}", status_text(status)))
        }
    }

    /// The start of an error response's body, on one line, with known secrets masked.
    fn explanation(&self, response: &mut Response<Body>) -> String {
        let mut bytes = Vec::new();
        // An unreadable body only costs the explanation; the status says enough.
        let _ = response
            .body_mut()
            .as_reader()
            .take(MAX_EXPLANATION_READ)
            .read_to_end(&mut bytes);
        let text = String::from_utf8_lossy(&bytes);
        let text = mask_secrets(text.trim(), &self.secret_strings());
        one_line(&text)
    }

    /// Every string (and number) in the secrets, the account and the cookie of the request.
    fn secret_strings(&self) -> Vec<String> {
        let mut found = Vec::new();
        super::leaks::leaves(self.request.secrets, &mut found);
        if let Some(account) = self.request.account {
            super::leaks::leaves(account, &mut found);
        }
        if let Some(cookie) = self.request.cookie {
            found.push(cookie.to_owned());
        }
        found
    }

    /// What to do with the cookie, from the `Set-Humanitec-Driver-Cookie` header.
    fn cookie(&self, response: &Response<Body>) -> Result<Cookie, DriverError> {
        let Some(value) = response.headers().get(SET_COOKIE_HEADER) else {
            return Ok(Cookie::Unchanged);
        };
        let status = status_text(response.status());
        let bytes = value.as_bytes();
        if bytes.is_empty() {
            return Ok(Cookie::Cleared);
        }
        if bytes.len() > MAX_COOKIE_BYTES {
            return Err(self.error(
                ErrorKind::Final,
                format!(
                    "{status}: driver cookie of {} bytes exceeds the {MAX_COOKIE_BYTES}-byte limit",
                    bytes.len()
                ),
            ));
        }
        match std::str::from_utf8(bytes) {
            Ok(cookie) => Ok(Cookie::Set(cookie.to_owned())),
            Err(_) => Err(self.error(
                ErrorKind::Final,
                format!("{status}: driver cookie is not valid UTF-8 (base64-encode it)"),
            )),
        }
    }

    /// The whole body of a success answer.
    fn read_body(&self, response: &mut Response<Body>) -> Result<Vec<u8>, DriverError> {
        let status = status_text(response.status());
        let mut bytes = Vec::new();
        response
            .body_mut()
            .as_reader()
            .take(MAX_RESPONSE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                let e = ureq::Error::from(e);
                if matches!(e, ureq::Error::Timeout(_)) {
                    self.error(
                        ErrorKind::Transient,
                        format!(
                            "{status}: the response body did not arrive within {:?}",
                            self.timeout
                        ),
                    )
                } else {
                    self.error(
                        ErrorKind::Transient,
                        format!("{status}: reading the response body: {e}"),
                    )
                }
            })?;
        if bytes.len() as u64 > MAX_RESPONSE_BYTES {
            return Err(self.error(
                ErrorKind::Final,
                format!("{status}: the response body exceeds {MAX_RESPONSE_BYTES} bytes"),
            ));
        }
        Ok(bytes)
    }
}

/// `{"type", "resource", "driver": {"values", "secrets"}}`, with the account's credentials
/// as `driver.secrets.account`.
fn put_body(request: &DriverRequest<'_>) -> Result<Value, String> {
    let mut secrets = request.secrets.clone();
    if let Some(account) = request.account {
        if secrets.is_null() {
            secrets = Value::Object(Map::new());
        }
        match &mut secrets {
            Value::Object(map) => {
                map.insert("account".to_owned(), account.clone());
            }
            other => {
                return Err(format!(
                    "the driver secrets are {}, not an object, so they cannot carry the account",
                    kind_of(other)
                ));
            }
        }
    }
    let mut driver = Map::new();
    driver.insert("values".to_owned(), request.values.clone());
    driver.insert("secrets".to_owned(), secrets);
    let mut body = Map::new();
    body.insert(
        "type".to_owned(),
        Value::String(request.res_type.to_owned()),
    );
    body.insert("resource".to_owned(), request.resource.clone());
    body.insert("driver".to_owned(), Value::Object(driver));
    Ok(Value::Object(body))
}

/// `(resource.values, resource.secrets)` of a `200` answer, each `{}` when missing or null.
/// The reason it is not that shape never quotes the body: it may hold secret outputs.
fn parse_put_response(bytes: &[u8]) -> Result<(Value, Value, Vec<Manifest>), String> {
    let body: Value = serde_json::from_slice(bytes).map_err(|e| {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            "the body is empty".to_owned()
        } else {
            format!("invalid JSON at line {} column {}", e.line(), e.column())
        }
    })?;
    let Value::Object(mut body) = body else {
        return Err(format!("the body is {}, not an object", kind_of(&body)));
    };
    for key in ["id", "type"] {
        match body.get(key) {
            None | Some(Value::String(_)) => {}
            Some(other) => return Err(format!("{key} is {}, not a string", kind_of(other))),
        }
    }
    let mut resource = match body.remove("resource") {
        Some(Value::Object(resource)) => resource,
        None => return Err("resource is missing".to_owned()),
        Some(other) => {
            return Err(format!("resource is {}, not an object", kind_of(&other)));
        }
    };
    let mut object_at = |key: &str| match resource.remove(key) {
        None | Some(Value::Null) => Ok(Value::Object(Map::new())),
        Some(value @ Value::Object(_)) => Ok(value),
        Some(other) => Err(format!(
            "resource.{key} is {}, not an object",
            kind_of(&other)
        )),
    };
    let values = object_at("values")?;
    let secrets = object_at("secrets")?;
    let manifests =
        Manifest::list_from(body.remove("manifests").unwrap_or(Value::Null), "manifests")?;
    Ok((values, secrets, manifests))
}

/// `400 Bad Request`, or just `599` for a status without a standard reason.
fn status_text(status: StatusCode) -> String {
    match status.canonical_reason() {
        Some(reason) => format!("{} {reason}", status.as_u16()),
        None => status.as_u16().to_string(),
    }
}

/// `text` on one line (control characters as spaces), cut to [`MAX_EXPLANATION_CHARS`]: what
/// an error message may quote of a server's answer.
pub fn one_line(text: &str) -> String {
    let mut shown: String = text
        .chars()
        .take(MAX_EXPLANATION_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(MAX_EXPLANATION_CHARS).is_some() {
        shown.push('…');
    }
    shown
}

/// Percent-encodes everything but unreserved characters, so a GUResID stays one path segment.
pub fn encode_path_segment(segment: &str) -> String {
    let mut encoded = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    encoded
}

/// The URL without `user:password@`, for messages.
fn without_userinfo(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let authority_start = scheme_end + 3;
    let authority_end = url[authority_start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| authority_start + i);
    match url[authority_start..authority_end].rfind('@') {
        Some(at) => format!(
            "{}{}",
            &url[..authority_start],
            &url[authority_start + at + 1..]
        ),
        None => url.to_owned(),
    }
}

/// `text` with every occurrence of each secret replaced, longest secrets first.
fn mask_secrets(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&str> = secrets
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_owned();
    for secret in secrets {
        if text.contains(secret) {
            text = text.replace(secret, MASK);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::collections::VecDeque;
    use std::net::TcpListener;
    use std::sync::Mutex;
    use std::time::Instant;

    use gitplane_testkit::{HttpServer, poll};
    use serde_json::json;

    /// What the test server saw of one request.
    #[derive(Debug, Clone, PartialEq)]
    struct Seen {
        method: String,
        path: String,
        /// The body as JSON; `Null` when empty.
        body: Value,
        cookie: Option<String>,
        content_type: Option<String>,
    }

    /// What the test server answers to one request.
    struct Reply {
        status: u16,
        body: String,
        set_cookie: Option<String>,
        delay: Duration,
    }

    fn reply(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            body: body.into(),
            set_cookie: None,
            delay: Duration::ZERO,
        }
    }

    impl Reply {
        fn cookie(mut self, cookie: impl Into<String>) -> Self {
            self.set_cookie = Some(cookie.into());
            self
        }

        fn delay(mut self, delay: Duration) -> Self {
            self.delay = delay;
            self
        }
    }

    /// A server on 127.0.0.1 answering `replies` in order, one per request.
    struct Served {
        server: HttpServer,
        replies: usize,
    }

    impl Served {
        /// What the server saw, once it has answered every reply (or 10 s have passed).
        fn seen(self) -> Vec<Seen> {
            let _ = poll(Duration::from_secs(10), || {
                (self.server.requests().len() >= self.replies).then_some(())
            });
            self.server
                .requests()
                .into_iter()
                .map(|logged| {
                    let request = logged.request;
                    Seen {
                        method: request.method.clone(),
                        path: request.url.clone(),
                        body: if request.body.is_empty() {
                            Value::Null
                        } else {
                            serde_json::from_str(&request.body).expect("a JSON request body")
                        },
                        cookie: request.header(COOKIE_HEADER).map(str::to_owned),
                        content_type: request.header("Content-Type").map(str::to_owned),
                    }
                })
                .collect()
        }
    }

    /// A server on 127.0.0.1 that answers `replies` in order, one per request; [`Served::seen`]
    /// hands back what it saw. Its base URL is `http://127.0.0.1:<port>/queue`.
    fn serve(replies: Vec<Reply>) -> (String, Served) {
        let count = replies.len();
        let queue = Mutex::new(VecDeque::from(replies));
        let server = HttpServer::start(move |_| {
            let Some(reply) = queue.lock().expect("not poisoned").pop_front() else {
                return gitplane_testkit::Reply::status(500);
            };
            let mut answer = gitplane_testkit::Reply::text(reply.status, reply.body)
                .header("Content-Type", "application/json")
                .delay(reply.delay);
            if let Some(cookie) = reply.set_cookie {
                answer = answer.header(SET_COOKIE_HEADER, cookie);
            }
            answer
        });
        let url = format!("{}/queue", server.url);
        (
            url,
            Served {
                server,
                replies: count,
            },
        )
    }

    const GURESID: &str = "0123abcd";

    struct Inputs {
        resource: Value,
        values: Value,
        secrets: Value,
        account: Option<Value>,
        cookie: Option<String>,
    }

    fn inputs() -> Inputs {
        Inputs {
            resource: json!({"size": "small"}),
            values: json!({"region": "eu-west-1"}),
            secrets: json!({"password": "hunter2-very-secret"}),
            account: None,
            cookie: None,
        }
    }

    impl Inputs {
        fn request(&self) -> DriverRequest<'_> {
            DriverRequest {
                org: "gitplane",
                guresid: GURESID,
                env: "prod",
                app: Some("shop"),
                res_type: "acme-queue",
                class: "default",
                res_id: "modules.web.externals.jobs",
                resource: &self.resource,
                values: &self.values,
                secrets: &self.secrets,
                account: self.account.as_ref(),
                cookie: self.cookie.as_deref(),
            }
        }
    }

    fn driver(url: &str) -> HttpDriver {
        HttpDriver::new(url, Duration::from_secs(5))
    }

    fn put_seen(body: Value, cookie: Option<&str>) -> Seen {
        Seen {
            method: "PUT".to_owned(),
            path: format!("/queue/{GURESID}"),
            body,
            cookie: cookie.map(str::to_owned),
            content_type: Some("application/json".to_owned()),
        }
    }

    fn delete_seen(cookie: Option<&str>) -> Seen {
        Seen {
            method: "DELETE".to_owned(),
            path: format!("/queue/{GURESID}"),
            body: Value::Null,
            cookie: cookie.map(str::to_owned),
            content_type: None,
        }
    }

    fn expected_put_body() -> Value {
        json!({
            "type": "acme-queue",
            "resource": {"size": "small"},
            "driver": {
                "values": {"region": "eu-west-1"},
                "secrets": {"password": "hunter2-very-secret"},
            },
        })
    }

    fn done_body() -> String {
        json!({
            "id": GURESID,
            "type": "acme-queue",
            "resource": {
                "values": {"url": "amqp://queue.internal/jobs"},
                "secrets": {"token": "t0ken"},
            },
        })
        .to_string()
    }

    fn no_secret_in(error: &DriverError) {
        for secret in ["hunter2-very-secret", "acct-key-123", "my-cookie"] {
            assert!(
                !error.message.contains(secret),
                "secret {secret:?} in {:?}",
                error.message
            );
        }
    }

    #[test]
    fn read_gets_the_resource_with_the_cookie_and_tells_missing_from_no_read_path() {
        let (url, server) = serve(vec![
            reply(200, done_body()),
            reply(404, ""),
            reply(410, ""),
            reply(405, ""),
            reply(501, ""),
            reply(503, "busy with hunter2-very-secret"),
        ]);
        let mut inputs = inputs();
        inputs.cookie = Some("c1".to_owned());
        let driver = driver(&url);
        let outcome = driver.read(&inputs.request()).unwrap();
        let ReadOutcome::Found {
            outputs,
            secret_outputs,
        } = outcome
        else {
            panic!("a 200 is the resource now: {outcome:?}");
        };
        assert!(outputs.is_object() && secret_outputs.is_object());
        for want in [
            ReadOutcome::Missing,
            ReadOutcome::Missing,
            ReadOutcome::NoReadPath,
            ReadOutcome::NoReadPath,
        ] {
            assert_eq!(driver.read(&inputs.request()).unwrap(), want);
        }
        let err = driver.read(&inputs.request()).unwrap_err();
        assert_eq!(err.kind, ErrorKind::Transient);
        assert!(!err.message.contains("hunter2"), "{}", err.message);
        let seen = server.seen();
        assert_eq!(seen.len(), 6);
        for s in &seen {
            assert_eq!(s.method, "GET");
            assert_eq!(s.path, format!("/queue/{GURESID}"));
            assert_eq!(s.cookie.as_deref(), Some("c1"));
            assert_eq!(s.body, Value::Null, "a read sends no inputs");
        }
    }

    #[test]
    fn put_200_returns_outputs_and_secret_outputs() {
        let (url, server) = serve(vec![reply(200, done_body())]);
        let inputs = inputs();
        let outcome = driver(&url).put(&inputs.request()).unwrap();
        assert_eq!(
            outcome,
            PutOutcome::Done {
                outputs: json!({"url": "amqp://queue.internal/jobs"}),
                secret_outputs: json!({"token": "t0ken"}),
                cookie: Cookie::Unchanged,
                manifests: Vec::new(),
            }
        );
        assert_eq!(server.seen(), vec![put_seen(expected_put_body(), None)]);
    }

    #[test]
    fn put_200_without_values_or_secrets_gives_empty_objects() {
        let body = json!({"id": GURESID, "type": "acme-queue", "resource": {"values": null}});
        let (url, server) = serve(vec![reply(200, body.to_string())]);
        let inputs = inputs();
        let outcome = driver(&url).put(&inputs.request()).unwrap();
        assert_eq!(
            outcome,
            PutOutcome::Done {
                outputs: json!({}),
                secret_outputs: json!({}),
                cookie: Cookie::Unchanged,
                manifests: Vec::new(),
            }
        );
        assert_eq!(server.seen().len(), 1);
    }

    #[test]
    fn put_200_of_the_wrong_shape_is_final_and_does_not_quote_the_body() {
        let bodies = [
            "not json".to_owned(),
            String::new(),
            "[1, 2]".to_owned(),
            json!({"id": GURESID}).to_string(),
            json!({"resource": {"values": "s3cr3t-output"}}).to_string(),
            json!({"resource": {"secrets": ["s3cr3t-output"]}}).to_string(),
        ];
        let (url, server) = serve(bodies.iter().map(|b| reply(200, b.clone())).collect());
        let inputs = inputs();
        let driver = driver(&url);
        let mut messages = Vec::new();
        for _ in &bodies {
            let error = driver.put(&inputs.request()).unwrap_err();
            assert_eq!(error.kind, ErrorKind::Final, "{}", error.message);
            assert!(
                error.message.starts_with(&format!(
                    "PUT {url}/{GURESID}: 200 OK: the response is not {RESPONSE_SHAPE}: "
                )),
                "{}",
                error.message
            );
            assert!(
                !error.message.contains("s3cr3t-output"),
                "{}",
                error.message
            );
            messages.push(error.message.rsplit(": ").next().unwrap().to_owned());
        }
        assert_eq!(
            messages,
            vec![
                "invalid JSON at line 1 column 2",
                "the body is empty",
                "the body is an array, not an object",
                "resource is missing",
                "resource.values is a string, not an object",
                "resource.secrets is an array, not an object",
            ]
        );
        assert_eq!(server.seen().len(), bodies.len());
    }

    #[test]
    fn put_202_then_200_sends_the_cookie_back() {
        let (url, server) = serve(vec![
            reply(202, "").cookie("c2Vzc2lvbj0x"),
            reply(200, done_body()).cookie("c2Vzc2lvbj0y"),
        ]);
        let mut inputs = inputs();
        let driver = driver(&url);

        let first = driver.put(&inputs.request()).unwrap();
        assert_eq!(
            first,
            PutOutcome::InProgress {
                cookie: Cookie::Set("c2Vzc2lvbj0x".to_owned())
            }
        );
        let PutOutcome::InProgress {
            cookie: Cookie::Set(cookie),
        } = first
        else {
            unreachable!()
        };
        inputs.cookie = Some(cookie);

        let second = driver.put(&inputs.request()).unwrap();
        assert_eq!(
            second,
            PutOutcome::Done {
                outputs: json!({"url": "amqp://queue.internal/jobs"}),
                secret_outputs: json!({"token": "t0ken"}),
                cookie: Cookie::Set("c2Vzc2lvbj0y".to_owned()),
                manifests: Vec::new(),
            }
        );
        assert_eq!(
            server.seen(),
            vec![
                put_seen(expected_put_body(), None),
                put_seen(expected_put_body(), Some("c2Vzc2lvbj0x")),
            ]
        );
    }

    #[test]
    fn an_empty_set_cookie_header_clears_the_cookie() {
        let (url, server) = serve(vec![
            reply(200, done_body()).cookie(""),
            reply(202, "").cookie(""),
        ]);
        let mut inputs = inputs();
        inputs.cookie = Some("b2xk".to_owned());
        let driver = driver(&url);
        let PutOutcome::Done { cookie, .. } = driver.put(&inputs.request()).unwrap() else {
            panic!("expected Done");
        };
        assert_eq!(cookie, Cookie::Cleared);
        assert_eq!(
            driver.delete(&inputs.request()).unwrap(),
            DeleteOutcome::InProgress {
                cookie: Cookie::Cleared
            }
        );
        assert_eq!(
            server.seen(),
            vec![
                put_seen(expected_put_body(), Some("b2xk")),
                delete_seen(Some("b2xk")),
            ]
        );
    }

    #[test]
    fn the_account_goes_under_driver_secrets_account() {
        let (url, server) = serve(vec![reply(200, done_body()), reply(200, done_body())]);
        let account = json!({"key": "acct-key-123", "region": "eu"});
        let mut inputs = inputs();
        inputs.account = Some(account.clone());
        let driver = driver(&url);
        driver.put(&inputs.request()).unwrap();
        // Null secrets become an object to carry the account.
        inputs.secrets = Value::Null;
        driver.put(&inputs.request()).unwrap();

        let mut with_secrets = expected_put_body();
        with_secrets["driver"]["secrets"]["account"] = account.clone();
        let mut without_secrets = expected_put_body();
        without_secrets["driver"]["secrets"] = json!({"account": account});
        assert_eq!(
            server.seen(),
            vec![
                put_seen(with_secrets, None),
                put_seen(without_secrets, None),
            ]
        );
    }

    #[test]
    fn secrets_that_are_not_an_object_cannot_carry_the_account() {
        let mut inputs = inputs();
        inputs.account = Some(json!({"key": "acct-key-123"}));
        inputs.secrets = json!(["hunter2-very-secret"]);
        // Nothing listens here: the error comes before any request.
        let error = driver("http://127.0.0.1:9/queue")
            .put(&inputs.request())
            .unwrap_err();
        assert_eq!(error.kind, ErrorKind::Final);
        assert_eq!(
            error.message,
            format!(
                "PUT http://127.0.0.1:9/queue/{GURESID}: the driver secrets are an array, \
                 not an object, so they cannot carry the account"
            )
        );
        no_secret_in(&error);
    }

    #[test]
    fn a_cookie_over_10240_bytes_is_final_and_10240_is_fine() {
        let largest = "a".repeat(MAX_COOKIE_BYTES);
        let too_large = "b".repeat(MAX_COOKIE_BYTES + 1);
        let (url, server) = serve(vec![
            reply(200, done_body()).cookie(largest.clone()),
            reply(200, done_body()).cookie(too_large.clone()),
            reply(202, "").cookie(too_large.clone()),
            reply(202, "").cookie(too_large.clone()),
        ]);
        let inputs = inputs();
        let driver = driver(&url);

        let PutOutcome::Done { cookie, .. } = driver.put(&inputs.request()).unwrap() else {
            panic!("expected Done");
        };
        assert_eq!(cookie, Cookie::Set(largest));

        let error = driver.put(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Final);
        assert_eq!(
            error.message,
            format!(
                "PUT {url}/{GURESID}: 200 OK: driver cookie of 10241 bytes exceeds the \
                 10240-byte limit"
            )
        );
        let error = driver.put(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Final);
        assert!(
            error.message.ends_with(
                "202 Accepted: driver cookie of 10241 bytes exceeds the 10240-byte limit"
            )
        );
        let error = driver.delete(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Final);
        assert!(error.message.starts_with(&format!(
            "DELETE {url}/{GURESID}: 202 Accepted: driver cookie of 10241 bytes"
        )));
        assert!(!error.message.contains(&too_large));
        assert_eq!(server.seen().len(), 4);
    }

    #[test]
    fn put_400_is_final_and_carries_the_explanation() {
        let (url, server) = serve(vec![reply(400, r#"bad input "x""#)]);
        let inputs = inputs();
        let error = driver(&url).put(&inputs.request()).unwrap_err();
        assert_eq!(
            error,
            DriverError {
                kind: ErrorKind::Final,
                message: format!("PUT {url}/{GURESID}: 400 Bad Request: bad input \"x\""),
                cookie: Cookie::Unchanged,
            }
        );
        assert_eq!(server.seen(), vec![put_seen(expected_put_body(), None)]);
    }

    #[test]
    fn other_4xx_are_final_and_409_429_5xx_are_transient() {
        let cases = [
            (401, ErrorKind::Final, "401 Unauthorized"),
            (403, ErrorKind::Final, "403 Forbidden"),
            (422, ErrorKind::Final, "422 Unprocessable Entity"),
            (409, ErrorKind::Transient, "409 Conflict"),
            (429, ErrorKind::Transient, "429 Too Many Requests"),
            (500, ErrorKind::Transient, "500 Internal Server Error"),
            (502, ErrorKind::Transient, "502 Bad Gateway"),
            (503, ErrorKind::Transient, "503 Service Unavailable"),
            (599, ErrorKind::Transient, "599"),
        ];
        let (url, server) = serve(
            cases
                .iter()
                .map(|(status, _, _)| reply(*status, format!("why {status}")))
                .collect(),
        );
        let inputs = inputs();
        let driver = driver(&url);
        for (status, kind, text) in cases {
            let error = driver.put(&inputs.request()).unwrap_err();
            assert_eq!(
                error,
                DriverError {
                    kind,
                    message: format!("PUT {url}/{GURESID}: {text}: why {status}"),
                    cookie: Cookie::Unchanged,
                }
            );
        }
        assert_eq!(server.seen().len(), cases.len());
    }

    #[test]
    fn delete_errors_are_classified_like_put_errors() {
        let (url, server) = serve(vec![
            reply(400, "no"),
            reply(500, ""),
            reply(429, "slow down"),
            reply(409, "busy"),
        ]);
        let inputs = inputs();
        let driver = driver(&url);
        let errors: Vec<_> = (0..4)
            .map(|_| driver.delete(&inputs.request()).unwrap_err())
            .collect();
        let prefix = format!("DELETE {url}/{GURESID}");
        assert_eq!(
            errors,
            vec![
                DriverError::final_error(format!("{prefix}: 400 Bad Request: no")),
                DriverError::transient(format!("{prefix}: 500 Internal Server Error")),
                DriverError::transient(format!("{prefix}: 429 Too Many Requests: slow down")),
                DriverError::transient(format!("{prefix}: 409 Conflict: busy")),
            ]
        );
        assert_eq!(server.seen(), vec![delete_seen(None); 4]);
    }

    #[test]
    fn unexpected_statuses_are_final_without_the_body() {
        let (url, server) = serve(vec![
            reply(
                201,
                r#"{"resource": {"secrets": {"token": "s3cr3t-output"}}}"#,
            ),
            reply(302, "").cookie("x"),
        ]);
        let inputs = inputs();
        let driver = driver(&url);
        let error = driver.put(&inputs.request()).unwrap_err();
        assert_eq!(
            error,
            DriverError::final_error(format!(
                "PUT {url}/{GURESID}: 201 Created: unexpected status (expected 200 or 202)"
            ))
        );
        let error = driver.delete(&inputs.request()).unwrap_err();
        assert_eq!(
            error,
            DriverError::final_error(format!(
                "DELETE {url}/{GURESID}: 302 Found: unexpected status (expected 204, 202 or 404)"
            ))
        );
        assert_eq!(server.seen().len(), 2);
    }

    #[test]
    fn the_explanation_is_cut_at_300_characters() {
        let long = format!("{}{}", "é".repeat(300), "TAIL");
        let (url, server) = serve(vec![reply(400, format!("  {long}\n"))]);
        let inputs = inputs();
        let error = driver(&url).put(&inputs.request()).unwrap_err();
        assert_eq!(
            error.message,
            format!("PUT {url}/{GURESID}: 400 Bad Request: {}…", "é".repeat(300))
        );
        server.seen();
    }

    #[test]
    fn a_slow_driver_times_out_as_transient() {
        let (url, server) = serve(vec![reply(200, done_body()).delay(Duration::from_secs(2))]);
        let inputs = inputs();
        let driver = HttpDriver::new(&url, Duration::from_millis(200));
        let started = Instant::now();
        let error = driver.put(&inputs.request()).unwrap_err();
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_millis(1_500),
            "took {elapsed:?} with a 200 ms timeout"
        );
        assert_eq!(
            error,
            DriverError::transient(format!("PUT {url}/{GURESID}: no answer within 200ms"))
        );
        assert_eq!(server.seen(), vec![put_seen(expected_put_body(), None)]);
    }

    #[test]
    fn connection_refused_is_transient() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let url = format!("http://127.0.0.1:{port}/queue");
        let inputs = inputs();
        let driver = driver(&url);
        let error = driver.put(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Transient, "{}", error.message);
        assert!(
            error.message.starts_with(&format!("PUT {url}/{GURESID}: ")),
            "{}",
            error.message
        );
        let error = driver.delete(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Transient, "{}", error.message);
        assert!(
            error
                .message
                .starts_with(&format!("DELETE {url}/{GURESID}: ")),
            "{}",
            error.message
        );
    }

    #[test]
    fn an_invalid_url_is_final() {
        let inputs = inputs();
        let error = driver("not a url").put(&inputs.request()).unwrap_err();
        assert_eq!(error.kind, ErrorKind::Final, "{}", error.message);
        assert!(
            error.message.starts_with("PUT not a url/"),
            "{}",
            error.message
        );
    }

    #[test]
    fn delete_204_404_200_are_done_and_202_is_in_progress() {
        let (url, server) = serve(vec![
            reply(204, ""),
            reply(404, "no such resource"),
            reply(200, "{}"),
            reply(202, "").cookie("ZGVsZXRpbmc="),
            reply(202, ""),
        ]);
        let mut inputs = inputs();
        let driver = driver(&url);
        assert_eq!(driver.delete(&inputs.request()), Ok(DeleteOutcome::Done));
        assert_eq!(driver.delete(&inputs.request()), Ok(DeleteOutcome::Done));
        assert_eq!(driver.delete(&inputs.request()), Ok(DeleteOutcome::Done));
        assert_eq!(
            driver.delete(&inputs.request()),
            Ok(DeleteOutcome::InProgress {
                cookie: Cookie::Set("ZGVsZXRpbmc=".to_owned())
            })
        );
        inputs.cookie = Some("ZGVsZXRpbmc=".to_owned());
        assert_eq!(
            driver.delete(&inputs.request()),
            Ok(DeleteOutcome::InProgress {
                cookie: Cookie::Unchanged
            })
        );
        let mut expected = vec![delete_seen(None); 4];
        expected.push(delete_seen(Some("ZGVsZXRpbmc=")));
        assert_eq!(server.seen(), expected);
    }

    #[test]
    fn urls_join_with_exactly_one_slash() {
        let (url, server) = serve(vec![
            reply(200, done_body()),
            reply(200, done_body()),
            reply(204, ""),
        ]);
        let inputs = inputs();
        HttpDriver::new(&url, Duration::from_secs(5))
            .put(&inputs.request())
            .unwrap();
        HttpDriver::new(&format!("{url}/"), Duration::from_secs(5))
            .put(&inputs.request())
            .unwrap();
        HttpDriver::new(&format!("{url}/"), Duration::from_secs(5))
            .delete(&inputs.request())
            .unwrap();
        let paths: Vec<_> = server.seen().into_iter().map(|s| s.path).collect();
        assert_eq!(paths, vec![format!("/queue/{GURESID}"); 3]);

        for (base, expected) in [
            ("http://h:1/queue", "http://h:1/queue/0123abcd"),
            ("http://h:1/queue/", "http://h:1/queue/0123abcd"),
            ("http://h:1/queue//", "http://h:1/queue/0123abcd"),
            ("http://h:1", "http://h:1/0123abcd"),
            ("http://h:1/", "http://h:1/0123abcd"),
        ] {
            assert_eq!(driver(base).resource_url(GURESID), expected, "{base}");
        }
        assert_eq!(
            driver("http://h/q").resource_url("a/b c"),
            "http://h/q/a%2Fb%20c"
        );
    }

    #[test]
    fn no_secret_appears_in_any_error_message() {
        // A driver that echoes the request, cookie included, in its explanations.
        let echo = "bad: password=hunter2-very-secret key=acct-key-123 cookie=my-cookie";
        let (url, server) = serve(vec![
            reply(400, echo),
            reply(500, echo),
            reply(409, echo),
            reply(422, echo),
            reply(200, r#"{"oops": "hunter2-very-secret"#),
        ]);
        let mut inputs = inputs();
        inputs.account = Some(json!({"key": "acct-key-123", "port": 5432}));
        inputs.cookie = Some("my-cookie".to_owned());
        let driver = driver(&url);
        let mut errors = Vec::new();
        for _ in 0..3 {
            errors.push(driver.put(&inputs.request()).unwrap_err());
        }
        errors.push(driver.delete(&inputs.request()).unwrap_err());
        errors.push(driver.put(&inputs.request()).unwrap_err());
        assert_eq!(
            errors[0].message,
            format!("PUT {url}/{GURESID}: 400 Bad Request: bad: password=*** key=*** cookie=***")
        );
        for error in &errors {
            no_secret_in(error);
        }
        // Time-outs and refused connections carry no body at all.
        let refused = HttpDriver::new("http://127.0.0.1:9/queue", Duration::from_millis(100));
        no_secret_in(&refused.put(&inputs.request()).unwrap_err());
        no_secret_in(&refused.delete(&inputs.request()).unwrap_err());
        assert_eq!(server.seen().len(), 5);
    }

    #[test]
    fn userinfo_is_left_out_of_messages() {
        assert_eq!(
            without_userinfo("http://user:pw@127.0.0.1:9/queue/x"),
            "http://127.0.0.1:9/queue/x"
        );
        assert_eq!(
            without_userinfo("http://127.0.0.1:9/a@b"),
            "http://127.0.0.1:9/a@b"
        );
        assert_eq!(without_userinfo("no scheme"), "no scheme");
        let inputs = inputs();
        let error = driver("http://user:pw@127.0.0.1:9/queue")
            .delete(&inputs.request())
            .unwrap_err();
        assert!(!error.message.contains("pw"), "{}", error.message);
        assert!(
            error
                .message
                .starts_with(&format!("DELETE http://127.0.0.1:9/queue/{GURESID}: ")),
            "{}",
            error.message
        );
    }
}
