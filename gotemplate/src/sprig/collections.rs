//! Sprig's list and dict functions. Values are immutable: each function returns a new list or
//! dict, sharing what it did not change.

use std::collections::HashMap;
use std::sync::Arc;

use gotmpl::{TemplateError, Value};

use super::{
    Args, Dict, check_items, check_nesting, deep_equal, fail, is_empty, new_dict, new_list,
    string_list, strval, text, to_int64,
};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// `list a b …`.
pub(super) fn list(name: &str, args: &[Value]) -> Result<Value> {
    check_nesting(name, args)?;
    new_list(name, args.to_vec())
}

/// The one list argument of a list function.
fn the_list<'a>(name: &'a str, args: &'a [Value]) -> Result<&'a [Value]> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    a.list(0)
}

/// `first list`: the first item, nil for an empty list.
pub(super) fn first(name: &str, args: &[Value]) -> Result<Value> {
    Ok(the_list(name, args)?.first().cloned().unwrap_or(Value::Nil))
}

pub(super) fn last(name: &str, args: &[Value]) -> Result<Value> {
    Ok(the_list(name, args)?.last().cloned().unwrap_or(Value::Nil))
}

/// `rest list`: all but the first item.
pub(super) fn rest(name: &str, args: &[Value]) -> Result<Value> {
    let items = the_list(name, args)?;
    new_list(name, items.get(1..).unwrap_or_default().to_vec())
}

/// `initial list`: all but the last item.
pub(super) fn initial(name: &str, args: &[Value]) -> Result<Value> {
    let items = the_list(name, args)?;
    new_list(name, items[..items.len().saturating_sub(1)].to_vec())
}

/// `append list v` (and `push`): a new list with `v` at the end.
pub(super) fn append(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let items = a.list(0)?;
    check_nesting(name, [a.get(1)])?;
    check_items(name, items.len() as u128 + 1)?;
    let mut out = items.to_vec();
    out.push(a.get(1).clone());
    new_list(name, out)
}

/// `prepend list v`: a new list with `v` first.
pub(super) fn prepend(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let items = a.list(0)?;
    check_nesting(name, [a.get(1)])?;
    check_items(name, items.len() as u128 + 1)?;
    let mut out = Vec::with_capacity(items.len() + 1);
    out.push(a.get(1).clone());
    out.extend_from_slice(items);
    new_list(name, out)
}

/// `concat a b …`: the lists one after the other.
pub(super) fn concat(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    let mut lists = Vec::with_capacity(a.len());
    for i in 0..a.len() {
        lists.push(a.list(i)?);
    }
    check_items(name, lists.iter().map(|l| l.len() as u128).sum())?;
    new_list(name, lists.concat())
}

pub(super) fn reverse(name: &str, args: &[Value]) -> Result<Value> {
    let items = the_list(name, args)?;
    new_list(name, items.iter().rev().cloned().collect())
}

/// Whether `list` holds an item deeply equal to `needle`.
fn contains(name: &str, list: &[Value], needle: &Value) -> Result<bool> {
    for item in list {
        if deep_equal(name, item, needle)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// `uniq list`: each distinct item once, in order of first appearance.
pub(super) fn uniq(name: &str, args: &[Value]) -> Result<Value> {
    let items = the_list(name, args)?;
    let mut out: Vec<Value> = Vec::new();
    for item in items {
        if !contains(name, &out, item)? {
            out.push(item.clone());
        }
    }
    new_list(name, out)
}

/// `without list a b …`: the list without the items equal to any of the others.
pub(super) fn without(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let items = a.list(0)?;
    let omitted = &args[1..];
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        if !contains(name, omitted, item)? {
            out.push(item.clone());
        }
    }
    new_list(name, out)
}

/// `has needle list`: whether the list holds the needle; false for no list at all.
pub(super) fn has(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    if let Value::Nil = a.get(1) {
        return Ok(Value::Bool(false));
    }
    Ok(Value::Bool(contains(name, a.list(1)?, a.get(0))?))
}

/// `compact list`: the items that are not empty.
pub(super) fn compact(name: &str, args: &[Value]) -> Result<Value> {
    let items = the_list(name, args)?;
    new_list(
        name,
        items.iter().filter(|v| !is_empty(v)).cloned().collect(),
    )
}

/// Sprig's `slice list [start [end]]` (which replaces Go's built-in): items `start..end`; nil
/// for an empty list. Go's built-in form on a string (bytes `start..end`) works as well.
pub(super) fn slice(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.between(1, 3)?;
    let len = match a.get(0) {
        Value::List(items) => items.len(),
        Value::String(s) => s.len(),
        _ => {
            a.list(0)?;
            0
        }
    };
    if len == 0 && matches!(a.get(0), Value::List(_)) {
        return Ok(Value::Nil);
    }
    let start = if a.len() > 1 { to_int64(a.get(1)) } else { 0 };
    let end = if a.len() > 2 {
        to_int64(a.get(2))
    } else {
        len as i64
    };
    if start < 0 || end < start || end > len as i64 {
        return Err(fail(name, "the indexes are out of range"));
    }
    let (start, end) = (start as usize, end as usize);
    match a.get(0) {
        Value::List(items) => new_list(name, items[start..end].to_vec()),
        Value::String(s) => text(
            name,
            String::from_utf8_lossy(&s.as_bytes()[start..end]).into_owned(),
        ),
        _ => Ok(Value::Nil),
    }
}

/// `chunk size list`: the list cut into lists of `size` items (the last may be shorter).
pub(super) fn chunk(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let size = a.int(0)?;
    let items = a.list(1)?;
    if size < 1 {
        return Err(fail(name, "the size must be at least 1"));
    }
    check_nesting(name, [a.get(1)])?;
    let chunks = items
        .chunks(size as usize)
        .map(|c| new_list(name, c.to_vec()))
        .collect::<Result<Vec<_>>>()?;
    new_list(name, chunks)
}

/// `dict k1 v1 k2 v2 …`: keys as strings; a key without a value gets "".
pub(super) fn dict(name: &str, args: &[Value]) -> Result<Value> {
    check_nesting(name, args.iter().skip(1).step_by(2))?;
    let mut out = Dict::new();
    for pair in args.chunks(2) {
        let key: Arc<str> = strval(name, &pair[0])?.into();
        let value = pair
            .get(1)
            .cloned()
            .unwrap_or_else(|| Value::String("".into()));
        out.insert(key, value);
    }
    new_dict(name, out)
}

/// The dict and the key of `get d k`, `hasKey d k`, `unset d k`.
fn dict_and_key<'a>(name: &'a str, args: &'a [Value]) -> Result<(Option<&'a Dict>, &'a str)> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    Ok((a.dict(0)?, a.str(1)?))
}

/// `get d k`: the value at `k`, or "" when there is none.
pub(super) fn get(name: &str, args: &[Value]) -> Result<Value> {
    let (dict, key) = dict_and_key(name, args)?;
    Ok(dict
        .and_then(|d| d.get(key))
        .cloned()
        .unwrap_or_else(|| Value::String("".into())))
}

pub(super) fn has_key(name: &str, args: &[Value]) -> Result<Value> {
    let (dict, key) = dict_and_key(name, args)?;
    Ok(Value::Bool(dict.is_some_and(|d| d.contains_key(key))))
}

/// `set d k v`: the dict with `k` set to `v`. (The template's variable holding `d` is changed
/// too, see `rewrite`.)
pub(super) fn set(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let Some(dict) = a.dict(0)? else {
        return Err(fail(
            name,
            "the dict is nil (a missing key?): there is no dict to set a key in",
        ));
    };
    let key = a.str(1)?;
    check_nesting(name, [a.get(2)])?;
    let mut out = dict.clone();
    out.insert(key.into(), a.get(2).clone());
    new_dict(name, out)
}

/// `unset d k`: the dict without `k`.
pub(super) fn unset(name: &str, args: &[Value]) -> Result<Value> {
    let (dict, key) = dict_and_key(name, args)?;
    let mut out = dict.cloned().unwrap_or_default();
    out.remove(key);
    new_dict(name, out)
}

/// `pluck k d1 d2 …`: the values at `k` of the dicts that have it.
pub(super) fn pluck(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let key = a.str(0)?;
    let mut out = Vec::new();
    for i in 1..a.len() {
        if let Some(value) = a.dict(i)?.and_then(|d| d.get(key)) {
            out.push(value.clone());
        }
    }
    new_list(name, out)
}

/// `dig k1 k2 … default d`: the value at the path of keys in nested dicts, or `default` where
/// a key is missing. A step through something that is not a dict is an error, as in Sprig.
pub(super) fn dig(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(3)?;
    let last = a.len() - 1;
    let Some(mut dict) = (match a.get(last) {
        Value::Map(d) => Some(d.as_ref()),
        _ => None,
    }) else {
        return Err(fail(
            name,
            format!(
                "the last argument must be a dict, not {}",
                super::describe(a.get(last))
            ),
        ));
    };
    let default = a.get(last - 1);
    let mut keys = Vec::with_capacity(last - 1);
    for i in 0..last - 1 {
        keys.push(a.str(i)?);
    }
    for (i, key) in keys.iter().enumerate() {
        let Some(step) = dict.get(*key) else {
            return Ok(default.clone());
        };
        if i + 1 == keys.len() {
            return Ok(step.clone());
        }
        match step {
            Value::Map(d) => dict = d,
            other => {
                return Err(fail(
                    name,
                    format!(
                        "the value at key {} of the path is {}, not a dict",
                        i + 1,
                        super::describe(other)
                    ),
                ));
            }
        }
    }
    Ok(default.clone())
}

/// `keys d1 d2 …`: the keys of each dict, sorted within each (Go's order would be random).
pub(super) fn keys(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    let mut out = Vec::new();
    for i in 0..a.len() {
        if let Some(dict) = a.dict(i)? {
            check_items(name, (out.len() + dict.len()) as u128)?;
            out.extend(dict.keys().map(|k| k.to_string()));
        }
    }
    string_list(name, out)
}

/// `values d`: the values, in the order of their sorted keys (Go's order would be random).
pub(super) fn values(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let values = a
        .dict(0)?
        .map(|d| d.values().cloned().collect())
        .unwrap_or_default();
    new_list(name, values)
}

/// The dict and the key names of `pick d k…` and `omit d k…`.
fn dict_and_keys<'a>(name: &'a str, args: &'a [Value]) -> Result<(Option<&'a Dict>, Vec<&'a str>)> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let dict = a.dict(0)?;
    let mut keys = Vec::with_capacity(a.len() - 1);
    for i in 1..a.len() {
        keys.push(a.str(i)?);
    }
    Ok((dict, keys))
}

/// `pick d k1 k2 …`: a dict of only the given keys.
pub(super) fn pick(name: &str, args: &[Value]) -> Result<Value> {
    let (dict, keys) = dict_and_keys(name, args)?;
    let out = dict
        .map(|d| {
            d.iter()
                .filter(|(k, _)| keys.contains(&k.as_ref()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    new_dict(name, out)
}

/// `omit d k1 k2 …`: a dict without the given keys.
pub(super) fn omit(name: &str, args: &[Value]) -> Result<Value> {
    let (dict, keys) = dict_and_keys(name, args)?;
    let out = dict
        .map(|d| {
            d.iter()
                .filter(|(k, _)| !keys.contains(&k.as_ref()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    new_dict(name, out)
}

/// Merged dicts of one `merge` call, by the pair they were made from: a dict shared in the
/// arguments (`dict "a" $x "b" $x`) is merged once and shared in the result.
type MergeMemo = HashMap<(*const Dict, *const Dict), Arc<Dict>>;

/// `src` merged into `dst` as mergo does for Sprig: a key missing or empty in `dst` takes
/// `src`'s value, dicts present on both sides merge recursively; with `overwrite`, `src`'s
/// value wins wherever it is set (a nil included), except that dicts still merge.
fn merged(
    dst: &Arc<Dict>,
    src: &Arc<Dict>,
    overwrite: bool,
    memo: &mut MergeMemo,
    steps: &mut u64,
) -> Arc<Dict> {
    // A dict merged into itself is itself, whichever side wins.
    if Arc::ptr_eq(dst, src) {
        return dst.clone();
    }
    let key = (Arc::as_ptr(dst), Arc::as_ptr(src));
    if let Some(done) = memo.get(&key) {
        return done.clone();
    }
    let mut out = dst.as_ref().clone();
    *steps += 8 * (1 + out.len() as u64);
    for (key, from) in src.iter() {
        *steps += 1;
        // Past the whole budget the result no longer matters: charging fails the render.
        if *steps > context::STEP_BUDGET {
            break;
        }
        if let Value::Nil = from {
            if overwrite {
                out.insert(key.clone(), Value::Nil);
            }
            continue;
        }
        let to = out.get(key);
        match (from, to) {
            (Value::Map(from), Some(Value::Map(to))) if !to.is_empty() => {
                let inner = merged(to, from, overwrite, memo, steps);
                out.insert(key.clone(), Value::Map(inner));
                continue;
            }
            (Value::List(_), Some(to)) if !is_empty(to) => {
                if overwrite {
                    out.insert(key.clone(), from.clone());
                }
                continue;
            }
            _ => {}
        }
        if overwrite || to.is_none_or(is_empty) {
            out.insert(key.clone(), from.clone());
        }
    }
    let out = Arc::new(out);
    memo.insert(key, out.clone());
    out
}

/// `merge dst src1 src2 …` (and `mergeOverwrite`): `dst` with the sources merged into it in
/// order. (The template's variable holding `dst` is changed too, see `rewrite`.)
pub(super) fn merge(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let overwrite = name.contains("Overwrite");
    let mut out = match a.get(0) {
        Value::Map(dict) => dict.clone(),
        _ => Arc::new(a.dict(0)?.cloned().unwrap_or_default()),
    };
    let mut memo = MergeMemo::new();
    let mut steps = 0;
    for i in 1..a.len() {
        if let Value::Map(src) = a.get(i) {
            out = merged(&out, src, overwrite, &mut memo, &mut steps);
        } else {
            a.dict(i)?;
        }
    }
    context::charge(name, steps)?;
    Ok(Value::Map(out))
}
