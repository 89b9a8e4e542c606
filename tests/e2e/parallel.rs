//! What an apply does on many cores is what it does on one: the graph, the GUResIDs and every
//! row the state records never depend on how many threads ran or which finished first.

use std::path::Path;

use crate::util::{Sandbox, open_db, rows};

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
