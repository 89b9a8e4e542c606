//! What an apply does on many cores is what it does on one: the graph, the GUResIDs and every
//! row the state records never depend on how many threads ran or which finished first.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use gitplane_testkit::{HttpServer, Reply};

use crate::util::{Sandbox, http_driver_config, open_db, rows};

/// Apps in the repository: enough that files parse, and in-process calls and their records run,
/// spread over the threads (a batch of a few hundred operations).
const APPS: usize = 40;

/// The template with `APPS` copies of its app, committed.
fn many_apps() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    for n in 0..APPS {
        for file in ["backend.yaml", "frontend.yaml"] {
            sb.write(
                &format!("workloads/app-{n:02}/{file}"),
                &sb.read(&format!("workloads/shop/{file}")),
            );
        }
    }
    sb.commit("Many apps");
    sb
}

/// What the state at `path` records, without the times and the sealed bytes (sealing draws a
/// random nonce): each table's rows in their id order where ids say the order of writing.
fn recorded(path: &Path) -> Vec<Vec<Vec<String>>> {
    let db = open_db(path);
    [
        "SELECT guresid, env, app, type, class, res_id, definition, driver, account,
                deletion_policy, template_hash, status, inputs_hash, outputs, inputs, error,
                commit_id, deployment_id, version_from
           FROM resource ORDER BY guresid",
        "SELECT id, deployment_id, guresid, app, type, class, res_id, action, reason, status,
                attempts, outputs_changed, error
           FROM operation ORDER BY id",
        "SELECT * FROM binding ORDER BY id",
        "SELECT * FROM link ORDER BY id",
        "SELECT * FROM edge ORDER BY env, from_guresid, to_guresid",
        "SELECT guresid, manifests FROM resource_manifest ORDER BY guresid",
        "SELECT id, guresid, env, app, type, class, res_id, definition, driver, status,
                inputs_hash, outputs, error, commit_id, valid_from, valid_to
           FROM resource_version ORDER BY id",
        "SELECT env, app, fingerprint FROM app_fingerprint ORDER BY env, app",
    ]
    .iter()
    .map(|sql| rows(&db, sql))
    .collect()
}

/// With one thread each batch is journalled in place; with four, the batches answered in
/// process go to the journal's writer, on a connection of its own: the rows are the same.
#[test]
fn one_thread_and_four_record_the_same_graph_and_rows() {
    let sb = many_apps();
    let repo = sb.origin.to_str().unwrap();
    let run = |threads: &str, state: &Path| {
        let state = state.to_str().unwrap();
        let env = [("RAYON_NUM_THREADS", threads)];
        let graph = sb
            .gitplane_raw(
                &["graph", "-o", "json", "--repo", repo, "--state", state],
                &env,
            )
            .ok()
            .stdout;
        sb.gitplane_raw(&["apply", "--repo", repo, "--state", state], &env)
            .ok()
            .stdout_has("succeeded");
        graph
    };
    let one = sb.root.join("one.db");
    let four = sb.root.join("four.db");
    let graph_one = run("1", &one);
    let graph_four = run("4", &four);
    assert!(
        graph_one.matches("\"guresid\"").count() > 10 * APPS,
        "{graph_one}"
    );
    assert_eq!(graph_one, graph_four, "graph JSON, 1 thread vs 4");
    let (rows_one, rows_four) = (recorded(&one), recorded(&four));
    assert!(
        rows_one[1].len() > 10 * APPS,
        "operations: {}",
        rows_one[1].len()
    );
    for (table, (a, b)) in rows_one.iter().zip(&rows_four).enumerate() {
        assert_eq!(a, b, "table #{table} of the state, 1 thread vs 4");
    }
}

/// A driver call that comes after hundreds of resources answered in process (their journal
/// written on a connection of its own while the next batch is prepared) finds every resource it
/// reads recorded in the state when it arrives: nothing outside gitplane acts on what is not
/// journalled.
#[test]
fn a_driver_call_after_many_in_process_answers_finds_what_it_reads_recorded() {
    let sb = many_apps();
    let workload = sb.read("definitions/workload.yaml");
    sb.write(
        "definitions/workload.yaml",
        &workload.replace("driver_type: humanitec/echo", "driver_type: test/http"),
    );
    sb.commit("Workloads through an HTTP driver");
    let state = sb.state.clone();
    // What each resource reads, from the graph once the driver is registered.
    let reads: Arc<OnceLock<HashMap<String, Vec<String>>>> = Arc::default();
    let (seen, missing): (Arc<Mutex<usize>>, Arc<Mutex<Vec<String>>>) = Default::default();
    let server = {
        let (state, reads, seen, missing) =
            (state.clone(), reads.clone(), seen.clone(), missing.clone());
        HttpServer::start(move |request| {
            let guresid = request.last_segment().to_owned();
            if request.method == "PUT" {
                let db = open_db(&state);
                let providers = reads.get().and_then(|r| r.get(&guresid));
                for provider in providers.into_iter().flatten() {
                    let recorded: i64 = db
                        .query_row(
                            "SELECT count(*) FROM resource r JOIN operation o
                               ON o.guresid = r.guresid AND o.status = 'succeeded'
                             WHERE r.guresid = ?1",
                            [provider],
                            |r| r.get(0),
                        )
                        .expect("the state reads");
                    if recorded == 0 {
                        missing
                            .lock()
                            .unwrap()
                            .push(format!("{guresid} reads {provider}"));
                    }
                }
                *seen.lock().unwrap() += 1;
            }
            Reply::text(
                200,
                format!(
                    r#"{{"id":"{guresid}","type":"workload","resource":{{"values":{{}},"secrets":{{}}}}}}"#
                ),
            )
        })
    };
    let args = sb.host_config(&http_driver_config(
        &format!("{}/driver", server.url),
        "concurrency: 4",
    ));
    let with_args = |command: &[&str]| {
        let mut all = command.to_vec();
        all.extend(args.iter().map(String::as_str));
        // More than one thread: the batches answered in process go to the journal's writer.
        sb.gitplane_raw(&all, &[("RAYON_NUM_THREADS", "4")]).ok()
    };
    let graphs: serde_json::Value =
        serde_json::from_str(&with_args(&["graph", "-o", "json"]).stdout).expect("graph JSON");
    let graphs = graphs.as_array().expect("one graph per environment");
    // The edges leave the dependent.
    let mut read: HashMap<String, Vec<String>> = HashMap::new();
    for edge in graphs
        .iter()
        .flat_map(|g| g["edges"].as_array().expect("edges"))
    {
        read.entry(edge["from"].as_str().expect("from").to_owned())
            .or_default()
            .push(edge["to"].as_str().expect("to").to_owned());
    }
    reads.set(read).expect("set once");
    let workloads = graphs
        .iter()
        .flat_map(|g| g["nodes"].as_array().expect("nodes"))
        .filter(|n| n["type"] == "workload")
        .count();
    with_args(&["apply"]).stdout_has("succeeded");
    let db = open_db(&state);
    let in_process: i64 = db
        .query_row(
            "SELECT count(*) FROM resource WHERE driver = 'humanitec/echo'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        in_process > 4 * APPS as i64,
        "answered in process: {in_process}"
    );
    assert!(workloads > 2 * APPS, "workloads: {workloads}");
    assert_eq!(*seen.lock().unwrap(), workloads, "one call per workload");
    let missing = missing.lock().unwrap();
    assert!(
        missing.is_empty(),
        "called before what it reads was recorded: {missing:?}"
    );
}
