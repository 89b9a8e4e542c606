//! Sprig's arithmetic: integers as `spf13/cast` converts them (and as Go wraps them on
//! overflow), floats as Go's `math`, and the `…f` functions through exact decimals as
//! Sprig's `shopspring/decimal` (so `addf 1.1 2.2` is 3.3, not 3.3000000000000003).

use std::fmt::Write as _;

use gotmpl::{TemplateError, Value};

use super::{
    Args, check_items, check_len, exact_int, fail, new_list, strval, text, to_float64, to_int64,
};
use crate::context;

type Result<T> = std::result::Result<T, TemplateError>;

/// `atoi s`: Go's `strconv.Atoi`, with 0 for text that is not a decimal integer and the
/// nearest 64-bit integer for one out of range.
pub(super) fn atoi(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let s = a.str(0)?;
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Ok(Value::Int(0));
    }
    let n = s.parse::<i64>().unwrap_or(if s.starts_with('-') {
        i64::MIN
    } else {
        i64::MAX
    });
    Ok(Value::Int(n))
}

/// `int v` and `int64 v`: cast's conversion (see `to_int64`).
pub(super) fn int(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Int(to_int64(a.get(0))))
}

pub(super) fn float64(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Float(to_float64(a.get(0))))
}

/// `toDecimal v`: `v` printed, then read as an octal number (`toDecimal "0777"` is 511); 0
/// when it is not one.
pub(super) fn to_decimal(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let shown = strval(name, a.get(0))?;
    let (negative, digits) = match shown.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, shown.strip_prefix('+').unwrap_or(&shown)),
    };
    let n = i64::from_str_radix(digits, 8)
        .ok()
        .filter(|_| !digits.starts_with(['+', '-']))
        .map_or(0, |n| if negative { -n } else { n });
    Ok(Value::Int(n))
}

/// How many numbers `start, start+step, …` lie before `stop` (Sprig's `untilStep`).
fn step_count(start: i64, stop: i64, step: i64) -> u128 {
    let (start, stop, step) = (i128::from(start), i128::from(stop), i128::from(step));
    if stop < start {
        if step >= 0 {
            return 0;
        }
        ((start - stop + (-step) - 1) / (-step)) as u128
    } else {
        if step <= 0 {
            return 0;
        }
        ((stop - start + step - 1) / step) as u128
    }
}

fn step_values(name: &str, start: i64, stop: i64, step: i64) -> Result<Vec<i64>> {
    let count = step_count(start, stop, step);
    check_items(name, count)?;
    context::charge(name, count as u64)?;
    Ok((0..count as i64)
        .map(|i| start.wrapping_add(i.wrapping_mul(step)))
        .collect())
}

/// `until n`: the list 0, 1, … n-1 (or 0, -1, … for a negative `n`).
pub(super) fn until(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let count = a.int(0)?;
    let step = if count < 0 { -1 } else { 1 };
    let values = step_values(name, 0, count, step)?;
    new_list(name, values.into_iter().map(Value::Int).collect())
}

/// `untilStep start stop step`: start, start+step, … up to (not including) stop.
pub(super) fn until_step(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(3)?;
    let values = step_values(name, a.int(0)?, a.int(1)?, a.int(2)?)?;
    new_list(name, values.into_iter().map(Value::Int).collect())
}

/// `seq end`, `seq start end`, `seq start step end`: the numbers as text separated by
/// spaces, counting down when `end` is below `start`, as the Unix `seq` does.
pub(super) fn seq(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    let mut params = Vec::with_capacity(a.len());
    for i in 0..a.len() {
        params.push(a.int(i)?);
    }
    let values = match params[..] {
        [end] => {
            let step = if end < 1 { -1 } else { 1 };
            step_values(name, 1, end.saturating_add(step), step)?
        }
        [start, end] => {
            let step = if end < start { -1 } else { 1 };
            step_values(name, start, end.saturating_add(step), step)?
        }
        [start, step, end] => {
            let toward = if end < start { -1 } else { 1 };
            if end < start && step > 0 {
                Vec::new()
            } else {
                step_values(name, start, end.saturating_add(toward), step)?
            }
        }
        _ => Vec::new(),
    };
    check_len(name, values.len() as u128 * 21)?;
    let mut out = String::new();
    for (i, v) in values.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{v}");
    }
    text(name, out)
}

fn ints(a: &Args<'_>) -> impl Iterator<Item = i64> {
    a.values.iter().map(to_int64)
}

pub(super) fn add1(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Int(to_int64(a.get(0)).wrapping_add(1)))
}

pub(super) fn add(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    Ok(Value::Int(ints(&a).fold(0i64, i64::wrapping_add)))
}

pub(super) fn sub(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    Ok(Value::Int(
        to_int64(a.get(0)).wrapping_sub(to_int64(a.get(1))),
    ))
}

pub(super) fn mul(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    Ok(Value::Int(ints(&a).fold(1i64, i64::wrapping_mul)))
}

pub(super) fn div(name: &str, args: &[Value]) -> Result<Value> {
    integer_division(name, args, i64::wrapping_div)
}

pub(super) fn modulo(name: &str, args: &[Value]) -> Result<Value> {
    integer_division(name, args, i64::wrapping_rem)
}

/// `div` and `mod`: two integers, the second not zero (Go would panic).
fn integer_division(name: &str, args: &[Value], op: fn(i64, i64) -> i64) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(2)?;
    let (x, y) = (to_int64(a.get(0)), to_int64(a.get(1)));
    if y == 0 {
        return Err(fail(name, "division by zero"));
    }
    Ok(Value::Int(op(x, y)))
}

pub(super) fn max(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    Ok(Value::Int(ints(&a).max().unwrap_or(0)))
}

pub(super) fn min(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    Ok(Value::Int(ints(&a).min().unwrap_or(0)))
}

pub(super) fn floor(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Float(to_float64(a.get(0)).floor()))
}

pub(super) fn ceil(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    Ok(Value::Float(to_float64(a.get(0)).ceil()))
}

/// `round x places [threshold]`: `x` rounded to `places` decimals, up from a fraction of
/// `threshold` (0.5 unless given), as Sprig computes it.
pub(super) fn round(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.between(2, 3)?;
    let value = to_float64(a.get(0));
    let places = a.int(1)?;
    let threshold = match a.get(2) {
        Value::Nil if a.len() < 3 => 0.5,
        Value::Float(f) => *f,
        other => exact_int(other)
            .map(|n| n as f64)
            .ok_or_else(|| fail(name, "the 3rd argument must be a number"))?,
    };
    let pow = 10f64.powf(places as f64);
    let digit = pow * value;
    let fraction = digit.fract();
    let rounded = if fraction >= threshold {
        digit.ceil()
    } else {
        digit.floor()
    };
    Ok(Value::Float(rounded / pow))
}

/// An exact decimal `mantissa × 10^exponent`, as shopspring's `NewFromFloat` reads a float:
/// the shortest decimal that reads back as it.
#[derive(Clone, Copy)]
struct Decimal {
    mantissa: i128,
    exponent: i32,
}

impl Decimal {
    fn from_f64(f: f64) -> Option<Decimal> {
        if !f.is_finite() {
            return None;
        }
        let scientific = format!("{f:e}");
        let (digits, exponent) = scientific.split_once('e')?;
        let exponent: i32 = exponent.parse().ok()?;
        let fraction_digits = digits.split_once('.').map_or(0, |(_, f)| f.len()) as i32;
        let mantissa: i128 = digits.replace('.', "").parse().ok()?;
        Some(Decimal {
            mantissa,
            exponent: exponent - fraction_digits,
        })
    }

    fn to_f64(self) -> f64 {
        format!("{}e{}", self.mantissa, self.exponent)
            .parse()
            .unwrap_or(f64::NAN)
    }

    /// Both numbers with the smaller exponent, when the mantissas still fit.
    fn aligned(self, other: Decimal) -> Option<(i128, i128, i32)> {
        let exponent = self.exponent.min(other.exponent);
        let scale = |d: Decimal| {
            let shift = u32::try_from(d.exponent - exponent).ok()?;
            10i128.checked_pow(shift)?.checked_mul(d.mantissa)
        };
        Some((scale(self)?, scale(other)?, exponent))
    }

    fn add(self, other: Decimal) -> Option<Decimal> {
        let (a, b, exponent) = self.aligned(other)?;
        Some(Decimal {
            mantissa: a.checked_add(b)?,
            exponent,
        })
    }

    fn sub(self, other: Decimal) -> Option<Decimal> {
        let (a, b, exponent) = self.aligned(other)?;
        Some(Decimal {
            mantissa: a.checked_sub(b)?,
            exponent,
        })
    }

    fn mul(self, other: Decimal) -> Option<Decimal> {
        Some(Decimal {
            mantissa: self.mantissa.checked_mul(other.mantissa)?,
            exponent: self.exponent.checked_add(other.exponent)?,
        })
    }
}

/// Folds the arguments with `exact` on decimals, falling back to `float` on floats for numbers
/// too large for the decimal (beyond 38 digits).
fn decimal_fold(
    first: f64,
    rest: impl Iterator<Item = f64>,
    exact: fn(Decimal, Decimal) -> Option<Decimal>,
    float: fn(f64, f64) -> f64,
) -> f64 {
    let mut acc = first;
    for x in rest {
        acc = Decimal::from_f64(acc)
            .zip(Decimal::from_f64(x))
            .and_then(|(p, q)| exact(p, q))
            .map_or_else(|| float(acc, x), Decimal::to_f64);
    }
    acc
}

fn floats<'a>(a: &Args<'a>) -> impl Iterator<Item = f64> + 'a {
    a.values.iter().map(to_float64)
}

pub(super) fn add1f(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.exactly(1)?;
    let x = to_float64(a.get(0));
    Ok(Value::Float(decimal_fold(
        x,
        std::iter::once(1.0),
        Decimal::add,
        |p, q| p + q,
    )))
}

pub(super) fn addf(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    Ok(Value::Float(decimal_fold(
        0.0,
        floats(&a),
        Decimal::add,
        |p, q| p + q,
    )))
}

pub(super) fn subf(name: &str, args: &[Value]) -> Result<Value> {
    fold_from_first(name, args, Decimal::sub, |p, q| p - q)
}

pub(super) fn mulf(name: &str, args: &[Value]) -> Result<Value> {
    fold_from_first(name, args, Decimal::mul, |p, q| p * q)
}

/// `subf`/`mulf`: the first argument, then each of the others applied to it in turn.
fn fold_from_first(
    name: &str,
    args: &[Value],
    exact: fn(Decimal, Decimal) -> Option<Decimal>,
    float: fn(f64, f64) -> f64,
) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let mut all = floats(&a);
    let first = all.next().unwrap_or(0.0);
    Ok(Value::Float(decimal_fold(first, all, exact, float)))
}

/// `divf a b …`: a divided by each of the others. shopspring divides to 16 decimals; the float
/// quotient differs from that at most in the last digit.
pub(super) fn divf(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let mut all = floats(&a);
    let first = all.next().unwrap_or(0.0);
    let mut acc = first;
    for x in all {
        if x == 0.0 {
            return Err(fail(name, "division by zero"));
        }
        acc /= x;
    }
    Ok(Value::Float(acc))
}

/// Go's `math.Max`: NaN wins, and +0 is above -0.
fn go_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    if a == 0.0 && b == 0.0 {
        return if a.is_sign_negative() { b } else { a };
    }
    a.max(b)
}

fn go_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    if a == 0.0 && b == 0.0 {
        return if a.is_sign_negative() { a } else { b };
    }
    a.min(b)
}

pub(super) fn maxf(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let mut all = floats(&a);
    let first = all.next().unwrap_or(0.0);
    Ok(Value::Float(all.fold(first, go_max)))
}

pub(super) fn minf(name: &str, args: &[Value]) -> Result<Value> {
    let a = Args::new(name, args);
    a.at_least(1)?;
    let mut all = floats(&a);
    let first = all.next().unwrap_or(0.0);
    Ok(Value::Float(all.fold(first, go_min)))
}
