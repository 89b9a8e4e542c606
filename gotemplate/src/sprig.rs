//! The Sprig functions (and the few of Helm's that definitions use) on gotmpl values: Go's
//! conversion rules, bounded results, and messages that never show a value.
//!
//! Each function follows Sprig v3 as Go runs it: the conversions of `spf13/cast` for `int`,
//! `add` and friends, `fmt`'s `%v` for `toString` and `cat`, `encoding/json` for `toJson`,
//! `mergo` for `merge`. Arguments Go declares as `string` or `int` must be one (a missing key
//! passed as a string is an error, as in Go), except that an integer argument also accepts a
//! float without a fraction, since data read from JSON may hold one.
//!
//! Where gitplane differs from Go on purpose:
//! - `keys` and `values` return dict order (sorted by key) instead of Go's random order;
//! - values are immutable: `set`, `unset` and `merge` change the variable they are given (see
//!   `rewrite`), not every other reference to the same dict;
//! - functions that would allocate without bound (`repeat`, `until`, `indent`…) fail past
//!   [`MAX_VALUE_BYTES`] or [`MAX_LIST_ITEMS`];
//! - strings are UTF-8: where Go would cut a character in half (`substr`, `trunc`), the broken
//!   bytes become U+FFFD;
//! - integers in the data stay integers (Go's JSON decoding makes them floats, which `%v`
//!   prints as `1.2345678e+07`), so `typeOf` says `int` where Go may say `float64`, and lists
//!   and dicts are always `[]interface {}` and `map[string]interface {}`;
//! - Sprig's `slice` also takes a string, as Go's built-in does (Sprig's refuses one);
//! - `fromYaml` reads YAML 1.2 as the rest of gitplane (`yes` stays a string), and its error
//!   (in the `Error` key, as Helm) never quotes the text.
//!
//! The dates, key and certificate generators, `semver`, DNS lookups and `env` are left out on
//! purpose (see `UNSUPPORTED`): a template using one is refused when it is parsed.

mod builtins;
mod collections;
mod defaults;
mod encoding;
mod json;
mod numbers;
mod random;
mod regexes;
mod strings;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write as _};
use std::sync::{Arc, LazyLock};

use gotmpl::{FuncMap, TemplateError, Value};

use super::context;
use super::rewrite::{Known, SHOW_FUNCTION, STEP_FUNCTION, THEN_FUNCTION};

pub(super) use json::value_from_json;

/// The longest string a function may return, in bytes.
pub(super) const MAX_VALUE_BYTES: usize = 16 << 20;
/// The most items a list a function returns may hold.
pub(super) const MAX_LIST_ITEMS: usize = 1_000_000;
/// How deeply lists and dicts may nest, in data and in what functions build: deeper values
/// would exhaust the stack when printed or dropped.
pub(super) const MAX_DEPTH: usize = 128;

/// Starts every message a function of ours fails with, so that `mod.rs` can tell them from
/// gotmpl's own (which may quote a value) and show them as they are.
pub(super) const MESSAGE_MARK: &str = "\u{0}gitplane\u{0}";

/// A function of the table: its name (for messages, aliases share code) and its arguments.
pub(super) type Func = fn(&str, &[Value]) -> Result<Value, TemplateError>;

/// A failure of function `name` (of the template as a whole for an empty name). `message`
/// must not contain a value from the data.
pub(super) fn fail(name: &str, message: impl fmt::Display) -> TemplateError {
    if name.is_empty() {
        TemplateError::Exec(format!("{MESSAGE_MARK}{message}"))
    } else {
        TemplateError::Exec(format!("{MESSAGE_MARK}{name}: {message}"))
    }
}

/// Go's built-in functions, which gotmpl provides.
const GO_BUILTINS: [&str; 19] = [
    "and", "call", "html", "index", "slice", "js", "len", "not", "or", "print", "printf",
    "println", "urlquery", "eq", "ge", "gt", "le", "lt", "ne",
];

const DATES: &str = "gitplane's templates have no date functions, so that a template renders \
                     the same text from the same inputs (a date would change the outputs on \
                     every deployment); pass a date in driver_inputs if you need one";
const CRYPTO: &str = "gitplane's templates do not generate keys, certificates or password \
                      hashes; create them outside gitplane and pass them in as secrets";

/// Sprig's and Helm's functions that gitplane leaves out, with why.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("ago", DATES),
    ("date", DATES),
    ("date_in_zone", DATES),
    ("date_modify", DATES),
    ("dateInZone", DATES),
    ("dateModify", DATES),
    ("duration", DATES),
    ("durationRound", DATES),
    ("htmlDate", DATES),
    ("htmlDateInZone", DATES),
    ("must_date_modify", DATES),
    ("mustDateModify", DATES),
    ("mustToDate", DATES),
    ("now", DATES),
    ("toDate", DATES),
    ("unixEpoch", DATES),
    ("bcrypt", CRYPTO),
    ("htpasswd", CRYPTO),
    ("genPrivateKey", CRYPTO),
    ("derivePassword", CRYPTO),
    ("buildCustomCert", CRYPTO),
    ("genCA", CRYPTO),
    ("genCAWithKey", CRYPTO),
    ("genSelfSignedCert", CRYPTO),
    ("genSelfSignedCertWithKey", CRYPTO),
    ("genSignedCert", CRYPTO),
    ("genSignedCertWithKey", CRYPTO),
    ("encryptAES", CRYPTO),
    ("decryptAES", CRYPTO),
    (
        "semver",
        "semantic version functions are not implemented; compare versions outside the template",
    ),
    (
        "semverCompare",
        "semantic version functions are not implemented; compare versions outside the template",
    ),
    (
        "getHostByName",
        "templates may not look names up in DNS: rendering must not depend on the network",
    ),
    (
        "env",
        "a template may not read the environment of the gitplane daemon, which holds its \
         secrets; pass the value in driver_inputs instead",
    ),
    (
        "expandenv",
        "a template may not read the environment of the gitplane daemon, which holds its \
         secrets; pass the values in driver_inputs instead",
    ),
    (
        "include",
        "it is Helm's, not Sprig's; use {{ template \"name\" . }} instead",
    ),
    (
        "tpl",
        "it is Helm's: a template may not render text it computes as a template",
    ),
    ("lookup", "it is Helm's and reads a Kubernetes cluster"),
    ("toToml", "TOML is not implemented; use toYaml or toJson"),
    (
        "fromToml",
        "TOML is not implemented; use fromYaml or fromJson",
    ),
];

/// Every function gitplane adds to Go's built-ins.
const FUNCTIONS: &[(&str, Func)] = &[
    // Go's built-ins that build or compare text, replaced so that their work is bounded.
    ("print", builtins::print),
    ("println", builtins::println),
    ("printf", builtins::printf),
    ("html", builtins::escaper),
    ("js", builtins::escaper),
    ("urlquery", builtins::escaper),
    ("eq", builtins::eq),
    ("ne", builtins::ne),
    ("lt", builtins::compare),
    ("le", builtins::compare),
    ("gt", builtins::compare),
    ("ge", builtins::compare),
    // Strings.
    ("hello", strings::hello),
    ("abbrev", strings::abbrev),
    ("abbrevboth", strings::abbrevboth),
    ("trunc", strings::trunc),
    ("trim", strings::trim),
    ("upper", strings::upper),
    ("lower", strings::lower),
    ("title", strings::title),
    ("untitle", strings::untitle),
    ("substr", strings::substr),
    ("repeat", strings::repeat),
    ("trimall", strings::trim_all),
    ("trimAll", strings::trim_all),
    ("trimSuffix", strings::trim_suffix),
    ("trimPrefix", strings::trim_prefix),
    ("nospace", strings::nospace),
    ("initials", strings::initials),
    ("swapcase", strings::swapcase),
    ("snakecase", strings::snakecase),
    ("kebabcase", strings::kebabcase),
    ("camelcase", strings::camelcase),
    ("wrap", strings::wrap),
    ("wrapWith", strings::wrap_with),
    ("contains", strings::contains),
    ("hasPrefix", strings::has_prefix),
    ("hasSuffix", strings::has_suffix),
    ("quote", strings::quote),
    ("squote", strings::squote),
    ("cat", strings::cat),
    ("indent", strings::indent),
    ("nindent", strings::nindent),
    ("replace", strings::replace),
    ("plural", strings::plural),
    ("toString", strings::to_string),
    ("toStrings", strings::to_strings),
    ("split", strings::split),
    ("splitn", strings::splitn),
    ("splitList", strings::split_list),
    ("join", strings::join),
    ("sortAlpha", strings::sort_alpha),
    // Regular expressions.
    ("regexMatch", regexes::regex_match),
    ("mustRegexMatch", regexes::regex_match),
    ("regexFindAll", regexes::regex_find_all),
    ("mustRegexFindAll", regexes::regex_find_all),
    ("regexFind", regexes::regex_find),
    ("mustRegexFind", regexes::regex_find),
    ("regexReplaceAll", regexes::regex_replace_all),
    ("mustRegexReplaceAll", regexes::regex_replace_all),
    ("regexReplaceAllLiteral", regexes::regex_replace_all),
    ("mustRegexReplaceAllLiteral", regexes::regex_replace_all),
    ("regexSplit", regexes::regex_split),
    ("mustRegexSplit", regexes::regex_split),
    ("regexQuoteMeta", regexes::regex_quote_meta),
    // Random values.
    ("randAlphaNum", random::rand_string),
    ("randAlpha", random::rand_string),
    ("randNumeric", random::rand_string),
    ("randAscii", random::rand_string),
    ("randBytes", random::rand_bytes),
    ("randInt", random::rand_int),
    ("shuffle", random::shuffle),
    ("uuidv4", random::uuidv4),
    // Numbers.
    ("atoi", numbers::atoi),
    ("int", numbers::int),
    ("int64", numbers::int),
    ("float64", numbers::float64),
    ("toDecimal", numbers::to_decimal),
    ("seq", numbers::seq),
    ("until", numbers::until),
    ("untilStep", numbers::until_step),
    ("add1", numbers::add1),
    ("add", numbers::add),
    ("sub", numbers::sub),
    ("mul", numbers::mul),
    ("div", numbers::div),
    ("mod", numbers::modulo),
    ("max", numbers::max),
    ("biggest", numbers::max),
    ("min", numbers::min),
    ("floor", numbers::floor),
    ("ceil", numbers::ceil),
    ("round", numbers::round),
    ("add1f", numbers::add1f),
    ("addf", numbers::addf),
    ("subf", numbers::subf),
    ("mulf", numbers::mulf),
    ("divf", numbers::divf),
    ("maxf", numbers::maxf),
    ("minf", numbers::minf),
    // Defaults, flow and types.
    ("default", defaults::default),
    ("empty", defaults::empty),
    ("coalesce", defaults::coalesce),
    ("all", defaults::all),
    ("any", defaults::any),
    ("ternary", defaults::ternary),
    ("fail", defaults::fail_template),
    ("required", defaults::required),
    ("deepCopy", defaults::deep_copy),
    ("mustDeepCopy", defaults::deep_copy),
    ("deepEqual", defaults::deep_equal_fn),
    ("typeOf", defaults::type_of),
    ("typeIs", defaults::type_is),
    ("typeIsLike", defaults::type_is_like),
    ("kindOf", defaults::kind_of),
    ("kindIs", defaults::kind_is),
    (STEP_FUNCTION, defaults::step),
    (THEN_FUNCTION, defaults::then),
    (SHOW_FUNCTION, defaults::show),
    // Lists.
    ("list", collections::list),
    ("tuple", collections::list),
    ("first", collections::first),
    ("mustFirst", collections::first),
    ("last", collections::last),
    ("mustLast", collections::last),
    ("rest", collections::rest),
    ("mustRest", collections::rest),
    ("initial", collections::initial),
    ("mustInitial", collections::initial),
    ("append", collections::append),
    ("push", collections::append),
    ("mustAppend", collections::append),
    ("mustPush", collections::append),
    ("prepend", collections::prepend),
    ("mustPrepend", collections::prepend),
    ("concat", collections::concat),
    ("reverse", collections::reverse),
    ("mustReverse", collections::reverse),
    ("uniq", collections::uniq),
    ("mustUniq", collections::uniq),
    ("without", collections::without),
    ("mustWithout", collections::without),
    ("has", collections::has),
    ("mustHas", collections::has),
    ("compact", collections::compact),
    ("mustCompact", collections::compact),
    ("slice", collections::slice),
    ("mustSlice", collections::slice),
    ("chunk", collections::chunk),
    ("mustChunk", collections::chunk),
    // Dicts.
    ("dict", collections::dict),
    ("get", collections::get),
    ("set", collections::set),
    ("unset", collections::unset),
    ("hasKey", collections::has_key),
    ("pluck", collections::pluck),
    ("dig", collections::dig),
    ("keys", collections::keys),
    ("values", collections::values),
    ("pick", collections::pick),
    ("omit", collections::omit),
    ("merge", collections::merge),
    ("mustMerge", collections::merge),
    ("mergeOverwrite", collections::merge),
    ("mustMergeOverwrite", collections::merge),
    // JSON and YAML.
    ("toJson", json::to_json),
    ("mustToJson", json::to_json),
    ("toRawJson", json::to_json),
    ("mustToRawJson", json::to_json),
    ("toPrettyJson", json::to_json),
    ("mustToPrettyJson", json::to_json),
    ("fromJson", json::from_json),
    ("mustFromJson", json::from_json),
    ("fromJsonArray", json::from_json_array),
    ("toYaml", json::to_yaml),
    ("mustToYaml", json::to_yaml),
    ("fromYaml", json::from_yaml),
    ("fromYamlArray", json::from_yaml_array),
    // Encodings, hashes, URLs and paths.
    ("b64enc", encoding::b64enc),
    ("b64dec", encoding::b64dec),
    ("b32enc", encoding::b32enc),
    ("b32dec", encoding::b32dec),
    ("sha1sum", encoding::sha1sum),
    ("sha256sum", encoding::sha256sum),
    ("sha512sum", encoding::sha512sum),
    ("adler32sum", encoding::adler32sum),
    ("urlParse", encoding::url_parse),
    ("urlJoin", encoding::url_join),
    ("base", encoding::path_base),
    ("osBase", encoding::path_base),
    ("dir", encoding::path_dir),
    ("osDir", encoding::path_dir),
    ("clean", encoding::path_clean),
    ("osClean", encoding::path_clean),
    ("ext", encoding::path_ext),
    ("osExt", encoding::path_ext),
    ("isAbs", encoding::path_is_abs),
    ("osIsAbs", encoding::path_is_abs),
];

/// What a function call costs before its work: gotmpl evaluates and collects its arguments.
const CALL_STEPS: u64 = 8;

/// The functions to register on every template, built once.
pub(super) fn function_map() -> FuncMap {
    static MAP: LazyLock<FuncMap> = LazyLock::new(|| {
        let mut map = FuncMap::new();
        for &(name, func) in FUNCTIONS {
            map.insert(
                name.to_owned(),
                Arc::new(move |args: &[Value]| {
                    // gitplane's own calls (`_gitplane…`) are the template's work, not a function's.
                    let payer = if name.starts_with("_gitplane") {
                        ""
                    } else {
                        name
                    };
                    context::charge(payer, CALL_STEPS)?;
                    func(name, args)
                }),
            );
        }
        map
    });
    MAP.clone()
}

/// What gitplane knows of a function name.
pub(super) fn known(name: &str) -> Known {
    if GO_BUILTINS.contains(&name) || FUNCTIONS.iter().any(|&(n, _)| n == name) {
        Known::Function
    } else if let Some(&(_, why)) = UNSUPPORTED.iter().find(|&&(n, _)| n == name) {
        Known::Unsupported(why)
    } else {
        Known::Unknown
    }
}

/// The names of every function gitplane implements beyond Go's built-ins.
#[cfg(test)]
pub(super) fn implemented() -> impl Iterator<Item = &'static str> {
    FUNCTIONS.iter().map(|&(name, _)| name)
}

/// A function's arguments, read with Go's type rules and described in messages by their kind,
/// never their value.
#[derive(Clone, Copy)]
pub(super) struct Args<'a> {
    pub name: &'a str,
    pub values: &'a [Value],
}

impl<'a> Args<'a> {
    pub fn new(name: &'a str, values: &'a [Value]) -> Self {
        Args { name, values }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn exactly(&self, n: usize) -> Result<(), TemplateError> {
        self.between(n, n)
    }

    pub fn at_least(&self, n: usize) -> Result<(), TemplateError> {
        self.between(n, usize::MAX)
    }

    pub fn between(&self, min: usize, max: usize) -> Result<(), TemplateError> {
        let got = self.values.len();
        if (min..=max).contains(&got) {
            return Ok(());
        }
        let wanted = match (min, max) {
            (m, n) if m == n => plural(m, "argument"),
            (m, usize::MAX) => format!("at least {}", plural(m, "argument")),
            (m, n) => format!("{m} to {n} arguments"),
        };
        Err(fail(self.name, format!("takes {wanted}, got {got}")))
    }

    /// Argument `i` (0-based), nil when absent.
    pub fn get(&self, i: usize) -> &'a Value {
        static NIL: Value = Value::Nil;
        self.values.get(i).unwrap_or(&NIL)
    }

    fn wrong(&self, i: usize, wanted: &str) -> TemplateError {
        fail(
            self.name,
            format!(
                "the {} argument must be {wanted}, not {}",
                ordinal(i + 1),
                describe(self.get(i))
            ),
        )
    }

    pub fn str(&self, i: usize) -> Result<&'a str, TemplateError> {
        match self.get(i) {
            Value::String(s) => Ok(s),
            _ => Err(self.wrong(i, "a string")),
        }
    }

    pub fn int(&self, i: usize) -> Result<i64, TemplateError> {
        exact_int(self.get(i)).ok_or_else(|| self.wrong(i, "an integer"))
    }

    pub fn bool(&self, i: usize) -> Result<bool, TemplateError> {
        match self.get(i) {
            Value::Bool(b) => Ok(*b),
            _ => Err(self.wrong(i, "a bool")),
        }
    }

    /// A dict argument; nil (Go's nil map) is `None`.
    pub fn dict(&self, i: usize) -> Result<Option<&'a Dict>, TemplateError> {
        match self.get(i) {
            Value::Map(m) => Ok(Some(m)),
            Value::Nil => Ok(None),
            _ => Err(self.wrong(i, "a dict")),
        }
    }

    /// A list argument, as Sprig's list functions want one.
    pub fn list(&self, i: usize) -> Result<&'a [Value], TemplateError> {
        match self.get(i) {
            Value::List(items) => Ok(items),
            _ => Err(self.wrong(i, "a list")),
        }
    }
}

/// gotmpl's dict.
pub(super) type Dict = BTreeMap<Arc<str>, Value>;

/// `n` as an integer argument: an integer, or a float without a fraction.
pub(super) fn exact_int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::Uint(n) => i64::try_from(*n).ok(),
        Value::Float(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Some(*f as i64),
        _ => None,
    }
}

/// How messages name a value's kind.
pub(super) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Nil => "nil (a missing key?)",
        Value::Bool(_) => "a bool",
        Value::Int(_) | Value::Uint(_) => "an integer",
        Value::Float(_) => "a float",
        Value::String(_) => "a string",
        Value::List(_) => "a list",
        Value::Map(_) => "a dict",
        Value::Function(_) => "a function",
    }
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (1, 11) | (2, 12) | (3, 13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// A string result, refused past [`MAX_VALUE_BYTES`] and charged to the budget.
pub(super) fn text(name: &str, s: impl Into<String>) -> Result<Value, TemplateError> {
    let s = s.into();
    if s.len() > MAX_VALUE_BYTES {
        return Err(too_long(name));
    }
    // A step per 4 bytes made: the budget also bounds what a render allocates (about 120 MB).
    context::charge(name, 1 + s.len() as u64 / 4)?;
    Ok(Value::String(s.into()))
}

pub(super) fn too_long(name: &str) -> TemplateError {
    fail(
        name,
        format!(
            "the result would be longer than {} MiB",
            MAX_VALUE_BYTES >> 20
        ),
    )
}

/// Fails unless a string of `len` bytes may be built; call before building it.
pub(super) fn check_len(name: &str, len: u128) -> Result<(), TemplateError> {
    if len > MAX_VALUE_BYTES as u128 {
        return Err(too_long(name));
    }
    Ok(())
}

/// A list result, refused past [`MAX_LIST_ITEMS`] and charged to the budget.
pub(super) fn new_list(name: &str, items: Vec<Value>) -> Result<Value, TemplateError> {
    check_items(name, items.len() as u128)?;
    context::charge(name, 1 + 4 * items.len() as u64)?;
    Ok(Value::List(items.into()))
}

/// Fails unless a list of `count` items may be built; call before building it.
pub(super) fn check_items(name: &str, count: u128) -> Result<(), TemplateError> {
    if count > MAX_LIST_ITEMS as u128 {
        return Err(fail(
            name,
            format!("the list would have more than {MAX_LIST_ITEMS} items"),
        ));
    }
    Ok(())
}

/// A dict result, charged to the budget.
pub(super) fn new_dict(name: &str, dict: Dict) -> Result<Value, TemplateError> {
    context::charge(name, 1 + 8 * dict.len() as u64)?;
    Ok(Value::Map(Arc::new(dict)))
}

pub(super) fn string_list(name: &str, items: Vec<String>) -> Result<Value, TemplateError> {
    new_list(
        name,
        items.into_iter().map(|s| Value::String(s.into())).collect(),
    )
}

/// Fails if a list or dict holding `children` would nest deeper than [`MAX_DEPTH`].
pub(super) fn check_nesting<'v>(
    name: &str,
    children: impl IntoIterator<Item = &'v Value>,
) -> Result<(), TemplateError> {
    let mut memo = HashMap::new();
    let mut steps = 0u64;
    let deepest = children
        .into_iter()
        .map(|c| depth(c, &mut memo, &mut steps))
        .max()
        .unwrap_or(0);
    context::charge(name, steps)?;
    if deepest + 1 > MAX_DEPTH {
        return Err(fail(
            name,
            format!("the value would nest lists and dicts more than {MAX_DEPTH} levels deep"),
        ));
    }
    Ok(())
}

/// How many levels of lists and dicts `value` holds. Shared parts are measured once, so a
/// value built by doubling (`list $x $x`) costs its distinct parts, not its printed size.
fn depth(value: &Value, memo: &mut HashMap<*const (), usize>, steps: &mut u64) -> usize {
    let (key, children): (*const (), Box<dyn Iterator<Item = &Value>>) = match value {
        Value::List(items) => (Arc::as_ptr(items) as *const (), Box::new(items.iter())),
        Value::Map(dict) => (Arc::as_ptr(dict) as *const (), Box::new(dict.values())),
        _ => return 0,
    };
    if let Some(&known) = memo.get(&key) {
        return known;
    }
    let mut deepest = 0;
    for child in children {
        *steps += 1;
        deepest = deepest.max(depth(child, memo, steps));
    }
    memo.insert(key, deepest + 1);
    deepest + 1
}

/// A `fmt::Write` into a string that fails once the string would pass `limit` bytes.
pub(super) struct Limited {
    pub text: String,
    limit: usize,
    pub exceeded: bool,
}

impl Limited {
    pub fn new(limit: usize) -> Self {
        Limited {
            text: String::new(),
            limit,
            exceeded: false,
        }
    }
}

impl fmt::Write for Limited {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        if self.text.len() + s.len() > self.limit {
            self.exceeded = true;
            return Err(fmt::Error);
        }
        self.text.push_str(s);
        Ok(())
    }
}

/// Go's `fmt.Sprint` of one value (`%v`), as Sprig's `toString` writes it.
pub(super) fn write_go(out: &mut impl fmt::Write, value: &Value) -> fmt::Result {
    match value {
        Value::Nil => out.write_str("<nil>"),
        Value::Bool(b) => write!(out, "{b}"),
        Value::Int(n) => write!(out, "{n}"),
        Value::Uint(n) => write!(out, "{n}"),
        Value::Float(f) => out.write_str(&go_float(*f, FloatStyle::Print)),
        Value::String(s) => out.write_str(s),
        Value::List(items) => {
            out.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_char(' ')?;
                }
                write_go(out, item)?;
            }
            out.write_char(']')
        }
        Value::Map(dict) => {
            out.write_str("map[")?;
            for (i, (key, item)) in dict.iter().enumerate() {
                if i > 0 {
                    out.write_char(' ')?;
                }
                out.write_str(key)?;
                out.write_char(':')?;
                write_go(out, item)?;
            }
            out.write_char(']')
        }
        Value::Function(_) => out.write_str("<func>"),
    }
}

/// Sprig's `strval`: a string as it is, anything else as Go's `%v` prints it.
pub(super) fn strval<'v>(name: &str, value: &'v Value) -> Result<Cow<'v, str>, TemplateError> {
    if let Value::String(s) = value {
        return Ok(Cow::Borrowed(s));
    }
    let mut out = Limited::new(MAX_VALUE_BYTES);
    if write_go(&mut out, value).is_err() {
        return Err(too_long(name));
    }
    context::charge_bytes(name, out.text.len())?;
    Ok(Cow::Owned(out.text))
}

/// Which of Go's float formats to write.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum FloatStyle {
    /// `fmt`'s `%v` (and YAML's): shortest digits, exponent below 1e-4 and from 1e6.
    Print,
    /// `encoding/json`: shortest digits, exponent below 1e-6 and from 1e21, `e-7` not `e-07`.
    Json,
}

/// A float as Go writes it: `strconv.FormatFloat(f, 'g', -1, 64)` for [`FloatStyle::Print`],
/// `encoding/json`'s rule for [`FloatStyle::Json`] (the caller refuses NaN and infinities).
pub(super) fn go_float(f: f64, style: FloatStyle) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.into();
    }
    // Rust's `{:e}` gives the shortest digits that read back as `f`, as Go's `-1` precision.
    let scientific = format!("{:e}", f.abs());
    let (mantissa, exponent) = scientific
        .split_once('e')
        .unwrap_or((scientific.as_str(), "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let use_exponent = match style {
        // strconv's 'g' with the shortest precision decides with a precision of 6.
        FloatStyle::Print => !(-4..6).contains(&exponent),
        FloatStyle::Json => f != 0.0 && !(-6..21).contains(&exponent),
    };
    if use_exponent {
        let (first, rest) = digits.split_at(1.min(digits.len()));
        let fraction = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        let exp_digits = match style {
            FloatStyle::Print => format!("{:02}", exponent.abs()),
            FloatStyle::Json => exponent.abs().to_string(),
        };
        return format!("{sign}{first}{fraction}e{exp_sign}{exp_digits}");
    }
    // Plain decimal: Rust's `Display` writes the same shortest digits without an exponent.
    format!("{sign}{}", f.abs())
}

/// Go's `strconv.Quote`: a double-quoted string with Go's escapes.
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if is_go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

/// An approximation of Go's `strconv.IsPrint`: letters, marks, numbers, punctuation, symbols
/// and the ASCII space. Rust has no Unicode category tables in std, so control characters,
/// spaces other than ' ', format characters and surrogates' neighbours are what is excluded.
fn is_go_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(c,
        '\u{ad}'
        | '\u{600}'..='\u{605}'
        | '\u{61c}'
        | '\u{6dd}'
        | '\u{70f}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{e000}'..='\u{f8ff}'
        | '\u{f0000}'..='\u{10ffff}'
    )
}

/// Sprig's `empty`: nil, false, zero, and empty strings, lists and dicts.
pub(super) fn is_empty(value: &Value) -> bool {
    match value {
        Value::Nil => true,
        Value::Bool(b) => !b,
        Value::Int(n) => *n == 0,
        Value::Uint(n) => *n == 0,
        Value::Float(f) => *f == 0.0,
        Value::String(s) => s.is_empty(),
        Value::List(items) => items.is_empty(),
        Value::Map(dict) => dict.is_empty(),
        Value::Function(_) => false,
    }
}

/// Go's `reflect.DeepEqual` on template values: same kinds, same contents (an integer is never
/// equal to a float). Every node compared costs a step.
pub(super) fn deep_equal(name: &str, a: &Value, b: &Value) -> Result<bool, TemplateError> {
    fn walk(a: &Value, b: &Value, steps: &mut u64) -> bool {
        *steps += 1;
        // Past the whole budget the answer no longer matters: charging fails the render.
        if *steps > context::STEP_BUDGET {
            return false;
        }
        match (a, b) {
            (Value::Nil, Value::Nil) => true,
            (Value::Bool(x), Value::Bool(y)) => x == y,
            (Value::Int(x), Value::Int(y)) => x == y,
            (Value::Uint(x), Value::Uint(y)) => x == y,
            (Value::Float(x), Value::Float(y)) => x == y,
            (Value::String(x), Value::String(y)) => x == y,
            (Value::List(x), Value::List(y)) => {
                Arc::ptr_eq(x, y)
                    || (x.len() == y.len()
                        && x.iter().zip(y.iter()).all(|(p, q)| walk(p, q, steps)))
            }
            (Value::Map(x), Value::Map(y)) => {
                Arc::ptr_eq(x, y)
                    || (x.len() == y.len()
                        && x.iter()
                            .zip(y.iter())
                            .all(|((k1, v1), (k2, v2))| k1 == k2 && walk(v1, v2, steps)))
            }
            _ => false,
        }
    }
    let mut steps = 0;
    let equal = walk(a, b, &mut steps);
    context::charge(name, steps)?;
    Ok(equal)
}

/// `spf13/cast`'s `ToInt64`, which Sprig's arithmetic uses: numbers truncated, bools as 0 or 1,
/// strings parsed as Go integer literals (`0x1F`, `012` in octal, `1_000`; a decimal part is
/// dropped), anything else 0.
pub(super) fn to_int64(value: &Value) -> i64 {
    match value {
        Value::Int(n) => *n,
        Value::Uint(n) => *n as i64,
        // Go converts out-of-range floats to an unspecified value; Rust saturates.
        Value::Float(f) => *f as i64,
        Value::Bool(b) => i64::from(*b),
        Value::String(s) => parse_go_int(drop_decimal(s)).unwrap_or(0),
        _ => 0,
    }
}

/// `spf13/cast`'s `ToFloat64`.
pub(super) fn to_float64(value: &Value) -> f64 {
    match value {
        Value::Int(n) => *n as f64,
        Value::Uint(n) => *n as f64,
        Value::Float(f) => *f,
        Value::Bool(b) => f64::from(u8::from(*b)),
        Value::String(s) => parse_go_float(s).unwrap_or(0.0),
        _ => 0.0,
    }
}

/// cast's `trimDecimal`: `"12.50"` is read as `"12"`, `".5"` as `"0"`.
fn drop_decimal(s: &str) -> &str {
    let Some((whole, fraction)) = s.split_once('.') else {
        return s;
    };
    let digits = whole.strip_prefix(['+', '-']).unwrap_or(whole);
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return s;
    }
    if digits.is_empty() {
        return if whole.starts_with('-') { "-0" } else { "0" };
    }
    whole
}

/// Go's `strconv.ParseInt(s, 0, 64)`: an optional sign, then a Go integer literal.
pub(super) fn parse_go_int(s: &str) -> Option<i64> {
    let (negative, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits, prefixed) = if let Some(rest) = lower.strip_prefix("0x") {
        (16, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest, true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest, true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..], true)
    } else {
        (10, lower.as_str(), false)
    };
    // Underscores only between digits (or right after a base prefix), as in Go literals.
    if digits.contains('_') {
        let bytes = digits.as_bytes();
        let bad_start = bytes.first() == Some(&b'_') && !prefixed;
        if bad_start || bytes.last() == Some(&b'_') || digits.contains("__") {
            return None;
        }
    }
    let digits: String = digits.chars().filter(|c| *c != '_').collect();
    if digits.is_empty() {
        return None;
    }
    let magnitude = u64::from_str_radix(&digits, radix).ok()?;
    if negative {
        if magnitude == 1 << 63 {
            Some(i64::MIN)
        } else {
            i64::try_from(magnitude).ok().map(|m| -m)
        }
    } else {
        i64::try_from(magnitude).ok()
    }
}

/// Go's `strconv.ParseFloat(s, 64)`, for the forms real templates use.
pub(super) fn parse_go_float(s: &str) -> Option<f64> {
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let lower = body.to_ascii_lowercase();
    // Rust also reads "infinity" and "nan", as Go does; both refuse spaces and empty text.
    if lower.starts_with("0x") || lower.contains('_') {
        return None;
    }
    s.parse::<f64>().ok()
}
