//! Sprig's defaults, flow control and type functions, and the two functions gitplane's
//! rewriting of the template calls (see `rewrite`).

use gotmpl::{TemplateError, Value};

use super::{Args, deep_equal, fail, is_empty, strval, text};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// `default d v`: `v`, or `d` where `v` is empty (nil, false, 0, "", an empty list or dict).
pub(super) fn default(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let given = a.get(1);
    Ok(if a.len() < 2 || is_empty(given) {
        a.get(0).clone()
    } else {
        given.clone()
    })
}

pub(super) fn empty(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Bool(is_empty(a.get(0))))
}

/// `coalesce a b …`: the first argument that is not empty, or nil.
pub(super) fn coalesce(_name: &str, args: &[Value]) -> Result<Value> {
    Ok(args
        .iter()
        .find(|v| !is_empty(v))
        .cloned()
        .unwrap_or(Value::Nil))
}

pub(super) fn all(_name: &str, args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(args.iter().all(|v| !is_empty(v))))
}

pub(super) fn any(_name: &str, args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(args.iter().any(|v| !is_empty(v))))
}

/// `ternary a b cond`: `a` when `cond` is true, else `b`.
pub(super) fn ternary(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    Ok(if a.bool(2)? {
        a.get(0).clone()
    } else {
        a.get(1).clone()
    })
}

/// The author's message of `fail` or `required`, when the template wrote it as a literal.
/// A message computed at run time may carry data (`printf "bad %s" .password`): not shown.
fn authors_message(name: &str, message: &str) -> TemplateError {
    if context::is_literal(message) {
        fail(name, message)
    } else {
        fail(
            name,
            "the template failed with a message built from its data, which is not shown (it \
             may hold a secret); write the message as a literal string to see it here",
        )
    }
}

/// `fail "message"`: fails the render with the template author's message.
pub(super) fn fail_template(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Err(authors_message(name, a.str(0)?))
}

/// Helm's `required "message" v`: `v`, or a failure with the message where `v` is nil or "".
pub(super) fn required(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let message = a.str(0)?;
    match a.get(1) {
        Value::Nil => Err(authors_message(name, message)),
        Value::String(s) if s.is_empty() => Err(authors_message(name, message)),
        v => Ok(v.clone()),
    }
}

/// `deepCopy v`: values are immutable in gitplane, so a copy is the value itself.
pub(super) fn deep_copy(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(a.get(0).clone())
}

pub(super) fn deep_equal_fn(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    Ok(Value::Bool(deep_equal(name, a.get(0), a.get(1))?))
}

/// Go's `%T` of the value as Go would hold it. Lists and dicts are always the generic
/// `[]interface {}` and `map[string]interface {}` (Go may have a `[]string`).
fn go_type(value: &Value) -> &'static str {
    match value {
        Value::Nil => "<nil>",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Uint(_) => "uint64",
        Value::Float(_) => "float64",
        Value::String(_) => "string",
        Value::List(_) => "[]interface {}",
        Value::Map(_) => "map[string]interface {}",
        Value::Function(_) => "func([]interface {}) (interface {}, error)",
    }
}

/// Go's `reflect.Kind` name of the value.
fn go_kind(value: &Value) -> &'static str {
    match value {
        Value::Nil => "invalid",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Uint(_) => "uint64",
        Value::Float(_) => "float64",
        Value::String(_) => "string",
        Value::List(_) => "slice",
        Value::Map(_) => "map",
        Value::Function(_) => "func",
    }
}

pub(super) fn type_of(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    text(name, go_type(a.get(0)))
}

pub(super) fn type_is(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    Ok(Value::Bool(a.str(0)? == go_type(a.get(1))))
}

/// `typeIsLike t v`: `typeIs`, or `v` is a pointer to `t` (gitplane has no pointers).
pub(super) fn type_is_like(name: &str, args: &[Value]) -> Result<Value> {
    type_is(name, args)
}

pub(super) fn kind_of(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    text(name, go_kind(a.get(0)))
}

pub(super) fn kind_is(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    Ok(Value::Bool(a.str(0)? == go_kind(a.get(1))))
}

/// Charges a template body's size on every entry (inserted by `rewrite`); prints nothing.
pub(super) fn step(name: &str, args: &[Value]) -> Result<Value> {
    let size = args.first().and_then(super::exact_int).unwrap_or(1).max(1);
    // The budget runs out in the template's own loops and calls: no function to name.
    let _ = name;
    context::charge("", size as u64)?;
    Ok(Value::String("".into()))
}

/// `_gitplaneThen a b` is `b`: evaluates an assignment `a` first (inserted by `rewrite`).
pub(super) fn then(_name: &str, args: &[Value]) -> Result<Value> {
    Ok(args.get(1).cloned().unwrap_or(Value::Nil))
}

/// The value an action prints, as Go's `fmt` prints it: floats (alone or inside lists and
/// dicts) become text; everything else is printed by gotmpl as Go would (inserted by
/// `rewrite`).
pub(super) fn show(name: &str, args: &[Value]) -> Result<Value> {
    match args.last() {
        Some(value @ (Value::Float(_) | Value::List(_) | Value::Map(_))) => {
            Ok(Value::String(strval(name, value)?.into_owned().into()))
        }
        Some(other) => Ok(other.clone()),
        None => Ok(Value::Nil),
    }
}
