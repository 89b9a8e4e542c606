//! What reading stored secrets (`secret_refs: {store, ref}`) adds before a plan.
//!
//! `cargo bench --bench stores`:
//! - one Vault KV v2 read and one dir-store read, each the median of many, against a Vault-like
//!   server on 127.0.0.1 and a temporary directory;
//! - `Built::read_stored_secrets` on a graph of 10 000 apps (50 000 resources) whose 10 000
//!   databases read the same two secrets: the walk over every node, two reads, and filling the
//!   values in;
//! - the same with 200 definitions that each read a secret of their own (200 reads, eight at
//!   a time), against a Vault that answers at once and one that takes 5 ms, like one across a
//!   network.

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use gitplane::deploy::Built;
use gitplane::stores::{SecretStores, StoreConfig};
use serde_json::json;

const TOKEN: &str = "bench-token";

/// A KV v2 read route: every path holds `{"password": "<path>"}`; each answer waits `latency`
/// first, like a Vault across a network.
fn vault(latency: Duration) -> String {
    let server = tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let port = server.server_addr().to_ip().expect("an IP address").port();
    thread::spawn(move || {
        for request in server.incoming_requests() {
            // Vault answers concurrently: one thread per request.
            thread::spawn(move || {
                thread::sleep(latency);
                let path = request
                    .url()
                    .trim_start_matches("/v1/secret/data/")
                    .to_owned();
                let body =
                    json!({"data": {"data": {"password": path}, "metadata": {"version": 1}}});
                let _ = request.respond(tiny_http::Response::from_string(body.to_string()));
            });
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn stores(dir: &Path, url: String) -> SecretStores {
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).expect("write the token");
    std::fs::write(dir.join("admin"), "file-secret\n").expect("write a secret file");
    SecretStores::new(BTreeMap::from([
        (
            "files".to_owned(),
            StoreConfig::Dir {
                path: dir.to_owned(),
            },
        ),
        (
            "vault".to_owned(),
            StoreConfig::Vault {
                url,
                token_file,
                mount: "secret".to_owned(),
                timeout: Duration::from_secs(5),
            },
        ),
    ]))
}

/// `apps` apps with a workload and a database each; `distinct` more resource types whose
/// definitions each read their own Vault secret, requested by the first app.
fn repository(apps: usize, distinct: usize) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    files.insert(
        "environments/development.yaml".to_owned(),
        b"type: development\nimplicit_resources: []\n".to_vec(),
    );
    let definition = |id: &str, res_type: &str, refs: &str| {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\nentity:\n  \
             type: {res_type}\n  driver_type: humanitec/echo\n  driver_inputs:\n    values: {{name: x}}\n{refs}  \
             criteria:\n    - {{}}\n"
        )
    };
    let mut docs = vec![
        definition(
            "postgres",
            "postgres",
            "    secret_refs:\n      password: {store: vault, ref: 'db/prod#password'}\n      \
             admin: {store: files, ref: admin}\n",
        ),
        definition("workload", "workload", ""),
    ];
    let mut extra = String::new();
    for k in 0..distinct {
        docs.push(definition(
            &format!("svc-{k}"),
            &format!("svc-{k}"),
            &format!("    secret_refs:\n      key: {{store: vault, ref: 'svc/{k}#password'}}\n"),
        ));
        extra.push_str(&format!("  svc{k}:\n    type: svc-{k}\n"));
    }
    files.insert(
        "definitions/platform.yaml".to_owned(),
        docs.join("---\n").into_bytes(),
    );
    for i in 0..apps {
        let more = if i == 0 { extra.as_str() } else { "" };
        files.insert(
            format!("workloads/app-{i:05}/web.yaml"),
            format!(
                "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
                 image: x\nresources:\n  db:\n    type: postgres\n{more}"
            )
            .into_bytes(),
        );
    }
    files
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fill(apps: usize, distinct: usize, stores: &SecretStores) -> (usize, Duration) {
    let files = repository(apps, distinct);
    let repo = gitplane::model::load(&files).expect("the generated repository loads");
    let graph = gitplane::graph::build(&repo, &repo.environments[0]).expect("and builds");
    let resources = graph.len();
    let mut runs = Vec::new();
    for _ in 0..3 {
        let mut built = Built {
            graphs: vec![graph.clone()],
        };
        let t = Instant::now();
        built
            .read_stored_secrets(stores)
            .expect("every secret is readable");
        runs.push(t.elapsed());
    }
    (resources, runs.into_iter().min().unwrap_or_default())
}

fn main() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let local = stores(dir.path(), vault(Duration::ZERO));

    let time = |store: &str, reference: &str| {
        let runs: Vec<Duration> = (0..500)
            .map(|_| {
                let t = Instant::now();
                local.read(store, reference, None).expect("readable");
                t.elapsed()
            })
            .collect();
        median(runs)
    };
    println!(
        "one read: vault {:.3} ms, dir {:.3} ms (median of 500)",
        ms(time("vault", "db/prod#password")),
        ms(time("files", "admin"))
    );
    let remote = stores(dir.path(), vault(Duration::from_millis(5)));
    for (apps, distinct, stores, vault) in [
        (10_000, 0, &local, "local"),
        (10, 200, &local, "local"),
        (10, 200, &remote, "5 ms away"),
    ] {
        let (resources, took) = fill(apps, distinct, stores);
        println!(
            "read_stored_secrets: {apps:>6} apps {resources:>6} resources {:>4} distinct refs, \
             vault {vault:<9}: {:>7.1} ms (best of 3)",
            distinct + 2,
            ms(took)
        );
    }
}
