//! `gitplane pin`: an environment frozen at what it runs, with no deployment; later commits are
//! planned, not applied, until `unpin`.

use crate::util::Sandbox;

#[test]
fn pin_freezes_an_environment_at_what_it_runs_until_unpinned() {
    let sb = Sandbox::applied();
    let running = sb.head();
    let deployments = sb.max_id("deployment");
    sb.gitplane(&[
        "pin",
        "--env",
        "production",
        "--reason",
        "audit freeze",
        "--by",
        "alice",
    ])
    .ok()
    .stdout_has(&format!(
        "production: pinned at {} by alice: audit freeze",
        &running[..12]
    ));
    assert_eq!(
        sb.max_id("deployment"),
        deployments,
        "a pin deploys nothing"
    );
    assert_eq!(
        sb.rows("SELECT commit_id, pinned_by, reason FROM env_pin WHERE unpinned_at IS NULL"),
        [[running.as_str(), "alice", "audit freeze"]]
    );

    // Refused: a second pin, no reason, no environment or two; each changes nothing.
    sb.gitplane(&["pin", "--env", "production", "--reason", "again"])
        .fails()
        .stderr_has("environment 'production' is pinned already (at");
    sb.gitplane(&["pin", "--env", "development", "--reason", " "])
        .fails()
        .stderr_has("pin: --reason is empty");
    sb.gitplane(&["pin", "--reason", "which?"])
        .fails()
        .stderr_has("pin: pass exactly one --env");
    assert_eq!(sb.count("SELECT COUNT(*) FROM env_pin"), 1);

    // A later commit: development gets it, production is planned only.
    sb.edit(
        "workloads/shop/backend.yaml",
        "backend:1.4.2",
        "backend:1.4.3",
    );
    let newer = sb.commit("backend 1.4.3");
    // As after a rollback, apply exits 1: a commit it was asked to apply was not.
    sb.gitplane(&["apply"]).fails().stdout_has(&format!(
        "production: pinned at {} by alice (audit freeze): commit {} is planned, not applied",
        &running[..12],
        &newer[..12]
    ));
    assert_eq!(sb.last_deployment("development").commit, newer);
    assert_eq!(sb.last_deployment("production").commit, running);
    let history = sb.gitplane(&["history", "--env", "production"]).ok();
    history.stdout_has("pin by alice");

    // Unpinned, production gets the newest commit.
    sb.gitplane(&["unpin", "--env", "production", "--by", "bob"])
        .ok();
    assert_eq!(sb.last_deployment("production").commit, newer);
}
