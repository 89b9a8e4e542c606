//! `gitplane report NAME`: the state's report views, as a table, JSON or CSV.
//!
//! Each report is one of the public views of `schema.sql`, which hold no secret values; the
//! state crate reads it, this module only formats it.

use std::io::Write;

use clap::ValueEnum;
use gitplane_state::{Report, ReportCell, ReportFilter, ReportView};
use serde_json::Value;

use super::output::Table;
use super::{CliError, CommandResult, Context};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportName {
    Resources,
    Deployments,
    Failures,
    Links,
    Consumers,
    Orphans,
    Drift,
    /// What the newest detect-only drift run of each environment found.
    DriftDetected,
}

impl ReportName {
    fn view(self) -> ReportView {
        match self {
            ReportName::Resources => ReportView::Resources,
            ReportName::Deployments => ReportView::Deployments,
            ReportName::Failures => ReportView::Failures,
            ReportName::Links => ReportView::Links,
            ReportName::Consumers => ReportView::Consumers,
            ReportName::Orphans => ReportView::Orphans,
            ReportName::Drift => ReportView::Drift,
            ReportName::DriftDetected => ReportView::DriftDetected,
        }
    }

    fn name(self) -> String {
        self.to_possible_value()
            .map(|v| v.get_name().to_owned())
            .unwrap_or_default()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
    Csv,
}

/// Prints report `name` of the state, of the `--env` environments (all when none are named).
/// `consumers` needs `resource`, whose consumers it lists; no other report takes one.
pub fn report(
    ctx: &Context,
    name: ReportName,
    resource: Option<&str>,
    format: ReportFormat,
    stdout: &mut impl Write,
) -> Result<CommandResult, CliError> {
    match (name, resource) {
        (ReportName::Consumers, None) => {
            eprintln!(
                "error: report consumers needs a RESOURCE: a GUResID, or app/type.class#id \
                 (with --env when several environments have it); `gitplane status` lists them"
            );
            return Ok(CommandResult::Failure);
        }
        (ReportName::Consumers, Some(_)) | (_, None) => {}
        (_, Some(extra)) => {
            eprintln!(
                "error: report {} takes no RESOURCE (got {extra:?}); only `report consumers` does",
                name.name()
            );
            return Ok(CommandResult::Failure);
        }
    }
    let store = super::existing_store(ctx)?;
    let known = store.environments()?;
    if let Some(env) = ctx.envs.iter().find(|e| !known.contains(e)) {
        return Err(crate::app::AppError::UnknownStateEnv {
            env: env.clone(),
            state: ctx.state.clone(),
            known: known.join(", "),
        }
        .into());
    }
    let provider = match resource {
        Some(wanted) => Some(super::find_resource(&store, ctx, wanted)?.0),
        None => None,
    };
    let report = store.report(
        name.view(),
        &ReportFilter {
            envs: &ctx.envs,
            provider: provider.as_deref(),
        },
    )?;
    let text = match format {
        ReportFormat::Table => table(&report),
        ReportFormat::Json => json(&report),
        ReportFormat::Csv => csv(&report),
    };
    stdout.write_all(text.as_bytes())?;
    Ok(CommandResult::Success)
}

/// Aligned columns headed by the column names; NULL is `-`, line breaks are escaped.
fn table(report: &Report) -> String {
    let header: Vec<&str> = report.columns.iter().map(String::as_str).collect();
    let mut t = Table::new(&header);
    for row in &report.rows {
        t.row(
            row.iter()
                .map(|cell| match cell {
                    ReportCell::Null => "-".to_owned(),
                    ReportCell::Integer(v) => v.to_string(),
                    ReportCell::Real(v) => v.to_string(),
                    ReportCell::Text(s) => s
                        .replace('\\', "\\\\")
                        .replace('\n', "\\n")
                        .replace('\r', "\\r")
                        .replace('\t', "\\t"),
                })
                .collect(),
        );
    }
    t.render("")
}

/// One JSON value of a cell: SQLite's types kept, JSON text parsed.
fn json_value(cell: &ReportCell, is_json: bool) -> Value {
    match cell {
        ReportCell::Null => Value::Null,
        ReportCell::Integer(v) => Value::from(*v),
        ReportCell::Real(v) => serde_json::Number::from_f64(*v)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        ReportCell::Text(s) if is_json => {
            serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone()))
        }
        ReportCell::Text(s) => Value::String(s.clone()),
    }
}

/// An array of objects, column name to value, with the keys in the view's column order.
fn json(report: &Report) -> String {
    if report.rows.is_empty() {
        return "[]\n".to_owned();
    }
    let pretty = |v: &Value| serde_json::to_string_pretty(v).expect("a Value always serialises");
    let objects: Vec<String> = report
        .rows
        .iter()
        .map(|row| {
            let fields: Vec<String> = report
                .columns
                .iter()
                .zip(&report.json)
                .zip(row)
                .map(|((column, &is_json), cell)| {
                    let value = pretty(&json_value(cell, is_json)).replace('\n', "\n    ");
                    format!("    {}: {value}", pretty(&Value::String(column.clone())))
                })
                .collect();
            format!("  {{\n{}\n  }}", fields.join(",\n"))
        })
        .collect();
    format!("[\n{}\n]\n", objects.join(",\n"))
}

/// RFC 4180: a header line, CRLF line ends, a field quoted when it holds a comma, a quote or a
/// line break, quotes doubled. NULL is an empty field, an empty string `""`.
fn csv(report: &Report) -> String {
    fn field(s: &str) -> String {
        if s.is_empty() || s.contains([',', '"', '\n', '\r']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s.to_owned()
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, fields: Vec<String>| {
        out.push_str(&fields.join(","));
        out.push_str("\r\n");
    };
    line(&mut out, report.columns.iter().map(|c| field(c)).collect());
    for row in &report.rows {
        line(
            &mut out,
            row.iter()
                .map(|cell| match cell {
                    ReportCell::Null => String::new(),
                    ReportCell::Integer(v) => v.to_string(),
                    ReportCell::Real(v) => v.to_string(),
                    ReportCell::Text(s) => field(s),
                })
                .collect(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Report {
        Report {
            columns: vec!["id".into(), "name".into(), "outputs".into(), "d".into()],
            json: vec![false, false, true, false],
            rows: vec![
                vec![
                    ReportCell::Integer(1),
                    ReportCell::Text("a,\"b\"\nc".into()),
                    ReportCell::Text(r#"{"x":1,"y":[2]}"#.into()),
                    ReportCell::Real(0.25),
                ],
                vec![
                    ReportCell::Integer(2),
                    ReportCell::Text(String::new()),
                    ReportCell::Null,
                    ReportCell::Null,
                ],
            ],
        }
    }

    #[test]
    fn csv_quotes_and_doubles() {
        assert_eq!(
            csv(&sample()),
            "id,name,outputs,d\r\n\
             1,\"a,\"\"b\"\"\nc\",\"{\"\"x\"\":1,\"\"y\"\":[2]}\",0.25\r\n\
             2,\"\",,\r\n"
        );
    }

    #[test]
    fn json_keeps_types_and_column_order() {
        let text = json(&sample());
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            v,
            serde_json::json!([
                {"id": 1, "name": "a,\"b\"\nc", "outputs": {"x": 1, "y": [2]}, "d": 0.25},
                {"id": 2, "name": "", "outputs": null, "d": null},
            ])
        );
        let first = text.find("\"id\"").unwrap();
        assert!(first < text.find("\"name\"").unwrap());
        assert!(text.find("\"name\"").unwrap() < text.find("\"outputs\"").unwrap());
    }

    #[test]
    fn table_shows_null_as_dash_and_escapes_line_breaks() {
        let t = table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("id  name"));
        assert!(lines[1].contains("a,\"b\"\\nc"));
        assert!(lines[2].ends_with('-'));
    }

    #[test]
    fn empty_reports_have_a_header_or_an_empty_array() {
        let empty = Report {
            rows: Vec::new(),
            ..sample()
        };
        assert_eq!(table(&empty), "id  name  outputs  d\n");
        assert_eq!(csv(&empty), "id,name,outputs,d\r\n");
        assert_eq!(json(&empty), "[]\n");
    }
}
