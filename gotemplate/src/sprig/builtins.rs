//! Go's built-in functions that gitplane replaces, so that what they build and compare is
//! bounded and paid for: `print`, `println`, `printf`, `html`, `js`, `urlquery`, and the
//! comparisons `eq`, `ne`, `lt`, `le`, `gt`, `ge` (gotmpl's compare a 16 MiB string for the
//! price of one step). They keep gotmpl's (and Go's) semantics and messages.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, LazyLock};

use gotmpl::{Template, TemplateError, Value};

use super::{Args, Dict, Limited, MAX_VALUE_BYTES, check_len, fail, text, too_long, write_go};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// `fmt.Sprint` / `fmt.Sprintln` of the arguments, refused past the value limit.
fn sprint(name: &str, args: &[Value], line: bool) -> Result<String> {
    let mut out = Limited::new(MAX_VALUE_BYTES);
    let is_string = |v: &Value| matches!(v, Value::String(_));
    for (i, arg) in args.iter().enumerate() {
        // Sprint puts a space between two operands when neither is a string.
        let space = i > 0 && (line || (!is_string(arg) && !is_string(&args[i - 1])));
        if space && out.write_char(' ').is_err() {
            return Err(too_long(name));
        }
        if write_go(&mut out, arg).is_err() {
            return Err(too_long(name));
        }
    }
    if line && out.write_char('\n').is_err() {
        return Err(too_long(name));
    }
    Ok(out.text)
}

pub(super) fn print(name: &str, args: &[Value]) -> Result<Value> {
    text(name, sprint(name, args, false)?)
}

pub(super) fn println(name: &str, args: &[Value]) -> Result<Value> {
    text(name, sprint(name, args, true)?)
}

/// The most arguments `printf` takes after its format.
const MAX_PRINTF_ARGS: usize = 32;

/// `{{printf .f .a0 .a1 …}}` for each number of arguments: gotmpl's own `printf`, which it
/// does not export, run on our arguments.
static PRINTF: LazyLock<Vec<Option<Template>>> = LazyLock::new(|| {
    (0..=MAX_PRINTF_ARGS)
        .map(|n| {
            let mut source = String::from("{{printf .f");
            for i in 0..n {
                let _ = write!(source, " .a{i}");
            }
            source.push_str("}}");
            Template::new("printf").parse(&source).ok()
        })
        .collect()
});

/// Go's `printf`, refused before it runs when its arguments could make its result longer than
/// the value limit (gotmpl builds the whole result before anything can stop it).
pub(super) fn printf(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let format = a.str(0)?;
    let rest = &args[1..];
    let Some(Some(helper)) = PRINTF.get(rest.len()) else {
        return Err(fail(
            name,
            format!("takes at most {MAX_PRINTF_ARGS} arguments after the format"),
        ));
    };
    let mut bound = format.len() as u128 + format_padding(format);
    let mut steps = 0u64;
    for arg in rest {
        bound += printed_bound(arg, &mut steps);
        if bound > MAX_VALUE_BYTES as u128 {
            return Err(too_long(name));
        }
    }
    context::charge(name, steps)?;
    let mut data: Dict = BTreeMap::new();
    data.insert("f".into(), Value::String(format.into()));
    for (i, arg) in rest.iter().enumerate() {
        data.insert(format!("a{i}").into(), arg.clone());
    }
    // Running a template of its own costs about as much as a few hundred steps.
    context::charge(name, 200)?;
    let out = helper
        .execute_to_string(&Value::Map(Arc::new(data)))
        .map_err(|_| fail(name, "the format could not be applied"))?;
    text(name, out)
}

/// The most padding the widths and precisions of a format can add (gotmpl caps each at 65535).
fn format_padding(format: &str) -> u128 {
    let bytes = format.as_bytes();
    let mut total = 0u128;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'%' {
            i += 1;
            continue;
        }
        i += 1;
        let mut number = 0u128;
        while i < bytes.len() && !bytes[i].is_ascii_alphabetic() && bytes[i] != b'%' {
            match bytes[i] {
                b'0'..=b'9' => number = (number * 10 + u128::from(bytes[i] - b'0')).min(65_535),
                b'*' => total += 65_535,
                _ => {
                    total += number;
                    number = 0;
                }
            }
            i += 1;
        }
        total += number + 1;
        i += 1;
    }
    total
}

/// An upper bound of how long any verb prints `value`, stopping once past the value limit.
fn printed_bound(value: &Value, steps: &mut u64) -> u128 {
    *steps += 1;
    match value {
        Value::Nil | Value::Bool(_) => 16,
        // `%b` of a 64-bit integer, and its `%!d(…)` wrappers.
        Value::Int(_) | Value::Uint(_) => 96,
        // `%f` of 1e308.
        Value::Float(_) => 340,
        // `%q` and `%x` quadruple a string at most.
        Value::String(s) => 4 * s.len() as u128 + 16,
        Value::List(items) => {
            let mut total = 16;
            for item in items.iter() {
                total += 1 + printed_bound(item, steps);
                if total > MAX_VALUE_BYTES as u128 {
                    break;
                }
            }
            total
        }
        Value::Map(dict) => {
            let mut total = 16;
            for (key, item) in dict.iter() {
                total += 4 * key.len() as u128 + 2 + printed_bound(item, steps);
                if total > MAX_VALUE_BYTES as u128 {
                    break;
                }
            }
            total
        }
        Value::Function(_) => 16,
    }
}

/// Go's `html`, `js` and `urlquery`: the arguments printed as `fmt.Sprint` does (a nil as
/// `<no value>`), then escaped.
pub(super) fn escaper(name: &str, args: &[Value]) -> Result<Value> {
    let joined: String = match args {
        [Value::String(s)] => s.to_string(),
        _ => {
            let shown: Vec<Value> = args
                .iter()
                .map(|a| match a {
                    Value::Nil => Value::String("<no value>".into()),
                    other => other.clone(),
                })
                .collect();
            sprint(name, &shown, false)?
        }
    };
    // Escaping at most sextuples the text (`&` becomes `&amp;`, `<` becomes `\u003C`).
    check_len(name, 6 * joined.len() as u128)?;
    context::charge_chars(name, joined.len())?;
    let escaped = match name {
        "html" => gotmpl::html_escape(&joined),
        "js" => gotmpl::js_escape(&joined),
        _ => gotmpl::url_encode(&joined),
    };
    text(name, escaped)
}

/// What one comparison reads: the strings it compares, byte by byte.
fn charge_compared(name: &str, args: &[Value]) -> Result<()> {
    let bytes: usize = args
        .iter()
        .map(|a| match a {
            Value::String(s) => s.len(),
            _ => 0,
        })
        .sum();
    context::charge_bytes(name, bytes)
}

/// Go's `eq` on two values: basic kinds only; integers compare across signedness.
fn equal(name: &str, left: &Value, right: &Value) -> Result<bool> {
    Ok(match (left, right) {
        (Value::Nil, Value::Nil) => true,
        (Value::Nil, _) | (_, Value::Nil) => false,
        (Value::Bool(a), Value::Bool(b)) => a == b,
        (Value::Int(a), Value::Int(b)) => a == b,
        (Value::Uint(a), Value::Uint(b)) => a == b,
        (Value::Int(a), Value::Uint(b)) | (Value::Uint(b), Value::Int(a)) => {
            *a >= 0 && *a as u64 == *b
        }
        (Value::Float(a), Value::Float(b)) => a == b,
        (Value::String(a), Value::String(b)) => a == b,
        (Value::List(_), Value::List(_))
        | (Value::Map(_), Value::Map(_))
        | (Value::Function(_), Value::Function(_)) => {
            return Err(fail(
                name,
                format!("non-comparable type {}", left.type_name()),
            ));
        }
        _ => {
            return Err(fail(
                name,
                format!(
                    "incompatible types for comparison: {} and {}",
                    left.type_name(),
                    right.type_name()
                ),
            ));
        }
    })
}

/// Go's ordering of two values for `lt` and friends: integers, floats and strings.
fn order(name: &str, left: &Value, right: &Value) -> Result<Ordering> {
    let invalid = || fail(name, "invalid type for comparison");
    match (left, right) {
        (Value::Int(a), Value::Int(b)) => Ok(a.cmp(b)),
        (Value::Uint(a), Value::Uint(b)) => Ok(a.cmp(b)),
        (Value::Int(a), Value::Uint(b)) => Ok(if *a < 0 {
            Ordering::Less
        } else {
            (*a as u64).cmp(b)
        }),
        (Value::Uint(a), Value::Int(b)) => Ok(if *b < 0 {
            Ordering::Greater
        } else {
            a.cmp(&(*b as u64))
        }),
        (Value::Float(a), Value::Float(b)) => a.partial_cmp(b).ok_or_else(invalid),
        (Value::String(a), Value::String(b)) => Ok(a.cmp(b)),
        _ if left.type_name() != right.type_name() => Err(fail(
            name,
            format!(
                "incompatible types for comparison: {} and {}",
                left.type_name(),
                right.type_name()
            ),
        )),
        _ => Err(invalid()),
    }
}

/// `eq a b c …`: whether `a` equals any of the others.
pub(super) fn eq(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(2)?;
    charge_compared(name, args)?;
    for other in &args[1..] {
        if equal(name, &args[0], other)? {
            return Ok(Value::Bool(true));
        }
    }
    Ok(Value::Bool(false))
}

pub(super) fn ne(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    charge_compared(name, args)?;
    Ok(Value::Bool(!equal(name, &args[0], &args[1])?))
}

/// `lt`, `le`, `gt` and `ge`.
pub(super) fn compare(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    charge_compared(name, args)?;
    let ordering = order(name, &args[0], &args[1])?;
    Ok(Value::Bool(match name {
        "lt" => ordering == Ordering::Less,
        "le" => ordering != Ordering::Greater,
        "gt" => ordering == Ordering::Greater,
        _ => ordering != Ordering::Less,
    }))
}
