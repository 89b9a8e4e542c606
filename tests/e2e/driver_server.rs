//! A real HTTP driver on 127.0.0.1 implementing the Humanitec Driver Interface the way a real
//! asynchronous driver does: one instance per GUResID, 202 while provisioning with a cookie that
//! counts the polls, 200 with outputs, 204 on delete. Behaviour is set per resource type, so a
//! test can inject a 500, a 400, a slow answer or an oversized cookie. It records every request.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The key of the behaviour of reads among those of resource types.
const READS: &str = "(reads)";

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

/// One request the driver received.
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
    received: Vec<Received>,
    /// Every request as it arrived, before it is answered: method, GUResID and when.
    arrivals: Vec<(String, String, Instant)>,
    /// Calls answered, for the flaky sequence.
    calls: u64,
}

pub struct DriverServer {
    /// `http://127.0.0.1:PORT/driver`, the URL to register.
    pub url: String,
    inner: Arc<(Mutex<Inner>, Condvar)>,
}

impl DriverServer {
    pub fn start() -> DriverServer {
        let server = tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = server.server_addr().to_ip().expect("an IP address").port();
        let inner: Arc<(Mutex<Inner>, Condvar)> = Arc::default();
        let shared = inner.clone();
        thread::spawn(move || {
            for request in server.incoming_requests() {
                let shared = shared.clone();
                // One thread per request: resources are provisioned concurrently.
                thread::spawn(move || handle(request, &shared));
            }
        });
        DriverServer {
            url: format!("http://127.0.0.1:{port}/driver"),
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

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn received(&self) -> Vec<Received> {
        self.lock().received.clone()
    }

    /// The live instances: GUResID to instance number.
    pub fn instances(&self) -> BTreeMap<String, u64> {
        self.lock().instances.clone()
    }

    /// GUResIDs for which more than one instance was ever created while none was deleted.
    pub fn creations(&self) -> HashMap<String, u32> {
        self.lock().creations.clone()
    }

    /// Every request as it arrived (method, GUResID, when), answered or not yet.
    pub fn arrivals(&self) -> Vec<(String, String, Instant)> {
        self.lock().arrivals.clone()
    }

    /// Blocks until `n` requests have arrived, answered or not (or `timeout` passes); returns
    /// whether they did.
    pub fn wait_for_arrivals(&self, n: usize, timeout: Duration) -> bool {
        let (lock, cv) = &*self.inner;
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, timeout, |i| i.arrivals.len() < n)
            .unwrap_or_else(|e| e.into_inner());
        guard.arrivals.len() >= n
    }

    /// Blocks until the server has received `n` requests (or `timeout` passes); returns whether
    /// it did.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        let (lock, cv) = &*self.inner;
        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
        let (guard, _) = cv
            .wait_timeout_while(guard, timeout, |i| i.received.len() < n)
            .unwrap_or_else(|e| e.into_inner());
        guard.received.len() >= n
    }
}

fn handle(mut request: tiny_http::Request, shared: &(Mutex<Inner>, Condvar)) {
    let arrived = Instant::now();
    let method = request.method().to_string();
    let guresid = request
        .url()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let cookie = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Humanitec-Driver-Cookie"))
        .map(|h| h.value.to_string());
    let mut text = String::new();
    let _ = request.as_reader().read_to_string(&mut text);
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let res_type = body["type"].as_str().unwrap_or_default().to_owned();

    let behavior = {
        let mut inner = shared.0.lock().unwrap_or_else(|e| e.into_inner());
        inner
            .arrivals
            .push((method.clone(), guresid.clone(), arrived));
        shared.1.notify_all();
        let key = if method == "GET" { READS } else { &res_type };
        inner.behaviors.get(key).cloned().unwrap_or_default()
    };
    thread::sleep(behavior.delay);

    let (status, response_body, set_cookie) = {
        let mut inner = shared.0.lock().unwrap_or_else(|e| e.into_inner());
        answer(&mut inner, &method, &guresid, &body, &behavior)
    };
    let text = if status == 204 {
        String::new()
    } else {
        response_body.to_string()
    };
    let mut response = tiny_http::Response::from_string(text)
        .with_status_code(status)
        .with_header(
            "Content-Type: application/json"
                .parse::<tiny_http::Header>()
                .expect("a valid header"),
        );
    if let Some(c) = &set_cookie {
        let header = tiny_http::Header::from_bytes("Set-Humanitec-Driver-Cookie", c.as_bytes())
            .expect("a valid header");
        response = response.with_header(header);
    }
    // Taken before the answer leaves: a client may send its next request the moment it reads
    // this one, so a later timestamp could land after that request's `arrived`.
    let answered = Instant::now();
    let _ = request.respond(response);
    let (lock, cv) = shared;
    let mut inner = lock.lock().unwrap_or_else(|e| e.into_inner());
    inner.received.push(Received {
        method,
        guresid,
        body,
        cookie,
        status,
        set_cookie,
        arrived,
        answered,
    });
    cv.notify_all();
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
