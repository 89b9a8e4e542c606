//! One deletion guard verdict: judged on the whole environment's recorded resources, whatever
//! part of it a commit made gitplane read, with a true reason, and the same from `plan` (table,
//! steps and review JSON) as from `apply`.

use crate::util::Sandbox;

/// Six apps, each a workload and its own base-env: twelve resources in `dev`, all echo.
fn six_apps(sb: &Sandbox) {
    sb.write("environments/dev.yaml", "type: development\n");
    sb.write(
        "definitions/echo.yaml",
        "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\n\
         entity:\n  type: workload\n  driver_type: echo\n  criteria:\n    - {}\n---\n\
         apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: base-env\n\
         entity:\n  type: base-env\n  driver_type: echo\n  driver_inputs:\n    values:\n      \
         zone: one\n  criteria:\n    - {}\n",
    );
    for i in 1..=6 {
        sb.write(
            &format!("workloads/app{i}/web.yaml"),
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
             image: web:1\n",
        );
    }
}

/// What `plan` says of `dev` in its three forms: the table's guard line, the steps' `held`,
/// and the review's.
fn planned_verdict(sb: &Sandbox) -> (Option<String>, serde_json::Value, serde_json::Value) {
    let table = sb.gitplane(&["plan"]).ok();
    let line = table
        .stdout
        .lines()
        .find(|l| l.contains("held by the deletion guard"))
        .map(str::to_owned);
    let steps = sb.gitplane(&["plan", "--format", "steps-json"]).ok().json();
    // One environment's steps come as its object, several as a list.
    let dev = match &steps {
        serde_json::Value::Array(envs) => envs[0].clone(),
        one => one.clone(),
    };
    let review = sb.gitplane(&["plan", "--format", "json"]).ok().json();
    (line, dev["held"].clone(), review)
}

/// Finding: removing 3 of 6 apps was held with the false reason "all 6 resources … the commit
/// has no environments/dev.yaml", `plan` did not predict it, and the same removal in a commit
/// that also touched `definitions/` went through. Half the environment is not above the 50%
/// threshold: neither form holds it, and `plan` says so before.
#[test]
fn removing_half_the_apps_is_judged_on_the_whole_environment_either_way() {
    for touch_definitions in [false, true] {
        let sb = Sandbox::new();
        six_apps(&sb);
        sb.commit("Six apps");
        sb.gitplane(&["apply"]).ok();
        assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 12);

        for i in 1..=3 {
            sb.remove(&format!("workloads/app{i}"));
        }
        if touch_definitions {
            sb.edit("definitions/echo.yaml", "zone: one", "zone: two");
        }
        sb.commit("Three apps go");
        let (line, steps, _) = planned_verdict(&sb);
        assert_eq!(
            line, None,
            "plan holds nothing (definitions touched: {touch_definitions})"
        );
        assert!(steps.is_null(), "{steps}");
        let apply = sb.gitplane(&["apply"]).ok();
        assert!(!apply.stdout.contains("held"), "{apply}");
        assert_eq!(sb.last_deployment("dev").status, "succeeded");
        assert_eq!(sb.count("SELECT COUNT(*) FROM resource"), 6);
    }
}

/// Above the threshold, the verdict and its reason are the same whichever part was read, and
/// `plan` gives them before `apply` does.
#[test]
fn a_mass_removal_is_held_alike_with_a_true_reason_and_plan_predicts_it() {
    let mut reasons = Vec::new();
    for touch_definitions in [false, true] {
        let sb = Sandbox::new();
        six_apps(&sb);
        sb.commit("Six apps");
        sb.gitplane(&["apply"]).ok();
        for i in 1..=4 {
            sb.remove(&format!("workloads/app{i}"));
        }
        if touch_definitions {
            sb.edit("definitions/echo.yaml", "zone: one", "zone: two");
        }
        sb.commit("Four apps go");
        let (line, steps, review) = planned_verdict(&sb);
        let line = line.expect("plan shows the hold");
        let reason = "it would delete 8 of 12 resources of environment dev (67%, above the 50% \
                      threshold)";
        assert!(line.contains(reason), "{line}");
        assert!(!line.contains("no environments/dev.yaml"), "{line}");
        assert_eq!(steps["reason"], reason);
        assert_eq!(steps["deletions"].as_array().unwrap().len(), 8);
        assert!(review.to_string().contains(reason), "{review}");

        let apply = sb.gitplane(&["apply"]).fails();
        apply.stdout_has(reason);
        let held = sb.last_deployment("dev");
        assert_eq!(held.status, "held");
        assert_eq!(
            sb.count("SELECT COUNT(*) FROM resource"),
            12,
            "nothing deleted"
        );
        reasons.push(held.error);
    }
    assert_eq!(reasons[0], reasons[1], "one verdict whatever was read");
}
