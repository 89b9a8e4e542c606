//! JSON and YAML in templates: `toJson` writes what Go's `encoding/json` writes, `toYaml` what
//! Helm's writes (up to the choice of quotes), and `fromJson`/`fromYaml` read them back.
//!
//! Go decodes every JSON number as a float, so `fromJson` data prints `1234567` as
//! `1.234567e+06` there; gitplane keeps integers as integers.

use std::fmt::Write as _;
use std::sync::Arc;

use gotmpl::{TemplateError, Value};

use super::{
    Args, Dict, FloatStyle, Limited, MAX_DEPTH, MAX_VALUE_BYTES, fail, go_float, new_dict,
    new_list, text, too_long,
};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// Data nested deeper than [`MAX_DEPTH`], which a template must not be given.
#[derive(Debug)]
pub(crate) struct TooDeep;

/// JSON data as a template value: integers stay integers (unsigned above `i64::MAX`), other
/// numbers are floats.
pub(crate) fn value_from_json(value: &serde_json::Value) -> std::result::Result<Value, TooDeep> {
    fn convert(value: &serde_json::Value, depth: usize) -> std::result::Result<Value, TooDeep> {
        Ok(match value {
            serde_json::Value::Null => Value::Nil,
            serde_json::Value::Bool(b) => Value::Bool(*b),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Value::Int(i),
                (None, Some(u)) => Value::Uint(u),
                _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            serde_json::Value::String(s) => Value::String(s.as_str().into()),
            serde_json::Value::Array(items) => {
                if depth >= MAX_DEPTH {
                    return Err(TooDeep);
                }
                let items = items
                    .iter()
                    .map(|v| convert(v, depth + 1))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Value::List(items.into())
            }
            serde_json::Value::Object(map) => {
                if depth >= MAX_DEPTH {
                    return Err(TooDeep);
                }
                let mut dict = Dict::new();
                for (k, v) in map {
                    dict.insert(Arc::from(k.as_str()), convert(v, depth + 1)?);
                }
                Value::Map(Arc::new(dict))
            }
        })
    }
    convert(value, 0)
}

/// Why a value has no JSON or YAML form.
enum EncodeError {
    TooLong,
    /// What Go's encoder refuses: NaN and infinite floats, functions.
    Unsupported,
}

impl From<std::fmt::Error> for EncodeError {
    fn from(_: std::fmt::Error) -> Self {
        EncodeError::TooLong
    }
}

/// Go's `encoding/json` string: `<`, `>` and `&` escaped unless `raw`, as `toRawJson` asks.
fn json_string(out: &mut Limited, s: &str, raw: bool) -> std::fmt::Result {
    out.write_char('"')?;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escape: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            '\u{8}' => Some("\\b"),
            '\u{c}' => Some("\\f"),
            '<' if !raw => Some("\\u003c"),
            '>' if !raw => Some("\\u003e"),
            '&' if !raw => Some("\\u0026"),
            '\u{2028}' => Some("\\u2028"),
            '\u{2029}' => Some("\\u2029"),
            c if (c as u32) < 0x20 => None,
            _ => continue,
        };
        out.write_str(&s[start..i])?;
        match escape {
            Some(e) => out.write_str(e)?,
            None => write!(out, "\\u{:04x}", c as u32)?,
        }
        start = i + c.len_utf8();
    }
    out.write_str(&s[start..])?;
    out.write_char('"')
}

/// Writes `value` as Go's `json.Marshal` (compact) or `json.MarshalIndent(v, "", "  ")`.
fn write_json(
    out: &mut Limited,
    value: &Value,
    raw: bool,
    pretty: Option<usize>,
) -> std::result::Result<(), EncodeError> {
    let newline = |out: &mut Limited, level: usize| -> std::fmt::Result {
        out.write_char('\n')?;
        for _ in 0..level {
            out.write_str("  ")?;
        }
        Ok(())
    };
    match value {
        Value::Nil => out.write_str("null")?,
        Value::Bool(b) => write!(out, "{b}")?,
        Value::Int(n) => write!(out, "{n}")?,
        Value::Uint(n) => write!(out, "{n}")?,
        Value::Float(f) if !f.is_finite() => return Err(EncodeError::Unsupported),
        Value::Float(f) => out.write_str(&go_float(*f, FloatStyle::Json))?,
        Value::String(s) => json_string(out, s, raw)?,
        Value::List(items) if items.is_empty() => out.write_str("[]")?,
        Value::List(items) => {
            out.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                if let Some(level) = pretty {
                    newline(out, level + 1)?;
                }
                write_json(out, item, raw, pretty.map(|l| l + 1))?;
            }
            if let Some(level) = pretty {
                newline(out, level)?;
            }
            out.write_char(']')?;
        }
        Value::Map(dict) if dict.is_empty() => out.write_str("{}")?,
        Value::Map(dict) => {
            out.write_char('{')?;
            for (i, (key, item)) in dict.iter().enumerate() {
                if i > 0 {
                    out.write_char(',')?;
                }
                if let Some(level) = pretty {
                    newline(out, level + 1)?;
                }
                json_string(out, key, raw)?;
                out.write_str(if pretty.is_some() { ": " } else { ":" })?;
                write_json(out, item, raw, pretty.map(|l| l + 1))?;
            }
            if let Some(level) = pretty {
                newline(out, level)?;
            }
            out.write_char('}')?;
        }
        Value::Function(_) => return Err(EncodeError::Unsupported),
    }
    Ok(())
}

/// `toJson`, `toRawJson` (no HTML escapes), `toPrettyJson` (indented by two spaces) and their
/// `must…` forms. A value Go cannot encode gives "" (an error for `must…` and `toRawJson`).
pub(super) fn to_json(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let raw = name.contains("Raw");
    let pretty = name.contains("Pretty").then_some(0);
    let mut out = Limited::new(MAX_VALUE_BYTES);
    match write_json(&mut out, a.get(0), raw, pretty) {
        Ok(()) => text(name, out.text),
        Err(EncodeError::TooLong) => Err(too_long(name)),
        Err(EncodeError::Unsupported) if name.starts_with("must") || raw => Err(fail(
            name,
            "the value has no JSON form (a float that is NaN or infinite, or a function)",
        )),
        Err(EncodeError::Unsupported) => text(name, ""),
    }
}

/// The JSON text of `fromJson`'s argument, parsed; `None` when it is not JSON.
fn parse_json(name: &str, s: &str) -> Result<Option<Value>> {
    context::charge_bytes(name, s.len() * 4)?;
    let Ok(parsed) = serde_json::from_str::<serde_json::Value>(s) else {
        return Ok(None);
    };
    value_from_json(&parsed).map(Some).map_err(|TooDeep| {
        fail(
            name,
            format!("the data nests more than {MAX_DEPTH} levels deep"),
        )
    })
}

/// `fromJson s`: the JSON value; nil when `s` is not JSON (`mustFromJson` fails instead).
pub(super) fn from_json(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    match parse_json(name, a.str(0)?)? {
        Some(value) => Ok(value),
        None if name.starts_with("must") => Err(fail(
            name,
            "the text is not valid JSON (it is not shown: it may be secret)",
        )),
        None => Ok(Value::Nil),
    }
}

/// Helm's `fromJsonArray s`: the JSON list, or a list holding an error message.
pub(super) fn from_json_array(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    match parse_json(name, a.str(0)?)? {
        Some(list @ Value::List(_)) => Ok(list),
        _ => new_list(
            name,
            vec![Value::String("error: the text is not a JSON array".into())],
        ),
    }
}

/// Helm's `fromYaml s`: the YAML mapping, or a dict whose `Error` key says why not.
pub(super) fn from_yaml(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let error = |why: &str| {
        let mut dict = Dict::new();
        dict.insert("Error".into(), Value::String(why.into()));
        new_dict(name, dict)
    };
    match parse_yaml(name, a.str(0)?)? {
        Some(Value::Map(dict)) => Ok(Value::Map(dict)),
        Some(Value::Nil) => new_dict(name, Dict::new()),
        Some(_) => error("error: the YAML text is not a mapping"),
        None => error("error: the text is not valid YAML"),
    }
}

/// Helm's `fromYamlArray s`: the YAML sequence, or a list holding an error message.
pub(super) fn from_yaml_array(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    match parse_yaml(name, a.str(0)?)? {
        Some(list @ Value::List(_)) => Ok(list),
        Some(Value::Nil) => new_list(name, Vec::new()),
        Some(_) => new_list(
            name,
            vec![Value::String(
                "error: the YAML text is not a sequence".into(),
            )],
        ),
        None => new_list(
            name,
            vec![Value::String("error: the text is not valid YAML".into())],
        ),
    }
}

/// The YAML text parsed as gitplane reads YAML (YAML 1.2: `yes` stays a string); `None` when
/// it is not YAML. Its errors are not kept: they quote the text.
fn parse_yaml(name: &str, s: &str) -> Result<Option<Value>> {
    context::charge(name, 1 + s.len() as u64)?;
    let Some(parsed) = read_yaml(s) else {
        return Ok(None);
    };
    value_from_json(&parsed).map(Some).map_err(|TooDeep| {
        fail(
            name,
            format!("the data nests more than {MAX_DEPTH} levels deep"),
        )
    })
}

/// Whether YAML 1.1 (Helm's) or 1.2 would read the plain scalar `s` as something other than
/// this string: null, a bool, a number, a date, or the merge key.
fn resolves_to_non_string(s: &str) -> bool {
    const WORDS: [&str; 27] = [
        "~", "null", "Null", "NULL", "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
        "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
        "<<",
    ];
    if WORDS.contains(&s) || s == "=" {
        return true;
    }
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = body.to_ascii_lowercase();
    if matches!(lower.as_str(), ".inf" | ".nan") {
        return true;
    }
    // Anything made of digits and number punctuation that starts like a number: integers in
    // any base, floats, sexagesimals (`1:20`), dates (`2001-12-14`).
    let starts_like_number = body.starts_with(|c: char| c.is_ascii_digit())
        || (body.starts_with('.') && body[1..].starts_with(|c: char| c.is_ascii_digit()));
    starts_like_number
        && body
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-' | '+'))
        && (body.chars().all(|c| !c.is_ascii_alphabetic())
            || lower.starts_with("0x")
            || lower.starts_with("0o")
            || lower.starts_with("0b")
            || body.parse::<f64>().is_ok()
            || lower.contains('e'))
}

/// Whether `s` can be written as a plain YAML scalar in block context and read back as the
/// same string.
fn plain_allowed(s: &str) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if s.trim() != s || resolves_to_non_string(s) {
        return false;
    }
    if s.chars().any(|c| c.is_control() || !yaml_printable(c)) {
        return false;
    }
    if s.contains(": ") || s.contains(" #") || s.ends_with(':') {
        return false;
    }
    let second = s[first.len_utf8()..].chars().next();
    match first {
        '-' | '?' | ':' => second.is_some_and(|c| c != ' '),
        ',' | '[' | ']' | '{' | '}' | '#' | '&' | '*' | '!' | '|' | '>' | '\'' | '"' | '%'
        | '@' | '`' => false,
        _ => true,
    }
}

/// YAML's printable characters (no controls but line breaks, no BOM, no surrogates).
fn yaml_printable(c: char) -> bool {
    match c {
        '\n' => true,
        '\u{20}'..='\u{7e}' | '\u{85}' => true,
        '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}' => c != '\u{feff}',
        c => c >= '\u{10000}',
    }
}

/// A double-quoted YAML scalar.
fn yaml_quoted(out: &mut Limited, s: &str) -> std::fmt::Result {
    out.write_char('"')?;
    for c in s.chars() {
        match c {
            '"' => out.write_str("\\\"")?,
            '\\' => out.write_str("\\\\")?,
            '\n' => out.write_str("\\n")?,
            '\t' => out.write_str("\\t")?,
            '\r' => out.write_str("\\r")?,
            c if c != '\n' && yaml_printable(c) => out.write_char(c)?,
            c if (c as u32) <= 0xff => write!(out, "\\x{:02X}", c as u32)?,
            c if (c as u32) <= 0xffff => write!(out, "\\u{:04X}", c as u32)?,
            c => write!(out, "\\U{:08X}", c as u32)?,
        }
    }
    out.write_char('"')
}

/// Whether `s` goes in a literal block (`|-`): several lines, each printable, none ending in a
/// space, not starting with a space (which would need an indentation indicator).
fn literal_allowed(s: &str) -> bool {
    s.contains('\n')
        && !s.starts_with([' ', '\n'])
        && !s.ends_with(' ')
        && !s.contains(" \n")
        && s.chars()
            .all(|c| c == '\n' || (!c.is_control() && yaml_printable(c)))
}

fn pad(out: &mut Limited, indent: usize) -> std::fmt::Result {
    for _ in 0..indent {
        out.write_char(' ')?;
    }
    Ok(())
}

/// A literal block's header (after `|`) and lines, at `indent`.
fn yaml_literal(out: &mut Limited, s: &str, indent: usize) -> std::fmt::Result {
    let (chomp, body) = if !s.ends_with('\n') {
        ("-", s)
    } else if s.ends_with("\n\n") {
        ("+", &s[..s.len() - 1])
    } else {
        ("", &s[..s.len() - 1])
    };
    writeln!(out, "|{chomp}")?;
    for line in body.split('\n') {
        if !line.is_empty() {
            pad(out, indent)?;
            out.write_str(line)?;
        }
        out.write_char('\n')?;
    }
    Ok(())
}

/// A scalar on the current line (no line break).
fn yaml_scalar(out: &mut Limited, value: &Value) -> std::result::Result<(), EncodeError> {
    match value {
        Value::Nil => out.write_str("null")?,
        Value::Bool(b) => write!(out, "{b}")?,
        Value::Int(n) => write!(out, "{n}")?,
        Value::Uint(n) => write!(out, "{n}")?,
        Value::Float(f) if f.is_nan() => out.write_str(".nan")?,
        Value::Float(f) if f.is_infinite() => {
            out.write_str(if *f > 0.0 { ".inf" } else { "-.inf" })?
        }
        Value::Float(f) => out.write_str(&go_float(*f, FloatStyle::Print))?,
        Value::String(s) if plain_allowed(s) => out.write_str(s)?,
        Value::String(s) => yaml_quoted(out, s)?,
        Value::List(_) => out.write_str("[]")?,
        Value::Map(_) => out.write_str("{}")?,
        Value::Function(_) => return Err(EncodeError::Unsupported),
    }
    Ok(())
}

fn yaml_map(
    out: &mut Limited,
    dict: &Dict,
    indent: usize,
    inline_first: bool,
) -> std::result::Result<(), EncodeError> {
    for (i, (key, value)) in dict.iter().enumerate() {
        if i > 0 || !inline_first {
            pad(out, indent)?;
        }
        if plain_allowed(key) {
            out.write_str(key)?;
        } else {
            yaml_quoted(out, key)?;
        }
        out.write_char(':')?;
        match value {
            Value::Map(inner) if !inner.is_empty() => {
                out.write_char('\n')?;
                yaml_map(out, inner, indent + 2, false)?;
            }
            // Helm's YAML (go-yaml v2) does not indent a sequence under its key.
            Value::List(items) if !items.is_empty() => {
                out.write_char('\n')?;
                yaml_list(out, items, indent, false)?;
            }
            Value::String(s) if literal_allowed(s) => {
                out.write_char(' ')?;
                yaml_literal(out, s, indent + 2)?;
            }
            scalar => {
                out.write_char(' ')?;
                yaml_scalar(out, scalar)?;
                out.write_char('\n')?;
            }
        }
    }
    Ok(())
}

fn yaml_list(
    out: &mut Limited,
    items: &[Value],
    indent: usize,
    inline_first: bool,
) -> std::result::Result<(), EncodeError> {
    for (i, item) in items.iter().enumerate() {
        if i > 0 || !inline_first {
            pad(out, indent)?;
        }
        out.write_str("- ")?;
        match item {
            Value::Map(inner) if !inner.is_empty() => yaml_map(out, inner, indent + 2, true)?,
            Value::List(inner) if !inner.is_empty() => yaml_list(out, inner, indent + 2, true)?,
            Value::String(s) if literal_allowed(s) => yaml_literal(out, s, indent + 2)?,
            scalar => {
                yaml_scalar(out, scalar)?;
                out.write_char('\n')?;
            }
        }
    }
    Ok(())
}

/// `toYaml v`: `v` as YAML, without the final line break (as Helm trims it); "" for a value
/// YAML cannot hold (`mustToYaml` fails).
pub(super) fn to_yaml(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let mut out = Limited::new(MAX_VALUE_BYTES);
    let written = match a.get(0) {
        Value::Map(dict) if !dict.is_empty() => yaml_map(&mut out, dict, 0, false),
        Value::List(items) if !items.is_empty() => yaml_list(&mut out, items, 0, false),
        Value::String(s) if literal_allowed(s) => {
            yaml_literal(&mut out, s, 2).map_err(EncodeError::from)
        }
        scalar => yaml_scalar(&mut out, scalar),
    };
    match written {
        Ok(()) => {
            let mut s = out.text;
            if s.ends_with('\n') {
                s.pop();
            }
            text(name, s)
        }
        Err(EncodeError::TooLong) => Err(too_long(name)),
        Err(EncodeError::Unsupported) if name.starts_with("must") => {
            Err(fail(name, "the value has no YAML form (a function)"))
        }
        Err(EncodeError::Unsupported) => text(name, ""),
    }
}

/// `text` as YAML 1.2 data (`yes` stays a string), one document no longer than a value may
/// be; `None` when it is not. serde-saphyr's own budget bounds aliases and nesting.
pub(crate) fn read_yaml(text: &str) -> Option<serde_json::Value> {
    if text.len() > MAX_VALUE_BYTES {
        return None;
    }
    let options = serde_saphyr::options! { strict_booleans: true };
    serde_saphyr::from_str_with_options(text, options).ok()
}
