//! Sprig's regular expression functions, with Go's RE2 syntax and Go's semantics.
//!
//! The regex crate reads nearly the same syntax; what differs is rewritten before compiling:
//! `\d`, `\w`, `\s` and `\b` match ASCII only in Go (the crate's match any script), `[` inside
//! a class is a plain character in Go, and `\Q…\E` quotes in Go. gitplane's build of the crate
//! has no Unicode category tables, so `\pL` and friends are refused.

use regex::{NoExpand, Regex, RegexBuilder};

use gotmpl::{TemplateError, Value};

use super::{Args, MAX_LIST_ITEMS, check_items, check_len, fail, string_list, text};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// The largest compiled program a pattern may make (a render keeps up to 16).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Rewrites Go's pattern syntax into the regex crate's (see the module's comment).
pub(super) fn translate(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::with_capacity(pattern.len() + 8);
    let mut in_class = false;
    // Right after `[` or `[^`, where `]` is a plain character.
    let mut class_start = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' && i + 1 < chars.len() {
            let d = chars[i + 1];
            if d == 'Q' {
                let rest: String = chars[i + 2..].iter().collect();
                let (quoted, after) = match rest.find("\\E") {
                    Some(end) => (&rest[..end], rest[end + 2..].chars().count()),
                    None => (rest.as_str(), 0),
                };
                out.push_str(&regex::escape(quoted));
                i = chars.len() - after;
                class_start = false;
                continue;
            }
            let replacement = match (in_class, d) {
                (false, 'd') => Some("[0-9]"),
                (false, 'D') => Some("[^0-9]"),
                (false, 'w') => Some("[0-9A-Za-z_]"),
                (false, 'W') => Some("[^0-9A-Za-z_]"),
                (false, 's') => Some("[\\t\\n\\x0C\\r ]"),
                (false, 'S') => Some("[^\\t\\n\\x0C\\r ]"),
                (false, 'b') => Some("(?-u:\\b)"),
                (false, 'B') => Some("(?-u:\\B)"),
                (true, 'd') => Some("0-9"),
                (true, 'D') => Some("[:^digit:]"),
                (true, 'w') => Some("0-9A-Za-z_"),
                (true, 'W') => Some("[:^word:]"),
                (true, 's') => Some("\\t\\n\\x0C\\r "),
                // Go's `\s` leaves out `\v`, which `[:space:]` holds.
                (true, 'S') => Some("[:^space:]"),
                _ => None,
            };
            match replacement {
                Some(r) => out.push_str(r),
                None => {
                    out.push('\\');
                    out.push(d);
                }
            }
            i += 2;
            class_start = false;
            continue;
        }
        if in_class {
            if c == '[' && chars.get(i + 1) == Some(&':') {
                // `[:alpha:]` and the like: copied whole.
                let end = (i + 2..chars.len().saturating_sub(1))
                    .find(|&j| chars[j] == ':' && chars[j + 1] == ']')
                    .map_or(chars.len(), |j| j + 2);
                out.extend(&chars[i..end]);
                i = end;
                class_start = false;
                continue;
            }
            match c {
                ']' if !class_start => in_class = false,
                // Plain characters in Go; nesting and set operators in the regex crate.
                '[' | '&' | '~' => out.push('\\'),
                _ => {}
            }
            out.push(c);
            class_start = false;
            i += 1;
            continue;
        }
        out.push(c);
        if c == '[' {
            in_class = true;
            class_start = true;
            if chars.get(i + 1) == Some(&'^') {
                out.push('^');
                i += 1;
            }
        }
        i += 1;
    }
    out
}

/// `pattern` compiled, or why not. The reason quotes the pattern only when the template
/// wrote it; a pattern from the data may be secret.
fn compile(name: &str, pattern: &str) -> Result<Regex> {
    if let Some(regex) = context::cached_regex(pattern) {
        return Ok(regex);
    }
    // Compiling costs tens of microseconds, more for long patterns.
    context::charge(name, 2000 + 200 * pattern.len() as u64)?;
    let compiled = RegexBuilder::new(&translate(pattern))
        .octal(true)
        .size_limit(REGEX_SIZE_LIMIT)
        .build();
    match compiled {
        Ok(regex) => {
            context::keep_regex(pattern, &regex);
            Ok(regex)
        }
        Err(reason) if context::is_literal(pattern) => Err(fail(
            name,
            format!("{pattern:?} is not a regular expression gitplane can use: {reason}"),
        )),
        Err(_) => Err(fail(
            name,
            "the pattern is not a regular expression gitplane can use (it is not shown: it comes \
             from the data)",
        )),
    }
}

/// Steps for running a regular expression over `s`.
fn charge_search(name: &str, s: &str) -> Result<()> {
    context::charge(name, 1 + s.len() as u64)
}

/// `regexMatch pattern s`; an invalid pattern does not match (`mustRegexMatch` fails).
pub(super) fn regex_match(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (pattern, s) = (a.str(0)?, a.str(1)?);
    let regex = match compile(name, pattern) {
        Ok(regex) => regex,
        Err(e) if name.starts_with("must") => return Err(e),
        Err(_) => return Ok(Value::Bool(false)),
    };
    charge_search(name, s)?;
    Ok(Value::Bool(regex.is_match(s)))
}

/// `regexFindAll pattern s n`: the first `n` matches, every match for a negative `n`.
pub(super) fn regex_find_all(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (pattern, s, n) = (a.str(0)?, a.str(1)?, a.int(2)?);
    let regex = compile(name, pattern)?;
    charge_search(name, s)?;
    let limit = if n < 0 { usize::MAX } else { n as usize };
    let found: Vec<String> = regex
        .find_iter(s)
        .take(limit.min(MAX_LIST_ITEMS + 1))
        .map(|m| m.as_str().to_owned())
        .collect();
    check_items(name, found.len() as u128)?;
    string_list(name, found)
}

/// `regexFind pattern s`: the first match, or "".
pub(super) fn regex_find(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (pattern, s) = (a.str(0)?, a.str(1)?);
    let regex = compile(name, pattern)?;
    charge_search(name, s)?;
    text(name, regex.find(s).map_or("", |m| m.as_str()))
}

/// `regexReplaceAll pattern s replacement`: `$1` and `${name}` in the replacement are groups
/// (`regexReplaceAllLiteral` takes it as it is).
pub(super) fn regex_replace_all(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (pattern, s, replacement) = (a.str(0)?, a.str(1)?, a.str(2)?);
    let regex = compile(name, pattern)?;
    charge_search(name, s)?;
    let literal = name.ends_with("Literal");
    // Each match is replaced by the replacement, whose `$` groups are each at most a match.
    let (mut count, mut longest) = (0u128, 0u128);
    for m in regex.find_iter(s) {
        count += 1;
        longest = longest.max(m.len() as u128);
    }
    let per_match = if literal {
        replacement.len() as u128
    } else {
        replacement.len() as u128 + replacement.matches('$').count() as u128 * longest
    };
    check_len(name, s.len() as u128 + count * per_match)?;
    let replaced = if literal {
        regex.replace_all(s, NoExpand(replacement))
    } else {
        regex.replace_all(s, replacement)
    };
    text(name, replaced.into_owned())
}

/// `regexSplit pattern s n`, as Go's `Regexp.Split`: at most `n` pieces (all for a negative
/// `n`); an empty match at the start makes no empty first piece.
pub(super) fn regex_split(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (pattern, s, n) = (a.str(0)?, a.str(1)?, a.int(2)?);
    let regex = compile(name, pattern)?;
    charge_search(name, s)?;
    if n == 0 {
        return string_list(name, Vec::new());
    }
    if !pattern.is_empty() && s.is_empty() {
        return string_list(name, vec![String::new()]);
    }
    let limit = if n < 0 { usize::MAX } else { n as usize };
    let mut pieces = Vec::new();
    let (mut begin, mut end) = (0, 0);
    for m in regex.find_iter(s).take(limit) {
        if n > 0 && pieces.len() == limit - 1 {
            break;
        }
        check_items(name, pieces.len() as u128 + 2)?;
        end = m.start();
        if m.end() != 0 {
            pieces.push(s[begin..end].to_owned());
        }
        begin = m.end();
    }
    if end != s.len() {
        pieces.push(s[begin..].to_owned());
    }
    string_list(name, pieces)
}

/// Go's `regexp.QuoteMeta`: a backslash before each of `\.+*?()|[]{}^$`.
pub(super) fn regex_quote_meta(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let s = a.str(0)?;
    check_len(name, 2 * s.len() as u128)?;
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    text(name, out)
}
