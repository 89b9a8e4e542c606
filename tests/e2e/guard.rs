//! The deletion guard cannot be got round: a held deployment that a newer commit overtook can
//! no longer be approved, and a commit is judged by the threshold in force, not by one it sets.

use crate::util::Sandbox;

const TINY_APP: &str = "apiVersion: score.dev/v1b1\nmetadata:\n  name: tiny\ncontainers:\n  \
                        main:\n    image: registry.example.com/tiny:1\n";

#[test]
fn a_superseded_held_deployment_cannot_be_approved() {
    let sb = Sandbox::applied();
    // Renaming the only app's folder deletes every resource it has: held.
    sb.git(&["mv", "workloads/shop", "workloads/store"]);
    sb.commit("Rename the app");
    sb.gitplane(&["apply", "--env", "development"])
        .fails()
        .stdout_has("held by the deletion guard");
    let held = sb.last_deployment("development");
    assert_eq!(held.status, "held", "{held:?}");

    // Renamed back and applied: the environment runs the newest commit.
    sb.git(&["mv", "workloads/store", "workloads/shop"]);
    let back = sb.commit("Rename it back");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let resources = sb.resource_rows();
    let newest = sb.last_deployment("development");

    let run = sb
        .gitplane(&["approve", "--yes", &held.id.to_string()])
        .fails();
    run.stderr_has(&format!(
        "deployment {} was superseded by deployment {}",
        held.id, newest.id
    ))
    .stderr_has("only the newest deployment of an environment can be approved");
    assert_eq!(sb.resource_rows(), resources, "approve changed nothing");
    assert_eq!(
        sb.last_deployment("development").id,
        newest.id,
        "approve started no deployment"
    );
    let closed = sb
        .deployments_after(held.id - 1)
        .into_iter()
        .find(|d| d.id == held.id)
        .unwrap();
    assert_eq!(closed.status, "superseded", "{closed:?}");
    assert!(
        closed
            .error
            .as_deref()
            .is_some_and(|e| e.contains(&format!("superseded by deployment {}", newest.id))),
        "{closed:?}"
    );
    let status = sb
        .gitplane(&["status", "--env", "development", "--format", "json"])
        .ok()
        .json()[0]
        .clone();
    assert_eq!(status["commit"], back.as_str());
}

#[test]
fn a_newer_held_deployment_supersedes_an_older_one() {
    let sb = Sandbox::applied();
    sb.git(&["mv", "workloads/shop", "workloads/store"]);
    sb.commit("Rename the app");
    sb.gitplane(&["apply", "--env", "production"]).fails();
    let first = sb.last_deployment("production");
    sb.git(&["mv", "workloads/store", "workloads/market"]);
    let second_commit = sb.commit("Rename it again");
    sb.gitplane(&["apply", "--env", "production"]).fails();
    let second = sb.last_deployment("production");
    assert_eq!(second.status, "held");

    sb.gitplane(&["approve", "--yes", &first.id.to_string()])
        .fails()
        .stderr_has("was superseded by deployment");
    // The newest is approved and runs the newest commit.
    sb.gitplane(&["approve", "--yes", &second.id.to_string()])
        .ok();
    let status = sb
        .gitplane(&["status", "--env", "production", "--format", "json"])
        .ok()
        .json()[0]
        .clone();
    assert_eq!(status["commit"], second_commit.as_str());
    let history = sb
        .gitplane(&["history", "--env", "production", "--format", "json"])
        .ok()
        .json();
    let of = |id: i64| {
        history
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["id"] == id)
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(of(first.id), "superseded");
    assert_eq!(of(second.id), "succeeded");
}

#[test]
fn a_commit_cannot_raise_its_own_deletion_threshold() {
    let sb = Sandbox::applied();
    let resources = sb.resource_rows();
    // Every app goes, a tiny one comes, and the commit sets the threshold to 100%.
    sb.remove("workloads/shop");
    sb.write("workloads/tiny/main.yaml", TINY_APP);
    sb.write(
        "gitplane.yaml",
        "environment_defaults:\n  deletion_guard: {threshold: 100}\n",
    );
    sb.commit("Replace everything, and raise the threshold");
    let run = sb.gitplane(&["apply"]).fails();
    run.stdout_has("held by the deletion guard")
        .stdout_has("above the 50% threshold")
        .stdout_has("this commit raises the threshold to 100%");
    assert_eq!(sb.resource_rows(), resources, "nothing was deleted");
    assert_eq!(sb.last_deployment("development").status, "held");
    assert_eq!(sb.last_deployment("production").status, "held");

    // Once approved, the commit's threshold is in force: the next commit that replaces the
    // whole app passes at 100%.
    let held = sb.last_deployment("development");
    sb.gitplane(&["approve", "--yes", &held.id.to_string()])
        .ok();
    sb.git(&["mv", "workloads/tiny", "workloads/small"]);
    sb.commit("Rename the tiny app");
    sb.gitplane(&["apply", "--env", "development"]).ok();
    let d = sb.last_deployment("development");
    assert_eq!(d.status, "succeeded", "{d:?}");
    assert_eq!(d.counts[2], 2, "its two resources were replaced: {d:?}");
}

#[test]
fn removing_an_environment_file_deletes_its_resources_through_the_guard() {
    let sb = Sandbox::applied();
    let production = sb.res_ids("production");
    assert_eq!(production.len(), 6);
    sb.remove("environments/production.yaml");
    sb.commit("Retire production");
    let run = sb.gitplane(&["apply"]).fails();
    run.stdout_has("production: deployment")
        .stdout_has(
            "held by the deletion guard: it would delete all 6 resources of environment production",
        )
        .stdout_has("the commit has no environments/production.yaml");
    assert_eq!(sb.res_ids("production"), production, "nothing deleted yet");
    assert_eq!(sb.last_deployment("development").status, "succeeded");

    // Approved, every resource goes, the base-env last.
    let held = sb.last_deployment("production");
    assert_eq!(held.status, "held");
    sb.gitplane(&["approve", "--yes", &held.id.to_string()])
        .ok();
    let d = sb.last_deployment("production");
    assert_eq!(d.status, "succeeded", "{d:?}");
    assert_eq!(d.counts, [0, 0, 6, 0, 0], "{d:?}");
    let ops = sb.operations(d.id);
    assert_eq!(
        ops.last().map(|(_, r, _)| r.as_str()),
        Some("base-env"),
        "{ops:?}"
    );
    assert!(sb.res_ids("production").is_empty());
    assert_eq!(sb.res_ids("development").len(), 6);

    // Gone for good: the next apply does not look at it.
    let before = sb.max_id("deployment");
    sb.gitplane(&["apply"]).ok();
    let new = sb.deployments_after(before);
    assert!(new.iter().all(|d| d.env == "development"), "{new:?}");
}
