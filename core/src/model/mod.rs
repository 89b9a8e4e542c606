//! The config repository as typed values: environments, Score workloads and Resource Definitions.
//!
//! [`load`] is a pure function of a commit's files: it parses every file, checks what can be
//! checked without building a graph, and returns every error it found, each with its file and
//! line, rather than stopping at the first.

pub mod placeholder;
pub mod template;
pub mod workload_update;
pub mod yaml;

mod files;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

pub use files::{CriterionFile, DriverInputsFile, ProvisionFile, octal_mode};
use placeholder::{Dialect, Expr, PlaceholderError};
use template::{Template, TemplateError};

/// The class a resource has when nobody names one.
pub const DEFAULT_CLASS: &str = "default";

/// `${context.org.id}` when `gitplane.yaml` sets no `org`: gitplane has no organisations, and
/// names built from the placeholder (`${context.org.id}-${context.app.id}`) still read well.
pub const DEFAULT_ORG: &str = "gitplane";

/// The share (percent) of an environment's resources a commit may delete before it is held.
pub const DEFAULT_DELETION_THRESHOLD: f64 = 50.0;

/// What a drift run of an environment does (`drift:` in its file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DriftMode {
    /// Re-apply the last good commit, calling every driver, so drivers repair what changed.
    #[default]
    Correct,
    /// Read each resource (or compare what was recorded) and record what differs; change
    /// nothing.
    Detect,
}

impl DriftMode {
    pub fn parse(text: &str) -> Result<DriftMode, String> {
        match text {
            "correct" => Ok(DriftMode::Correct),
            "detect" => Ok(DriftMode::Detect),
            _ => Err(format!(
                "drift '{}' is not a drift mode: write `correct` (re-apply on the schedule, the \
                 default) or `detect` (only record what differs)",
                text.chars().take(40).collect::<String>()
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DriftMode::Correct => "correct",
            DriftMode::Detect => "detect",
        }
    }
}

/// A cron schedule for drift runs, as written and as parsed.
#[derive(Debug, Clone)]
pub struct Schedule {
    pub text: String,
    pub cron: cron::Schedule,
}

impl Schedule {
    /// Parses the usual 5-field crontab form (a seconds field of `0` is prepended) or the
    /// 6/7-field form with seconds.
    ///
    /// Each field is checked here first, so that an error speaks of the expression as written:
    /// the cron crate sees the rewritten one and words its ranges its own way.
    ///
    /// The 5-field form counts the days of the week as crontab does (0 to 7, 0 and 7 both
    /// Sunday, so `1-5` is Monday to Friday); the cron crate counts 1 to 7 from Sunday, so
    /// those numbers are handed to it as day names. The 6/7-field form is the crate's own.
    pub fn parse(text: &str) -> Result<Schedule, String> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let crontab = [
            &CRON_FIELDS[1],
            &CRON_FIELDS[2],
            &CRON_FIELDS[3],
            &CRON_FIELDS[4],
            &CRONTAB_WEEKDAY,
        ];
        let own: Vec<&CronField> = CRON_FIELDS.iter().collect();
        let units: &[&CronField] = match fields.len() {
            5 => &crontab,
            6 | 7 => &own,
            n => {
                return Err(format!(
                    "schedule '{text}' has {n} field(s): write 5 ({CRON_SHAPE}), or 6 with \
                     seconds first"
                ));
            }
        };
        for (position, (field, unit)) in fields.iter().zip(units).enumerate() {
            if let Err(reason) = unit.check(field) {
                return Err(format!(
                    "schedule '{text}': the {} (field {}) {reason}; a schedule is \
                     {CRON_SHAPE}",
                    unit.name,
                    position + 1
                ));
            }
        }
        let full = if fields.len() == 5 {
            format!(
                "0 {} {} {} {} {}",
                fields[0],
                fields[1],
                fields[2],
                fields[3],
                crontab_weekdays(fields[4])
            )
        } else {
            text.to_owned()
        };
        full.parse::<cron::Schedule>()
            .map(|cron| Schedule {
                text: text.to_owned(),
                cron,
            })
            .map_err(|e| {
                // The crate's message quotes the rewritten expression with a caret line; its
                // last line is the reason.
                let message = e.to_string();
                let reason = message.lines().last().unwrap_or("").trim();
                format!(
                    "schedule '{text}' is not a cron expression gitplane understands \
                     ({reason}); a schedule is {CRON_SHAPE}"
                )
            })
    }
}

const CRON_SHAPE: &str = "minute hour day-of-month month day-of-week, such as \"0 3 * * *\" \
                          (every day at 03:00)";

const WEEKDAYS: [&str; 7] = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"];

/// A crontab day-of-week field (checked already) as the cron crate reads it: every number,
/// range and step written out as day names, which both count alike.
fn crontab_weekdays(field: &str) -> String {
    let items: Vec<String> = field
        .split(',')
        .map(|item| {
            let (base, step) = match item.split_once('/') {
                Some((base, step)) => (base, step.parse::<usize>().unwrap_or(1).max(1)),
                None => (item, 1),
            };
            if base == "*" || base == "?" {
                return item.to_owned();
            }
            let (from, to) = base.split_once('-').unwrap_or((base, base));
            match (CRONTAB_WEEKDAY.value(from), CRONTAB_WEEKDAY.value(to)) {
                (Ok(from), Ok(to)) if from <= to => (from..=to)
                    .step_by(step)
                    .map(|day| WEEKDAYS[day as usize % 7])
                    .collect::<Vec<_>>()
                    .join(","),
                // Left as written: the crate says what is wrong with it.
                _ => item.to_owned(),
            }
        })
        .collect();
    items.join(",")
}

/// The day of the week as crontab counts it: 0 to 7, 0 and 7 both Sunday.
const CRONTAB_WEEKDAY: CronField = CronField {
    name: "day of the week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

/// One field of a cron expression, as the scheduler (the cron crate) counts it.
struct CronField {
    name: &'static str,
    min: u32,
    max: u32,
    /// Names allowed instead of numbers (`JAN`, `MON`), lower-cased, from `min` on.
    names: &'static [&'static str],
}

const CRON_FIELDS: [CronField; 7] = [
    CronField {
        name: "second",
        min: 0,
        max: 59,
        names: &[],
    },
    CronField {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    CronField {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    CronField {
        name: "day of the month",
        min: 1,
        max: 31,
        names: &[],
    },
    CronField {
        name: "month",
        min: 1,
        max: 12,
        names: &[
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ],
    },
    CronField {
        name: "day of the week",
        min: 1,
        max: 7,
        names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    },
    CronField {
        name: "year",
        min: 1970,
        max: 2099,
        names: &[],
    },
];

impl CronField {
    /// `*`, `?`, `N`, `N-M`, each optionally `/STEP`, separated by commas.
    fn check(&self, field: &str) -> Result<(), String> {
        for item in field.split(',') {
            let (base, step) = match item.split_once('/') {
                Some((base, step)) => (base, Some(step)),
                None => (item, None),
            };
            if let Some(step) = step {
                match step.parse::<u32>() {
                    Ok(s) if s >= 1 => {}
                    _ => {
                        return Err(format!(
                            "has the step '/{step}': a step is a whole number of 1 or more, as in */15"
                        ));
                    }
                }
            }
            if base == "*" || base == "?" {
                continue;
            }
            let (from, to) = base.split_once('-').unwrap_or((base, base));
            for value in [from, to] {
                self.value(value)?;
            }
        }
        Ok(())
    }

    fn value(&self, value: &str) -> Result<u32, String> {
        let range = || {
            let names = match self.names.first().zip(self.names.last()) {
                Some((first, last)) => {
                    format!(" or {}-{}", first.to_uppercase(), last.to_uppercase())
                }
                None => String::new(),
            };
            let sunday = match (self.name, self.min) {
                ("day of the week", 0) => " (0 and 7 are Sunday)",
                ("day of the week", _) => " (1 is Sunday)",
                _ => "",
            };
            format!("from {} to {}{sunday}{names}", self.min, self.max)
        };
        if let Some(i) = self
            .names
            .iter()
            .position(|n| n.eq_ignore_ascii_case(value))
        {
            return Ok(self.min + i as u32);
        }
        match value.parse::<u32>() {
            Ok(n) if (self.min..=self.max).contains(&n) => Ok(n),
            Ok(n) => Err(format!("is {n}, but it runs {}", range())),
            Err(_) => Err(format!(
                "is '{value}', which is not a number {}, a range (1-5), a step (*/15) or a \
                 list (1,15)",
                range()
            )),
        }
    }
}

/// A place in the repository: file, and line and column where known.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SourceLocation {
    pub file: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
}

impl SourceLocation {
    pub fn file(file: impl Into<String>) -> Self {
        SourceLocation {
            file: file.into(),
            line: None,
            column: None,
        }
    }

    pub fn at(file: impl Into<String>, line: usize) -> Self {
        SourceLocation {
            file: file.into(),
            line: Some(line),
            column: None,
        }
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// Why a commit's files do not load.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{location}: {kind}")]
pub struct LoadError {
    pub location: SourceLocation,
    pub kind: LoadErrorKind,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadErrorKind {
    #[error("{0}")]
    Yaml(String),
    #[error("the file is not UTF-8 text: save it as UTF-8")]
    NotUtf8,
    #[error("{0}")]
    Invalid(String),
    #[error(
        "bad placeholder in '{path}' ({}): {}",
        text.as_deref().map(|t| format!("{t:?}")).unwrap_or_else(|| "value hidden: it is secret".into()),
        source.reason
    )]
    Placeholder {
        path: String,
        /// The string that holds the placeholder; `None` under `secrets`, which is never shown.
        text: Option<String>,
        source: PlaceholderError,
    },
    #[error("definition id '{id}' is already used in {first}")]
    DuplicateDefinition { id: String, first: SourceLocation },
    #[error(
        "definitions '{first}' ({first_location}) and '{second}' have equal criteria {criteria} \
         for type '{res_type}': make one rule more specific or remove it"
    )]
    EqualCriteria {
        res_type: String,
        criteria: String,
        first: String,
        first_location: SourceLocation,
        second: String,
    },
    #[error("workload '{name}' of app '{app}' is already defined in {first}")]
    DuplicateWorkload {
        app: String,
        name: String,
        first: String,
    },
    #[error("the repository has no environments: add a file environments/<id>.yaml")]
    NoEnvironments,
}

/// Everything a commit declares, checked and ready for the graph builder.
#[derive(Debug, Clone)]
pub struct Repository {
    /// What `${context.org.id}` reads: `org` in `gitplane.yaml`, else [`DEFAULT_ORG`].
    pub org: String,
    pub environments: Vec<Environment>,
    /// Apps by id, each with its workloads.
    pub apps: BTreeMap<String, App>,
    /// Each app's `workloads/<app>/values.yaml`, which its Score files read as `${values.KEY}`.
    pub values: BTreeMap<String, Arc<AppValues>>,
    pub definitions: Vec<Definition>,
}

/// `workloads/<app>/values.yaml`: the app's values (HPO's shared app values), which its Score
/// files read as `${values.KEY}`, and per environment the values that differ there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppValues {
    pub file: String,
    pub source: Arc<str>,
    pub values: BTreeMap<String, Value>,
    /// Environment id to the values it overrides.
    pub environments: BTreeMap<String, BTreeMap<String, Value>>,
}

impl AppValues {
    /// The value of `key` in environment `env`: its override, else the app's value.
    pub fn get(&self, env: &str, key: &str) -> Option<&Value> {
        self.environments
            .get(env)
            .and_then(|over| over.get(key))
            .or_else(|| self.values.get(key))
    }
}

impl Default for Repository {
    fn default() -> Self {
        Repository {
            org: DEFAULT_ORG.to_owned(),
            environments: Vec::new(),
            apps: BTreeMap::new(),
            values: BTreeMap::new(),
            definitions: Vec::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Environment {
    pub id: String,
    pub env_type: String,
    /// `None`: every app of the repository.
    pub apps: Option<Vec<String>>,
    /// Resource types every app gets in this environment, each with res_id equal to its type.
    pub implicit_resources: Vec<String>,
    /// Drift runs re-apply the last good commit on this schedule.
    pub schedule: Option<Schedule>,
    /// What a drift run does here: set right what changed, or only record it.
    pub drift: DriftMode,
    /// Resources the platform team declares for every app of the environment, by name.
    pub shared_resources: BTreeMap<String, SharedResource>,
    /// Percent of the recorded resources a commit may delete before it is held.
    pub deletion_threshold: f64,
    pub location: SourceLocation,
}

impl Environment {
    pub fn runs_app(&self, app: &str) -> bool {
        self.apps
            .as_ref()
            .is_none_or(|apps| apps.iter().any(|a| a == app))
    }
}

#[derive(Debug, Clone, Default)]
pub struct App {
    pub id: String,
    /// Workloads by name; shared with the parse cache, which keeps them for the next commit.
    pub workloads: BTreeMap<String, Arc<Workload>>,
}

/// A Score workload file.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: String,
    pub file: String,
    pub source: Arc<str>,
    /// The Score file's `metadata`, which `${metadata.KEY}` reads.
    pub metadata: Value,
    /// The whole Score file, with its placeholders; resolved, it is the workload's resource input.
    pub spec: Template<Expr>,
    /// Resource dependencies by name.
    pub resources: BTreeMap<String, ScoreResource>,
    /// The `containers.*.files` entries whose content is a file of the repository (`source`),
    /// read into `spec` once every file of the commit is known.
    pub file_sources: Vec<FileSource>,
}

/// A Score `files` entry whose content is read from the repository: `source`, relative to the
/// Score file, within the app's folder (what the app's fingerprint covers).
#[derive(Debug, Clone, PartialEq)]
pub struct FileSource {
    /// Where the entry is in the Score file: `containers`, the container, `files`, then the
    /// target (the mapping form) or the position (the older list form).
    pub at: Vec<template::Step>,
    /// The repository path `source` names.
    pub path: String,
    /// `noExpand: true`: the file's text is taken as it is, placeholders and all.
    pub no_expand: bool,
    pub location: SourceLocation,
}

#[derive(Debug, Clone)]
pub struct ScoreResource {
    pub res_type: String,
    pub class: String,
    /// `Some`: shared inside the app as `shared.<id>`.
    pub id: Option<String>,
    pub params: Value,
    /// How the request chooses what serves it, beyond type and class.
    pub choice: Choice,
    /// Older Score's `properties`: the outputs the workload reads, by name.
    pub properties: BTreeMap<String, Property>,
    pub location: SourceLocation,
}

/// One entry of an older Score file's `resources.NAME.properties` (score.dev before the
/// `params` era): how the workload reads output NAME.
///
/// `default` fills the output when the resource does not provide it (as score-compose filled a
/// missing variable with it); `secret` makes what reads it secret even when the resource gives
/// the output as a plain value. `required` changes nothing: an output that is missing and has
/// no default is always an error. `type` and `description` are documentation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Property {
    pub default: Option<Value>,
    pub secret: bool,
}

/// What a Score resource asks for, besides its type (docs/repository.md, "Choosing a definition").
/// Given in the resource's `metadata.annotations`, so the file stays valid Score.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Choice {
    /// Criteria matching on its class; with no class given, the type's default definition when
    /// no criteria match.
    #[default]
    Criteria,
    /// `gitplane.dev/selector: "k=v,k2=v2"`: a definition whose labels carry all of these.
    Labels(BTreeMap<String, String>),
    /// `gitplane.dev/class-ref: DEFINITION`: that definition, no matching.
    Definition(String),
    /// `gitplane.dev/resource-ref: NAME`: the environment's shared resource NAME (a global or a
    /// user-provided one); nothing is provisioned for this request itself.
    Resource(String),
    /// `gitplane.dev/interface: "name=$id,..."`: any resource whose outputs carry these `$id`s,
    /// whatever its type and output names (reuse before create); the workload reads each output
    /// under its own `name`.
    Interface(BTreeMap<String, String>),
}

/// The annotations a Score resource may carry for gitplane.
pub const SELECTOR_ANNOTATION: &str = "gitplane.dev/selector";
pub const CLASS_REF_ANNOTATION: &str = "gitplane.dev/class-ref";
pub const RESOURCE_REF_ANNOTATION: &str = "gitplane.dev/resource-ref";
pub const INTERFACE_ANNOTATION: &str = "gitplane.dev/interface";

/// An environment-level resource: a global one (provisioned by its definition, shared by every
/// app that refers to it) or a user-provided one (registered with its outputs, never
/// provisioned or deleted by gitplane).
#[derive(Debug, Clone, PartialEq)]
pub struct SharedResource {
    pub name: String,
    pub res_type: String,
    pub class: String,
    pub params: Value,
    /// `Some`: user-provided, with these outputs.
    pub provided: Option<Value>,
    /// For a user-provided resource: the `$id` of each output (output name to `$id`).
    pub provides: BTreeMap<String, String>,
    pub location: SourceLocation,
}

/// The account a definition's resources are provisioned with (`driver_account`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DriverAccount {
    /// An account the host config names.
    Named(String),
    /// `${resources.DESC.account}`: the account of the resource DESC names, as that resource's
    /// definition gives it (HPO's way to choose the cloud account per environment with one
    /// `config` resource). The referencing resource depends on it.
    Of {
        desc: placeholder::Descriptor,
        /// As written, for messages.
        written: String,
    },
}

/// A Resource Definition (Humanitec format).
#[derive(Debug, Clone)]
pub struct Definition {
    pub id: String,
    pub name: String,
    pub res_type: String,
    pub driver_type: String,
    pub driver_account: Option<DriverAccount>,
    pub deletion_policy: crate::records::DeletionPolicy,
    /// `false`: resources keep the values they were last bound to until `gitplane resolve`.
    pub auto_update: bool,
    /// Ordering-only dependencies: provisioned first, never read.
    pub depends_on: Vec<DependsOn>,
    /// `metadata.labels`: what label selectors match.
    pub labels: BTreeMap<String, String>,
    /// Breaks ties among definitions a selector chooses from: higher wins.
    pub weight: i64,
    /// Serves requests of its type that name no class and match no criteria.
    pub default: bool,
    /// The `$id` of each output its resources provide (output name to `$id`), for requests by
    /// interface.
    pub provides: BTreeMap<String, String>,
    pub values: Template<Expr>,
    pub secrets: Template<Expr>,
    pub provision: Vec<Provision>,
    pub criteria: Vec<Criterion>,
    pub location: SourceLocation,
    /// The text of this definition's YAML document, to point errors at the right line.
    pub source: Arc<str>,
    /// Line of the document's first line in its file, minus one.
    pub line_offset: usize,
}

impl Definition {
    /// Where this definition writes `ref: REFERENCE` (a stored secret), or the definition
    /// itself.
    pub fn locate_store_ref(&self, reference: &str) -> SourceLocation {
        match line_of_key_value(&self.source, "ref", reference) {
            Some(line) => SourceLocation::at(&self.location.file, line + self.line_offset),
            None => self.locate(reference),
        }
    }

    /// Where `needle` first appears in this definition, or the definition itself.
    pub fn locate(&self, needle: &str) -> SourceLocation {
        match line_of(&self.source, needle) {
            Some(line) => SourceLocation::at(&self.location.file, line + self.line_offset),
            None => self.location.clone(),
        }
    }
}

/// `depends_on: ["TYPE[.CLASS][#ID]"]`: class and id default to the depending resource's.
#[derive(Debug, Clone)]
pub struct DependsOn {
    pub key: String,
    pub res_type: String,
    pub class: Option<String>,
    pub id: Option<String>,
}

/// A co-provisioned resource: `provision: {"TYPE[.CLASS][#ID]": {...}}`.
#[derive(Debug, Clone)]
pub struct Provision {
    pub key: String,
    pub res_type: String,
    pub class: Option<String>,
    pub id: Option<String>,
    pub is_dependent: bool,
    pub match_dependents: bool,
    pub params: Value,
}

/// One matching rule. Fields left out match anything; a missing class means `default`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Criterion {
    pub res_id: Option<String>,
    pub env_id: Option<String>,
    pub app_id: Option<String>,
    pub env_type: Option<String>,
    pub class: String,
}

impl fmt::Display for Criterion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut fields = Vec::new();
        for (name, value) in [
            ("app_id", &self.app_id),
            ("env_id", &self.env_id),
            ("env_type", &self.env_type),
            ("res_id", &self.res_id),
        ] {
            if let Some(v) = value {
                fields.push(format!("{name}: {v}"));
            }
        }
        fields.push(format!("class: {}", self.class));
        write!(f, "{{{}}}", fields.join(", "))
    }
}

/// The first line (1-based) of `source` that contains `needle`.
pub fn line_of(source: &str, needle: &str) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    let first_line_of_needle = needle.lines().next().unwrap_or(needle);
    let is_comment = |l: &str| l.trim_start().starts_with('#');
    // A comment that mentions the needle is not where it is set.
    source
        .lines()
        .position(|l| !is_comment(l) && l.contains(first_line_of_needle))
        .or_else(|| {
            source
                .lines()
                .position(|l| l.contains(first_line_of_needle))
        })
        .map(|i| i + 1)
}

/// The 1-based line where `key: value` is written, in block (`key: value`) or flow
/// (`{key: value}`) style, the value plain or quoted, and not merely a prefix of a longer one.
pub fn line_of_key_value(source: &str, key: &str, value: &str) -> Option<usize> {
    let prefix = format!("{key}:");
    source
        .lines()
        .position(|line| {
            if line.trim_start().starts_with('#') {
                return false;
            }
            line.match_indices(&prefix).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-') {
                    return false;
                }
                let rest = line[at + prefix.len()..].trim_start();
                let written = match rest.chars().next() {
                    Some(q @ ('\'' | '"')) => rest[1..].split(q).next().unwrap_or(""),
                    _ => rest
                        .split([',', '}'])
                        .next()
                        .unwrap_or("")
                        .split(" #")
                        .next()
                        .unwrap_or("")
                        .trim_end(),
                };
                written == value
            })
        })
        .map(|i| i + 1)
}

/// A commit's files as [`load`] reads them: contents by repository path, and the symbolic links
/// found where gitplane reads files (which it does not follow, and reports).
pub trait Sources {
    fn contents(&self) -> &BTreeMap<String, Vec<u8>>;
    /// Repository path of each symbolic link to the target it names.
    fn links(&self) -> &BTreeMap<String, String>;
}

/// Files without links, as tests and benchmarks build them.
impl Sources for BTreeMap<String, Vec<u8>> {
    fn contents(&self) -> &BTreeMap<String, Vec<u8>> {
        self
    }

    fn links(&self) -> &BTreeMap<String, String> {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        &NONE
    }
}

/// Loads every file of a commit.
pub fn load<S: Sources + ?Sized>(files: &S) -> Result<Repository, Vec<LoadError>> {
    let contents = files.contents();
    let limits = files::limits_of(contents);
    let mut loader = files::Loader::default();
    for (path, bytes) in contents {
        loader.absorb(files::parse_file(path, bytes, limits));
    }
    loader.read_sources(contents);
    loader.absorb_links(files.links());
    loader.finish()
}

/// Parsed files of the last commit loaded, so the next commit parses only what changed.
///
/// Each file parses on its own (what spans files, such as unique definition ids, is checked
/// after), so a file whose contents did not change parses to the same thing: the environments
/// of one commit, and the next commit, parse each definition once. The limits of
/// `gitplane.yaml` are part of the key: a file that fit the old ones may not fit new ones.
#[derive(Debug, Default)]
pub struct LoadCache {
    files: std::collections::HashMap<String, (Vec<u8>, yaml::Limits, files::ParsedFile)>,
}

impl LoadCache {
    /// Forgets the parsed workload files, keeping what every load reads (definitions,
    /// environments, settings). A later commit reads only the workloads it changed, so a
    /// long-running process need not keep thousands of parsed workloads between commits.
    pub fn forget_workloads(&mut self) {
        self.files.retain(|path, _| !path.starts_with("workloads/"));
    }
}

/// [`load`], reusing and refreshing `cache`.
pub fn load_cached<S: Sources + ?Sized>(
    files: &S,
    cache: &mut LoadCache,
) -> Result<Repository, Vec<LoadError>> {
    let contents = files.contents();
    let limits = files::limits_of(contents);
    let mut loader = files::Loader::default();
    let mut next = std::collections::HashMap::with_capacity(contents.len());
    let mut known = Vec::with_capacity(contents.len());
    let mut unknown = Vec::new();
    for (path, bytes) in contents {
        match cache.files.remove(path) {
            Some((old, old_limits, parsed)) if old == *bytes && old_limits == limits => {
                known.push((path, parsed))
            }
            _ => unknown.push((path, bytes)),
        }
    }
    let parsed = parse_all(&unknown, limits);
    // Files are absorbed in path order, whichever were parsed now.
    let mut all: Vec<(&String, files::ParsedFile)> = known.into_iter().chain(parsed).collect();
    all.sort_by(|a, b| a.0.cmp(b.0));
    for (path, parsed) in all {
        loader.absorb(parsed.clone());
        next.insert(path.clone(), (contents[path].clone(), limits, parsed));
    }
    cache.files = next;
    loader.read_sources(contents);
    loader.absorb_links(files.links());
    loader.finish()
}

/// Parses files, on every core when there are many: files parse independently.
fn parse_all<'p>(
    unknown: &[(&'p String, &Vec<u8>)],
    limits: yaml::Limits,
) -> Vec<(&'p String, files::ParsedFile)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 || unknown.len() < 64 {
        return unknown
            .iter()
            .map(|(path, bytes)| (*path, files::parse_file(path, bytes, limits)))
            .collect();
    }
    let chunk = unknown.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let workers: Vec<_> = unknown
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|(path, bytes)| (*path, files::parse_file(path, bytes, limits)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("parsing a file does not panic"))
            .collect()
    })
}

pub(crate) fn placeholder_errors<'s>(
    file: &'s str,
    source: &'s str,
    line_offset: usize,
    errors: Vec<TemplateError>,
) -> impl Iterator<Item = LoadError> + 's {
    errors.into_iter().map(move |e| {
        // Point at the bad placeholder itself: the string's line, and its column in that line
        // plus the placeholder's column in the string.
        let found = source.lines().enumerate().find_map(|(i, line)| {
            line.find(e.text.as_str())
                .map(|byte| (i + 1, line[..byte].chars().count()))
        });
        let (line, column) = match found {
            Some((line, before)) => (Some(line + line_offset), Some(before + e.error.column)),
            None => (line_of(source, &e.text).map(|l| l + line_offset), None),
        };
        LoadError {
            location: SourceLocation {
                file: file.to_owned(),
                line,
                column,
            },
            kind: LoadErrorKind::Placeholder {
                text: (!e.path.starts_with("driver_inputs.secrets")).then_some(e.text),
                path: e.path,
                source: e.error,
            },
        }
    })
}

pub(crate) fn parse_template(
    value: &Value,
    dialect: Dialect,
    path: &str,
    errors: &mut Vec<TemplateError>,
) -> Template<Expr> {
    Template::parse(value, dialect, path, errors)
}
