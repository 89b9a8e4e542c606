//! `gitplane report NAME`: each report is one of the public views of `schema.sql`, printed as a
//! table, JSON or CSV; what it prints is what the view holds, and never a secret.

use std::collections::BTreeSet;

use rusqlite::types::ValueRef;
use serde_json::{Value, json};

use crate::util::{Run, Sandbox, keys};

/// The template's secret values.
const SECRETS: [&str; 2] = ["dev-password-change-me", "prod-password-change-me"];

const FORMATS: [&str; 3] = ["table", "json", "csv"];

/// Every report, with the RESOURCE `consumers` needs.
const REPORTS: [&[&str]; 7] = [
    &["resources"],
    &["deployments"],
    &["failures"],
    &["links"],
    &[
        "consumers",
        "shop/base-env.default#base-env",
        "--env",
        "development",
    ],
    &["orphans"],
    &["drift"],
];

/// One report in the three formats.
struct Out {
    table: String,
    json: Vec<Value>,
    /// The JSON output as printed, for the order of keys.
    json_text: String,
    csv_text: String,
    /// Parsed: the header, then one record a row; an unquoted empty field is `NULL`.
    csv: Vec<Vec<String>>,
}

impl Out {
    /// The table's lines split on whitespace (for reports whose values have no spaces).
    fn table_cells(&self) -> Vec<Vec<String>> {
        self.table
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    }

    fn table_header(&self) -> Vec<String> {
        self.table_cells().remove(0)
    }
}

#[track_caller]
fn assert_no_secret(run: &Run) {
    run.hides(&SECRETS);
}

/// `gitplane report ARGS --format F` for each format, each asserted to succeed without secrets.
#[track_caller]
fn report(sb: &Sandbox, args: &[&str]) -> Out {
    let run = |format: &str| {
        let mut all = vec!["report"];
        all.extend(args);
        all.extend(["--format", format]);
        let run = sb.gitplane(&all).ok();
        assert_no_secret(&run);
        run
    };
    let table = run("table");
    let json = run("json");
    let csv = run("csv");
    let parsed = json.json();
    let objects = parsed
        .as_array()
        .unwrap_or_else(|| panic!("not a JSON array:{json}"))
        .clone();
    assert!(
        objects.iter().all(Value::is_object),
        "not an array of objects:{json}"
    );
    Out {
        table: table.stdout,
        json: objects,
        json_text: json.stdout,
        csv: parse_csv(&csv.stdout),
        csv_text: csv.stdout,
    }
}

/// An RFC 4180 reader, strict: CRLF line ends, quotes only around whole fields, doubled inside.
/// An unquoted empty field is `NULL`, a quoted one the empty string.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    fn finish(field: &mut String, quoted: &mut bool) -> String {
        let value = if field.is_empty() && !*quoted {
            "NULL".to_owned()
        } else {
            std::mem::take(field)
        };
        *quoted = false;
        value
    }
    let mut records = Vec::new();
    let mut record = Vec::new();
    let mut field = String::new();
    let (mut quoted, mut in_quotes) = (false, false);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => in_quotes = false,
                _ => field.push(c),
            }
            continue;
        }
        match c {
            '"' => {
                assert!(field.is_empty() && !quoted, "a stray quote in {text:?}");
                in_quotes = true;
                quoted = true;
            }
            ',' => record.push(finish(&mut field, &mut quoted)),
            '\r' => {
                assert_eq!(chars.next(), Some('\n'), "CR without LF in {text:?}");
                record.push(finish(&mut field, &mut quoted));
                records.push(std::mem::take(&mut record));
            }
            '\n' => panic!("a bare LF line end in {text:?}"),
            _ => {
                assert!(!quoted, "text after a closing quote in {text:?}");
                field.push(c);
            }
        }
    }
    assert!(
        record.is_empty() && field.is_empty() && !in_quotes,
        "the last record must end with CRLF: {text:?}"
    );
    records
}

/// The rows of `sql` straight from the state file: column names, and each row as text (`NULL`
/// for null) and as JSON (SQLite's types kept, the `json` columns parsed).
fn view(sb: &Sandbox, sql: &str, json: &[&str]) -> (Vec<String>, Vec<Vec<String>>, Vec<Value>) {
    let db = sb.db();
    let mut stmt = db.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
    let columns: Vec<String> = stmt.column_names().map(str::to_owned).collect();
    let mut text = Vec::new();
    let mut objects = Vec::new();
    let mut q = stmt.query([]).unwrap();
    while let Some(row) = q.next().unwrap() {
        let mut cells = Vec::new();
        let mut object = serde_json::Map::new();
        for (i, column) in columns.iter().enumerate() {
            let (cell, value) = match row.get_ref(i).unwrap() {
                ValueRef::Null => ("NULL".to_owned(), Value::Null),
                ValueRef::Integer(v) => (v.to_string(), json!(v)),
                ValueRef::Real(v) => (v.to_string(), json!(v)),
                ValueRef::Text(t) => {
                    let t = String::from_utf8(t.to_vec()).unwrap();
                    let v = if json.contains(&column.as_str()) {
                        serde_json::from_str(&t)
                            .unwrap_or_else(|e| panic!("{column} holds no JSON ({e}): {t}"))
                    } else {
                        Value::String(t.clone())
                    };
                    (t, v)
                }
                ValueRef::Blob(_) => panic!("{column}: a blob"),
            };
            cells.push(cell);
            object.insert(column.clone(), value);
        }
        text.push(cells);
        objects.push(Value::Object(object));
    }
    (columns, text, objects)
}

/// Asserts that all three formats print exactly the rows of `sql`: the header, every value,
/// in order. With `plain_table`, the table's cells are compared too (no value has a space).
#[track_caller]
fn assert_matches_view(out: &Out, sb: &Sandbox, sql: &str, json: &[&str], plain_table: bool) {
    let (columns, text, objects) = view(sb, sql, json);
    // CSV: the header, then every value as the view's text.
    let mut expected = vec![columns.clone()];
    expected.extend(text.iter().cloned());
    assert_eq!(out.csv, expected, "csv:\n{}", out.csv_text);
    // JSON: the types kept, JSON columns parsed, keys in the view's order.
    assert_eq!(out.json, objects, "json:\n{}", out.json_text);
    if let Some(first) = out.json_text.split("\n  }").next()
        && !out.json.is_empty()
    {
        let at: Vec<usize> = columns
            .iter()
            .map(|c| {
                first
                    .find(&format!("\"{c}\":"))
                    .unwrap_or_else(|| panic!("no key {c}"))
            })
            .collect();
        assert!(at.is_sorted(), "keys out of order:\n{first}");
    }
    // Table: the header, then a line a row, NULL as `-`.
    assert_eq!(out.table_header(), columns, "table:\n{}", out.table);
    assert_eq!(out.table.lines().count(), text.len() + 1, "{}", out.table);
    if plain_table {
        let dashed: Vec<Vec<String>> = text
            .iter()
            .map(|r| {
                r.iter()
                    .map(|c| if c == "NULL" { "-".into() } else { c.clone() })
                    .collect()
            })
            .collect();
        assert_eq!(out.table_cells()[1..], dashed[..], "table:\n{}", out.table);
    }
}

/// Asserts an empty report: a header of `columns` alone, or `[]`.
#[track_caller]
fn assert_empty(out: &Out, columns: &[&str]) {
    assert_eq!(out.table, format!("{}\n", columns.join("  ")));
    assert_eq!(out.csv_text, format!("{}\r\n", columns.join(",")));
    assert_eq!(out.json_text, "[]\n");
    assert!(out.json.is_empty());
}

/// The GUResID of a resource of the state.
fn guresid(sb: &Sandbox, env: &str, res_id: &str) -> String {
    sb.db()
        .query_row(
            "SELECT guresid FROM resource WHERE env = ?1 AND res_id = ?2",
            [env, res_id],
            |r| r.get(0),
        )
        .unwrap_or_else(|e| panic!("no {env}/{res_id}: {e}"))
}

fn column<'a>(rows: &'a [Value], name: &str) -> Vec<&'a Value> {
    rows.iter().map(|r| &r[name]).collect()
}

#[test]
fn resources_report_lists_every_current_resource() {
    let sb = Sandbox::applied();
    let out = report(&sb, &["resources"]);
    assert_eq!(out.json.len(), 12, "{}", out.json_text);
    let columns = [
        "env",
        "app",
        "type",
        "class",
        "res_id",
        "guresid",
        "definition",
        "driver",
        "status",
        "outputs",
        "commit_id",
        "updated_at",
    ];
    for row in &out.json {
        assert_eq!(keys(row), columns.into_iter().collect::<BTreeSet<_>>());
        assert!(row["outputs"].is_object(), "outputs are parsed: {row}");
    }
    let ids: BTreeSet<(String, String)> = out
        .json
        .iter()
        .map(|r| {
            (
                r["env"].as_str().unwrap().to_owned(),
                r["res_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut expected = BTreeSet::new();
    for env in ["development", "production"] {
        for id in [
            "base-env",
            "modules.backend",
            "modules.backend.externals.db",
            "modules.frontend",
            "modules.frontend.externals.dns",
            "shared.cache",
        ] {
            expected.insert((env.to_owned(), id.to_owned()));
        }
    }
    assert_eq!(ids, expected);
    let base = out
        .json
        .iter()
        .find(|r| r["env"] == "development" && r["res_id"] == "base-env")
        .unwrap();
    assert_eq!(
        base["outputs"],
        json!({
            "dns_zone": "dev.shop.example.com",
            "pghost": "pg.dev.internal",
            "pgport": 5432,
            "redis_host": "redis.dev.internal"
        })
    );

    // CSV: a header and 12 records; outputs JSON holds commas and quotes, so it is quoted.
    assert_eq!(out.csv.len(), 13);
    assert_eq!(out.csv[0], columns);
    assert_eq!(out.csv_text.lines().count(), 13);
    assert!(
        out.csv_text.contains(
            "\"{\"\"dns_zone\"\":\"\"dev.shop.example.com\"\",\"\"pghost\"\":\"\"pg.dev.internal\"\",\
             \"\"pgport\"\":5432,\"\"redis_host\"\":\"\"redis.dev.internal\"\"}\""
        ),
        "{}",
        out.csv_text
    );
    assert_eq!(out.table.lines().count(), 13);
    assert_matches_view(
        &out,
        &sb,
        "SELECT * FROM current_resources",
        &["outputs"],
        true,
    );

    // --env: one environment's rows only.
    let dev = report(&sb, &["resources", "--env", "development"]);
    assert_eq!(dev.json.len(), 6);
    assert_matches_view(
        &dev,
        &sb,
        "SELECT * FROM current_resources WHERE env = 'development'",
        &["outputs"],
        true,
    );
    let both = report(
        &sb,
        &["resources", "--env", "production", "--env", "development"],
    );
    assert_eq!(both.json, out.json);
}

#[test]
fn deployments_report_is_newest_first_with_durations_and_holds() {
    let sb = Sandbox::applied();
    // Removing every workload would delete everything: the deletion guard holds both.
    sb.remove("workloads/shop");
    sb.commit("Retire the shop");
    sb.gitplane(&["apply"]).fails();

    let out = report(&sb, &["deployments"]);
    assert_eq!(out.json.len(), 4, "{}", out.json_text);
    let ids: Vec<i64> = out.json.iter().map(|d| d["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [4, 3, 2, 1], "newest first");
    assert_eq!(
        column(&out.json, "status"),
        [
            &json!("held"),
            &json!("held"),
            &json!("succeeded"),
            &json!("succeeded")
        ]
    );
    for d in &out.json {
        assert!(d.get("duration_s").is_some(), "{d}");
        if d["status"] == "succeeded" {
            let s = d["duration_s"].as_f64().expect("a number of seconds");
            assert!((0.0..60.0).contains(&s), "{d}");
            assert_eq!(d["created"], 6, "{d}");
            assert_eq!(d["held"], Value::Null);
        } else {
            // What it would delete: a JSON array, parsed.
            let held = d["held"].as_array().unwrap_or_else(|| panic!("{d}"));
            assert_eq!(held.len(), 6, "{d}");
        }
    }
    // The held arrays hold commas and quotes: quoted in CSV.
    assert!(out.csv_text.contains(",\"[\"\""), "{}", out.csv_text);
    assert_matches_view(&out, &sb, "SELECT * FROM deployments", &["held"], false);
    assert!(out.table.lines().nth(1).unwrap().starts_with("4 "));

    let prod = report(&sb, &["deployments", "--env", "production"]);
    assert_eq!(prod.json.len(), 2);
    assert!(prod.json.iter().all(|d| d["env"] == "production"));
    assert_matches_view(
        &prod,
        &sb,
        "SELECT * FROM deployments WHERE env = 'production'",
        &["held"],
        false,
    );
}

#[test]
fn failures_report_lists_failed_and_skipped_operations() {
    let sb = Sandbox::applied();
    let columns = [
        "deployment_id",
        "env",
        "commit_id",
        "guresid",
        "app",
        "type",
        "class",
        "res_id",
        "action",
        "status",
        "error",
        "started_at",
        "finished_at",
    ];
    assert_empty(&report(&sb, &["failures"]), &columns);

    // Values may not read a secret output: the dns fails, in both environments.
    sb.edit(
        "definitions/dns.yaml",
        "      host: ${context.app.id}.${resources.base-env#base-env.outputs.dns_zone}\n",
        "      host: ${context.app.id}.${resources.base-env#base-env.outputs.dns_zone}\n      \
         pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
    );
    let bad = sb.commit("The dns reads a secret");
    let run = sb.gitplane(&["apply"]).fails();
    assert_no_secret(&run);

    let out = report(&sb, &["failures"]);
    assert!(!out.json.is_empty(), "{}", out.json_text);
    for row in &out.json {
        assert_eq!(keys(row), columns.into_iter().collect::<BTreeSet<_>>());
        assert_eq!(row["commit_id"], bad.as_str(), "{row}");
        assert!(row["deployment_id"].is_i64(), "{row}");
    }
    for env in ["development", "production"] {
        let dns = out
            .json
            .iter()
            .find(|r| r["env"] == env && r["res_id"] == "modules.frontend.externals.dns")
            .unwrap_or_else(|| panic!("no failed dns in {env}: {}", out.json_text));
        assert_eq!(dns["status"], "failed", "{dns}");
        assert_eq!(dns["action"], "update", "{dns}");
        assert_eq!(dns["type"], "dns", "{dns}");
        assert!(
            dns["error"].as_str().unwrap().contains("pgpassword"),
            "{dns}"
        );
    }
    // Nothing that worked is listed.
    assert!(
        out.json
            .iter()
            .all(|r| r["status"] == "failed" || r["status"] == "skipped"),
        "{}",
        out.json_text
    );
    assert_matches_view(&out, &sb, "SELECT * FROM failures", &[], false);
    let table_lines: Vec<&str> = out.table.lines().collect();
    assert!(
        table_lines[1..]
            .iter()
            .any(|l| l.contains("modules.frontend.externals.dns") && l.contains("failed")),
        "{}",
        out.table
    );

    let dev = report(&sb, &["failures", "--env", "development"]);
    assert!(dev.json.iter().all(|r| r["env"] == "development"));
    assert_matches_view(
        &dev,
        &sb,
        "SELECT * FROM failures WHERE env = 'development'",
        &[],
        false,
    );
}

#[test]
fn links_report_has_every_edge_with_its_bindings() {
    let sb = Sandbox::applied();
    let out = report(&sb, &["links", "--env", "development"]);
    let columns = [
        "env",
        "deployment_id",
        "consumer",
        "consumer_type",
        "consumer_id",
        "provider",
        "provider_type",
        "provider_id",
        "kind",
        "update_type",
        "needed_path",
        "provided_path",
        "data_type",
        "value",
        "secret",
        "inserted",
        "interface",
    ];
    assert_eq!(out.csv[0], columns);
    // The 7 reference edges of development, consumer to provider.
    let links: BTreeSet<(String, String, String, String)> = out
        .json
        .iter()
        .map(|r| {
            let s = |k: &str| {
                r[k].as_str()
                    .unwrap_or_else(|| panic!("{k}: {r}"))
                    .to_owned()
            };
            (
                s("consumer_id"),
                s("provider_id"),
                s("kind"),
                s("update_type"),
            )
        })
        .collect();
    let edge = |c: &str, p: &str| {
        (
            c.to_owned(),
            p.to_owned(),
            "reference".to_owned(),
            "NeedsProvides".to_owned(),
        )
    };
    assert_eq!(
        links,
        BTreeSet::from([
            edge("modules.backend", "modules.backend.externals.db"),
            edge("modules.backend", "shared.cache"),
            edge("modules.backend.externals.db", "base-env"),
            edge("modules.frontend", "shared.cache"),
            edge("modules.frontend", "modules.frontend.externals.dns"),
            edge("modules.frontend.externals.dns", "base-env"),
            edge("shared.cache", "base-env"),
        ])
    );
    assert_eq!(
        sb.count("SELECT COUNT(*) FROM link WHERE env = 'development'"),
        7
    );
    // One row a binding: postgres's host comes from base-env's pghost, its password too, but
    // the password's value is not kept.
    let binding = |needed: &str| {
        out.json
            .iter()
            .find(|r| {
                r["consumer_id"] == "modules.backend.externals.db" && r["needed_path"] == needed
            })
            .unwrap_or_else(|| panic!("no binding {needed}: {}", out.json_text))
    };
    let host = binding("values.host");
    assert_eq!(host["provider_id"], "base-env");
    assert_eq!(host["provided_path"], "outputs.pghost");
    assert_eq!(host["data_type"], "string");
    assert_eq!(host["value"], "pg.dev.internal", "the value is parsed JSON");
    assert_eq!(host["secret"], 0);
    assert_eq!(
        host["interface"],
        Value::Null,
        "read by name, not through an interface"
    );
    let port = binding("values.port");
    assert_eq!(port["value"], 5432);
    assert_eq!(port["data_type"], "int");
    let password = binding("secrets.password");
    assert_eq!(password["provided_path"], "outputs.pgpassword");
    assert_eq!(password["value"], Value::Null);
    assert_eq!(password["secret"], 1);
    // As text, the value is the view's JSON: quoted in CSV, NULL an empty field.
    let csv_host = out
        .csv
        .iter()
        .find(|r| r[4] == "modules.backend.externals.db" && r[10] == "values.host")
        .unwrap();
    assert_eq!(csv_host[13], "\"pg.dev.internal\"");
    assert!(
        out.csv_text
            .contains(",values.host,outputs.pghost,string,\"\"\"pg.dev.internal\"\"\",0,0,\r\n"),
        "{}",
        out.csv_text
    );
    assert!(
        out.csv_text
            .contains(",secrets.password,outputs.pgpassword,string,,1,0,\r\n"),
        "{}",
        out.csv_text
    );
    assert_matches_view(
        &out,
        &sb,
        "SELECT * FROM links WHERE env = 'development'",
        &["value"],
        true,
    );

    // Every environment, straight from the view.
    let all = report(&sb, &["links"]);
    assert_matches_view(&all, &sb, "SELECT * FROM links", &["value"], true);
    assert!(all.json.iter().any(|r| r["env"] == "production"));
}

#[test]
fn consumers_report_is_transitive() {
    let sb = Sandbox::applied();
    let base = guresid(&sb, "development", "base-env");
    let out = report(
        &sb,
        &[
            "consumers",
            "shop/base-env.default#base-env",
            "--env",
            "development",
        ],
    );
    let columns = [
        "env",
        "provider",
        "consumer",
        "consumer_type",
        "consumer_id",
        "depth",
    ];
    assert_eq!(out.csv[0], columns);
    let got: Vec<(String, String, i64)> = out
        .json
        .iter()
        .map(|r| {
            assert_eq!(r["provider"], base.as_str(), "{r}");
            assert_eq!(r["env"], "development", "{r}");
            (
                r["consumer_type"].as_str().unwrap().to_owned(),
                r["consumer_id"].as_str().unwrap().to_owned(),
                r["depth"].as_i64().unwrap(),
            )
        })
        .collect();
    let row = |t: &str, id: &str, depth| (t.to_owned(), id.to_owned(), depth);
    assert_eq!(
        got,
        [
            row("postgres", "modules.backend.externals.db", 1),
            row("dns", "modules.frontend.externals.dns", 1),
            row("redis", "shared.cache", 1),
            row("workload", "modules.backend", 2),
            row("workload", "modules.frontend", 2),
        ],
        "by depth, then id"
    );
    // What the view says, labelled from current_resources.
    let sql = format!(
        "SELECT c.env, c.provider, c.consumer, r.type AS consumer_type, \
         r.res_id AS consumer_id, c.depth \
         FROM consumers c JOIN current_resources r ON r.guresid = c.consumer \
         WHERE c.provider = '{base}' ORDER BY c.depth, r.res_id"
    );
    assert_matches_view(&out, &sb, &sql, &[], true);
    let raw: BTreeSet<(String, i64)> = sb
        .rows(&format!(
            "SELECT consumer, depth FROM consumers WHERE provider = '{base}'"
        ))
        .into_iter()
        .map(|r| (r[0].clone(), r[1].parse().unwrap()))
        .collect();
    let printed: BTreeSet<(String, i64)> = out
        .json
        .iter()
        .map(|r| {
            (
                r["consumer"].as_str().unwrap().to_owned(),
                r["depth"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(printed, raw);

    // By GUResID, without --env: the same rows.
    let by_id = report(&sb, &["consumers", &base]);
    assert_eq!(by_id.json, out.json);
    assert_eq!(by_id.csv_text, out.csv_text);

    // A workload has no consumers: a header alone.
    let backend = report(
        &sb,
        &[
            "consumers",
            "shop/workload.default#modules.backend",
            "--env",
            "development",
        ],
    );
    assert_empty(&backend, &columns);

    // The dns is used by the frontend alone.
    let dns = report(
        &sb,
        &[
            "consumers",
            &guresid(&sb, "production", "modules.frontend.externals.dns"),
        ],
    );
    assert_eq!(
        column(&dns.json, "consumer_id"),
        [&json!("modules.frontend")]
    );
    assert!(dns.json.iter().all(|r| r["env"] == "production"));
}

#[test]
fn consumers_report_needs_one_known_resource() {
    let sb = Sandbox::applied();
    for format in FORMATS {
        sb.gitplane(&["report", "consumers", "--format", format])
            .fails()
            .stderr_has("report consumers needs a RESOURCE");
    }
    // The label is in both environments.
    sb.gitplane(&["report", "consumers", "shop/base-env.default#base-env"])
        .fails()
        .stderr_has("recorded in several environments");
    sb.gitplane(&["report", "consumers", "shop/nope.default#nope"])
        .fails()
        .stderr_has("no recorded resource is shop/nope.default#nope");
    // Only consumers takes a RESOURCE.
    sb.gitplane(&["report", "links", "shop/base-env.default#base-env"])
        .fails()
        .stderr_has("takes no RESOURCE");
}

#[test]
fn orphans_report_shows_held_back_deletions_and_why() {
    let sb = Sandbox::applied();
    let columns = [
        "env",
        "app",
        "type",
        "class",
        "res_id",
        "guresid",
        "definition",
        "deletion_policy",
        "orphan_since",
        "orphan_reason",
    ];
    assert_empty(&report(&sb, &["orphans"]), &columns);

    // The frontend goes and the database breaks in one commit: development keeps the frontend's
    // resources, as orphans, until a good apply.
    sb.remove("workloads/shop/frontend.yaml");
    sb.edit(
        "definitions/postgres.yaml",
        "      name: ${context.app.id}_${context.env.id}\n",
        "      name: ${context.app.id}_${context.env.id}\n      \
         pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
    );
    sb.commit("Remove the frontend, break the database");
    assert_no_secret(&sb.gitplane(&["apply"]).fails());

    let out = report(&sb, &["orphans"]);
    assert_eq!(
        column(&out.json, "res_id"),
        [
            &json!("modules.frontend.externals.dns"),
            &json!("modules.frontend")
        ],
        "by env, app, type, id"
    );
    for row in &out.json {
        assert_eq!(keys(row), columns.into_iter().collect::<BTreeSet<_>>());
        assert_eq!(row["env"], "development");
        assert_eq!(row["deletion_policy"], "delete");
        assert!(row["orphan_since"].is_string(), "{row}");
        assert!(
            row["orphan_reason"]
                .as_str()
                .unwrap()
                .starts_with("held back: "),
            "{row}"
        );
    }
    // The reason holds commas: quoted in CSV.
    assert!(out.csv_text.contains(",\"held back: "), "{}", out.csv_text);
    assert!(out.table.contains("held back: "), "{}", out.table);
    assert_matches_view(&out, &sb, "SELECT * FROM orphans", &[], false);
    assert_empty(&report(&sb, &["orphans", "--env", "production"]), &columns);

    // A good apply deletes them: no orphans are left.
    sb.edit(
        "definitions/postgres.yaml",
        "      pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
        "",
    );
    sb.commit("Fix the database");
    sb.gitplane(&["apply"]).ok();
    assert_empty(&report(&sb, &["orphans"]), &columns);
}

#[test]
fn drift_report_is_empty_without_drift_runs() {
    let sb = Sandbox::applied();
    let columns = [
        "env",
        "app",
        "type",
        "class",
        "res_id",
        "guresid",
        "deployment_id",
        "commit_id",
        "finished_at",
    ];
    let out = report(&sb, &["drift"]);
    assert_empty(&out, &columns);
    assert_eq!(out.csv, [columns.to_vec()]);
    assert_matches_view(&out, &sb, "SELECT * FROM drift", &[], true);
    assert_empty(&report(&sb, &["drift", "--env", "development"]), &columns);
}

#[test]
fn reports_need_a_state_file_and_known_environments() {
    let sb = Sandbox::template();
    for args in REPORTS {
        for format in FORMATS {
            let mut all = vec!["report"];
            all.extend(args);
            all.extend(["--format", format]);
            sb.gitplane(&all).fails().stderr_has("no state file");
        }
    }
    assert!(!sb.state.exists(), "a report never creates the state file");

    sb.gitplane(&["apply"]).ok();
    sb.gitplane(&["report", "resources", "--env", "staging"])
        .fails()
        .stderr_has("no environment 'staging' is recorded");
}

#[test]
fn no_report_shows_a_secret() {
    let sb = Sandbox::applied();
    // A failing commit too: its errors are in deployments and failures.
    sb.edit(
        "definitions/dns.yaml",
        "      host: ${context.app.id}.${resources.base-env#base-env.outputs.dns_zone}\n",
        "      host: ${context.app.id}.${resources.base-env#base-env.outputs.dns_zone}\n      \
         pw: ${resources.base-env#base-env.outputs.pgpassword}\n",
    );
    sb.commit("The dns reads a secret");
    sb.gitplane(&["apply"]).fails();
    // The secret is in the state file, sealed, where no view reads it.
    assert!(
        sb.unsealed("SELECT outputs, 'resource_secret.outputs:' || guresid FROM resource_secret")
            .iter()
            .any(|o| o.contains("dev-password-change-me"))
    );
    let mut printed = 0;
    for args in REPORTS {
        // `report` asserts no secret in any format.
        let out = report(&sb, args);
        printed += out.json.len();
    }
    assert!(printed > 50, "the reports are not empty: {printed} rows");
}
