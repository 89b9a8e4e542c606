//! Go's text/template with the Sprig functions, in which `humanitec/template` definitions are
//! written: parsed once, rendered within fixed limits, failing with messages that never show
//! the data.
//!
//! The engine is gotmpl, a faithful port of Go's text/template; `sprig` adds Sprig v3's
//! functions (and Helm's `toYaml`, `fromYaml`, `required`), `rewrite` prepares the parsed tree.
//! What a template may cost is bounded: its output ([`MAX_RENDERED_BYTES`]), every value a
//! function builds (16 MiB, a million list items, 128 levels of nesting), `{{range}}`
//! iterations ([`MAX_RANGE_ITERATIONS`]), and its total work (a budget of steps that every
//! template body and every function draws on).
//!
//! Missing keys behave as in Go: `{{ .driver.values.missing }}` prints `<no value>`, and a
//! missing key is nil to functions (`default "x" .missing` is `x`).
//!
//! Messages never quote a value from the data, which holds secrets: gotmpl's own runtime
//! messages that quote one are reworded, a function's messages name kinds, not values, and
//! `fail`/`required` show their message only when it is a string literal of the template.
//! gotmpl reports no position at run time; when the function that failed is called on a
//! single line of the template, the message names that line.

mod context;
mod rewrite;
mod sprig;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use gotmpl::{Template, TemplateError};

use rewrite::Facts;
use sprig::MESSAGE_MARK;

/// The most text a render may produce, in bytes.
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// The most `{{range}}` iterations a render may run, over all its loops.
pub const MAX_RANGE_ITERATIONS: u64 = 1_000_000;

/// Why a template does not parse or render: which template, the line when known, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}{}: {message}", line.map(|l| format!(", line {l}")).unwrap_or_default())]
pub struct GoTemplateError {
    pub name: String,
    pub line: Option<usize>,
    pub message: String,
}

/// A Go text/template, parsed once, with the Sprig functions.
pub struct GoTemplate {
    name: String,
    template: Template,
    /// Whether the template has a body beyond whitespace, registered (and metered) under its
    /// name; gotmpl keeps a blank body apart.
    has_body: bool,
    literals: Arc<BTreeSet<String>>,
    facts: Facts,
}

impl fmt::Debug for GoTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GoTemplate")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl GoTemplate {
    /// Parses `source`. `name` is how messages call it (e.g. `values.templates.outputs`).
    pub fn parse(name: &str, source: &str) -> Result<GoTemplate, GoTemplateError> {
        let error = |line: Option<usize>, message: String| GoTemplateError {
            name: name.to_owned(),
            line,
            message,
        };
        let parsed = Template::new(name)
            .funcs(sprig::function_map())
            .max_range_iters(MAX_RANGE_ITERATIONS)
            .parse(source)
            .map_err(|e| match e {
                TemplateError::Parse { line, message, .. }
                | TemplateError::Lex { line, message, .. } => error(Some(line), message),
                other => error(None, other.to_string()),
            })?;
        let has_body = parsed.lookup(name).is_some();
        let (template, facts) = rewrite::prepare(parsed, &sprig::known)
            .map_err(|bad| error(Some(bad.line), bad.message))?;
        Ok(GoTemplate {
            name: name.to_owned(),
            template,
            has_body,
            literals: Arc::new(facts.literals.clone()),
            facts,
        })
    }

    /// Renders with `data` as dot. Output over [`MAX_RENDERED_BYTES`] is an error, not an OOM.
    pub fn render(&self, data: &serde_json::Value) -> Result<String, GoTemplateError> {
        let dot = sprig::value_from_json(data).map_err(|_| GoTemplateError {
            name: self.name.clone(),
            line: None,
            message: format!(
                "the template's data nests lists and mappings more than {} levels deep",
                sprig::MAX_DEPTH
            ),
        })?;
        let _context = context::install(self.literals.clone());
        let mut out = sprig::Limited::new(MAX_RENDERED_BYTES);
        let result = if self.has_body {
            self.template
                .execute_template_fmt(&mut out, &self.name, &dot)
        } else {
            // Only whitespace, comments and definitions: printed as it is, nothing to meter.
            self.template.execute_fmt(&mut out, &dot)
        };
        match result {
            Ok(()) => Ok(out.text),
            Err(_) if out.exceeded => Err(GoTemplateError {
                name: self.name.clone(),
                line: None,
                message: format!(
                    "the rendered text would be longer than {} MiB",
                    MAX_RENDERED_BYTES >> 20
                ),
            }),
            Err(e) => Err(self.runtime_error(e)),
        }
    }

    /// A runtime error of gotmpl, reworded where its text could show a value.
    fn runtime_error(&self, error: TemplateError) -> GoTemplateError {
        let (function, message) = runtime_message(error);
        let line = function.and_then(|f| {
            let lines = self.facts.calls.get(&f)?;
            (lines.len() == 1).then(|| lines.first().copied()).flatten()
        });
        GoTemplateError {
            name: self.name.clone(),
            line,
            message,
        }
    }
}

/// The message for a runtime error, and the function it comes from when it names one.
fn runtime_message(error: TemplateError) -> (Option<String>, String) {
    let named = |function: &str, message: String| (Some(function.to_owned()), message);
    match error {
        TemplateError::Exec(text) => {
            if let Some(ours) = text.strip_prefix(MESSAGE_MARK) {
                let function = ours.split_once(": ").map(|(f, _)| f.to_owned());
                return (function, ours.to_owned());
            }
            gotmpl_exec_message(&text)
        }
        TemplateError::IndexOutOfRange { .. } => {
            named("index", "index: the index is out of range".into())
        }
        TemplateError::TypeMismatch { expected, got } => (
            None,
            format!("a value has the wrong type: expected {expected}, got {got}"),
        ),
        TemplateError::MissingKey { key } => (None, format!("map has no entry for key {key:?}")),
        TemplateError::RecursionLimit => (
            None,
            "templates and blocks nest too deeply (a template that calls itself without end?)"
                .into(),
        ),
        TemplateError::RangeIterLimit => (
            None,
            format!(
                "the template's loops ran more than {MAX_RANGE_ITERATIONS} times in all: look for \
                 a range over more items than intended"
            ),
        ),
        TemplateError::FuncPanic { name, .. } => {
            named(&name, format!("{name}: the function failed unexpectedly"))
        }
        TemplateError::ArgCount {
            name,
            expected,
            got,
        } => named(
            &name,
            format!("{name}: wrong number of arguments: expected {expected}, got {got}"),
        ),
        TemplateError::NotIterable(kind) => (None, format!("cannot range over a {kind}")),
        TemplateError::UndefinedTemplate(t) => (None, format!("no template named {t:?}")),
        TemplateError::UndefinedFunction(f) => (None, format!("function {f:?} not defined")),
        TemplateError::UndefinedVariable(v) => (None, format!("undefined variable {v}")),
        TemplateError::Write => (None, "the rendered text could not be written".into()),
        other => (None, other.to_string()),
    }
}

/// gotmpl's execution messages, without the ones' values: the few that print an argument
/// (`len`, a two-variable range over a number, slice bounds) are reworded.
fn gotmpl_exec_message(text: &str) -> (Option<String>, String) {
    if text.starts_with("len: ") {
        return (
            Some("len".into()),
            "len: the value has no length (it is not a string, list or dict)".into(),
        );
    }
    if text.starts_with("can't use ") && text.contains(" to iterate over more than one") {
        return (
            None,
            "cannot range over an integer with two variables".into(),
        );
    }
    if text.starts_with("printf: ") {
        return (
            Some("printf".into()),
            "printf: the format must be a string".into(),
        );
    }
    if text.starts_with("slice: ") || text.starts_with("wrong number of args for slice") {
        return (
            Some("slice".into()),
            "slice: the indexes are out of range".into(),
        );
    }
    // The others name types, template names and fields the author wrote, never values.
    (None, text.to_owned())
}
