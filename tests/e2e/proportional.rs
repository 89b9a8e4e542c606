//! Commands about part of an environment read that part: `graph --app` and `explain` build
//! the app asked about and the global resources it reaches, not the whole environment; what
//! they show of it is what the whole graph has.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::util::Sandbox;

/// The template with a second app, `blog`, a copy of `shop`, pushed and applied.
fn two_apps() -> Sandbox {
    let sb = Sandbox::new();
    sb.seed_template();
    for file in ["backend.yaml", "frontend.yaml"] {
        sb.write(
            &format!("workloads/blog/{file}"),
            &sb.read(&format!("workloads/shop/{file}")),
        );
    }
    sb.commit("Two apps");
    sb.gitplane(&["apply"]).ok();
    sb
}

/// The node GUResIDs of each environment of a `graph -o json`, with their apps.
fn nodes(graph: &Value) -> BTreeSet<(String, String, String)> {
    graph
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| {
            let env = g["env"].as_str().unwrap().to_owned();
            g["nodes"].as_array().unwrap().iter().map(move |n| {
                (
                    env.clone(),
                    n["app"].as_str().unwrap_or("-").to_owned(),
                    n["guresid"].as_str().unwrap().to_owned(),
                )
            })
        })
        .collect()
}

#[test]
fn graph_of_one_app_is_that_apps_part_of_the_whole_graph() {
    let sb = two_apps();
    let whole = nodes(&sb.gitplane(&["graph", "-o", "json"]).ok().json());
    let blog = nodes(
        &sb.gitplane(&["graph", "--app", "blog", "-o", "json"])
            .ok()
            .json(),
    );
    assert!(blog.iter().any(|(_, app, _)| app == "blog"), "{blog:?}");
    assert!(
        blog.iter().all(|(_, app, _)| app != "shop"),
        "no resource of another app: {blog:?}"
    );
    assert!(blog.is_subset(&whole), "{blog:?}");
    // Every resource of blog's is there (and no more than the global ones it reaches).
    let whole_blog: BTreeSet<_> = whole.iter().filter(|(_, app, _)| app == "blog").collect();
    let part_blog: BTreeSet<_> = blog.iter().filter(|(_, app, _)| app == "blog").collect();
    assert_eq!(part_blog, whole_blog);

    sb.gitplane(&["graph", "--app", "nope"])
        .fails()
        .stderr_has("no app 'nope' in commit")
        .stderr_has("(apps: blog, shop)");
}

#[test]
fn explain_reads_the_resources_app_alone() {
    let sb = two_apps();
    let resource = "blog/postgres.default#modules.backend.externals.db";
    let before = sb
        .gitplane(&["explain", resource, "--env", "development", "-o", "json"])
        .ok()
        .json();
    // Another app's workload stops parsing: the explanation of blog's database does not
    // depend on it, so it is the same, built from the commit.
    sb.edit(
        "workloads/shop/backend.yaml",
        "      port: 8080\n",
        "      port: 8080: x\n",
    );
    sb.commit("shop's backend broken");
    let after = sb
        .gitplane(&["explain", resource, "--env", "development", "-o", "json"])
        .ok()
        .json();
    assert_eq!(after["definition"], before["definition"], "{after}");
    assert_eq!(after["inputs"], before["inputs"], "{after}");
    assert!(
        after["note"].is_null() || !after["note"].to_string().contains("does not build"),
        "{after}"
    );
    // Shop's own resources are explained from the state, the commit not building for them.
    sb.gitplane(&[
        "explain",
        "shop/postgres.default#modules.backend.externals.db",
        "--env",
        "development",
    ])
    .ok()
    .stdout_has("does not build");
}
