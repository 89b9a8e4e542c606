//! A real HTTP driver on 127.0.0.1 implementing the Humanitec Driver Interface the way a real
//! asynchronous driver does: one instance per GUResID, 202 while provisioning with a cookie that
//! counts the polls, 200 with outputs, 204 on delete. Behaviour is set per resource type, so a
//! test can inject a 500, a 400, a slow answer or an oversized cookie. It records every request
//! as it arrives and as it was answered.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::http_server::{HttpServer, Logged, Reply, Request};

/// The key of the behaviour of reads among those of resource types.
const READS: &str = "(reads)";
/// The header a driver's cookie comes back in, and the one that sets it.
const COOKIE_HEADER: &str = "Humanitec-Driver-Cookie";
const SET_COOKIE_HEADER: &str = "Set-Humanitec-Driver-Cookie";

/// How the driver answers for one resource type.
#[derive(Debug, Clone, Default)]
pub struct Behavior {
    /// How many 202s a resource gets before its 200.
    pub polls: u32,
    /// How long each answer takes.
    pub delay: Duration,
    /// Answer this status, this many times per GUResID, before behaving.
    pub fail: Option<(u16, u32)>,
    /// Set a cookie of this many bytes on the 200.
    pub cookie_bytes: Option<usize>,
    /// Report an output that changes on every provisioning (`observed`: how many 200s this
    /// GUResID got), like a resource something outside gitplane keeps changing.
    pub drifting: bool,
    /// Answer 503 to about this percent of calls, at random (a fixed sequence per server).
    pub flaky_percent: u32,
    /// Copy every string the driver received in `driver.secrets` (the account's included)
    /// into its public outputs, hex-encoded (`leak_hex`) and URL-encoded (`leak_url`), as a
    /// careless driver might.
    pub leak_secrets: bool,
}

/// One request the driver received and answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub guresid: String,
    pub body: Value,
    pub cookie: Option<String>,
    pub status: u16,
    /// The cookie the answer set (`Set-Humanitec-Driver-Cookie`), if any.
    pub set_cookie: Option<String>,
    /// When the request arrived and when the answer was sent, from the server's clock.
    pub arrived: Instant,
    pub answered: Instant,
}

impl Received {
    fn of(logged: &Logged) -> Received {
        let request = &logged.request;
        Received {
            method: request.method.clone(),
            guresid: request.last_segment().to_owned(),
            body: request.json(),
            cookie: request.header(COOKIE_HEADER).map(str::to_owned),
            status: logged.status,
            set_cookie: logged
                .reply
                .headers
                .iter()
                .find(|(name, _)| name == SET_COOKIE_HEADER)
                .map(|(_, value)| value.clone()),
            arrived: request.arrived,
            answered: logged.answered,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    behaviors: HashMap<String, Behavior>,
    /// Live instances by GUResID, with the instance number.
    instances: BTreeMap<String, u64>,
    /// How many instances were ever created per GUResID.
    creations: HashMap<String, u32>,
    next_instance: u64,
    polls: HashMap<String, u32>,
    failures: HashMap<String, u32>,
    /// 200s answered per GUResID.
    provisioned: HashMap<String, u32>,
    /// Every request as it arrived, before it is answered: method, GUResID and when.
    arrivals: Vec<(String, String, Instant)>,
    /// Calls answered, for the flaky sequence.
    calls: u64,
}

/// The driver: an [`HttpServer`] whose handler is the Driver Interface above.
pub struct DriverServer {
    /// `http://127.0.0.1:PORT/driver`, the URL to register.
    pub url: String,
    server: HttpServer,
    /// The driver's memory, and a condition variable told of each arrival.
    inner: Arc<(Mutex<Inner>, Condvar)>,
}

impl DriverServer {
    pub fn start() -> DriverServer {
        let inner: Arc<(Mutex<Inner>, Condvar)> = Arc::default();
        let shared = inner.clone();
        // The server answers each request on a thread of its own: resources are provisioned
        // concurrently.
        let server = HttpServer::start(move |request| handle(request, &shared));
        DriverServer {
            url: format!("{}/driver", server.url),
            server,
            inner,
        }
    }

    pub fn behave(&self, res_type: &str, behavior: Behavior) {
        self.lock().behaviors.insert(res_type.to_owned(), behavior);
    }

    /// How the driver answers reads (`GET`, which carry no body, so no resource type).
    pub fn behave_reads(&self, behavior: Behavior) {
        self.lock().behaviors.insert(READS.to_owned(), behavior);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every request answered so far, in the order the answers were sent.
    pub fn received(&self) -> Vec<Received> {
        self.server.requests().iter().map(Received::of).collect()
    }

    /// The live instances: GUResID to instance number.
    pub fn instances(&self) -> BTreeMap<String, u64> {
        self.lock().instances.clone()
    }

    /// How many instances were created per GUResID since it was last deleted.
    pub fn creations(&self) -> HashMap<String, u32> {
        self.lock().creations.clone()
    }

    /// Every request as it arrived (method, GUResID, when), answered or not yet.
    pub fn arrivals(&self) -> Vec<(String, String, Instant)> {
        self.lock().arrivals.clone()
    }

    /// Blocks until `n` requests have arrived, answered or not (or `timeout` passes); returns
    /// whether they did. Woken by each arrival, not by a poll (see
    /// [`HttpServer::wait_for_answers`]).
    pub fn wait_for_arrivals(&self, n: usize, timeout: Duration) -> bool {
        let (lock, arrived) = &*self.inner;
        let inner = lock.lock().unwrap_or_else(PoisonError::into_inner);
        let (inner, _) = arrived
            .wait_timeout_while(inner, timeout, |i| i.arrivals.len() < n)
            .unwrap_or_else(PoisonError::into_inner);
        inner.arrivals.len() >= n
    }

    /// Blocks until the server has answered `n` requests (or `timeout` passes); returns whether
    /// it did.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        self.server.wait_for_answers(n, timeout)
    }

    /// The calls received, one line each, for a failure message.
    pub fn describe_calls(&self) -> String {
        self.server.describe_log()
    }
}

fn handle(request: &Request, (shared, arrived): &(Mutex<Inner>, Condvar)) -> Reply {
    let method = request.method.as_str();
    let guresid = request.last_segment();
    let body = request.json();
    let res_type = body["type"].as_str().unwrap_or_default();
    let behavior = {
        let mut inner = shared.lock().unwrap_or_else(PoisonError::into_inner);
        inner
            .arrivals
            .push((method.to_owned(), guresid.to_owned(), request.arrived));
        arrived.notify_all();
        let key = if method == "GET" { READS } else { res_type };
        inner.behaviors.get(key).cloned().unwrap_or_default()
    };
    thread::sleep(behavior.delay);

    let (status, response_body, set_cookie) = {
        let mut inner = shared.lock().unwrap_or_else(PoisonError::into_inner);
        answer(&mut inner, method, guresid, &body, &behavior)
    };
    let text = if status == 204 {
        String::new()
    } else {
        response_body.to_string()
    };
    let mut reply = Reply::text(status, text).header("Content-Type", "application/json");
    if let Some(cookie) = set_cookie {
        reply = reply.header(SET_COOKIE_HEADER, cookie);
    }
    reply
}

/// Status, body and cookie to set for one request.
fn answer(
    inner: &mut Inner,
    method: &str,
    guresid: &str,
    body: &Value,
    behavior: &Behavior,
) -> (u16, Value, Option<String>) {
    inner.calls += 1;
    if behavior.flaky_percent > 0 {
        // A multiplicative hash of the call's number: spread, and the same for every run.
        let roll = inner.calls.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        if roll % 100 < u64::from(behavior.flaky_percent) {
            return (503, json!({"message": "flaky: try again"}), None);
        }
    }
    if let Some((status, times)) = behavior.fail {
        let failed = inner.failures.entry(guresid.to_owned()).or_insert(0);
        if *failed < times {
            *failed += 1;
            return (
                status,
                json!({"message": format!("injected {status}")}),
                None,
            );
        }
    }
    match method {
        "PUT" if body["resource"]["fail"] == json!(true) => {
            (400, json!({"message": "this resource asks to fail"}), None)
        }
        "PUT" => {
            if !inner.instances.contains_key(guresid) {
                inner.next_instance += 1;
                let n = inner.next_instance;
                inner.instances.insert(guresid.to_owned(), n);
                *inner.creations.entry(guresid.to_owned()).or_insert(0) += 1;
            }
            let polls = inner.polls.entry(guresid.to_owned()).or_insert(0);
            if *polls < behavior.polls {
                *polls += 1;
                return (202, json!({}), Some(format!("polls={polls}")));
            }
            let instance = inner.instances[guresid];
            let cookie = match behavior.cookie_bytes {
                Some(n) => "c".repeat(n),
                None => format!("instance={instance}"),
            };
            let provisioned = inner.provisioned.entry(guresid.to_owned()).or_insert(0);
            *provisioned += 1;
            let mut values = json!({
                "instance": instance,
                "guresid": guresid,
                "name": format!("{}-{instance}", body["type"].as_str().unwrap_or("res")),
                "echo": body["driver"]["values"],
            });
            if behavior.drifting {
                values["observed"] = json!(*provisioned);
            }
            if behavior.leak_secrets {
                let mut leaves = Vec::new();
                string_leaves(&body["driver"]["secrets"], &mut leaves);
                let hex: Vec<String> = leaves
                    .iter()
                    .map(|s| s.bytes().map(|b| format!("{b:02x}")).collect())
                    .collect();
                let query: Vec<String> = leaves
                    .iter()
                    .enumerate()
                    .map(|(i, s)| format!("s{i}={}", url_encoded(s)))
                    .collect();
                values["leak_hex"] = json!(hex.join(","));
                values["leak_url"] = json!(format!("https://db.example/?{}", query.join("&")));
            }
            let mut answer = json!({"id": guresid, "type": body["type"], "resource": {
                "values": values,
                "secrets": {"token": format!("tok-{instance}")},
            }});
            // Manifests a definition asks for come back as the driver's own.
            if let Some(manifests) = body["driver"]["values"].get("manifests") {
                answer["manifests"] = manifests.clone();
            }
            (200, answer, Some(cookie))
        }
        "DELETE" => {
            inner.instances.remove(guresid);
            inner.polls.remove(guresid);
            // A deleted resource may be created again, under the same GUResID.
            inner.creations.remove(guresid);
            (204, Value::Null, None)
        }
        _ => (405, json!({"message": "method not allowed"}), None),
    }
}

/// Every string inside `value`.
fn string_leaves(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|v| string_leaves(v, out)),
        Value::Object(map) => map.values().for_each(|v| string_leaves(v, out)),
        _ => {}
    }
}

/// `text` percent-encoded as a query value: every byte but the unreserved ones escaped.
pub fn url_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
