use std::collections::BTreeMap;

use super::*;
use crate::graph::tests::template_files;
use crate::plan::plan;
use crate::plan::test_support::{applied, graph};

fn edit(files: &mut BTreeMap<String, Vec<u8>>, path: &str, from: &str, to: &str) {
    let text = String::from_utf8(files[path].clone()).unwrap();
    assert!(text.contains(from), "{from} not in {path}");
    files.insert(path.into(), text.replacen(from, to, 1).into_bytes());
}

/// The template applied to `env`, then `change` made to its files: the review of `env`.
fn review_after(env: &str, change: impl FnOnce(&mut BTreeMap<String, Vec<u8>>)) -> Review {
    let mut files = template_files();
    let before = applied(&graph(&files, env));
    change(&mut files);
    let g = graph(&files, env);
    let p = plan(&g, &before.records, &before.links);
    let held = crate::plan::deletion_guard(
        &p,
        crate::plan::RecordedCount::whole(before.records.len()),
        50.0,
    );
    let e = compare(&EnvState {
        graph: &g,
        plan: &p,
        recorded: &before.records,
        links: &before.links,
        bindings: &before.bindings,
        held,
    });
    Review {
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        reference: Some("feature".into()),
        environments: vec![e],
        rejected: Vec::new(),
        merge: None,
    }
}

/// The edits of the e2e test: a resource added, a secret changed, a workload removed and a
/// variable that reads another output.
fn feature(files: &mut BTreeMap<String, Vec<u8>>) {
    edit(
        files,
        "definitions/base-env.yaml",
        "pgpassword: prod-password-change-me",
        "pgpassword: rotated-prod-secret",
    );
    edit(
        files,
        "workloads/shop/backend.yaml",
        "DB_PORT: ${resources.db.port}",
        "DB_PORT: ${resources.db.host}",
    );
    files.remove("workloads/shop/frontend.yaml");
    let backend = String::from_utf8(files["workloads/shop/backend.yaml"].clone()).unwrap();
    files.insert(
        "workloads/shop/backend.yaml".into(),
        format!("{backend}  queue:\n    type: redis\n").into_bytes(),
    );
}

fn labels(resources: &[Resource]) -> Vec<&str> {
    resources.iter().map(|r| r.label.as_str()).collect()
}

#[test]
fn nothing_changed_reviews_as_no_changes() {
    let r = review_after("development", |_| {});
    assert!(r.environments[0].apps.is_empty());
    assert!(
        r.to_markdown()
            .starts_with("**gitplane plan** for `0123456789ab` (ref `feature`): no changes\n")
    );
    assert_eq!(r.to_json()["summary"]["environments_changed"], 0);
}

#[test]
fn creations_updates_deletions_links_and_bindings_are_listed_by_app() {
    let r = review_after("production", feature);
    let e = &r.environments[0];
    assert_eq!(e.apps.len(), 1);
    let shop = &e.apps[0];
    assert_eq!(shop.app.as_deref(), Some("shop"));
    assert_eq!(
        labels(&shop.created),
        ["shop/redis.default#modules.backend.externals.queue"]
    );
    let updated: Vec<(&str, bool)> = shop
        .updated
        .iter()
        .map(|u| (u.resource.label.as_str(), u.maybe))
        .collect();
    assert_eq!(
        updated,
        [
            ("shop/base-env.default#base-env", false),
            ("shop/postgres.default#modules.backend.externals.db", true),
            ("shop/redis.default#shared.cache", true),
            // Its Score file has a new resource: a change known now, beside what it reads.
            ("shop/workload.default#modules.backend", false),
        ]
    );
    assert_eq!(
        shop.updated[3].changes,
        ["resource.resources.queue: changed (secret)"]
    );
    assert!(
        shop.updated[3]
            .known_after_apply
            .iter()
            .any(|k| k.starts_with("resource.containers.api.variables.DB_PORT <- ")),
        "{:?}",
        shop.updated[3]
    );
    assert_eq!(
        shop.updated[0].changes,
        ["secrets.pgpassword: changed (secret)"]
    );
    let deleted: Vec<&str> = shop
        .deleted
        .iter()
        .map(|d| d.resource.label.as_str())
        .collect();
    assert_eq!(
        deleted,
        [
            "shop/dns.default#modules.frontend.externals.dns",
            "shop/workload.default#modules.frontend"
        ]
    );
    let added: Vec<(&str, &str)> = shop
        .wiring
        .links_added
        .iter()
        .map(|l| (l.consumer.as_str(), l.provider.as_str()))
        .collect();
    assert_eq!(
        added,
        [
            (
                "shop/redis.default#modules.backend.externals.queue",
                "shop/base-env.default#base-env"
            ),
            (
                "shop/workload.default#modules.backend",
                "shop/redis.default#modules.backend.externals.queue"
            ),
        ]
    );
    assert_eq!(shop.wiring.links_removed.len(), 3);
    // The new queue reads the base's host, known after apply: the base changes first.
    let (key, end) = &shop.wiring.bindings_added[0];
    assert_eq!(
        key.resource,
        "shop/redis.default#modules.backend.externals.queue"
    );
    assert_eq!(end.value, BoundValue::KnownAfterApply);
    // DB_PORT reads the database's host now: a changed binding, from one output to another.
    let (key, from, to) = &shop.wiring.bindings_changed[0];
    assert_eq!(key.input, "resource.containers.api.variables.DB_PORT");
    assert_eq!(
        (from.output.as_str(), to.output.as_str()),
        ("outputs.port", "outputs.host")
    );
    assert_eq!(shop.wiring.bindings_removed, []);
}

#[test]
fn a_binding_to_an_unchanged_provider_shows_its_value() {
    let r = review_after("production", |files| {
        edit(
            files,
            "workloads/shop/backend.yaml",
            "DB_PORT: ${resources.db.port}",
            "DB_PORT: ${resources.db.host}",
        )
    });
    let shop = &r.environments[0].apps[0];
    let (key, from, to) = &shop.wiring.bindings_changed[0];
    assert_eq!(key.resource, "shop/workload.default#modules.backend");
    assert_eq!(from.value, BoundValue::Value(json!(5432)));
    assert_eq!(to.value, BoundValue::Value(json!("pg-ha.prod.internal")));
    let j = r.to_json();
    let changed = &j["environments"][0]["apps"][0]["bindings"]["changed"][0];
    assert_eq!(changed["from"]["output"], "outputs.port");
    assert_eq!(changed["to"]["value"], "pg-ha.prod.internal");
}

#[test]
fn no_secret_value_reaches_any_form() {
    let r = review_after("production", feature);
    for text in [
        r.to_markdown(),
        r.to_text(),
        serde_json::to_string(&r.to_json()).unwrap(),
    ] {
        for secret in [
            "rotated-prod-secret",
            "prod-password-change-me",
            "shop_prod",
        ] {
            assert!(!text.contains(secret), "{secret} in:\n{text}");
        }
        assert!(text.contains("secrets.pgpassword: changed (secret)"));
    }
}

#[test]
fn the_markdown_has_a_summary_a_table_and_details_and_is_stable() {
    let r = review_after("production", feature);
    let md = r.to_markdown();
    let first = md.lines().next().unwrap();
    assert_eq!(
        first,
        "**gitplane plan** for `0123456789ab` (ref `feature`): 1 to create, 2 to update, 2 to \
         delete, 2 may update, 5 link change(s), 2 binding change(s) in 1 environment"
    );
    assert!(
        md.contains("| shop | 1 | 2 (+2 may) | 2 | +2 −3 | +1 −0 ~1 |"),
        "{md}"
    );
    assert!(md.contains("<details><summary>production: changes by resource</summary>"));
    assert!(md.trim_end().ends_with("</details>"));
    assert_eq!(md, review_after("production", feature).to_markdown());
}

#[test]
fn a_mass_deletion_shows_as_held() {
    let r = review_after("development", |files| {
        files.remove("workloads/shop/frontend.yaml");
        files.remove("workloads/shop/backend.yaml");
    });
    let e = &r.environments[0];
    let held = e.held.as_ref().expect("held");
    assert_eq!(held.deletions.len(), 6);
    let j = r.to_json();
    assert_eq!(
        j["environments"][0]["held"]["resources"]
            .as_array()
            .unwrap()
            .len(),
        6
    );
    assert_eq!(j["summary"]["environments_held"], 1);
    assert!(r.to_markdown().contains("**Held by the deletion guard**"));
}

#[test]
fn user_text_cannot_break_out_of_the_markdown() {
    assert_eq!(code("a`b"), "`` a`b ``");
    assert_eq!(code("plain|<x>"), "`plain|<x>`");
    assert_eq!(code("two\nlines"), "`two lines`");
    assert_eq!(escape("a|b<c>`d`*e*"), "a\\|b\\<c\\>\\`d\\`\\*e\\*");
    assert_eq!(html("<b>&"), "&lt;b&gt;&amp;");
    let mut r = review_after("production", feature);
    r.environments[0].apps[0].app = Some("sh|op<script>`".into());
    let md = r.to_markdown();
    assert!(md.contains("| sh\\|op\\<script\\>\\` |"), "{md}");
    assert!(md.contains("**app `` sh|op<script>` ``**"), "{md}");
}

/// Finding: an image bump vanished from a plan when the same workload also read a changing
/// output; only "may update (known after apply)" was shown.
#[test]
fn an_image_bump_shows_beside_the_inputs_known_after_apply() {
    let r = review_after("development", |files| {
        edit(files, "definitions/redis.yaml", "port: 6379", "port: 6380");
        edit(
            files,
            "workloads/shop/backend.yaml",
            "backend:1.4.2",
            "backend:1.5.0",
        );
    });
    let text = r.to_text();
    assert!(
        text.contains(
            "update shop/workload.default#modules.backend (inputs changed; more known after \
             apply)"
        ),
        "{text}"
    );
    assert!(
        text.contains("        resource.containers.api.image: "),
        "{text}"
    );
    assert!(
        text.contains(
            "        resource.containers.api.variables.CACHE_URL <- \
             shop/redis.default#shared.cache outputs.port (known after apply)"
        ),
        "{text}"
    );
    // The frontend changes nothing of its own: it stays a maybe.
    assert!(
        text.contains("may update shop/workload.default#modules.frontend"),
        "{text}"
    );
    let md = r.to_markdown();
    assert!(md.contains("  - `resource.containers.api.image: "), "{md}");
}

/// Finding: a one-field definition change across 200 apps gave 307 KB of Markdown, which
/// GitHub refuses as a comment (over 65 536 characters).
#[test]
fn a_200_app_plan_fits_a_comment_and_still_names_every_changed_app() {
    let mut files = template_files();
    let apps = 200;
    // The estate applied, then a one-field change of the definition every app reads.
    let shop: Vec<(String, Vec<u8>)> = files
        .iter()
        .filter(|(p, _)| p.starts_with("workloads/shop/"))
        .map(|(p, c)| (p.clone(), c.clone()))
        .collect();
    for (path, contents) in &shop {
        files.remove(path);
        for n in 0..apps {
            let path = path.replace("workloads/shop/", &format!("workloads/app-{n:03}/"));
            files.insert(path, contents.clone());
        }
    }
    let before = applied(&graph(&files, "development"));
    edit(
        &mut files,
        "definitions/base-env.yaml",
        "pghost: pg.dev.internal",
        "pghost: pg-ha.dev.internal",
    );
    let g = graph(&files, "development");
    let p = plan(&g, &before.records, &before.links);
    let e = compare(&EnvState {
        graph: &g,
        plan: &p,
        recorded: &before.records,
        links: &before.links,
        bindings: &before.bindings,
        held: None,
    });
    let r = Review {
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        reference: Some("feature".into()),
        environments: vec![e],
        rejected: Vec::new(),
        merge: None,
    };
    assert_eq!(r.environments[0].apps.len(), apps);
    let whole = r.to_markdown_within(usize::MAX);
    assert!(whole.len() > MARKDOWN_LIMIT, "{}", whole.len());

    let md = r.to_markdown();
    assert!(md.len() <= MARKDOWN_LIMIT, "{} bytes", md.len());
    assert_eq!(
        md.lines().next(),
        whole.lines().next(),
        "the same summary line"
    );
    // The counts first: the environment's, then one row per app, every one of them.
    assert!(
        md.contains("| development | 200 | 0 | 200 (+1000 may) | 0 |"),
        "{}",
        &md[..2000]
    );
    for n in 0..apps {
        assert!(
            md.contains(&format!("\n| app-{n:03} | 0 | 1 (+5 may) | 0 |")),
            "app-{n:03} is not in the table"
        );
    }
    // Details while they fit, then a line saying how many were left out and how to see them.
    let shown = md.matches("\n**app `").count();
    assert!(shown > 0 && shown < apps, "{shown} apps shown");
    let left = apps - shown;
    let resources = left * 6;
    assert!(
        md.contains(&format!(
            "**{resources} more resources in {left} apps not shown here**: run `gitplane plan \
             --ref feature --env development --format text` to see every change."
        )),
        "{}",
        &md[md.len().saturating_sub(1500)..]
    );
    assert_eq!(md, r.to_markdown(), "the same bytes each time");

    // Even when the tables do not fit, the limit holds and each environment says how to see it.
    let tiny = r.to_markdown_within(2_000);
    assert!(tiny.len() <= 2_000, "{tiny}");
    assert!(
        tiny.contains("### development: 0 to create, 200 to update"),
        "{tiny}"
    );
    assert!(
        tiny.contains("**1200 more resources in 200 apps not shown here**"),
        "{tiny}"
    );
}
