//! Sprig's string functions.
//!
//! Sprig indexes strings by byte (`substr`, `trunc`, `abbrev`), as Go does; where a cut falls
//! inside a character, the broken bytes become U+FFFD instead of invalid UTF-8.

use std::sync::Arc;

use gotmpl::{TemplateError, Value};

use super::{
    Args, Dict, MAX_VALUE_BYTES, check_items, check_len, fail, go_quote, new_dict, string_list,
    strval, text, too_long,
};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

pub(super) fn hello(name: &str, args: &[Value]) -> Result<Value> {
    Args::new(name, args).exactly(0)?;
    text(name, "Hello!")
}

/// Bytes `start..end` of `s`, with a character cut in half replaced by U+FFFD.
fn byte_slice(s: &str, start: usize, end: usize) -> String {
    String::from_utf8_lossy(&s.as_bytes()[start..end]).into_owned()
}

/// goutils' `AbbreviateFull`: `None` where it fails (Sprig then returns "").
fn abbreviate(s: &str, offset: i64, max_width: i64) -> Option<String> {
    let len = s.len() as i64;
    if s.is_empty() {
        return Some(String::new());
    }
    if max_width < 4 {
        return None;
    }
    if len <= max_width {
        return Some(s.to_owned());
    }
    let mut offset = offset.min(len);
    if len.saturating_sub(offset) < max_width - 3 {
        offset = len - (max_width - 3);
    }
    if offset <= 4 {
        return Some(byte_slice(s, 0, (max_width - 3) as usize) + "...");
    }
    if max_width < 7 {
        return None;
    }
    if offset.saturating_add(max_width - 3) < len {
        let tail = String::from_utf8_lossy(&s.as_bytes()[offset as usize..]).into_owned();
        let inner = abbreviate(&tail, 0, max_width - 3).unwrap_or_default();
        return Some(format!("...{inner}"));
    }
    Some(format!(
        "...{}",
        byte_slice(s, (len - (max_width - 3)) as usize, len as usize)
    ))
}

pub(super) fn abbrev(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (width, s) = (a.int(0)?, a.str(1)?);
    if width < 4 {
        return text(name, s);
    }
    text(name, abbreviate(s, 0, width).unwrap_or_default())
}

pub(super) fn abbrevboth(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (left, right, s) = (a.int(0)?, a.int(1)?, a.str(2)?);
    if right < 4 || (left > 0 && right < 7) {
        return text(name, s);
    }
    text(name, abbreviate(s, left, right).unwrap_or_default())
}

pub(super) fn trunc(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (count, s) = (a.int(0)?, a.str(1)?);
    let len = s.len() as i64;
    if count < 0 && len + count > 0 {
        return text(name, byte_slice(s, (len + count) as usize, s.len()));
    }
    if count >= 0 && len > count {
        return text(name, byte_slice(s, 0, count as usize));
    }
    text(name, s)
}

/// A function of one string argument.
fn map_str(name: &str, args: &[Value], f: impl FnOnce(&str) -> String) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let s = a.str(0)?;
    context::charge_chars(name, s.len())?;
    text(name, f(s))
}

pub(super) fn trim(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| s.trim().to_owned())
}

/// Go's `unicode.ToUpper`: the simple mapping, one character to one.
pub(super) fn go_upper(c: char) -> char {
    let mut upper = c.to_uppercase();
    match (upper.next(), upper.next()) {
        (Some(u), None) => u,
        _ => c,
    }
}

/// Go's `unicode.ToLower`.
pub(super) fn go_lower(c: char) -> char {
    if c == '\u{130}' {
        return 'i';
    }
    let mut lower = c.to_lowercase();
    match (lower.next(), lower.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// Go's `unicode.ToTitle`: as upper case, except for the four Latin digraphs.
fn go_title(c: char) -> char {
    match c {
        'Ǆ' | 'ǅ' | 'ǆ' => 'ǅ',
        'Ǉ' | 'ǈ' | 'ǉ' => 'ǈ',
        'Ǌ' | 'ǋ' | 'ǌ' => 'ǋ',
        'Ǳ' | 'ǲ' | 'ǳ' => 'ǲ',
        _ => go_upper(c),
    }
}

pub(super) fn upper(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| s.chars().map(go_upper).collect())
}

pub(super) fn lower(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| s.chars().map(go_lower).collect())
}

/// Go's `strings.Title`: the first letter of every word in title case, the rest as it is.
pub(super) fn title(name: &str, args: &[Value]) -> Result<Value> {
    fn separator(c: char) -> bool {
        if c.is_ascii() {
            return !(c.is_ascii_alphanumeric() || c == '_');
        }
        !(c.is_alphabetic() || c.is_numeric()) && c.is_whitespace()
    }
    map_str(name, args, |s| {
        let mut previous = ' ';
        s.chars()
            .map(|c| {
                let out = if separator(previous) { go_title(c) } else { c };
                previous = c;
                out
            })
            .collect()
    })
}

/// goutils' `Uncapitalize`: the first letter of every whitespace-separated word in lower case.
pub(super) fn untitle(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| {
        let mut at_start = true;
        s.chars()
            .map(|c| {
                if c.is_whitespace() {
                    at_start = true;
                    c
                } else if at_start {
                    at_start = false;
                    go_lower(c)
                } else {
                    c
                }
            })
            .collect()
    })
}

/// Sprig's `substr start end s`: bytes `start..end`; a negative start means from 0, a negative
/// or too large end means to the end. Bounds Go would panic on are an error.
pub(super) fn substr(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (start, end, s) = (a.int(0)?, a.int(1)?, a.str(2)?);
    let len = s.len() as i64;
    let (from, to) = if start < 0 {
        (0, end)
    } else if end < 0 || end > len {
        (start, len)
    } else {
        (start, end)
    };
    if to < 0 || to > len {
        return Err(fail(name, "the end is past the end of the string"));
    }
    if from > to {
        return Err(fail(name, "the start is after the end"));
    }
    text(name, byte_slice(s, from as usize, to as usize))
}

pub(super) fn repeat(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (count, s) = (a.int(0)?, a.str(1)?);
    if count < 0 {
        return Err(fail(name, "the count is negative"));
    }
    check_len(name, count as u128 * s.len() as u128)?;
    text(name, s.repeat(count as usize))
}

pub(super) fn trim_all(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (cutset, s) = (a.str(0)?, a.str(1)?);
    text(name, s.trim_matches(|c| cutset.contains(c)))
}

pub(super) fn trim_suffix(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (suffix, s) = (a.str(0)?, a.str(1)?);
    text(name, s.strip_suffix(suffix).unwrap_or(s))
}

pub(super) fn trim_prefix(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (prefix, s) = (a.str(0)?, a.str(1)?);
    text(name, s.strip_prefix(prefix).unwrap_or(s))
}

/// goutils' `DeleteWhiteSpace`. (It reads bytes, so it garbles non-ASCII text in Go; gitplane
/// removes whitespace characters and keeps the others whole.)
pub(super) fn nospace(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| {
        s.chars().filter(|c| !c.is_whitespace()).collect()
    })
}

/// goutils' `Initials`: the first character of every whitespace-separated word.
pub(super) fn initials(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| {
        s.split(char::is_whitespace)
            .filter_map(|word| word.chars().next())
            .collect()
    })
}

/// goutils' `SwapCase`: upper case to lower; lower case to upper (title case at the start of a
/// word).
pub(super) fn swapcase(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| {
        let mut after_space = true;
        s.chars()
            .map(|c| {
                if c.is_uppercase() {
                    after_space = false;
                    go_lower(c)
                } else if c.is_lowercase() {
                    let out = if after_space {
                        go_title(c)
                    } else {
                        go_upper(c)
                    };
                    after_space = false;
                    out
                } else {
                    after_space = c.is_whitespace();
                    c
                }
            })
            .collect()
    })
}

pub(super) fn snakecase(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| words_to_lower_case(s, '_'))
}

pub(super) fn kebabcase(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| words_to_lower_case(s, '-'))
}

/// xstrings' connectors: what separates words in `snakecase` and `camelcase`.
fn is_connector(c: char) -> bool {
    c == '-' || c == '_' || c.is_whitespace()
}

/// A letter of an alphabet: any letter but the common CJK ideographs (which have no case).
fn is_alphabet(c: char) -> bool {
    c.is_alphabetic()
        && !matches!(c, '\u{4e00}'..='\u{9fcc}' | '\u{3400}'..='\u{4d85}' | '\u{20000}'..='\u{2b81d}')
}

/// Go's `unicode.IsPunct` for ASCII and the common punctuation blocks (Rust's standard
/// library has no category tables).
fn is_punct(c: char) -> bool {
    if c.is_ascii() {
        return matches!(c, '!'..='#' | '%'..='*' | ','..='/' | ':' | ';' | '?' | '@' | '['..=']' | '_' | '{' | '}');
    }
    matches!(c,
        '¡' | '§' | '«' | '¶' | '·' | '»' | '¿'
        | '\u{2010}'..='\u{2027}'
        | '\u{2030}'..='\u{2043}'
        | '\u{2045}'..='\u{2051}'
        | '\u{2053}'..='\u{205e}'
        | '\u{3001}'..='\u{3003}'
        | '\u{3008}'..='\u{3011}'
        | '\u{3014}'..='\u{301f}'
        | '\u{ff01}'..='\u{ff03}'
        | '\u{ff05}'..='\u{ff0a}'
        | '\u{ff0c}'..='\u{ff0f}'
        | '\u{ff1a}' | '\u{ff1b}' | '\u{ff1f}' | '\u{ff20}'
        | '\u{ff3b}'..='\u{ff3d}'
        | '\u{ff3f}' | '\u{ff5b}' | '\u{ff5d}'
        | '\u{ff5f}'..='\u{ff65}'
    )
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Word {
    End,
    Number,
    Upper,
    Alphabet,
    Connector,
    Punct,
    Other,
}

/// The next word of `s` as xstrings splits words: a run of connectors, of punctuation, of
/// digits, of lower-case letters, an upper-case letter with the lower-case ones after it, or a
/// run of capitals (`HTTPServer` gives `HTTP`, then `Server`).
fn next_word(s: &str) -> (Word, &str, &str) {
    let mut chars = s.char_indices().peekable();
    let Some((_, first)) = chars.next() else {
        return (Word::End, "", "");
    };
    let run_end = |pred: &dyn Fn(char) -> bool| -> usize {
        s.char_indices()
            .skip(1)
            .find(|&(_, c)| !pred(c))
            .map_or(s.len(), |(i, _)| i)
    };
    let (kind, end) = if is_connector(first) {
        (Word::Connector, run_end(&is_connector))
    } else if is_punct(first) {
        (Word::Punct, run_end(&is_punct))
    } else if first.is_uppercase() {
        let second = chars.peek().map(|&(_, c)| c);
        match second {
            Some(c) if c.is_uppercase() => {
                // A run of capitals; the last one starts the next word when a lower-case
                // letter follows it ("HTTPServer").
                let mut last_start = first.len_utf8();
                let mut end = s.len();
                for (i, c) in s.char_indices().skip(1) {
                    if !c.is_uppercase() {
                        end = if is_alphabet(c) { last_start } else { i };
                        break;
                    }
                    last_start = i;
                }
                (Word::Upper, end)
            }
            Some(c) if is_alphabet(c) => (
                Word::Upper,
                run_end(&|c| is_alphabet(c) && !c.is_uppercase()),
            ),
            _ => (Word::Upper, first.len_utf8()),
        }
    } else if is_alphabet(first) {
        (
            Word::Alphabet,
            run_end(&|c| is_alphabet(c) && !c.is_uppercase()),
        )
    } else if first.is_numeric() {
        (Word::Number, run_end(&char::is_numeric))
    } else {
        (
            Word::Other,
            run_end(&|c| !(is_connector(c) || is_alphabet(c) || c.is_numeric() || is_punct(c))),
        )
    };
    (kind, &s[..end], &s[end..])
}

/// Writes a word: capitals in lower case, connectors as `connector`.
fn push_lower(out: &mut String, kind: Word, word: &str, connector: char) {
    if kind != Word::Upper && kind != Word::Connector {
        out.push_str(word);
        return;
    }
    for c in word.chars() {
        if is_connector(c) {
            out.push(connector);
        } else if c.is_uppercase() {
            out.push(go_lower(c));
        } else {
            out.push(c);
        }
    }
}

/// xstrings' `ToSnakeCase` and `ToKebabCase`: words in lower case joined by `connector`, a
/// number kept with the word it follows unless lower-case letters follow it
/// (`Bld4Floor3rd` gives `bld4_floor_3rd`).
fn words_to_lower_case(s: &str, connector: char) -> String {
    let mut out = String::with_capacity(s.len() + s.len() / 4);
    let (mut kind, mut word, mut rest) = next_word(s);
    while !rest.is_empty() {
        if kind != Word::Connector {
            push_lower(&mut out, kind, word, connector);
        }
        let (previous, previous_word) = (kind, word);
        (kind, word, rest) = next_word(rest);
        match previous {
            Word::Number => {
                while matches!(kind, Word::Alphabet | Word::Number) {
                    push_lower(&mut out, kind, word, connector);
                    (kind, word, rest) = next_word(rest);
                }
                if !matches!(kind, Word::End | Word::Punct | Word::Connector) {
                    out.push(connector);
                }
            }
            Word::Connector => push_lower(&mut out, previous, previous_word, connector),
            Word::Punct => {}
            _ => {
                if kind != Word::Number {
                    if kind != Word::Connector && kind != Word::Punct {
                        out.push(connector);
                    }
                    continue;
                }
                if rest.is_empty() {
                    continue;
                }
                let number = word;
                (kind, word, rest) = next_word(rest);
                if kind != Word::Alphabet {
                    push_lower(&mut out, Word::Number, number, connector);
                    if kind != Word::Connector && kind != Word::Punct {
                        out.push(connector);
                    }
                    continue;
                }
                // Lower-case letters after a number: the number starts a word of its own.
                out.push(connector);
                push_lower(&mut out, Word::Number, number, connector);
                while matches!(kind, Word::Alphabet | Word::Number) {
                    push_lower(&mut out, kind, word, connector);
                    (kind, word, rest) = next_word(rest);
                }
                if !matches!(kind, Word::End | Word::Connector | Word::Punct) {
                    out.push(connector);
                }
            }
        }
    }
    push_lower(&mut out, kind, word, connector);
    out
}

/// xstrings' `ToPascalCase` (Sprig's `camelcase`): connectors removed and the letter after
/// each one in upper case; leading connectors, and all but one of a run, are kept.
pub(super) fn camelcase(name: &str, args: &[Value]) -> Result<Value> {
    map_str(name, args, |s| {
        let mut out = String::with_capacity(s.len());
        let mut chars = s.chars();
        let mut current = None;
        for c in chars.by_ref() {
            if is_connector(c) {
                out.push(c);
            } else {
                current = Some(go_upper(c));
                break;
            }
        }
        let Some(mut current) = current else {
            return out;
        };
        for next in chars {
            let previous = current;
            current = next;
            if is_connector(current) && is_connector(previous) {
                out.push(previous);
            } else if is_connector(previous) {
                current = go_upper(current);
            } else {
                out.push(previous);
            }
        }
        out.push(current);
        out
    })
}

/// goutils' `WrapCustom`: breaks lines at spaces so that each is at most `width` bytes where
/// it can be.
fn wrap_text(s: &str, width: i64, newline: &str, wrap_long_words: bool) -> String {
    let bytes = s.as_bytes();
    let width = width.max(1) as usize;
    let newline = if newline.is_empty() { "\n" } else { newline };
    let mut out: Vec<u8> = Vec::with_capacity(bytes.len());
    let mut offset = 0;
    while bytes.len() - offset > width {
        if bytes[offset] == b' ' {
            offset += 1;
            continue;
        }
        let end = width + offset + 1;
        let space = bytes[offset..end].iter().rposition(|&b| b == b' ');
        if let Some(space) = space {
            out.extend_from_slice(&bytes[offset..offset + space]);
            out.extend_from_slice(newline.as_bytes());
            offset += space + 1;
        } else if wrap_long_words {
            out.extend_from_slice(&bytes[offset..offset + width]);
            out.extend_from_slice(newline.as_bytes());
            offset += width;
        } else {
            let end = width + offset;
            match bytes[end..].iter().position(|&b| b == b' ') {
                None => {
                    out.extend_from_slice(&bytes[offset..]);
                    offset = bytes.len();
                }
                Some(i) => {
                    out.extend_from_slice(&bytes[offset..end + i]);
                    out.extend_from_slice(newline.as_bytes());
                    offset = end + i + 1;
                }
            }
        }
    }
    out.extend_from_slice(&bytes[offset..]);
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn wrap(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (width, s) = (a.int(0)?, a.str(1)?);
    context::charge_chars(name, s.len())?;
    text(name, wrap_text(s, width, "\n", false))
}

pub(super) fn wrap_with(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (width, newline, s) = (a.int(0)?, a.str(1)?, a.str(2)?);
    let lines = s.len() as u128 / width.max(1) as u128 + 1;
    check_len(name, s.len() as u128 + lines * newline.len().max(1) as u128)?;
    context::charge_chars(name, s.len())?;
    text(name, wrap_text(s, width, newline, true))
}

/// A test of two strings: `(needle, haystack)`, in Sprig's order.
fn test_str(name: &str, args: &[Value], f: impl FnOnce(&str, &str) -> bool) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (needle, haystack) = (a.str(0)?, a.str(1)?);
    context::charge_bytes(name, haystack.len())?;
    Ok(Value::Bool(f(needle, haystack)))
}

pub(super) fn contains(name: &str, args: &[Value]) -> Result<Value> {
    test_str(name, args, |needle, s| s.contains(needle))
}

pub(super) fn has_prefix(name: &str, args: &[Value]) -> Result<Value> {
    test_str(name, args, |prefix, s| s.starts_with(prefix))
}

pub(super) fn has_suffix(name: &str, args: &[Value]) -> Result<Value> {
    test_str(name, args, |suffix, s| s.ends_with(suffix))
}

/// The arguments that are not nil, each as `show` writes it, joined by spaces.
fn join_shown(name: &str, args: &[Value], show: impl Fn(&str) -> String) -> Result<Value> {
    let mut out = String::new();
    for arg in args.iter().filter(|a| !matches!(a, Value::Nil)) {
        let shown = show(&strval(name, arg)?);
        if out.len() + shown.len() + 1 > MAX_VALUE_BYTES {
            return Err(too_long(name));
        }
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&shown);
    }
    text(name, out)
}

/// `quote "a" "b"` is `"a" "b"`: each argument Go-quoted; nil arguments are left out.
pub(super) fn quote(name: &str, args: &[Value]) -> Result<Value> {
    join_shown(name, args, go_quote)
}

pub(super) fn squote(name: &str, args: &[Value]) -> Result<Value> {
    join_shown(name, args, |s| format!("'{s}'"))
}

pub(super) fn cat(name: &str, args: &[Value]) -> Result<Value> {
    join_shown(name, args, str::to_owned)
}

fn indent_text(name: &str, spaces: i64, s: &str) -> Result<String> {
    if spaces < 0 {
        return Err(fail(name, "the number of spaces is negative"));
    }
    let lines = s.bytes().filter(|&b| b == b'\n').count() as u128 + 1;
    check_len(name, s.len() as u128 + lines * spaces as u128)?;
    let pad = " ".repeat(spaces as usize);
    Ok(format!("{pad}{}", s.replace('\n', &format!("\n{pad}"))))
}

/// `indent n s`: every line of `s`, the first included, after `n` spaces.
pub(super) fn indent(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    text(name, indent_text(name, a.int(0)?, a.str(1)?)?)
}

/// `nindent n s`: a newline, then `indent n s`.
pub(super) fn nindent(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    text(
        name,
        format!("\n{}", indent_text(name, a.int(0)?, a.str(1)?)?),
    )
}

/// `replace old new s`: every `old` in `s` replaced (an empty `old` matches around each
/// character, as in Go).
pub(super) fn replace(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (old, new, s) = (a.str(0)?, a.str(1)?, a.str(2)?);
    let count = if old.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(old).count()
    };
    check_len(name, s.len() as u128 + count as u128 * new.len() as u128)?;
    context::charge_chars(name, s.len())?;
    text(name, s.replace(old, new))
}

pub(super) fn plural(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let (one, many, count) = (a.str(0)?, a.str(1)?, a.int(2)?);
    text(name, if count == 1 { one } else { many })
}

pub(super) fn to_string(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    if let Value::String(_) = a.get(0) {
        return Ok(a.get(0).clone());
    }
    text(name, strval(name, a.get(0))?.into_owned())
}

/// Sprig's `strslice`: a list's items as strings (nil items left out), no value as no items,
/// anything else as one string.
pub(super) fn strings_of(name: &str, value: &Value) -> Result<Vec<String>> {
    match value {
        Value::List(items) => {
            let mut total = 0;
            let mut out = Vec::with_capacity(items.len());
            for item in items.iter().filter(|i| !matches!(i, Value::Nil)) {
                let s = strval(name, item)?.into_owned();
                total += s.len();
                if total > MAX_VALUE_BYTES {
                    return Err(too_long(name));
                }
                out.push(s);
            }
            Ok(out)
        }
        Value::Nil => Ok(Vec::new()),
        other => Ok(vec![strval(name, other)?.into_owned()]),
    }
}

pub(super) fn to_strings(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    string_list(name, strings_of(name, a.get(0))?)
}

/// Go's `strings.SplitN(s, sep, n)`; `n < 0` splits at every separator.
fn split_go(name: &str, s: &str, sep: &str, n: i64) -> Result<Vec<String>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let pieces = if sep.is_empty() {
        s.chars().count()
    } else {
        s.matches(sep).count() + 1
    };
    let pieces = if n > 0 {
        pieces.min(n as usize)
    } else {
        pieces
    };
    check_items(name, pieces as u128)?;
    context::charge_chars(name, s.len())?;
    if sep.is_empty() {
        // Every character a piece; with a limit, the last piece holds the rest.
        let mut out: Vec<String> = Vec::with_capacity(pieces);
        let mut rest = s;
        while !rest.is_empty() {
            if out.len() + 1 == pieces {
                out.push(rest.to_owned());
                break;
            }
            let width = rest.chars().next().map_or(1, char::len_utf8);
            out.push(rest[..width].to_owned());
            rest = &rest[width..];
        }
        return Ok(out);
    }
    Ok(if n > 0 {
        s.splitn(n as usize, sep).map(str::to_owned).collect()
    } else {
        s.split(sep).map(str::to_owned).collect()
    })
}

/// Sprig's split result: a dict `{_0: …, _1: …}`.
fn pieces_dict(name: &str, pieces: Vec<String>) -> Result<Value> {
    let dict: Dict = pieces
        .into_iter()
        .enumerate()
        .map(|(i, p)| (Arc::from(format!("_{i}")), Value::String(p.into())))
        .collect();
    new_dict(name, dict)
}

pub(super) fn split(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    pieces_dict(name, split_go(name, a.str(1)?, a.str(0)?, -1)?)
}

pub(super) fn splitn(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    pieces_dict(name, split_go(name, a.str(2)?, a.str(0)?, a.int(1)?)?)
}

pub(super) fn split_list(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    string_list(name, split_go(name, a.str(1)?, a.str(0)?, -1)?)
}

/// `join sep list`: the list's items as strings (see [`strings_of`]) joined by `sep`.
pub(super) fn join(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let sep = a.str(0)?;
    let items = strings_of(name, a.get(1))?;
    check_len(
        name,
        items.iter().map(|s| s.len() as u128).sum::<u128>()
            + sep.len() as u128 * items.len() as u128,
    )?;
    text(name, items.join(sep))
}

/// `sortAlpha list`: the list's items as strings, sorted; anything else as a list of one.
pub(super) fn sort_alpha(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let mut items = match a.get(0) {
        list @ Value::List(_) => strings_of(name, list)?,
        other => vec![strval(name, other)?.into_owned()],
    };
    context::charge(name, items.len() as u64 * 8)?;
    items.sort();
    string_list(name, items)
}
