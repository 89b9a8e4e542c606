//! Sprig's random functions, from the operating system's random source (as Sprig's
//! `crypto/rand`), each value drawn uniformly.

use base64::Engine as _;
use gotmpl::{TemplateError, Value};

use super::{Args, check_len, fail, text};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

fn random_bytes(name: &str, buf: &mut [u8]) -> Result<()> {
    getrandom::getrandom(buf).map_err(|_| fail(name, "the system's random source failed"))
}

/// A uniform number below `bound` (which must not be 0).
fn below(name: &str, bound: u64) -> Result<u64> {
    // Rejecting the top partial range of u64 keeps every result equally likely.
    let zone = u64::MAX - u64::MAX % bound;
    loop {
        let mut buf = [0u8; 8];
        random_bytes(name, &mut buf)?;
        let n = u64::from_le_bytes(buf);
        if n < zone {
            return Ok(n % bound);
        }
    }
}

const LETTERS: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const DIGITS: &str = "0123456789";

/// `randAlphaNum n`, `randAlpha n`, `randNumeric n`, `randAscii n`: `n` random characters
/// (letters and digits, letters, digits, or printable ASCII). A negative `n` gives "".
pub(super) fn rand_string(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let count = a.int(0)?;
    if count <= 0 {
        return text(name, "");
    }
    check_len(name, count as u128)?;
    let alphabet: Vec<u8> = match name {
        "randAlphaNum" => format!("{LETTERS}{DIGITS}").into_bytes(),
        "randAlpha" => LETTERS.as_bytes().to_vec(),
        "randNumeric" => DIGITS.as_bytes().to_vec(),
        _ => (b' '..=b'~').collect(),
    };
    context::charge_bytes(name, count as usize * 4)?;
    // One random byte per character; bytes past the largest multiple of the alphabet's size
    // are drawn again, so every character is equally likely.
    let zone = 256 - 256 % alphabet.len();
    let mut out = String::with_capacity(count as usize);
    let mut buf = [0u8; 256];
    while out.len() < count as usize {
        random_bytes(name, &mut buf)?;
        for &b in &buf {
            if (b as usize) < zone && out.len() < count as usize {
                out.push(alphabet[b as usize % alphabet.len()] as char);
            }
        }
    }
    text(name, out)
}

/// `randBytes n`: `n` random bytes, base64-encoded.
pub(super) fn rand_bytes(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let count = a.int(0)?;
    if count < 0 {
        return Err(fail(name, "the count is negative"));
    }
    check_len(name, count as u128 * 4 / 3 + 4)?;
    let mut buf = vec![0u8; count as usize];
    random_bytes(name, &mut buf)?;
    text(name, base64::engine::general_purpose::STANDARD.encode(&buf))
}

/// `randInt min max`: a random integer from `min` up to, not including, `max`.
pub(super) fn rand_int(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (min, max) = (a.int(0)?, a.int(1)?);
    let span = max
        .checked_sub(min)
        .filter(|s| *s > 0)
        .ok_or_else(|| fail(name, "the maximum must be greater than the minimum"))?;
    let n = below(name, span as u64)?;
    Ok(Value::Int(min.wrapping_add(n as i64)))
}

/// `shuffle s`: the characters of `s` in a random order.
pub(super) fn shuffle(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let s = a.str(0)?;
    let mut chars: Vec<char> = s.chars().collect();
    context::charge(name, chars.len() as u64 * 16)?;
    for i in (1..chars.len()).rev() {
        let j = below(name, i as u64 + 1)? as usize;
        chars.swap(i, j);
    }
    text(name, chars.into_iter().collect::<String>())
}

/// `uuidv4`: a random (version 4) UUID, in lower case with hyphens.
pub(super) fn uuidv4(name: &str, args: &[Value]) -> Result<Value> {
    Args::new(name, args).exactly(0)?;
    let mut b = [0u8; 16];
    random_bytes(name, &mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    text(
        name,
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        ),
    )
}
