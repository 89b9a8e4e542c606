//! Sprig's encodings (base64, base32), hashes, URL and path functions, following Go's
//! `encoding/base64`, `crypto/*`, `net/url` and `path`.

use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use gotmpl::{TemplateError, Value};
use sha2::{Digest, Sha256, Sha512};

use super::{Args, Dict, check_len, describe, fail, new_dict, text};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// Go's `base64.StdEncoding` for decoding: canonical padding, stray low bits allowed.
const GO_BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
);

/// The one string argument of an encoding or hash function.
fn the_string<'a>(name: &'a str, args: &'a [Value]) -> Result<&'a str> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let s = a.str(0)?;
    context::charge_chars(name, s.len())?;
    Ok(s)
}

pub(super) fn b64enc(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    check_len(name, s.len() as u128 * 4 / 3 + 4)?;
    text(name, GO_BASE64.encode(s))
}

/// `b64dec s`: the decoded text; Go's error text as the result when `s` is not base64, as
/// Sprig returns it. Line breaks are skipped, as Go's decoder skips them.
pub(super) fn b64dec(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    let compact: String = s.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    match GO_BASE64.decode(&compact) {
        Ok(bytes) => text(name, String::from_utf8_lossy(&bytes).into_owned()),
        Err(e) => {
            let at = match e {
                base64::DecodeError::InvalidByte(at, _) => at,
                base64::DecodeError::InvalidLastSymbol { offset, .. } => offset,
                _ => compact.len() - compact.len() % 4,
            };
            text(name, format!("illegal base64 data at input byte {at}"))
        }
    }
}

const BASE32_ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/// Go's `base32.StdEncoding`: RFC 4648, padded with `=`.
pub(super) fn b32enc(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    check_len(name, s.len() as u128 * 8 / 5 + 8)?;
    let mut out = String::with_capacity(s.len() * 8 / 5 + 8);
    for block in s.as_bytes().chunks(5) {
        let mut buf = [0u8; 5];
        buf[..block.len()].copy_from_slice(block);
        let bits = buf.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b));
        let symbols = (block.len() * 8).div_ceil(5);
        for i in 0..8 {
            if i < symbols {
                out.push(BASE32_ALPHABET[((bits >> (35 - 5 * i)) & 31) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    text(name, out)
}

/// Go's `base32.StdEncoding` decoding of `s` (line breaks skipped), or the offset of the
/// first byte that is wrong.
fn base32_decode(s: &str) -> std::result::Result<Vec<u8>, usize> {
    let input: Vec<u8> = s.bytes().filter(|b| *b != b'\r' && *b != b'\n').collect();
    if !input.len().is_multiple_of(8) {
        return Err(input.len() - input.len() % 8);
    }
    let mut out = Vec::with_capacity(input.len() / 8 * 5);
    let blocks = input.len() / 8;
    for (n, block) in input.chunks(8).enumerate() {
        let symbols = block.iter().position(|b| *b == b'=').unwrap_or(8);
        let padding_ok = block[symbols..].iter().all(|b| *b == b'=')
            && matches!(symbols, 2 | 4 | 5 | 7 | 8)
            && (symbols == 8 || n + 1 == blocks);
        if !padding_ok {
            return Err(n * 8 + symbols);
        }
        let mut bits = 0u64;
        for (i, b) in block.iter().enumerate() {
            let value = if i < symbols {
                BASE32_ALPHABET
                    .iter()
                    .position(|a| a == b)
                    .ok_or(n * 8 + i)? as u64
            } else {
                0
            };
            bits = (bits << 5) | value;
        }
        let bytes = symbols * 5 / 8;
        for i in 0..bytes {
            out.push((bits >> (32 - 8 * i)) as u8);
        }
    }
    Ok(out)
}

pub(super) fn b32dec(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    match base32_decode(s) {
        Ok(bytes) => text(name, String::from_utf8_lossy(&bytes).into_owned()),
        Err(at) => text(name, format!("illegal base32 data at input byte {at}")),
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// SHA-1 (FIPS 180-4), for `sha1sum`: gitplane's dependencies carry SHA-2 only.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [
        0x6745_2301,
        0xEFCD_AB89,
        0x98BA_DCFE,
        0x1032_5476,
        0xC3D2_E1F0,
    ];
    let mut message = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    message.push(0x80);
    while message.len() % 64 != 56 {
        message.push(0);
    }
    message.extend_from_slice(&bit_len.to_be_bytes());
    for block in message.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in block.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (chunk, word) in out.chunks_mut(4).zip(h) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

pub(super) fn sha1sum(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    text(name, hex(&sha1(s.as_bytes())))
}

pub(super) fn sha256sum(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    text(name, hex(&Sha256::digest(s.as_bytes())))
}

pub(super) fn sha512sum(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    text(name, hex(&Sha512::digest(s.as_bytes())))
}

/// `adler32sum s`: the Adler-32 checksum in decimal.
pub(super) fn adler32sum(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    let (mut a, mut b) = (1u32, 0u32);
    for byte in s.bytes() {
        a = (a + u32::from(byte)) % 65_521;
        b = (b + a) % 65_521;
    }
    text(name, ((b << 16) | a).to_string())
}

/// The parts of a URL that Go's `net/url` parser picks out.
#[derive(Default, Debug, PartialEq)]
struct Url {
    scheme: String,
    opaque: String,
    /// The user name and, after a `:`, the password.
    user: Option<(String, Option<String>)>,
    host: String,
    path: String,
    raw_query: String,
    force_query: bool,
    fragment: String,
}

/// The contexts of Go's `url.shouldEscape`.
#[derive(Clone, Copy, PartialEq)]
enum Part {
    Path,
    Host,
    UserPassword,
    Fragment,
}

fn should_escape(c: u8, part: Part) -> bool {
    if c.is_ascii_alphanumeric() {
        return false;
    }
    if part == Part::Host
        && matches!(
            c,
            b'!' | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'*'
                | b'+'
                | b','
                | b';'
                | b'='
                | b':'
                | b'['
                | b']'
                | b'<'
                | b'>'
                | b'"'
        )
    {
        return false;
    }
    match c {
        b'-' | b'_' | b'.' | b'~' => return false,
        b'$' | b'&' | b'+' | b',' | b'/' | b':' | b';' | b'=' | b'?' | b'@' => {
            return match part {
                Part::Path => c == b'?',
                Part::UserPassword => matches!(c, b'@' | b'/' | b'?' | b':'),
                Part::Fragment => false,
                Part::Host => true,
            };
        }
        _ => {}
    }
    !(part == Part::Fragment && matches!(c, b'!' | b'(' | b')' | b'*'))
}

fn escape(s: &str, part: Part) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if should_escape(b, part) {
            let _ = write!(out, "%{b:02X}");
        } else {
            out.push(b as char);
        }
    }
    out
}

/// Go's `url.unescape`: `%XX` decoded; a bad escape, or a character a host may not hold, is
/// an error.
fn unescape(s: &str, part: Part) -> std::result::Result<String, &'static str> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex_digit = |j: usize| {
                    bytes
                        .get(j)
                        .and_then(|b| (*b as char).to_digit(16))
                        .map(|d| d as u8)
                };
                let (Some(hi), Some(lo)) = (hex_digit(i + 1), hex_digit(i + 2)) else {
                    return Err("an invalid % escape");
                };
                if part == Part::Host && hi < 8 && &s[i..i + 3] != "%25" {
                    return Err("an escape in the host that Go does not allow");
                }
                out.push(hi << 4 | lo);
                i += 3;
            }
            b if part == Part::Host && b < 0x80 && should_escape(b, Part::Host) => {
                return Err("an invalid character in the host name");
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Go's `validOptionalPort`: "" or `:` and digits.
fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `url.Parse`, for what `urlParse` and `urlJoin` need.
fn parse_url(raw: &str) -> std::result::Result<Url, &'static str> {
    let mut url = Url::default();
    let (rest, fragment) = raw.split_once('#').unwrap_or((raw, ""));
    url.fragment = unescape(fragment, Part::Fragment)?;
    if rest.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("an invalid control character");
    }
    if rest.is_empty() {
        return Ok(url);
    }
    if rest == "*" {
        url.path = "*".into();
        return Ok(url);
    }
    let mut rest = rest;
    for (i, b) in rest.bytes().enumerate() {
        match b {
            b if b.is_ascii_alphabetic() => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("a missing scheme"),
            b':' => {
                url.scheme = rest[..i].to_ascii_lowercase();
                rest = &rest[i + 1..];
                break;
            }
            _ => break,
        }
    }
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        url.force_query = true;
        rest = &rest[..rest.len() - 1];
    } else if let Some((before, query)) = rest.split_once('?') {
        url.raw_query = query.into();
        rest = before;
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            url.opaque = rest.into();
            return Ok(url);
        }
        let first_segment = rest.split('/').next().unwrap_or("");
        if first_segment.contains(':') {
            return Err("a colon in the first path segment");
        }
    }
    if (!url.scheme.is_empty() || !rest.starts_with("///")) && rest.starts_with("//") {
        let after = &rest[2..];
        let end = after.find('/').unwrap_or(after.len());
        let authority = &after[..end];
        rest = &after[end..];
        let host = match authority.rfind('@') {
            None => authority,
            Some(at) => {
                let userinfo = &authority[..at];
                let valid = userinfo
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c));
                if !valid {
                    return Err("invalid user information");
                }
                url.user = Some(match userinfo.split_once(':') {
                    None => (unescape(userinfo, Part::UserPassword)?, None),
                    Some((user, password)) => (
                        unescape(user, Part::UserPassword)?,
                        Some(unescape(password, Part::UserPassword)?),
                    ),
                });
                &authority[at + 1..]
            }
        };
        url.host = parse_host(host)?;
    }
    url.path = unescape(rest, Part::Path)?;
    Ok(url)
}

fn parse_host(host: &str) -> std::result::Result<String, &'static str> {
    if host.starts_with('[') {
        let Some(close) = host.rfind(']') else {
            return Err("a missing ']' in the host");
        };
        if !valid_optional_port(&host[close + 1..]) {
            return Err("an invalid port");
        }
        return Ok(host.to_owned());
    }
    if let Some(colon) = host.rfind(':')
        && !valid_optional_port(&host[colon..])
    {
        return Err("an invalid port");
    }
    unescape(host, Part::Host)
}

/// Go's `URL.Hostname`: the host without its port or IPv6 brackets.
fn hostname(host: &str) -> &str {
    let mut name = host;
    if let Some(colon) = host.rfind(':')
        && valid_optional_port(&host[colon..])
    {
        name = &host[..colon];
    }
    name.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(name)
}

/// Go's `Userinfo.String`.
fn userinfo_string(user: &(String, Option<String>)) -> String {
    let mut out = escape(&user.0, Part::UserPassword);
    if let Some(password) = &user.1 {
        out.push(':');
        out.push_str(&escape(password, Part::UserPassword));
    }
    out
}

/// Go's `URL.String`.
fn url_string(url: &Url) -> String {
    let mut out = String::new();
    if !url.scheme.is_empty() {
        out.push_str(&url.scheme);
        out.push(':');
    }
    if !url.opaque.is_empty() {
        out.push_str(&url.opaque);
    } else {
        if !url.scheme.is_empty() || !url.host.is_empty() || url.user.is_some() {
            if !url.host.is_empty() || !url.path.is_empty() || url.user.is_some() {
                out.push_str("//");
            }
            if let Some(user) = &url.user {
                out.push_str(&userinfo_string(user));
                out.push('@');
            }
            out.push_str(&escape(&url.host, Part::Host));
        }
        let path = if url.path == "*" {
            "*".to_owned()
        } else {
            escape(&url.path, Part::Path)
        };
        if !path.is_empty() && !path.starts_with('/') && !url.host.is_empty() {
            out.push('/');
        }
        if out.is_empty() && path.split('/').next().is_some_and(|s| s.contains(':')) {
            out.push_str("./");
        }
        out.push_str(&path);
    }
    if url.force_query || !url.raw_query.is_empty() {
        out.push('?');
        out.push_str(&url.raw_query);
    }
    if !url.fragment.is_empty() {
        out.push('#');
        out.push_str(&escape(&url.fragment, Part::Fragment));
    }
    out
}

/// `urlParse s`: a dict of the URL's `scheme`, `host`, `hostname`, `path`, `query`, `opaque`,
/// `fragment` and `userinfo`. The error never shows the URL, which may hold a password.
pub(super) fn url_parse(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    let url = parse_url(s).map_err(|why| {
        fail(
            name,
            format!("the text is not a URL Go can parse: it has {why}"),
        )
    })?;
    let mut dict = Dict::new();
    let mut put = |key: &str, value: String| {
        dict.insert(Arc::from(key), Value::String(value.into()));
    };
    put("scheme", url.scheme.clone());
    put("host", url.host.clone());
    put("hostname", hostname(&url.host).to_owned());
    put("path", url.path.clone());
    put("query", url.raw_query.clone());
    put("opaque", url.opaque.clone());
    put("fragment", url.fragment.clone());
    put(
        "userinfo",
        url.user.as_ref().map(userinfo_string).unwrap_or_default(),
    );
    new_dict(name, dict)
}

/// `urlJoin d`: the URL made of the dict's parts, as `urlParse` names them.
pub(super) fn url_join(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let dict = a.dict(0)?;
    let part = |key: &str| -> Result<String> {
        match dict.and_then(|d| d.get(key)) {
            None => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.to_string()),
            Some(other) => Err(fail(
                name,
                format!("the {key} key must be a string, not {}", describe(other)),
            )),
        }
    };
    let userinfo = part("userinfo")?;
    let user = if userinfo.is_empty() {
        None
    } else {
        let parsed = parse_url(&format!("proto://{userinfo}@host"))
            .map_err(|why| fail(name, format!("the userinfo is not valid: it has {why}")))?;
        parsed.user
    };
    let url = Url {
        scheme: part("scheme")?,
        opaque: part("opaque")?,
        user,
        host: part("host")?,
        path: part("path")?,
        raw_query: part("query")?,
        force_query: false,
        fragment: part("fragment")?,
    };
    let joined = url_string(&url);
    context::charge_bytes(name, joined.len())?;
    text(name, joined)
}

/// Go's `path.Clean`: the shortest path naming the same file, lexically.
fn clean(p: &str) -> String {
    if p.is_empty() {
        return ".".into();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for segment in p.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|last| *last != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

fn path_fn(name: &str, args: &[Value], f: impl FnOnce(&str) -> String) -> Result<Value> {
    let s = the_string(name, args)?;
    text(name, f(s))
}

/// `base p`: the last element of the path.
pub(super) fn path_base(name: &str, args: &[Value]) -> Result<Value> {
    path_fn(name, args, |p| {
        if p.is_empty() {
            return ".".into();
        }
        let trimmed = p.trim_end_matches('/');
        if trimmed.is_empty() {
            return "/".into();
        }
        trimmed.rsplit('/').next().unwrap_or(trimmed).to_owned()
    })
}

/// `dir p`: all but the last element, cleaned.
pub(super) fn path_dir(name: &str, args: &[Value]) -> Result<Value> {
    path_fn(name, args, |p| {
        let dir = p.rfind('/').map_or("", |i| &p[..=i]);
        clean(dir)
    })
}

pub(super) fn path_clean(name: &str, args: &[Value]) -> Result<Value> {
    path_fn(name, args, clean)
}

/// `ext p`: the extension of the last element (from its last dot), or "".
pub(super) fn path_ext(name: &str, args: &[Value]) -> Result<Value> {
    path_fn(name, args, |p| {
        for (i, b) in p.bytes().enumerate().rev() {
            match b {
                b'/' => break,
                b'.' => return p[i..].to_owned(),
                _ => {}
            }
        }
        String::new()
    })
}

pub(super) fn path_is_abs(name: &str, args: &[Value]) -> Result<Value> {
    let s = the_string(name, args)?;
    Ok(Value::Bool(s.starts_with('/')))
}
