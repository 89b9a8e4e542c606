//! Reconciling 1 000 resources behind an asynchronous HTTP driver, against the ideal.
//!
//! The driver (tiny_http on 127.0.0.1, a thread per request) answers every call after 50 ms,
//! and a PUT twice with 202 before its 200, so each resource costs three calls. The graph has
//! 250 apps of four resources in a chain (workload -> queue -> postgres -> base-env): depth 4.
//!
//! ideal = max(critical path, all calls / concurrency) x 50 ms
//!       = max(4 x 3, 3 000 / concurrency) x 50 ms
//!
//! `cargo bench --bench reconcile` runs concurrency 16 (the default) and 64;
//! `cargo bench --bench reconcile -- 32` runs one limit.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gitplane::config::RetryPolicy;
use gitplane::drivers::{HttpDriver, Registry};
use gitplane::reconcile::{Settings, apply};
use gitplane_state::Store;

const APPS: usize = 250;
const LATENCY: Duration = Duration::from_millis(50);
const POLLS: u32 = 2;

fn driver_server() -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind");
    let port = server.server_addr().to_ip().expect("ip").port();
    let polls: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    std::thread::spawn(move || {
        for mut request in server.incoming_requests() {
            let polls = polls.clone();
            std::thread::spawn(move || {
                let mut body = String::new();
                let _ = request.as_reader().read_to_string(&mut body);
                std::thread::sleep(LATENCY);
                let guresid = request
                    .url()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                let response = if request.method() == &tiny_http::Method::Delete {
                    tiny_http::Response::from_string("").with_status_code(204)
                } else {
                    let mut polls = polls.lock().expect("not poisoned");
                    let n = polls.entry(guresid.clone()).or_insert(0);
                    if *n < POLLS {
                        *n += 1;
                        tiny_http::Response::from_string("{}").with_status_code(202)
                    } else {
                        let out = format!(
                            r#"{{"id":"{guresid}","type":"x","resource":{{"values":{{"name":"{guresid}"}},"secrets":{{}}}}}}"#
                        );
                        tiny_http::Response::from_string(out).with_status_code(200)
                    }
                };
                let _ = request.respond(response);
            });
        }
    });
    format!("http://127.0.0.1:{port}/driver")
}

fn repository() -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    files.insert(
        "environments/bench.yaml".to_owned(),
        b"type: bench\n".to_vec(),
    );
    let def = |id: &str, values: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
             type: {id}\n  driver_type: bench/http\n  driver_inputs:\n    values:\n      {values}\n  \
             criteria:\n    - {{}}\n"
        )
    };
    files.insert(
        "definitions/chain.yaml".to_owned(),
        [
            def("base-env", "zone: bench"),
            def(
                "postgres",
                "host: ${resources.base-env#base-env.outputs.name}",
            ),
            def("queue", "db: ${resources.postgres.outputs.name}"),
            def("workload", "queue: ${resources.queue.outputs.name}"),
        ]
        .join("---\n")
        .into_bytes(),
    );
    for i in 0..APPS {
        files.insert(
            format!("workloads/app-{i:03}/web.yaml"),
            b"apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    image: x\n"
                .to_vec(),
        );
    }
    files
}

fn run(concurrency: usize) {
    // A fresh driver per run: it remembers the polls of each GUResID.
    let url = &driver_server();
    let repo = gitplane::model::load(&repository()).expect("loads");
    let graph = gitplane::graph::build(&repo, &repo.environments[0]).expect("builds");
    assert_eq!(graph.len(), APPS * 4);
    let target = gitplane::deploy::Target {
        graph,
        scope: gitplane::deploy::Scope::whole(Default::default()),
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = Store::open(&dir.path().join("state.db")).expect("state");
    let mut drivers = Registry::builtin();
    drivers.register(
        "bench/http",
        Arc::new(HttpDriver::new(url, Duration::from_secs(10))),
        None,
    );
    let settings = Settings {
        concurrency,
        retry: RetryPolicy {
            poll_interval: Duration::from_millis(10),
            ..RetryPolicy::default()
        },
        accounts: Arc::new(|name| Err(format!("no account {name}"))),
        calls: None,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(concurrency + 8)
        .enable_time()
        .build()
        .expect("runtime");
    let started = Instant::now();
    let report = runtime
        .block_on(apply(
            &mut store,
            &drivers,
            &settings,
            &target,
            "bench",
            &Default::default(),
            &mut |_| {},
        ))
        .expect("state works");
    let wall = started.elapsed();
    assert_eq!(
        report.counts.created as usize,
        APPS * 4,
        "{:?}",
        report.failures
    );
    let calls = (APPS * 4) as u32 * (POLLS + 1);
    let critical = 4 * (POLLS + 1);
    let ideal = LATENCY * critical.max(calls.div_ceil(concurrency as u32));
    println!(
        "concurrency {concurrency:>3}: {} resources, {calls} calls, wall {:>6.2} s, ideal {:>6.2} s, ratio {:.2}",
        APPS * 4,
        wall.as_secs_f64(),
        ideal.as_secs_f64(),
        wall.as_secs_f64() / ideal.as_secs_f64()
    );
}

fn main() {
    let limits: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let limits = if limits.is_empty() {
        vec![16, 64]
    } else {
        limits
    };
    for limit in limits {
        run(limit);
    }
}
