//! `secret_refs: {store, ref}` through the binary: a directory store and a Vault KV v2 store
//! configured on the host, a real HTTP driver receiving what they hold, rotation, and each way a
//! store reference can be wrong.

use serde_json::{Value, json};

use std::time::Duration;

use crate::daemon::{Daemon, repo_args, wait_deployed};
use crate::util::{Run, Sandbox, rows};
use crate::vault_server::VaultServer;
use gitplane_testkit::DriverServer;

const TOKEN: &str = "hvs-T0KEN-never-shown";
const VAULT_V1: &str = "vault-s3cret-v1";
const VAULT_V2: &str = "vault-s3cret-v2";
const FILE_SECRET: &str = "file-s3cret-A1";
const SECRETS: [&str; 4] = [TOKEN, VAULT_V1, VAULT_V2, FILE_SECRET];

const DB_DEFINITION: &str = "definitions/postgres.yaml";

struct Platform {
    sb: Sandbox,
    driver: DriverServer,
    vault: VaultServer,
    config: String,
}

impl Platform {
    /// A workload with a database whose definition reads one secret from each store, and an
    /// older version of the Vault secret pinned.
    fn new() -> Platform {
        let sb = Sandbox::new();
        let driver = DriverServer::start();
        let vault = VaultServer::start(TOKEN);
        vault.put("db/prod", json!({"password": VAULT_V1, "user": "app"}));
        let dir = sb.root.join("secrets");
        std::fs::create_dir_all(dir.join("db")).unwrap();
        std::fs::write(dir.join("db/admin"), format!("{FILE_SECRET}\n")).unwrap();
        let token_file = sb.root.join("vault-token");
        std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
        let config = sb.root.join("host.yaml");
        std::fs::write(
            &config,
            format!(
                "drivers:\n  test/http:\n    http: {{url: \"{}\", timeout: 2s}}\n\
                 retry: {{attempts: 2, initial_delay: 10ms, max_delay: 20ms, poll_interval: 10ms}}\n\
                 watch_interval: 200ms\n\
                 secret_stores:\n  files: {{dir: {}}}\n  \
                 vault:\n    vault: {{url: \"{}\", token_file: {}, timeout: 2s}}\n",
                driver.url,
                dir.display(),
                vault.url,
                token_file.display()
            ),
        )
        .unwrap();
        sb.write(
            "environments/test.yaml",
            "type: test\nimplicit_resources: []\n",
        );
        sb.write(
            "workloads/shop/web.yaml",
            "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\ncontainers:\n  main:\n    \
             image: x\nresources:\n  db:\n    type: postgres\n",
        );
        sb.write(
            DB_DEFINITION,
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: postgres\n\
             entity:\n  type: postgres\n  driver_type: test/http\n  driver_inputs:\n    \
             values: {name: orders}\n    secrets:\n      dsn: postgres://app@db\n    \
             secret_refs:\n      password:\n        store: vault\n        ref: db/prod#password\n      \
             first_password: {store: vault, ref: 'db/prod#password', version: 1}\n      \
             user: {store: vault, ref: 'db/prod#user'}\n      \
             admin: {store: files, ref: db/admin}\n  criteria:\n    - {}\n",
        );
        sb.write(
            "definitions/workload.yaml",
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: workload\n\
             entity:\n  type: workload\n  driver_type: echo\n  criteria:\n    - {}\n",
        );
        sb.commit("a database with stored secrets");
        Platform {
            config: config.to_str().unwrap().to_owned(),
            sb,
            driver,
            vault,
        }
    }

    /// `gitplane ARGS` with the host config, traced as verbosely as gitplane logs.
    fn run(&self, args: &[&str]) -> Run {
        let mut all = args.to_vec();
        all.extend(["--config", &self.config]);
        let run = self.sb.gitplane_env(&all, &[("GITPLANE_LOG", "trace")]);
        assert_no_secret(&run);
        run
    }

    /// The driver secrets of each PUT for the database, in order.
    fn database_secrets(&self) -> Vec<Value> {
        self.driver
            .received()
            .into_iter()
            .filter(|r| r.method == "PUT" && r.body["type"] == "postgres")
            .map(|r| r.body["driver"]["secrets"].clone())
            .collect()
    }

    /// The line of the definition that holds `needle`.
    fn line_of(&self, needle: &str) -> usize {
        self.sb
            .read(DB_DEFINITION)
            .lines()
            .position(|l| l.contains(needle))
            .expect("the needle is in the definition")
            + 1
    }

    /// Every table but the deployment and operation journals, to compare before and after.
    fn recorded(&self) -> Vec<Vec<String>> {
        let conn = self.sb.db();
        ["resource", "resource_secret", "edge", "link", "binding"]
            .iter()
            .flat_map(|t| rows(&conn, &format!("SELECT * FROM {t}")))
            .collect()
    }
}

#[track_caller]
fn assert_no_secret(run: &Run) {
    run.hides(&SECRETS);
}

#[test]
fn stored_secrets_reach_the_driver_and_no_output_or_report() {
    let p = Platform::new();
    p.run(&["validate"]).ok();
    p.run(&["plan"]).ok();
    p.run(&["apply"]).ok();
    assert_eq!(
        p.database_secrets(),
        [json!({
            "dsn": "postgres://app@db",
            "password": VAULT_V1,
            "first_password": VAULT_V1,
            "user": "app",
            "admin": FILE_SECRET,
        })]
    );
    // Validating reads no store; planning and applying read each secret once, both fields of
    // its latest version from one answer.
    let mut reads = p.vault.reads();
    reads.sort();
    assert_eq!(
        reads,
        [
            "/v1/secret/data/db/prod",
            "/v1/secret/data/db/prod",
            "/v1/secret/data/db/prod?version=1",
            "/v1/secret/data/db/prod?version=1",
        ]
    );
    for args in [
        &["status", "--format", "json"][..],
        &["graph", "--format", "json"],
        &["plan", "--format", "steps-json"],
        &["report", "links", "--format", "json"],
        &["report", "resources"],
        &["history"],
    ] {
        p.run(args).ok();
    }
    let explained = p.run(&["explain", "shop/postgres.default#modules.web.externals.db"]);
    explained
        .ok()
        .stdout_has("secret store 'vault' ref 'db/prod#password'")
        .stdout_has("secret store 'vault' ref 'db/prod#password' version 1")
        .stdout_has("secret store 'files' ref 'db/admin'")
        .stdout_has(&format!(
            "secrets.admin = (secret)  (at {DB_DEFINITION}:{})",
            p.line_of("admin: {store: files")
        ));

    // Only resource_secret holds them, as it holds every secret input.
    let conn = p.sb.db();
    let tables = rows(
        &conn,
        "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') \
         AND name NOT LIKE 'sqlite_%' AND name != 'resource_secret'",
    );
    for table in tables.concat() {
        for row in rows(&conn, &format!("SELECT * FROM \"{table}\"")) {
            for secret in SECRETS {
                assert!(
                    !row.iter().any(|c| c.contains(secret)),
                    "{secret} in {table}: {row:?}"
                );
            }
        }
    }
    // Sealed, the secrets are nowhere in the file's bytes (nor its log) either.
    p.sb.assert_state_bytes_hide(&SECRETS);
    // A stored secret is no link between resources: the bindings are the workload's only.
    assert_eq!(
        p.sb.column("SELECT DISTINCT provided_path FROM binding WHERE needed_path LIKE 'secrets%'"),
        Vec::<String>::new()
    );
}

#[test]
fn a_rotated_secret_updates_the_resource_and_a_pinned_version_stays() {
    let p = Platform::new();
    p.run(&["apply"]).ok();
    p.run(&["apply"])
        .ok()
        .stdout_has("0 created, 0 updated, 0 deleted, 2 unchanged");
    assert_eq!(p.database_secrets().len(), 1);

    p.vault
        .put("db/prod", json!({"password": VAULT_V2, "user": "app"}));
    p.run(&["plan"])
        .ok()
        .stdout_has("secrets.password: changed (secret)");
    p.run(&["apply"])
        .ok()
        .stdout_has("0 created, 1 updated, 0 deleted, 1 unchanged");
    let sent = p.database_secrets();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1]["password"], VAULT_V2);
    assert_eq!(sent[1]["first_password"], VAULT_V1);

    // A rotated file is read on the next apply too.
    std::fs::write(p.sb.root.join("secrets/db/admin"), "file-rotated\n").unwrap();
    p.run(&["apply"]).ok().stdout_has("1 updated");
    assert_eq!(p.database_secrets()[2]["admin"], "file-rotated");
    // No version of a rotated secret is left in the file, in a live row or a free page.
    p.sb.assert_state_bytes_hide(&[VAULT_V1, VAULT_V2, FILE_SECRET, "file-rotated"]);
}

#[test]
fn a_store_the_host_does_not_configure_rejects_the_commit() {
    let p = Platform::new();
    p.sb.edit(DB_DEFINITION, "store: files", "store: lockbox");
    p.sb.commit("a store nobody configured");
    let line = p.line_of("store: lockbox");
    let expected = format!(
        "error: {DB_DEFINITION}:{line}: secret_refs: secret store 'lockbox' is \
         not configured in the host config (configured: files, vault): add it under secret_stores"
    );
    p.run(&["validate"]).fails().stderr_has(&expected);
    p.run(&["apply"]).fails().stderr_has(&expected);
    assert_eq!(p.sb.count("SELECT COUNT(*) FROM resource"), 0);
    assert!(p.driver.received().is_empty());
    assert!(p.vault.reads().is_empty(), "{:?}", p.vault.reads());
    assert_eq!(
        p.sb.column("SELECT status FROM deployment"),
        ["failed"],
        "the rejected commit is recorded"
    );
}

#[test]
fn a_secret_the_store_cannot_give_rejects_the_commit_and_changes_nothing() {
    let p = Platform::new();
    p.run(&["apply"]).ok();
    let before = p.recorded();
    let calls = p.driver.received().len();

    let cases: [(&str, &str, &str); 3] = [
        (
            "ref: db/prod#password",
            "ref: db/gone#password",
            "secret store 'vault' has no secret at 'db/gone' (HTTP 404)",
        ),
        (
            "ref: db/prod#password",
            "ref: db/prod#pasword",
            "secret store 'vault' has no field 'pasword' in the secret at 'db/prod' \
             (fields: password, user)",
        ),
        (
            "ref: db/admin",
            "ref: ../vault-token",
            "secret store 'files' cannot use ref '../vault-token': '..' is not allowed in a ref",
        ),
    ];
    for (from, to, reason) in cases {
        p.sb.edit(DB_DEFINITION, from, to);
        p.sb.commit(&format!("read {to}"));
        let line = p.line_of(to);
        let run = p.run(&["apply"]);
        run.fails()
            .stderr_has(&format!("{DB_DEFINITION}:{line}: secret_refs: {reason}"))
            .stderr_has("rejected: 1 error(s); nothing was changed");
        p.run(&["plan"]).fails().stderr_has(reason);
        if to.contains("..") {
            // A ref its store can never serve is known without reading anything.
            p.run(&["validate"]).fails().stderr_has(reason);
        }
        assert_eq!(p.recorded(), before, "after {to}");
        p.sb.edit(DB_DEFINITION, to, from);
        p.sb.commit("back");
    }
    assert_eq!(p.driver.received().len(), calls);

    // The error names the line of the ref, even where its text appears earlier
    // (`postgres://app@db`).
    p.sb.edit(DB_DEFINITION, "ref: db/admin}", "ref: db}");
    p.sb.commit("read a directory");
    p.run(&["apply"]).fails().stderr_has(&format!(
        "{DB_DEFINITION}:{}: secret_refs: secret store 'files' cannot use the secret at 'db'",
        p.line_of("ref: db}")
    ));
    p.sb.edit(DB_DEFINITION, "ref: db}", "ref: db/admin}");
    p.sb.commit("back");

    // A token Vault refuses: the message says where the token is, never what it is.
    std::fs::write(p.sb.root.join("vault-token"), "hvs-wrong\n").unwrap();
    p.run(&["apply"])
        .fails()
        .stderr_has("secret store 'vault' denied reading 'db/prod' (HTTP 403 permission denied)")
        .stderr_has("vault-token");
    assert_eq!(p.recorded(), before);
    assert_eq!(
        p.sb.column("SELECT status FROM deployment ORDER BY id"),
        [
            "succeeded",
            "failed",
            "failed",
            "failed",
            "failed",
            "failed"
        ]
    );
}

#[test]
fn a_malformed_store_reference_names_its_file_and_line() {
    let p = Platform::new();
    p.sb.edit(
        DB_DEFINITION,
        "admin: {store: files, ref: db/admin}",
        "admin: {store: files}",
    );
    p.sb.commit("a store reference without a ref");
    p.run(&["validate"]).fails().stderr_has(&format!(
        "{DB_DEFINITION}:{}: secret_refs.admin: a store reference needs a ref",
        p.line_of("secret_refs:")
    ));
}

#[test]
fn secret_store_config_problems_are_reported_with_their_lines() {
    let sb = Sandbox::template();
    let config = sb.root.join("host.yaml");
    std::fs::write(
        &config,
        "secret_stores:\n  a: {dir: relative/path}\n  b: {dir: /x, vault: {url: http://v, token_file: /t}}\n  \
         c:\n    vault: {url: ftp://v, token_file: t, timeout: soon}\n",
    )
    .unwrap();
    let run = sb.gitplane(&["validate", "--config", config.to_str().unwrap()]);
    let c = config.display();
    run.fails()
        .stderr_has(&format!(
            "{c}:2: secret store 'a': dir 'relative/path' must be an absolute path"
        ))
        .stderr_has(&format!(
            "{c}:3: secret store 'b' needs exactly one of dir or vault"
        ))
        .stderr_has(&format!(
            "{c}:4: secret store 'c': url 'ftp://v' must start with http:// or https://"
        ))
        .stderr_has(&format!(
            "{c}:4: secret store 'c': token_file 't' must be an absolute path"
        ))
        .stderr_has(&format!(
            "{c}:4: secret store 'c': timeout 'soon' is not a duration"
        ));
}

#[test]
fn the_daemon_reads_stored_secrets_for_each_commit() {
    let p = Platform::new();
    let mut args = repo_args(&p.sb);
    args.extend(["--config".to_owned(), p.config.clone()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let daemon = Daemon::start(&p.sb, &args);
    wait_deployed(&p.sb, &p.sb.head(), &["test"], Duration::from_secs(20));
    assert_eq!(p.database_secrets()[0]["password"], VAULT_V1);

    // The next commit reads the store again and sees the rotated secret.
    p.vault
        .put("db/prod", json!({"password": VAULT_V2, "user": "app"}));
    p.sb.edit(DB_DEFINITION, "name: orders", "name: orders-v2");
    let commit = p.sb.commit("rename the database");
    wait_deployed(&p.sb, &commit, &["test"], Duration::from_secs(20));
    let sent = p.database_secrets();
    assert_eq!(sent.last().unwrap()["password"], VAULT_V2, "{sent:?}");

    // A secret that cannot be read rejects the commit; nothing else happens.
    let calls = p.driver.received().len();
    p.sb.edit(
        DB_DEFINITION,
        "ref: db/prod#password",
        "ref: db/gone#password",
    );
    let broken = p.sb.commit("read a secret that is not there");
    wait_deployed(&p.sb, &broken, &["test"], Duration::from_secs(20));
    assert_eq!(
        p.sb.column(&format!(
            "SELECT status FROM deployment WHERE commit_id = '{broken}'"
        )),
        ["failed"]
    );
    assert_eq!(p.driver.received().len(), calls);
    let log = daemon.log();
    assert!(
        log.contains("secret store 'vault' has no secret at 'db/gone' (HTTP 404)"),
        "{log}"
    );

    // The commit is fine, the store is not ready: once the secret is there, the same commit is
    // applied without a new push, and the wait was reported once.
    p.vault.put("db/gone", json!({"password": VAULT_V1}));
    gitplane_testkit::eventually_or(
        "the same commit applied once the secret is there",
        Duration::from_secs(20),
        || {
            (p.sb.count(&format!(
                "SELECT COUNT(*) FROM deployment WHERE commit_id = '{broken}' AND status = 'succeeded'"
            )) > 0)
                .then_some(())
        },
        || daemon.log(),
    );
    assert_eq!(p.driver.received().len(), calls + 1);
    let log = daemon.log();
    assert_eq!(
        log.matches("secrets cannot be read: waiting for the secret stores")
            .count(),
        1,
        "{log}"
    );
    for secret in SECRETS {
        assert!(!log.contains(secret), "{secret} in the daemon log:\n{log}");
    }
}
