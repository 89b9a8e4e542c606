//! Reading one YAML document into a serde type, within size limits, with errors in the user's
//! terms.
//!
//! Every YAML file gitplane reads (the repository's files and the host config) goes through
//! [`from_str`]. serde-saphyr's own messages name its API (`from_str_multiple`,
//! `DuplicateKeyPolicy`), its parser's states (`expected mapping start`) or its budgets
//! (`Nodes { nodes: 250001 }`); a user who wrote `variables:` with nothing under it needs to
//! hear which key is wrong and what to write instead. So errors are rewritten here, from the
//! error's kind and the text at its location.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// The largest file gitplane reads, unless `gitplane.yaml` says otherwise.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 1024 * 1024;
/// The longest string (value or key) a file may hold, unless `gitplane.yaml` says otherwise.
pub const DEFAULT_MAX_VALUE_BYTES: u64 = 64 * 1024;
/// No limit may be raised above this: serde-saphyr refuses more scalar text than this anyway,
/// and a larger file would be copied into every resource that reads it.
pub const CEILING_BYTES: u64 = 64 * 1024 * 1024;

/// How large a file, and a string in it, may be. The defaults fit real repositories with room
/// to spare; `limits:` in `gitplane.yaml` changes them (see [`Limits::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    pub max_file_bytes: u64,
    pub max_value_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_value_bytes: DEFAULT_MAX_VALUE_BYTES,
        }
    }
}

/// Why a YAML document does not load: where, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct YamlError {
    /// 1-based, in the text given to [`from_str`].
    pub line: Option<usize>,
    /// 1-based character position in the line.
    pub column: Option<usize>,
    pub message: String,
}

/// A size in bytes as people write it: `1048576`, `512KiB`, `1MiB`, `1 MiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim());
    let bad = || format!("'{text}' is not a size: write e.g. 65536, 64KiB or 1MiB");
    let n: u64 = number.parse().map_err(|_| bad())?;
    let factor: u64 = match unit {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).ok_or_else(bad)
}

/// `1 MiB`, `64 KiB`, `1000 bytes`: a size for messages.
pub fn show_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else if bytes >= MIB {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{} KiB", bytes / KIB)
    } else if bytes >= KIB {
        format!("{:.1} KiB", bytes as f64 / KIB as f64)
    } else {
        format!("{bytes} bytes")
    }
}

/// `100 KiB (102400 bytes)`, or `65 bytes`: a measured size, exact where rounded.
fn show_size_exactly(bytes: u64) -> String {
    let shown = show_size(bytes);
    if shown.ends_with(" bytes") {
        shown
    } else {
        format!("{shown} ({bytes} bytes)")
    }
}

impl Limits {
    /// Checks limits a file asks for: each at least 1 byte, no more than [`CEILING_BYTES`],
    /// and a value no longer than a file.
    pub fn checked(max_file_bytes: u64, max_value_bytes: u64) -> Result<Limits, String> {
        for (key, v) in [
            ("file_size", max_file_bytes),
            ("value_size", max_value_bytes),
        ] {
            if v == 0 {
                return Err(format!(
                    "limits.{key} must be more than 0: write e.g. {key}: {}",
                    if key == "file_size" { "1MiB" } else { "64KiB" }
                ));
            }
            if v > CEILING_BYTES {
                return Err(format!(
                    "limits.{key} {} is more than gitplane reads ({}): keep large data out \
                     of the repository",
                    show_size(v),
                    show_size(CEILING_BYTES)
                ));
            }
        }
        if max_value_bytes > max_file_bytes {
            return Err(format!(
                "limits.value_size {} is larger than limits.file_size {}: a value cannot be \
                 longer than its file",
                show_size(max_value_bytes),
                show_size(max_file_bytes)
            ));
        }
        Ok(Limits {
            max_file_bytes,
            max_value_bytes,
        })
    }

    /// Whether `bytes` fit in a file; else an error at the line where the limit is crossed,
    /// which is where the oversized part is more often than not.
    pub fn check_file(&self, bytes: &[u8], setting: Option<&str>) -> Result<(), YamlError> {
        let len = bytes.len() as u64;
        if len <= self.max_file_bytes {
            return Ok(());
        }
        let crossed = usize::try_from(self.max_file_bytes).unwrap_or(usize::MAX);
        let line = bytes[..crossed.min(bytes.len())]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1;
        Err(YamlError {
            line: Some(line),
            column: None,
            message: format!(
                "the file is {}, more than the limit of {}: it passes the limit on this line. \
                 Keep large data out of it{}",
                show_size_exactly(len),
                show_size(self.max_file_bytes),
                setting.map_or_else(String::new, |s| format!(", split it, or raise {s}"))
            ),
        })
    }
}

/// What kind of file a document is, for messages: "an environment file".
#[derive(Debug, Clone, Copy)]
pub struct Doc<'a> {
    pub kind: &'a str,
    /// Where the value limit is set, for messages: "limits.value_size in gitplane.yaml";
    /// `None` where it is fixed.
    pub setting: Option<&'a str>,
}

/// Parses one YAML document of `text` into `T`. `text` must already fit `limits.max_file_bytes`
/// (see [`Limits::check_file`]); strings longer than `limits.max_value_bytes` and integers that
/// would be stored rounded are refused.
pub fn from_str<T: DeserializeOwned>(
    text: &str,
    limits: &Limits,
    doc: Doc<'_>,
) -> Result<T, YamlError> {
    let options = serde_saphyr::options! { strict_booleans: true };
    let result = match scan(text, limits, doc) {
        Some(e) => Err(e),
        None => serde_saphyr::from_str_with_options::<T>(text, options)
            .map_err(|e| explain(&e, text, doc)),
    };
    result.map_err(|mut e| {
        // YAML also breaks lines at a lone `\r`, which editors and `git diff` may not show as
        // a line: a location past the last line gitplane counts (at `\n`) points at the last.
        let lines = text.split('\n').count();
        if e.line.is_some_and(|l| l > lines) {
            e.line = Some(lines);
            e.column = None;
        }
        e
    })
}

/// Finds what the typed parse would accept but must not: a string over the value limit, and an
/// integer too large for 64 bits (serde-saphyr turns `123456789012345678901234567890` into the
/// float `1e30` where the target is untyped, such as a Score file's containers).
///
/// The scan parses the text a second time, so it runs only when it can find something: when the
/// text is longer than the value limit, or has a run of 19 digits (the fewest a 64-bit integer
/// needs to overflow). A syntax error ends the scan; the typed parse reports it.
fn scan(text: &str, limits: &Limits, doc: Doc<'_>) -> Option<YamlError> {
    let long = text.len() as u64 > limits.max_value_bytes;
    if !long && !has_digit_run(text, 19) {
        return None;
    }
    // For each open collection: a list (`None`), or a mapping and whether its next node is a
    // key. Keys are text wherever gitplane reads them, so a key of digits is never rounded.
    let mut open: Vec<Option<bool>> = Vec::new();
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else {
            return None;
        };
        let is_node = matches!(
            event,
            Event::Scalar(..)
                | Event::Alias(..)
                | Event::SequenceStart(..)
                | Event::MappingStart(..)
        );
        let is_key = match open.last_mut() {
            Some(Some(next_is_key)) if is_node => {
                let key = *next_is_key;
                *next_is_key = !key;
                key
            }
            _ => false,
        };
        match &event {
            Event::SequenceStart(..) => open.push(None),
            Event::MappingStart(..) => open.push(Some(true)),
            Event::SequenceEnd | Event::MappingEnd => {
                open.pop();
            }
            _ => {}
        }
        let Event::Scalar(value, style, _, tag) = event else {
            continue;
        };
        let at = |message: String| YamlError {
            line: Some(span.start.line()),
            column: Some(span.start.col() + 1),
            message,
        };
        if value.len() as u64 > limits.max_value_bytes {
            return Some(at(format!(
                "this string is {}, longer than the limit of {}: keep large data out of {} (a \
                 value is copied into every resource that reads it){}",
                show_size_exactly(value.len() as u64),
                show_size(limits.max_value_bytes),
                doc.kind,
                doc.setting
                    .map_or_else(String::new, |s| format!(", or raise {s}"))
            )));
        }
        if !is_key && style == ScalarStyle::Plain && tag.is_none() && !fits_exactly(&value) {
            let digits = value.trim();
            return Some(at(format!(
                "the integer {digits} does not fit in 64 bits and would be stored rounded (as \
                 {:e}): write a whole number between {} and {}, or quote it (\"{digits}\") \
                 to keep it as text",
                digits.parse::<f64>().unwrap_or(f64::NAN),
                i64::MIN,
                u64::MAX
            )));
        }
    }
    None
}

fn has_digit_run(text: &str, run: usize) -> bool {
    let mut current = 0;
    for b in text.bytes() {
        if b.is_ascii_digit() {
            current += 1;
            if current >= run {
                return true;
            }
        } else {
            current = 0;
        }
    }
    false
}

/// Whether a plain scalar is anything but a decimal integer that neither a 64-bit integer nor a
/// float holds exactly: such a literal would silently become a different number.
fn fits_exactly(scalar: &str) -> bool {
    let t = scalar.trim();
    let unsigned = t.strip_prefix(['-', '+']).unwrap_or(t);
    if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    if t.parse::<i64>().is_ok() || t.strip_prefix('+').unwrap_or(t).parse::<u64>().is_ok() {
        return true;
    }
    // Beyond 64 bits, only a float that is exactly this integer keeps it.
    let Ok(float) = unsigned.parse::<f64>() else {
        return false;
    };
    let exact = format!("{float:.0}");
    exact == unsigned.trim_start_matches('0')
}

/// The user's terms for a serde-saphyr error.
fn explain(e: &serde_saphyr::Error, text: &str, doc: Doc<'_>) -> YamlError {
    use serde_saphyr::Error as E;
    let (line, column) = match e.location() {
        Some(l) if l.line() > 0 => (Some(l.line() as usize), Some(l.column() as usize)),
        _ => (None, None),
    };
    let at = Context::at(text, line, column);
    let message = match e {
        E::AliasError { error, .. } => return explain(error, text, doc),
        E::WithSnippet { error, .. } => return explain(error, text, doc),
        E::Eof { .. } => format!(
            "the document ends before it has a value: {} cannot be empty",
            doc.kind
        ),
        E::MultipleDocuments { .. } => {
            let message = format!(
                "a second YAML document starts at this `---` line, but {} holds one \
                 document: remove the `---` line, or move what follows to a file of its own",
                doc.kind
            );
            // The library points past the marker; the user looks for the `---` itself.
            let line = second_document_line(text).or(line);
            return YamlError {
                line,
                column: line.map(|_| 1),
                message,
            };
        }
        E::DuplicateMappingKey { key, .. } => match key {
            Some(k) => format!(
                "`{k}` is set twice in the same mapping (also on line {}): keep one",
                at.earlier_key(k)
                    .map_or("above".to_owned(), |l| l.to_string())
            ),
            None => "a key is set twice in the same mapping: keep one".to_owned(),
        },
        E::Unexpected { expected, .. } => at.wrong_shape(expected),
        E::InvalidScalar { ty, .. } => at.wrong_scalar(ty),
        E::InvalidBooleanStrict { .. } => at.wrong_scalar("bool"),
        E::NullIntoString { .. } => format!("{} is empty: write a value", at.subject()),
        E::SerdeInvalidType {
            unexpected,
            expected,
            ..
        } => format!(
            "{} must be {}, not {}",
            at.subject(),
            serde_expected(expected),
            serde_unexpected(unexpected)
        ),
        E::NonFiniteFloat { value, .. } => format!(
            "{} is `{value}`, which is not a finite number: write a number, or quote it to keep \
             it as text",
            at.subject()
        ),
        E::Budget { breach, .. } => budget_message(breach),
        E::SerdeMissingField { field, .. } => {
            format!("missing field `{field}`: add `{field}: ...` to this mapping")
        }
        E::AliasReplayLimitExceeded { .. }
        | E::AliasExpansionLimitExceeded { .. }
        | E::AliasReplayStackDepthExceeded { .. }
        | E::AliasReplayCounterOverflow { .. } => {
            "aliases (`*name`) here expand to too much data: write the values out, or use fewer \
             aliases of aliases"
                .to_owned()
        }
        E::UnknownAnchor { .. } => {
            "this alias (`*name`) names no anchor (`&name`) defined before it in the document"
                .to_owned()
        }
        E::RecursiveReferencesRequireWeakTypes { .. } => {
            "this alias (`*name`) refers to a mapping or list that contains it: a value cannot \
             contain itself"
                .to_owned()
        }
        _ => {
            let generic = generic_message(e);
            if generic == "recursion limit exceeded" {
                nesting_message()
            } else if let Some(form) = generic.strip_prefix(UNTAGGED) {
                // serde names the Rust type that holds the alternatives; say what they are.
                format!(
                    "{} must be {}, not {}",
                    at.subject(),
                    untagged_forms(form),
                    at.found()
                )
            } else {
                with_advice(generic)
            }
        }
    };
    YamlError {
        line,
        column,
        message,
    }
}

/// serde's words for a value that fits none of a field's alternative forms, before the type name.
const UNTAGGED: &str = "data did not match any variant of untagged enum ";

/// What the alternatives of each field with several forms are, by the type serde names.
fn untagged_forms(type_name: &str) -> &'static str {
    match type_name.trim() {
        "SizeFile" => "a size, such as 65536, 64KiB or 1MiB",
        "KeepFile" => "a number of deployments, such as 1000, or an age, such as 90d",
        "RepoFile" => "a path, or `{url: ..., interval: ...}` for a remote",
        _ => "one of the forms this key takes (see docs/repository.md)",
    }
}

/// The YAML parser's own words for a syntax error, followed by what usually causes it and what
/// to write instead. The parser's words stay first: they are what a search engine knows.
fn with_advice(message: String) -> String {
    const ADVICE: &[(&str, &str)] = &[
        (
            "mapping values are not allowed",
            "a value holds `: ` (a colon and a space); quote the value, as in \
             `key: \"a: b\"`, or start a nested mapping on a line of its own",
        ),
        (
            "did not find expected key",
            "the keys of one mapping must start in the same column: line this one up with \
             the keys above it (spaces, not tabs)",
        ),
        (
            "did not find expected '-' indicator",
            "the items of one list must start in the same column: line this `- ` up with \
             the ones above it",
        ),
        (
            "block sequence entries are not allowed",
            "a `- item` stands where a value is expected: start the list on the line below \
             its key, indented",
        ),
        (
            "unclosed quote",
            "close the quote, or write a quote inside a value as \\\" (double quotes) or '' \
             (single quotes)",
        ),
        (
            "tabs disallowed",
            "indent with spaces: YAML does not allow tabs there",
        ),
        (
            "tab cannot be used",
            "indent with spaces: YAML does not allow tabs there",
        ),
        (
            "did not find expected ',' or '}'",
            "separate the entries of `{...}` with commas, and quote a value that holds `,` or \
             `}`",
        ),
        (
            "expected ',' or ']'",
            "separate the items of `[...]` with commas, and quote an item that holds `,` or \
             `]`",
        ),
        ("unknown field", "check the spelling, or remove the key"),
        (
            "invalid indentation",
            "indent a nested value more than its key, with spaces",
        ),
    ];
    match ADVICE.iter().find(|(words, _)| message.contains(words)) {
        Some((_, advice)) => format!("{message}: {advice}"),
        None => message,
    }
}

/// The 1-based line of the `---` that starts a second document in `text`: a marker in column 1
/// after the first document's content (a `---` before any content opens the first document).
pub fn second_document_line(text: &str) -> Option<usize> {
    let mut content = false;
    for (index, line) in text.split('\n').enumerate() {
        let line = line.trim_end_matches('\r');
        let marker = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if marker {
            if content {
                return Some(index + 1);
            }
            continue;
        }
        let trimmed = line.trim();
        if !trimmed.is_empty() && !trimmed.starts_with('#') && trimmed != "..." {
            content = true;
        }
    }
    None
}

/// Where the key at `path` (mapping keys from the root, list items by their index) is written:
/// its 1-based line and column. `None` when the text does not parse or has no such key.
pub fn key_location(text: &str, path: &[&str]) -> Option<(usize, usize)> {
    /// An open collection: a mapping with its current key (and whether a key comes next), or a
    /// list with the index of its current item.
    enum Open {
        Map { next_is_key: bool, key: String },
        List { index: Option<usize> },
    }
    let mut open: Vec<Open> = Vec::new();
    for item in Parser::new_from_str(text) {
        let Ok((event, span)) = item else {
            return None;
        };
        let is_node = matches!(
            event,
            Event::Scalar(..)
                | Event::Alias(..)
                | Event::SequenceStart(..)
                | Event::MappingStart(..)
        );
        if is_node {
            match open.last_mut() {
                Some(Open::Map { next_is_key, key }) if *next_is_key => {
                    *next_is_key = false;
                    *key = match &event {
                        Event::Scalar(value, ..) => value.to_string(),
                        _ => String::new(),
                    };
                    let here = open.len() == path.len()
                        && open.iter().zip(path).all(|(o, want)| match o {
                            Open::Map { key, .. } => key == want,
                            Open::List { index } => {
                                index.map(|i| i.to_string()).as_deref() == Some(want)
                            }
                        });
                    if here {
                        return Some((span.start.line(), span.start.col() + 1));
                    }
                    continue;
                }
                Some(Open::Map { next_is_key, .. }) => *next_is_key = true,
                Some(Open::List { index }) => *index = Some(index.map_or(0, |i| i + 1)),
                None => {}
            }
        }
        match event {
            Event::MappingStart(..) => open.push(Open::Map {
                next_is_key: true,
                key: String::new(),
            }),
            Event::SequenceStart(..) => open.push(Open::List { index: None }),
            Event::MappingEnd | Event::SequenceEnd => {
                open.pop();
            }
            _ => {}
        }
    }
    None
}

fn nesting_message() -> String {
    "lists and mappings nest too deeply here (more than 64 levels): flatten the structure"
        .to_owned()
}

fn budget_message(breach: &BudgetBreach) -> String {
    match breach {
        BudgetBreach::Nodes { .. } | BudgetBreach::Events { .. } => {
            "the document has more than 250000 values, lists and mappings (an alias counts \
             once for each use): split it into several files"
                .to_owned()
        }
        BudgetBreach::Depth { .. } => nesting_message(),
        BudgetBreach::ScalarBytes { .. } => {
            "the document's strings add up to more than 64 MiB: keep large data out of the \
             repository"
                .to_owned()
        }
        BudgetBreach::Aliases { .. }
        | BudgetBreach::Anchors { .. }
        | BudgetBreach::AliasAnchorRatio { .. } => {
            "the document uses too many aliases (`*name`) or anchors (`&name`): write the \
             values out"
                .to_owned()
        }
        BudgetBreach::Documents { .. } => {
            "the file has too many documents (`---` lines): split it into several files".to_owned()
        }
        _ => "the document is too large or too complex to read: split it into several files"
            .to_owned(),
    }
}

/// serde-saphyr's own message, first line, without its " at line L column C".
fn generic_message(e: &serde_saphyr::Error) -> String {
    let text = e.without_snippet().to_string();
    let first = text.lines().next().unwrap_or("invalid YAML").trim();
    match first.rfind(" at line ") {
        Some(pos) => first[..pos].to_owned(),
        None => first.to_owned(),
    }
}

/// Serde's "expected ..." in the user's terms.
fn serde_expected(expected: &str) -> String {
    match expected {
        e if e.starts_with("struct ") || e.starts_with("a map") || e == "map" => {
            "a mapping (`key: value` lines)".to_owned()
        }
        e if e.contains("sequence") => "a list (`- item` lines, or `[a, b]`)".to_owned(),
        "a string" | "string" => "text".to_owned(),
        "a boolean" | "bool" => "true or false".to_owned(),
        e if e.starts_with('i') && e[1..].parse::<u32>().is_ok() => "a whole number".to_owned(),
        e if e.starts_with('u') && e[1..].parse::<u32>().is_ok() || e == "usize" => {
            "a whole number, 0 or more".to_owned()
        }
        "f64" | "f32" => "a number".to_owned(),
        other => other.to_owned(),
    }
}

/// Serde's "invalid type: ..." subject in the user's terms.
fn serde_unexpected(unexpected: &str) -> String {
    match unexpected {
        "map" => "a mapping".to_owned(),
        "sequence" => "a list".to_owned(),
        "unit value" => "empty".to_owned(),
        u => u.to_owned(),
    }
}

/// The text around an error's location: the key being set and what its value looks like.
struct Context<'t> {
    lines: Vec<&'t str>,
    /// 0-based line index.
    line: Option<usize>,
    /// 0-based character index in the line.
    column: usize,
}

impl<'t> Context<'t> {
    fn at(text: &'t str, line: Option<usize>, column: Option<usize>) -> Self {
        let lines: Vec<&str> = text.lines().collect();
        Context {
            line: line
                .and_then(|l| l.checked_sub(1))
                .filter(|l| *l < lines.len()),
            column: column.unwrap_or(1).saturating_sub(1),
            lines,
        }
    }

    /// The key whose value is at the location: `threshold` in `deletion_guard: {threshold: x}`,
    /// or the key of a block above when the line has none before the location.
    fn key(&self) -> Option<String> {
        let index = self.line?;
        let line = self.lines[index];
        let before: String = line.chars().take(self.column + 1).collect();
        if let Some(key) = last_key(&before) {
            return Some(key);
        }
        // A value on a line of its own: the nearest line above, indented less, that opens a key.
        let indent = indentation(line);
        self.lines[..index]
            .iter()
            .rev()
            .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            .find(|l| indentation(l) < indent || l.trim_end().ends_with(':'))
            .and_then(|l| last_key(l))
    }

    /// `` `threshold` `` or "the value here".
    fn subject(&self) -> String {
        self.key()
            .map_or_else(|| "the value here".to_owned(), |k| format!("`{k}`"))
    }

    /// What is written at the location, in words: "empty", "a list", "a mapping", or the text.
    fn found(&self) -> String {
        let Some(index) = self.line else {
            return "something else".to_owned();
        };
        let line = self.lines[index];
        let mut rest: String = line.chars().skip(self.column).collect();
        if let Some(colon) = rest.strip_prefix(':') {
            rest = colon.to_owned();
        }
        let rest = strip_comment(rest.trim());
        if rest.is_empty() || rest == "~" || rest == "null" {
            // The value may be on the lines below, indented more than the key's line.
            let indent = indentation(line);
            let next = self.lines[index + 1..]
                .iter()
                .find(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
            return match next {
                Some(l) if indentation(l) > indent && l.trim_start().starts_with("- ") => {
                    "a list".to_owned()
                }
                Some(l) if indentation(l) > indent => "a mapping".to_owned(),
                _ => "empty".to_owned(),
            };
        }
        match rest.chars().next() {
            Some('[') => "a list".to_owned(),
            Some('{') => "a mapping".to_owned(),
            Some('-') if rest.starts_with("- ") || rest == "-" => "a list".to_owned(),
            _ => {
                let value = rest.trim_end_matches([',', '}', ']']).trim();
                let shown: String = value.chars().take(40).collect();
                if shown.len() < value.len() {
                    format!("`{shown}...`")
                } else {
                    format!("`{shown}`")
                }
            }
        }
    }

    /// For "expected mapping start" and the like.
    fn wrong_shape(&self, expected: &str) -> String {
        let found = self.found();
        if self.key().is_none() && self.line == Some(0) && self.column == 0 {
            // The document itself.
            let what = if expected.contains("mapping start") {
                "a mapping (`key: value` lines)"
            } else {
                "something else"
            };
            return format!("the document must be {what}, not {found}");
        }
        let subject = self.subject();
        let (what, how) = if expected == "string scalar" || expected == "scalar" {
            let what = if expected == "scalar" {
                "a single value"
            } else {
                "text"
            };
            return if found == "empty" {
                format!("{subject} is empty: write a value")
            } else {
                format!("{subject} must be {what}, not {found}")
            };
        } else if expected.contains("mapping start") {
            (
                "a mapping",
                "`key: value` lines indented under it, or `{}` for none",
            )
        } else if expected.contains("sequence start") {
            (
                "a list",
                "`- item` lines indented under it, or `[]` for none",
            )
        } else {
            return format!("{subject} is not what gitplane expects here ({expected})");
        };
        if found == "empty" {
            format!("{subject} is empty but must be {what}: write {how}, or remove the key")
        } else {
            format!("{subject} must be {what} ({how}), not {found}")
        }
    }

    /// For a scalar that does not parse as the field's type.
    fn wrong_scalar(&self, ty: &str) -> String {
        let want = match ty {
            "floating point" | "f64" | "f32" => "a number, such as 20 or 12.5",
            "bool" | "boolean" => "true or false",
            t if t.starts_with('u') || t == "usize" => "a whole number, 0 or more",
            t if t.starts_with('i') => "a whole number",
            _ => ty,
        };
        format!("{} must be {want}, not {}", self.subject(), self.found())
    }

    /// The line (1-based) where `key` was first set above the location, at the same
    /// indentation.
    fn earlier_key(&self, key: &str) -> Option<usize> {
        let index = self.line?;
        let indent = indentation(self.lines[index]);
        self.lines[..index]
            .iter()
            .rposition(|l| indentation(l) == indent && last_key(l).is_some_and(|k| k == key))
            .map(|i| i + 1)
    }
}

fn indentation(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

fn strip_comment(text: &str) -> &str {
    match text.find(" #") {
        Some(i) => text[..i].trim_end(),
        None if text.starts_with('#') => "",
        None => text,
    }
}

/// The last `key:` written in `text` (a key followed by `:` and a space or the end), unquoted.
fn last_key(text: &str) -> Option<String> {
    let text = strip_comment(text);
    let bytes = text.as_bytes();
    let colon = (0..bytes.len()).rev().find(|&i| {
        bytes[i] == b':' && bytes.get(i + 1).is_none_or(|c| *c == b' ' || *c == b'\t')
    })?;
    let head = &text[..colon];
    let start = head
        .rfind(['{', ',', '[', '-', '?'])
        .map_or(0, |i| i + 1)
        .max(head.rfind(": ").map_or(0, |i| i + 2));
    let key = head[start..].trim().trim_matches(['"', '\'']);
    (!key.is_empty()).then(|| key.to_owned())
}

impl fmt::Display for Limits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "file_size {}, value_size {}",
            show_size(self.max_file_bytes),
            show_size(self.max_value_bytes)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const DOC: Doc<'static> = Doc {
        kind: "an environment file",
        setting: Some("limits.value_size in gitplane.yaml"),
    };

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Env {
        #[serde(rename = "type")]
        env_type: String,
        #[serde(default)]
        shared: std::collections::BTreeMap<String, serde_json::Value>,
        #[serde(default)]
        list: Vec<String>,
        guard: Option<Guard>,
        extra: Option<serde_json::Value>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Guard {
        threshold: Option<f64>,
        on: Option<bool>,
    }

    fn error(text: &str) -> String {
        match from_str::<Env>(text, &Limits::default(), DOC) {
            Ok(v) => panic!("loaded: {v:?}"),
            Err(e) => format!(
                "{}:{}: {}",
                e.line.unwrap_or(0),
                e.column.unwrap_or(0),
                e.message
            ),
        }
    }

    #[test]
    fn library_terms_become_the_users() {
        for (text, want) in [
            (
                "type: a\n---\ntype: b\n",
                "2:1: a second YAML document starts at this `---` line, but an environment \
                 file holds one document: remove the `---` line, or move what follows to a \
                 file of its own",
            ),
            (
                "# leading marker opens the first document\n---\ntype: a\n--- # b\ntype: b\n",
                "4:1: a second YAML document starts at this `---` line",
            ),
            (
                "type: a\nguard:\n  threshold: 5: x\n",
                "3:15: mapping values are not allowed in this context: a value holds `: `",
            ),
            (
                "type: a\nguard:\n    threshold: 5\n  on: true\n",
                "4:3: while parsing a block mapping, did not find expected key: the keys of one \
                 mapping must start in the same column",
            ),
            (
                "type: a\ntype: b\n",
                "2:1: `type` is set twice in the same mapping (also on line 1): keep one",
            ),
            (
                "type: a\nshared:\n",
                "2:7: `shared` is empty but must be a mapping: write `key: value` lines \
                 indented under it, or `{}` for none, or remove the key",
            ),
            (
                "type: a\nlist: {}\n",
                "2:7: `list` must be a list (`- item` lines indented under it, or `[]` for \
                 none), not a mapping",
            ),
            (
                "type: a\nguard: {threshold: lots}\n",
                "2:20: `threshold` must be a number, such as 20 or 12.5, not `lots`",
            ),
            (
                "type: a\nguard:\n  on: yes\n",
                "3:7: `on` must be true or false, not `yes`",
            ),
            ("type: [a]\n", "1:7: `type` must be text, not a list"),
            (
                "shared: {}\n",
                "1:1: missing field `type`: add `type: ...` to this mapping",
            ),
        ] {
            let got = error(text);
            assert!(got.starts_with(want), "{text:?}\n got: {got}\nwant: {want}");
            for jargon in [
                "from_str",
                "DuplicateKeyPolicy",
                "mapping start",
                "sequence start",
            ] {
                assert!(!got.contains(jargon), "{got}");
            }
        }
    }

    #[test]
    fn budgets_and_nesting_are_explained() {
        let many = format!("type: a\nlist: [{}]\n", vec!["x"; 250_001].join(","));
        assert!(
            error(&many).contains("more than 250000 values"),
            "{}",
            error(&many)
        );
        let deep = format!(
            "type: a\nextra: {}1{}\n",
            "{a: ".repeat(100),
            "}".repeat(100)
        );
        assert!(error(&deep).contains("nest too deeply"), "{}", error(&deep));
        let deep = format!("type: a\nextra: {}{}\n", "[".repeat(3000), "]".repeat(3000));
        assert!(error(&deep).contains("nest too deeply"), "{}", error(&deep));
    }

    #[test]
    fn large_integers_are_refused_where_they_are() {
        let got = error("type: a\nextra:\n  port: 123456789012345678901234567890\n");
        assert!(
            got.starts_with(
                "3:9: the integer 123456789012345678901234567890 does not fit in 64 bits"
            ),
            "{got}"
        );
        // What fits 64 bits, or a float exactly, or is quoted, or is not an integer, loads.
        for ok in [
            "9223372036854775807",
            "-9223372036854775808",
            "18446744073709551615",
            "1180591620717411303424",
            "\"123456789012345678901234567890\"",
            "1234567890123456789012.5",
            "12345678901234567890123a",
        ] {
            let text = format!("type: a\nextra: {ok}\n");
            assert!(
                from_str::<Env>(&text, &Limits::default(), DOC).is_ok(),
                "{ok}"
            );
        }
        assert!(error("type: a\nextra: [-99999999999999999999]\n").contains("does not fit"));
        // A key of digits stays text; values after it are still checked.
        let keys = "type: a\nextra:\n  123456789012345678901234567890: ok\n  list: [1, {b: 2}]\n";
        let parsed = from_str::<Env>(keys, &Limits::default(), DOC);
        assert!(parsed.is_ok(), "{parsed:?}");
        let got = error(
            "type: a\nextra:\n  123456789012345678901234567890: [{x: 1}]\n  \
             y: 99999999999999999999\n",
        );
        assert!(
            got.starts_with("4:6: the integer 99999999999999999999"),
            "{got}"
        );
    }

    #[test]
    fn limits_are_enforced_with_their_line() {
        let limits = Limits::checked(1024, 100).unwrap();
        let text = format!("type: a\nextra:\n  big: {}\n", "x".repeat(101));
        let e = from_str::<Env>(&text, &limits, DOC).unwrap_err();
        assert_eq!((e.line, e.column), (Some(3), Some(8)));
        assert!(
            e.message.starts_with("this string is 101 bytes"),
            "{}",
            e.message
        );
        assert!(e.message.contains("limits.value_size in gitplane.yaml"));
        let text = format!("type: a\n{}", "# comment\n".repeat(200));
        let e = limits.check_file(text.as_bytes(), None).unwrap_err();
        assert_eq!(e.line, Some(103));
        assert!(
            e.message
                .starts_with("the file is 2.0 KiB (2008 bytes), more than the limit of 1 KiB")
        );
        assert!(Limits::checked(0, 0).is_err());
        assert!(Limits::checked(10, 20).is_err());
        assert!(Limits::checked(CEILING_BYTES + 1, 10).is_err());
    }

    /// Found by fuzzing (`load`): a file whose only line ends in a lone `\r` gave an error at
    /// line 2 of a 1-line file.
    #[test]
    fn a_location_stays_within_the_lines_gitplane_counts() {
        let e = from_str::<Env>("# a comment\r", &Limits::default(), DOC).unwrap_err();
        assert_eq!(e.line, Some(1), "{e:?}");
        assert!(e.message.contains("cannot be empty"), "{e:?}");
        let e = from_str::<Env>("type: a\r\rtype: b", &Limits::default(), DOC).unwrap_err();
        assert_eq!(e.line, Some(1), "{e:?}");
    }

    #[test]
    fn second_documents_are_found_at_their_marker() {
        assert_eq!(second_document_line("a: 1\n"), None);
        assert_eq!(second_document_line("---\na: 1\n"), None);
        assert_eq!(second_document_line("# x\n---\na: 1\n---\nb: 2\n"), Some(4));
        assert_eq!(second_document_line("a: |\n  ---\n  text\n"), None);
        assert_eq!(second_document_line("a: 1\r\n---\r\nb: 2\r\n"), Some(2));
    }

    #[test]
    fn keys_are_located_by_their_path() {
        let text = "containers:\n  web:\n    image: x\n    variables:\n  worker:\n    \
                    variables:\n    files: {a: 1}\nlist:\n  - name: a\n  - {name: b, x: [1]}\n";
        assert_eq!(
            key_location(text, &["containers", "worker", "variables"]),
            Some((6, 5))
        );
        assert_eq!(
            key_location(text, &["containers", "web", "variables"]),
            Some((4, 5))
        );
        assert_eq!(key_location(text, &["list", "1", "name"]), Some((10, 6)));
        assert_eq!(key_location(text, &["list", "0", "name"]), Some((9, 5)));
        assert_eq!(key_location(text, &["containers", "db"]), None);
        assert_eq!(key_location("a: 1\n", &["a", "b"]), None);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("65536"), Ok(65536));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert_eq!(parse_size("1 MiB"), Ok(1 << 20));
        assert!(parse_size("1GB").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999999999999MiB").is_err());
        assert_eq!(show_size(1 << 20), "1 MiB");
        assert_eq!(show_size(1536), "1.5 KiB");
    }

    #[test]
    fn keys_are_found_in_block_and_flow_style() {
        assert_eq!(last_key("a: {b: "), Some("b".into()));
        assert_eq!(
            last_key("  shared_resources:"),
            Some("shared_resources".into())
        );
        assert_eq!(last_key("- name: x, 'quoted': "), Some("quoted".into()));
        assert_eq!(last_key("url: http://x"), Some("url".into()));
        assert_eq!(last_key("no key here"), None);
    }
}
