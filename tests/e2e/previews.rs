//! Preview environments as a trust boundary, through the real daemon on a bare repository people
//! push to: a preview runs its branch's workloads with the watched ref's platform (a branch
//! cannot bring definitions, and so code or credentials, of its own unless `previews.trust:
//! branch` says so), and never touches an environment the watched ref declares, whatever the
//! state recorded about earlier previews.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::daemon::{Daemon, wait_deployed};
use crate::util::Sandbox;
use crate::workflow::{
    calls, guresids, host_config, push_branch, strs, wait_until, write_platform, write_workload,
};
use gitplane_testkit::DriverServer;

const CREDENTIAL: &str = "AKIA-preview-credential-7Qx9";

/// The workflow tests' platform committed on `main`, and the daemon watching it with the host
/// config's `extra` lines (the `previews:` under test), once `main` is deployed to `test`.
struct Watched {
    sb: Sandbox,
    server: DriverServer,
    /// The daemon's arguments; the host config's path is the last.
    args: Vec<String>,
    daemon: Daemon,
    main: String,
}

impl Watched {
    fn start(extra: impl FnOnce(&Sandbox) -> String) -> Watched {
        let sb = Sandbox::new();
        let server = DriverServer::start();
        write_platform(&sb, "v1");
        let main = sb.commit("A platform");
        let args = host_config(&sb, &server, &extra(&sb));
        let daemon = Daemon::start(&sb, &strs(&args));
        wait_deployed(&sb, &main, &["test"], Duration::from_secs(30));
        Watched {
            sb,
            server,
            args,
            daemon,
            main,
        }
    }

    /// The GUResIDs of `env`'s resources, and the newest PUT of type `res_type` among them.
    fn last_put(&self, ids: &BTreeSet<String>, res_type: &str) -> serde_json::Value {
        self.server
            .received()
            .into_iter()
            .rev()
            .find(|r| r.method == "PUT" && ids.contains(&r.guresid) && r.body["type"] == res_type)
            .map(|r| r.body)
            .unwrap_or_else(|| panic!("no PUT of a {res_type}"))
    }
}

/// A definition a branch adds: the postgres of its preview, by Terraform code that runs a
/// program on the host (touching `marker`) and publishes the account's credential as a plain
/// output.
fn hostile_definition(marker: &std::path::Path) -> String {
    format!(
        r#"apiVersion: entity.humanitec.io/v1b1
kind: Definition
metadata:
  id: branch-postgres
entity:
  type: postgres
  driver_type: humanitec/terraform
  driver_account: cloud
  driver_inputs:
    values:
      credentials_config:
        variables:
          cred: secret_key
      script: |
        variable "cred" {{}}
        resource "terraform_data" "x" {{
          provisioner "local-exec" {{
            command = "touch {}"
          }}
        }}
        output "name" {{ value = var.cred }}
  criteria:
    - {{env_type: preview, app_id: shop}}
"#,
        marker.display()
    )
}

/// Finding: with `previews:` on, a pushed `pr-*` branch that added a Terraform definition with a
/// `local-exec` provisioner ran it on the host, and one naming a resource account published its
/// credential. Now the branch's definitions are never read: its plan is all it gets, `status`
/// says why, and once it changes only workloads it is deployed with the watched ref's platform,
/// which a later commit of the watched ref updates.
#[test]
#[cfg_attr(not(terraform), ignore = "neither terraform nor tofu is installed")]
fn a_preview_runs_its_branchs_workloads_with_the_watched_refs_platform_only() {
    if !crate::terraform::installed() {
        return;
    }
    let mut marker = std::path::PathBuf::new();
    let w = Watched::start(|sb| {
        marker = sb.root.join("MARKER-code-ran");
        let account = sb.root.join("cloud.json");
        std::fs::write(&account, format!("{{\"secret_key\": \"{CREDENTIAL}\"}}")).unwrap();
        format!(
            "previews: {{branches: \"pr-*\", type: preview}}\naccounts:\n  cloud: {{file: {}}}\n",
            account.display()
        )
    });
    let Watched {
        sb,
        server,
        args,
        daemon,
        main,
    } = &w;

    // The branch brings a workload and a definition of its own.
    sb.git(&["checkout", "--quiet", "-b", "pr-1"]);
    write_workload(sb, "v2");
    sb.write("definitions/branch.yaml", &hostile_definition(&marker));
    let hostile = push_branch(sb, "pr-1", "A postgres of my own");
    wait_until(
        "the branch refused a preview",
        daemon,
        Duration::from_secs(30),
        || {
            sb.count(&format!(
                "SELECT COUNT(*) FROM preview WHERE env = 'pr-1' AND refused_commit = '{hostile}'"
            )) == 1
        },
    );
    // Time enough for a deployment to have started, had one been dispatched. Not a wait for
    // an event: time passes to show that none comes.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!marker.exists(), "the branch's code ran on the host");
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM deployment WHERE env = 'pr-1'"),
        0,
        "nothing deployed"
    );
    let status = sb.gitplane(&["status"]).ok();
    status.stdout_has(&format!(
        "not deployed: pr-1 at {}: it changes files outside workloads/ (definitions/branch.yaml)",
        &hostile[..12]
    ));
    let json = sb.gitplane(&["status", "--format", "json"]).ok();
    let preview = json
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["env"] == "pr-1")
        .cloned()
        .unwrap();
    assert_eq!(preview["preview"]["refused"]["commit"], hostile.as_str());
    // Its plan is still there for review.
    let config = &args[args.len() - 1];
    let plan = sb
        .gitplane(&[
            "plan", "--ref", "pr-1", "--format", "markdown", "--config", config,
        ])
        .ok();
    plan.hides(&[CREDENTIAL]).stdout_has("1 to update");

    // The branch drops its definition: it changes workloads alone, and is deployed with the
    // watched ref's postgres.
    sb.remove("definitions/branch.yaml");
    let workloads_only = push_branch(sb, "pr-1", "Only the workload");
    wait_deployed(sb, &workloads_only, &["pr-1"], Duration::from_secs(30));
    assert!(!marker.exists());
    let ids = guresids(sb, "pr-1");
    assert_eq!(ids.len(), 3);
    let last_put = |res_type: &str| w.last_put(&ids, res_type);
    assert_eq!(
        last_put("postgres")["driver"]["values"]["size"],
        "tiny-preview"
    );
    assert!(last_put("workload").to_string().contains("shop:v2"));
    assert_eq!(
        sb.rows("SELECT platform_commit, refused_commit FROM preview WHERE env = 'pr-1'"),
        [[main.clone(), "NULL".to_owned()]]
    );
    sb.gitplane(&["status", "--env", "pr-1"])
        .ok()
        .stdout_has(&format!("with the platform of {}", &main[..12]));

    // The watched ref's next platform reaches the preview without a push of the branch.
    sb.git(&["checkout", "--quiet", "main"]);
    sb.edit(
        "definitions/platform.yaml",
        "size: tiny-preview",
        "size: small-preview",
    );
    let platform = sb.commit("Bigger preview databases");
    wait_until(
        "the preview deployed with the new platform",
        daemon,
        Duration::from_secs(30),
        || {
            server.received().iter().any(|r| {
                r.method == "PUT"
                    && ids.contains(&r.guresid)
                    && r.body["driver"]["values"]["size"] == "small-preview"
            })
        },
    );
    assert_eq!(
        sb.rows("SELECT platform_commit FROM preview WHERE env = 'pr-1'"),
        [[platform.clone()]]
    );
    assert_eq!(
        last_put("postgres")["driver"]["values"]["size"],
        "small-preview"
    );
    assert!(
        last_put("workload").to_string().contains("shop:v2"),
        "still the branch's"
    );

    // The credential is nowhere gitplane writes or shows.
    sb.assert_state_bytes_hide(&[CREDENTIAL]);
    for args in [
        &["status", "--format", "json"][..],
        &["history", "--format", "json"],
        &["report", "resources", "--format", "json"],
    ] {
        sb.gitplane(args).ok().hides(&[CREDENTIAL]);
    }
    assert!(!daemon.log().contains(CREDENTIAL));
    assert!(!marker.exists());
}

/// `previews.trust: branch` is the documented opt-in to deploy whole branches: the branch's own
/// definitions are used.
#[test]
fn with_trust_branch_a_preview_runs_the_whole_branch() {
    let w = Watched::start(|_| {
        "previews: {branches: \"pr-*\", type: preview, trust: branch}\n".to_owned()
    });
    let sb = &w.sb;
    sb.git(&["checkout", "--quiet", "-b", "pr-3"]);
    sb.edit(
        "definitions/platform.yaml",
        "size: tiny-preview",
        "size: branch-size",
    );
    let head = push_branch(sb, "pr-3", "My own preview database");
    wait_deployed(sb, &head, &["pr-3"], Duration::from_secs(30));
    let ids = guresids(sb, "pr-3");
    assert_eq!(
        w.last_put(&ids, "postgres")["driver"]["values"]["size"],
        "branch-size"
    );
    assert_eq!(
        sb.rows("SELECT COALESCE(platform_commit, 'none') FROM preview WHERE env = 'pr-3'"),
        [["none"]]
    );
}

/// Finding: preview `pr-x` expired; the watched ref then declared `environments/pr-x.yaml` and
/// the daemon deployed it; a new push of branch `pr-x` deployed the branch over it, deleting
/// resources, and its ttl then deleted the rest. The watched ref's declaration always wins: the
/// push deploys nothing, deletes nothing, and the stale preview record is closed.
#[test]
fn a_branch_never_deploys_over_an_environment_the_watched_ref_declares() {
    let w =
        Watched::start(|_| "previews: {branches: \"pr-*\", type: preview, ttl: 2s}\n".to_owned());
    let (sb, server, daemon) = (&w.sb, &w.server, &w.daemon);

    // A preview that expires.
    sb.git(&["checkout", "--quiet", "-b", "pr-x"]);
    write_workload(sb, "v2");
    let first = push_branch(sb, "pr-x", "Try v2");
    wait_deployed(sb, &first, &["pr-x"], Duration::from_secs(30));
    wait_until("the ttl to expire", daemon, Duration::from_secs(20), || {
        sb.count("SELECT COUNT(*) FROM preview WHERE env = 'pr-x' AND removed_at IS NOT NULL") == 1
    });

    // The watched ref declares pr-x, and the daemon deploys it.
    sb.git(&["checkout", "--quiet", "main"]);
    sb.write("environments/pr-x.yaml", "type: test\n");
    let declared = sb.commit("pr-x becomes a real environment");
    wait_deployed(sb, &declared, &["pr-x"], Duration::from_secs(30));
    let owned = guresids(sb, "pr-x");
    assert_eq!(owned.len(), 3);
    let deletes_before = calls(server, "DELETE", &owned).len();

    // A new push of the branch changes nothing there.
    sb.git(&["checkout", "--quiet", "pr-x"]);
    write_workload(sb, "v3");
    let pushed = push_branch(sb, "pr-x", "Try v3");
    wait_until(
        "the stale preview record closed",
        daemon,
        Duration::from_secs(30),
        || {
            sb.count(
                "SELECT COUNT(*) FROM preview WHERE env = 'pr-x' \
                 AND removed_why = 'the watched ref declares it'",
            ) == 1
        },
    );
    // Longer than the ttl, and than a deployment of the push would take. Not a wait for an
    // event: time passes to show that none comes.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE commit_id = '{pushed}'"
        )),
        0,
        "the branch deployed nothing"
    );
    assert_eq!(guresids(sb, "pr-x"), owned, "every resource is still there");
    assert_eq!(
        calls(server, "DELETE", &owned).len(),
        deletes_before,
        "nothing deleted at the driver"
    );
    assert_eq!(
        sb.column("SELECT DISTINCT commit_id FROM resource WHERE env = 'pr-x'"),
        std::slice::from_ref(&declared)
    );
    sb.gitplane(&["status", "--env", "pr-x"])
        .ok()
        .stdout_has("no longer a preview (it was branch pr-x's): the watched ref declares it");
}

/// The same with a live preview: once the watched ref declares its environment, the watched
/// ref's commit deploys it (the preview's resources become the environment's) and the branch's
/// pushes leave it alone.
#[test]
fn the_watched_ref_takes_over_a_live_preview_it_declares() {
    let w = Watched::start(|_| "previews: {branches: \"pr-*\", type: preview}\n".to_owned());
    let (sb, daemon) = (&w.sb, &w.daemon);
    sb.git(&["checkout", "--quiet", "-b", "pr-y"]);
    write_workload(sb, "v2");
    let preview = push_branch(sb, "pr-y", "Try v2");
    wait_deployed(sb, &preview, &["pr-y"], Duration::from_secs(30));
    let ids = guresids(sb, "pr-y");

    sb.git(&["checkout", "--quiet", "main"]);
    sb.write("environments/pr-y.yaml", "type: test\n");
    let declared = sb.commit("pr-y becomes a real environment");
    wait_deployed(sb, &declared, &["pr-y"], Duration::from_secs(30));
    assert_eq!(
        sb.rows(&format!(
            "SELECT status FROM deployment WHERE env = 'pr-y' AND commit_id = '{declared}'"
        )),
        [["succeeded"]]
    );
    assert_eq!(
        sb.rows("SELECT removed_why FROM preview WHERE env = 'pr-y'"),
        [["the watched ref declares it"]]
    );
    // The watched ref's workload (v1) replaced the branch's, in place.
    assert!(w.last_put(&ids, "workload").to_string().contains("shop:v1"));

    sb.git(&["checkout", "--quiet", "pr-y"]);
    write_workload(sb, "v3");
    let pushed = push_branch(sb, "pr-y", "Try v3");
    daemon.wait_for_log(
        "the watched ref declares environment pr-y: no preview made",
        Duration::from_secs(30),
    );
    // Not a wait for an event: time passes to show that the refused push deploys nothing.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        sb.count(&format!(
            "SELECT COUNT(*) FROM deployment WHERE commit_id = '{pushed}'"
        )),
        0
    );
}
