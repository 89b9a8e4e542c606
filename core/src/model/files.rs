//! The file formats as serde types, and the loader that turns files into a [`Repository`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use super::placeholder::{Dialect, Expr, ParsedString, StoreRef, parse_string};
use super::yaml::{self, Doc, Limits};
use super::{
    App, Criterion, DEFAULT_CLASS, Definition, Environment, LoadError, LoadErrorKind, Provision,
    Repository, ScoreResource, SourceLocation, Template, Workload, line_of, parse_template,
    placeholder_errors,
};

const SCORE_API_VERSION: &str = "score.dev/v1b1";
const DEFINITION_API_VERSION: &str = "entity.humanitec.io/v1b1";
const SCORE_KIND: &str = "a Score workload file";
/// `gitplane.yaml` is read with the default limits: it is where they are changed.
const SETTINGS_KIND: &str = "gitplane.yaml";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvironmentFile {
    id: Option<String>,
    #[serde(rename = "type")]
    env_type: String,
    apps: Option<Vec<String>>,
    implicit_resources: Option<Vec<String>>,
    /// A cron expression for drift runs (5 fields, or 6 with seconds); `null` for none, even
    /// when `gitplane.yaml` gives a default.
    #[serde(default, deserialize_with = "present")]
    schedule: Option<Option<String>>,
    /// What a drift run does: `correct` (re-apply, the default) or `detect` (only record).
    drift: Option<String>,
    deletion_guard: Option<DeletionGuardFile>,
    /// Resources shared by every app of the environment, by name.
    #[serde(default)]
    shared_resources: BTreeMap<String, SharedResourceFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SharedResourceFile {
    #[serde(rename = "type")]
    res_type: String,
    class: Option<String>,
    #[serde(default)]
    params: Option<Value>,
    /// User-provided: the outputs of a resource gitplane never provisions.
    #[serde(default)]
    provided: Option<Value>,
    /// The `$id` of each output, for requests by interface.
    #[serde(default)]
    provides: BTreeMap<String, String>,
}

/// A key that is present, even as `null`, is `Some`: `null` can then say "none" where leaving
/// the key out says "the default".
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// `gitplane.yaml`: repository-wide settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    /// What `${context.org.id}` reads (gitplane has no organisations).
    org: Option<String>,
    environment_defaults: Option<EnvironmentDefaultsFile>,
    limits: Option<LimitsFile>,
}

/// `limits:` in `gitplane.yaml`: how large a file, and a string in one, may be.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    file_size: Option<SizeFile>,
    value_size: Option<SizeFile>,
}

/// `65536` or `64KiB`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SizeFile {
    Bytes(u64),
    Text(String),
}

/// Where the limits are set, for messages.
const FILE_SIZE_SETTING: &str = "limits.file_size in gitplane.yaml";
const VALUE_SIZE_SETTING: &str = "limits.value_size in gitplane.yaml";

/// What every environment file gets unless it says otherwise.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvironmentDefaultsFile {
    implicit_resources: Option<Vec<String>>,
    schedule: Option<String>,
    drift: Option<String>,
    deletion_guard: Option<DeletionGuardFile>,
}

/// `gitplane.yaml`'s `environment_defaults`, checked.
#[derive(Debug, Clone, Default)]
pub(super) struct EnvironmentDefaults {
    implicit_resources: Option<Vec<String>>,
    schedule: Option<super::Schedule>,
    drift: Option<super::DriftMode>,
    threshold: Option<f64>,
}

/// Which settings an environment file gives itself, so that defaults fill only the others.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Explicit {
    implicit_resources: bool,
    schedule: bool,
    drift: bool,
    threshold: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeletionGuardFile {
    /// Hold a commit that would delete more than this share (percent) of the environment.
    threshold: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ScoreFile {
    api_version: String,
    metadata: ScoreMetadata,
    containers: BTreeMap<String, Value>,
    #[serde(default)]
    service: Option<Value>,
    #[serde(default)]
    resources: BTreeMap<String, ScoreResourceFile>,
}

#[derive(Debug, Deserialize)]
struct ScoreMetadata {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoreResourceFile {
    #[serde(rename = "type")]
    res_type: String,
    class: Option<String>,
    id: Option<String>,
    #[serde(default)]
    metadata: Option<Value>,
    #[serde(default)]
    params: Option<Value>,
    /// Older Score: the outputs the workload reads, each with its default and secrecy.
    #[serde(default)]
    properties: Option<BTreeMap<String, Option<PropertyFile>>>,
}

/// One entry of older Score's `resources.NAME.properties`; see [`super::Property`].
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PropertyFile {
    /// Documentation only, as in the Score specification of the time.
    #[serde(rename = "type")]
    #[allow(dead_code)]
    kind: Option<String>,
    #[allow(dead_code)]
    description: Option<String>,
    default: Option<Value>,
    /// Changes nothing: a missing output without a default is always an error.
    #[serde(default)]
    #[allow(dead_code)]
    required: bool,
    #[serde(default)]
    secret: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DefinitionFile {
    api_version: String,
    kind: String,
    metadata: DefinitionMetadata,
    entity: EntityFile,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefinitionMetadata {
    id: String,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntityFile {
    name: Option<String>,
    #[serde(rename = "type")]
    res_type: String,
    driver_type: String,
    driver_account: Option<String>,
    #[serde(default)]
    driver_inputs: DriverInputsFile,
    #[serde(default)]
    provision: BTreeMap<String, ProvisionFile>,
    #[serde(default, deserialize_with = "criteria_list")]
    criteria: Vec<CriterionFile>,
    /// `orphan`: forget its resources when they leave the graph instead of deleting them.
    deletion_policy: Option<String>,
    /// `false`: its resources keep the values they were last bound to until `gitplane resolve`.
    auto_update: Option<bool>,
    /// Resources to provision first without reading them: `TYPE[.CLASS][#ID]`.
    #[serde(default)]
    depends_on: Vec<String>,
    /// Breaks ties among definitions a label selector chooses from; higher wins.
    weight: Option<i64>,
    /// Serves requests of its type that name no class and match no criteria.
    #[serde(default)]
    default: bool,
    /// The `$id` of each output (output name to `$id`), for requests by interface.
    #[serde(default)]
    provides: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverInputsFile {
    #[serde(default)]
    pub values: Option<Value>,
    #[serde(default)]
    pub secrets: Option<Value>,
    #[serde(default)]
    pub secret_refs: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionFile {
    #[serde(default)]
    pub is_dependent: bool,
    #[serde(default)]
    pub match_dependents: bool,
    #[serde(default)]
    pub params: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriterionFile {
    /// Humanitec exports carry an id per rule; it plays no part in matching.
    #[serde(default)]
    pub id: Option<String>,
    pub app_id: Option<String>,
    pub env_id: Option<String>,
    pub env_type: Option<String>,
    pub res_id: Option<String>,
    pub class: Option<String>,
}

/// Accumulates files and errors; see [`super::load`].
#[derive(Default)]
pub(super) struct Loader {
    /// What every file but `gitplane.yaml` is held to (that one is read with the defaults).
    limits: Limits,
    repo: Repository,
    /// One per `repo.environments`, in the same order.
    explicit: Vec<Explicit>,
    defaults: Option<EnvironmentDefaults>,
    /// `org` in `gitplane.yaml`.
    org: Option<String>,
    errors: Vec<LoadError>,
    definition_ids: HashMap<String, SourceLocation>,
    workload_files: HashMap<(String, String), String>,
}

/// What one file declares, parsed on its own: the unit [`super::LoadCache`] keeps.
#[derive(Debug, Clone, Default)]
pub(super) struct ParsedFile {
    environments: Vec<(Environment, Explicit)>,
    defaults: Option<EnvironmentDefaults>,
    org: Option<String>,
    workloads: Vec<(String, Arc<Workload>)>,
    values: Vec<(String, Arc<super::AppValues>)>,
    definitions: Vec<Definition>,
    errors: Vec<LoadError>,
}

/// The limits `gitplane.yaml` (or `gitplane.yml`) sets for the other files; the defaults when it
/// sets none or does not load (its errors are reported when it is parsed as a file).
pub(super) fn limits_of(files: &BTreeMap<String, Vec<u8>>) -> Limits {
    let Some((path, bytes)) = ["gitplane.yaml", "gitplane.yml"]
        .iter()
        .find_map(|p| files.get_key_value(*p))
    else {
        return Limits::default();
    };
    let mut probe = Loader::default();
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Limits::default();
    };
    if Limits::default()
        .check_file(bytes, Some(FILE_SIZE_SETTING))
        .is_err()
    {
        return Limits::default();
    }
    probe.settings(path, text);
    probe.limits
}

/// Parses one file, with no knowledge of the others but the limits `gitplane.yaml` sets.
pub(super) fn parse_file(path: &str, bytes: &[u8], limits: Limits) -> ParsedFile {
    let mut single = Loader {
        limits,
        ..Loader::default()
    };
    single.file(path, bytes);
    let workloads = single
        .repo
        .apps
        .into_iter()
        .flat_map(|(app, a)| a.workloads.into_values().map(move |w| (app.clone(), w)))
        .collect();
    ParsedFile {
        environments: single
            .repo
            .environments
            .into_iter()
            .zip(single.explicit)
            .collect(),
        defaults: single.defaults,
        org: single.org,
        workloads,
        values: single.repo.values.into_iter().collect(),
        definitions: single.repo.definitions,
        errors: single.errors,
    }
}

impl Loader {
    /// Adds one parsed file, checking what spans files: unique definition ids and workload
    /// names.
    pub(super) fn absorb(&mut self, parsed: ParsedFile) {
        self.errors.extend(parsed.errors);
        for (env, explicit) in parsed.environments {
            self.repo.environments.push(env);
            self.explicit.push(explicit);
        }
        if parsed.defaults.is_some() {
            self.defaults = parsed.defaults;
        }
        if parsed.org.is_some() {
            self.org = parsed.org;
        }
        self.repo.values.extend(parsed.values);
        for (app, workload) in parsed.workloads {
            if let Some(first) = self
                .workload_files
                .insert((app.clone(), workload.name.clone()), workload.file.clone())
            {
                self.error(
                    SourceLocation::file(&workload.file),
                    LoadErrorKind::DuplicateWorkload {
                        app: app.clone(),
                        name: workload.name.clone(),
                        first,
                    },
                );
                continue;
            }
            self.repo
                .apps
                .entry(app.clone())
                .or_insert_with(|| App {
                    id: app.clone(),
                    workloads: BTreeMap::new(),
                })
                .workloads
                .insert(workload.name.clone(), workload);
        }
        for def in parsed.definitions {
            if let Some(first) = self.definition_ids.get(&def.id) {
                let first = first.clone();
                self.error(
                    def.location.clone(),
                    LoadErrorKind::DuplicateDefinition {
                        id: def.id.clone(),
                        first,
                    },
                );
                continue;
            }
            self.definition_ids
                .insert(def.id.clone(), def.location.clone());
            self.repo.definitions.push(def);
        }
    }

    /// Reads each workload's `files[].source` from the commit's `contents` into its spec (as
    /// the entry's `content`); a source the commit does not hold is an error at the Score
    /// file's line. Done after the files are absorbed: a source file may change while the
    /// Score file, and so its cached parse, does not.
    pub(super) fn read_sources(&mut self, contents: &BTreeMap<String, Vec<u8>>) {
        use super::template::Step;
        let mut errors = Vec::new();
        for app in self.repo.apps.values_mut() {
            for workload in app.workloads.values_mut() {
                if workload.file_sources.is_empty() {
                    continue;
                }
                let workload = Arc::make_mut(workload);
                for source in &workload.file_sources {
                    let Some(bytes) = contents.get(&source.path) else {
                        errors.push(LoadError {
                            location: source.location.clone(),
                            kind: LoadErrorKind::Invalid(format!(
                                "files source names {}, which is not in the repository at this \
                                 commit (score-compose refuses it too): commit the file, or fix \
                                 the path (relative to the Score file)",
                                source.path
                            )),
                        });
                        continue;
                    };
                    let Ok(text) = std::str::from_utf8(bytes) else {
                        errors.push(LoadError {
                            location: source.location.clone(),
                            kind: LoadErrorKind::Invalid(format!(
                                "files source {} is not UTF-8 text: give binary files as \
                                 `binaryContent` (base64)",
                                source.path
                            )),
                        });
                        continue;
                    };
                    let content = Value::String(text.to_owned());
                    let leaf = if source.no_expand {
                        Template::Value(content)
                    } else {
                        let mut template_errors = Vec::new();
                        let leaf = parse_template(
                            &content,
                            Dialect::Score,
                            &source.path,
                            &mut template_errors,
                        );
                        errors.extend(placeholder_errors(&source.path, text, 0, template_errors));
                        leaf
                    };
                    let mut at = source.at.clone();
                    at.push(Step::Key("content".into()));
                    workload.spec.graft_at(&at, leaf);
                }
            }
        }
        self.errors.extend(errors);
    }

    /// Reports the symbolic links of the folders gitplane reads. None is followed: a link out
    /// of the repository names a file the commit does not hold, and a link inside it would let
    /// a file change without its own path changing, which the work-follows-the-change
    /// fingerprints cannot see.
    pub(super) fn absorb_links(&mut self, links: &BTreeMap<String, String>) {
        for (path, target) in links {
            let name = path.rsplit('/').next().unwrap_or(path);
            // A link named like a document, or like a folder; `README.md -> ...` is not read.
            let read = name.ends_with(".yaml") || name.ends_with(".yml") || !name.contains('.');
            if !read {
                continue;
            }
            let shown: String = target.chars().take(200).collect();
            let reason = if link_leaves_repository(path, target) {
                format!(
                    "a symbolic link to '{shown}', which is outside the repository: gitplane \
                     reads files from the commit and cannot follow it; commit the file itself \
                     at this path"
                )
            } else {
                format!(
                    "a symbolic link to '{shown}': gitplane does not follow links (a change to \
                     the target would not be seen as a change here); commit the file itself at \
                     this path, or remove the link"
                )
            };
            self.error(SourceLocation::file(path), LoadErrorKind::Invalid(reason));
        }
    }

    fn file(&mut self, path: &str, bytes: &[u8]) {
        if !(path.ends_with(".yaml") || path.ends_with(".yml")) {
            return;
        }
        let parts: Vec<&str> = path.split('/').collect();
        let kind = match parts.as_slice() {
            ["gitplane.yaml" | "gitplane.yml"] => FileKind::Settings,
            ["environments", _] => FileKind::Environment,
            ["workloads", app, "values.yaml" | "values.yml"] => {
                FileKind::AppValues((*app).to_owned())
            }
            ["workloads", app, _] => FileKind::Workload((*app).to_owned()),
            ["definitions", ..] => FileKind::Definitions,
            ["environments", ..] | ["workloads", ..] => {
                self.error(
                    SourceLocation::file(path),
                    LoadErrorKind::Invalid(
                        "misplaced file: environments live in environments/<id>.yaml and \
                         workloads in workloads/<app>/<name>.yaml"
                            .into(),
                    ),
                );
                return;
            }
            _ => return,
        };
        // The settings set the limits; they are read with the defaults.
        let limits = match kind {
            FileKind::Settings => Limits::default(),
            _ => self.limits,
        };
        if let Err(e) = limits.check_file(bytes, Some(FILE_SIZE_SETTING)) {
            self.error(
                SourceLocation {
                    file: path.to_owned(),
                    line: e.line,
                    column: None,
                },
                LoadErrorKind::Yaml(e.message),
            );
            return;
        }
        let Ok(text) = std::str::from_utf8(bytes) else {
            self.error(SourceLocation::file(path), LoadErrorKind::NotUtf8);
            return;
        };
        match kind {
            FileKind::Settings => self.settings(path, text),
            FileKind::Environment => self.environment(path, text),
            FileKind::Workload(app) => self.workload(path, &app, text),
            FileKind::AppValues(app) => self.app_values(path, &app, text),
            FileKind::Definitions => {
                for (offset, doc) in split_documents(text) {
                    self.definition(path, doc, offset);
                }
            }
        }
    }

    pub(super) fn finish(mut self) -> Result<Repository, Vec<LoadError>> {
        if self.repo.environments.is_empty() && self.errors.is_empty() {
            self.error(
                SourceLocation::file("environments/"),
                LoadErrorKind::NoEnvironments,
            );
        }
        self.check_equal_criteria();
        self.check_value_environments();
        if let Some(org) = self.org.take() {
            self.repo.org = org;
        }
        if let Some(defaults) = &self.defaults {
            for (env, explicit) in self.repo.environments.iter_mut().zip(&self.explicit) {
                defaults.fill(env, *explicit);
            }
        }
        if self.errors.is_empty() {
            Ok(self.repo)
        } else {
            self.errors.sort_by(|a, b| a.location.cmp(&b.location));
            Err(self.errors)
        }
    }

    fn error(&mut self, location: SourceLocation, kind: LoadErrorKind) {
        self.errors.push(LoadError { location, kind });
    }

    /// `gitplane.yaml`: repository-wide settings. Unknown keys are errors, never ignored.
    fn settings(&mut self, path: &str, text: &str) {
        let Some(file): Option<Option<SettingsFile>> =
            self.parse_yaml(path, text, 0, SETTINGS_KIND)
        else {
            return;
        };
        let Some(file) = file else {
            return;
        };
        let at = |needle: &str| SourceLocation {
            file: path.into(),
            line: line_of(text, needle),
            column: None,
        };
        if let Some(org) = file.org {
            match check_identifier(&org) {
                Ok(()) => self.org = Some(org),
                Err(reason) => {
                    self.error(at("org:"), LoadErrorKind::Invalid(format!("org: {reason}")))
                }
            }
        }
        if let Some(limits) = file.limits {
            let defaults = Limits::default();
            let mut size = |key: &str, given: Option<SizeFile>, default: u64| match given {
                None => Some(default),
                Some(SizeFile::Bytes(n)) => Some(n),
                Some(SizeFile::Text(text)) => match yaml::parse_size(&text) {
                    Ok(n) => Some(n),
                    Err(reason) => {
                        self.error(
                            at(&format!("{key}:")),
                            LoadErrorKind::Invalid(format!("limits.{key}: {reason}")),
                        );
                        None
                    }
                },
            };
            let file_size = size("file_size", limits.file_size, defaults.max_file_bytes);
            let value_size = size("value_size", limits.value_size, defaults.max_value_bytes);
            if let (Some(file_size), Some(value_size)) = (file_size, value_size) {
                match Limits::checked(file_size, value_size) {
                    Ok(limits) => self.limits = limits,
                    Err(reason) => {
                        let key = if reason.starts_with("limits.file_size") {
                            "file_size:"
                        } else {
                            "value_size:"
                        };
                        self.error(at(key), LoadErrorKind::Invalid(reason));
                    }
                }
            }
        }
        let Some(defaults) = file.environment_defaults else {
            return;
        };
        let before = self.errors.len();
        let threshold = match defaults.deletion_guard.and_then(|g| g.threshold) {
            None => None,
            Some(t) => match check_threshold(t) {
                Ok(t) => Some(t),
                Err(reason) => {
                    self.error(at("threshold:"), LoadErrorKind::Invalid(reason));
                    None
                }
            },
        };
        let schedule = match defaults.schedule {
            None => None,
            Some(s) => match super::Schedule::parse(&s) {
                Ok(s) => Some(s),
                Err(reason) => {
                    self.error(at("schedule:"), LoadErrorKind::Invalid(reason));
                    None
                }
            },
        };
        let drift = match defaults.drift {
            None => None,
            Some(d) => match super::DriftMode::parse(&d) {
                Ok(d) => Some(d),
                Err(reason) => {
                    self.error(at("drift:"), LoadErrorKind::Invalid(reason));
                    None
                }
            },
        };
        if self.errors.len() > before {
            return;
        }
        self.defaults = Some(EnvironmentDefaults {
            implicit_resources: defaults.implicit_resources,
            schedule,
            drift,
            threshold,
        });
    }

    fn environment(&mut self, path: &str, text: &str) {
        let Some(file): Option<EnvironmentFile> =
            self.parse_yaml(path, text, 0, "an environment file")
        else {
            return;
        };
        let stem = file_stem(path);
        let id = file.id.clone().unwrap_or_else(|| stem.to_owned());
        if id != stem {
            let line = line_of(text, "id:");
            self.error(
                SourceLocation {
                    file: path.into(),
                    line,
                    column: None,
                },
                LoadErrorKind::Invalid(format!(
                    "environment id '{id}' differs from the file name: name the file \
                     environments/{id}.yaml or drop the id"
                )),
            );
            return;
        }
        if let Err(reason) = check_identifier(&id) {
            self.error(SourceLocation::file(path), LoadErrorKind::Invalid(reason));
            return;
        }
        let explicit = Explicit {
            implicit_resources: file.implicit_resources.is_some(),
            schedule: file.schedule.is_some(),
            drift: file.drift.is_some(),
            threshold: file
                .deletion_guard
                .as_ref()
                .is_some_and(|g| g.threshold.is_some()),
        };
        let threshold = match check_threshold(
            file.deletion_guard
                .and_then(|g| g.threshold)
                .unwrap_or(super::DEFAULT_DELETION_THRESHOLD),
        ) {
            Ok(t) => t,
            Err(reason) => {
                self.error(
                    SourceLocation {
                        file: path.into(),
                        line: line_of(text, "threshold"),
                        column: None,
                    },
                    LoadErrorKind::Invalid(reason),
                );
                return;
            }
        };
        let schedule = match file.schedule.flatten() {
            None => None,
            Some(text_schedule) => match super::Schedule::parse(&text_schedule) {
                Ok(s) => Some(s),
                Err(reason) => {
                    self.error(
                        SourceLocation {
                            file: path.into(),
                            line: line_of(text, "schedule"),
                            column: None,
                        },
                        LoadErrorKind::Invalid(reason),
                    );
                    return;
                }
            },
        };
        let drift = match file.drift.as_deref().map(super::DriftMode::parse) {
            None => super::DriftMode::default(),
            Some(Ok(mode)) => mode,
            Some(Err(reason)) => {
                self.error(
                    SourceLocation {
                        file: path.into(),
                        line: file
                            .drift
                            .as_deref()
                            .and_then(|d| super::line_of_key_value(text, "drift", d))
                            .or_else(|| line_of(text, "drift:")),
                        column: None,
                    },
                    LoadErrorKind::Invalid(reason),
                );
                return;
            }
        };
        let mut shared_resources = BTreeMap::new();
        for (name, r) in file.shared_resources {
            let location = SourceLocation {
                file: path.into(),
                line: line_of(text, &format!("{name}:")),
                column: None,
            };
            if let Err(reason) = check_identifier(&name) {
                self.error(
                    location,
                    LoadErrorKind::Invalid(format!("shared resource: {reason}")),
                );
                continue;
            }
            if r.provided.is_some() && r.params.is_some() {
                self.error(
                    location,
                    LoadErrorKind::Invalid(format!(
                        "shared resource '{name}': a user-provided resource has outputs \
                         (provided), not params"
                    )),
                );
                continue;
            }
            if let Some(p) = &r.provided
                && !p.is_object()
            {
                self.error(
                    location,
                    LoadErrorKind::Invalid(format!(
                        "shared resource '{name}': provided must be a mapping of outputs"
                    )),
                );
                continue;
            }
            shared_resources.insert(
                name.clone(),
                super::SharedResource {
                    name,
                    res_type: r.res_type,
                    class: r.class.unwrap_or_else(|| DEFAULT_CLASS.to_owned()),
                    params: r.params.unwrap_or(Value::Null),
                    provided: r.provided,
                    provides: r.provides,
                    location,
                },
            );
        }
        self.repo.environments.push(Environment {
            id,
            deletion_threshold: threshold,
            schedule,
            drift,
            shared_resources,
            env_type: file.env_type,
            apps: file.apps,
            implicit_resources: file
                .implicit_resources
                .unwrap_or_else(|| vec!["base-env".to_owned()]),
            location: SourceLocation::file(path),
        });
        self.explicit.push(explicit);
    }

    fn workload(&mut self, path: &str, app: &str, text: &str) {
        if let Err(reason) = check_identifier(app) {
            self.error(
                SourceLocation::file(path),
                LoadErrorKind::Invalid(format!("app folder: {reason}")),
            );
            return;
        }
        // score-compose reads the first document of a file and drops the rest without a word;
        // gitplane refuses the file instead, saying where the second one starts.
        if let Some(line) = yaml::second_document_line(text) {
            self.error(
                SourceLocation {
                    file: path.into(),
                    line: Some(line),
                    column: Some(1),
                },
                LoadErrorKind::Yaml(format!(
                    "a second YAML document starts at this `---` line, but gitplane reads one \
                     workload per Score file: move what follows to a file of its own in \
                     workloads/{app}/ (any name ending in .yaml), or remove the `---` line"
                )),
            );
            return;
        }
        // Parsed once, as a tree, and the typed file taken from the tree. Only when that fails
        // is the text parsed as a `ScoreFile`, the parse that decides as it always did: YAML
        // scalars a tree keeps as numbers may be strings there, and its error (the first the
        // typed reading meets, which may come before a later syntax error) is the one reported.
        let raw: Option<Value> = self.try_yaml(text, SCORE_KIND).ok();
        let file = match raw.as_ref().map(ScoreFile::deserialize) {
            Some(Ok(file)) => file,
            _ => match self.parse_yaml::<ScoreFile>(path, text, 0, SCORE_KIND) {
                Some(file) => file,
                None => return,
            },
        };
        let raw = match raw {
            Some(raw) => raw,
            None => match self.parse_yaml::<Value>(path, text, 0, SCORE_KIND) {
                Some(raw) => raw,
                None => return,
            },
        };
        let empty = empty_score_sections(&raw);
        if !empty.is_empty() {
            for section in empty {
                let keys: Vec<&str> = section.iter().map(String::as_str).collect();
                let (line, column) = yaml::key_location(text, &keys).unzip();
                let key = keys.last().copied().unwrap_or_default();
                self.error(
                    SourceLocation {
                        file: path.into(),
                        line,
                        column,
                    },
                    LoadErrorKind::Yaml(format!(
                        "`{key}` is empty, which Score does not allow (score-compose and \
                         score-k8s refuse it too): write {}, or remove the key",
                        empty_section_advice(&keys)
                    )),
                );
            }
            return;
        }
        if file.api_version != SCORE_API_VERSION {
            self.error(
                SourceLocation {
                    file: path.into(),
                    line: line_of(text, "apiVersion"),
                    column: None,
                },
                LoadErrorKind::Invalid(format!(
                    "apiVersion '{}' is not supported: use '{SCORE_API_VERSION}'",
                    file.api_version
                )),
            );
            return;
        }
        let name = file.metadata.name.clone();
        if let Err(reason) = check_identifier(&name) {
            self.error(
                SourceLocation {
                    file: path.into(),
                    line: line_of(text, "name:"),
                    column: None,
                },
                LoadErrorKind::Invalid(format!("workload name: {reason}")),
            );
            return;
        }
        if let Some(first) = self
            .workload_files
            .insert((app.to_owned(), name.clone()), path.to_owned())
        {
            self.error(
                SourceLocation::file(path),
                LoadErrorKind::DuplicateWorkload {
                    app: app.into(),
                    name,
                    first,
                },
            );
            return;
        }
        let (file_sources, as_written) = self.file_entries(path, app, text, &raw);
        let mut template_errors = Vec::new();
        let spec = if as_written.is_empty() {
            parse_template(&raw, Dialect::Score, "", &mut template_errors)
        } else {
            // `noExpand` contents are not templates: parsed without them, put back as written.
            let mut expanded = raw.clone();
            for (at, _) in &as_written {
                if let Some(content) = expanded.pointer_mut(&json_pointer(at)) {
                    *content = Value::Null;
                }
            }
            let mut spec = parse_template(&expanded, Dialect::Score, "", &mut template_errors);
            for (at, content) in as_written {
                spec.graft_at(&at, Template::Value(content));
            }
            spec
        };
        let source: Arc<str> = Arc::from(text);
        self.errors
            .extend(placeholder_errors(path, text, 0, template_errors));
        let _ = file.service;
        let _ = file.containers;
        let mut resources = BTreeMap::new();
        for (res_name, res) in file.resources {
            let location = SourceLocation {
                file: path.into(),
                line: line_of(text, &format!("{res_name}:")),
                column: None,
            };
            let choice = match choice_of(&res) {
                Ok(c) => c,
                Err(reason) => {
                    self.error(
                        location,
                        LoadErrorKind::Invalid(format!("resource '{res_name}': {reason}")),
                    );
                    continue;
                }
            };
            if let Err(reason) = check_identifier(&res_name) {
                self.error(
                    location,
                    LoadErrorKind::Invalid(format!("resource name: {reason}")),
                );
                continue;
            }
            let properties = res
                .properties
                .unwrap_or_default()
                .into_iter()
                .map(|(name, p)| {
                    let p = p.map_or_else(super::Property::default, |p| super::Property {
                        default: p.default,
                        secret: p.secret,
                    });
                    (name, p)
                })
                .collect();
            resources.insert(
                res_name,
                ScoreResource {
                    res_type: res.res_type,
                    class: res.class.unwrap_or_else(|| DEFAULT_CLASS.to_owned()),
                    id: res.id,
                    params: res.params.unwrap_or(Value::Null),
                    choice,
                    properties,
                    location,
                },
            );
        }
        let metadata = raw.get("metadata").cloned().unwrap_or(Value::Null);
        self.repo
            .apps
            .entry(app.to_owned())
            .or_insert_with(|| App {
                id: app.to_owned(),
                workloads: BTreeMap::new(),
            })
            .workloads
            .insert(
                name.clone(),
                Arc::new(Workload {
                    name,
                    file: path.to_owned(),
                    source,
                    metadata,
                    spec,
                    resources,
                    file_sources,
                }),
            );
    }

    /// An app's values may override only environments the repository has: a typo in an
    /// environment's name would otherwise leave that environment on the app's values silently.
    fn check_value_environments(&mut self) {
        let known: BTreeSet<&str> = self
            .repo
            .environments
            .iter()
            .map(|e| e.id.as_str())
            .collect();
        let mut errors = Vec::new();
        for values in self.repo.values.values() {
            for env in values.environments.keys() {
                if !known.contains(env.as_str()) {
                    let (line, column) =
                        yaml::key_location(&values.source, &["environments", env]).unzip();
                    errors.push((
                        SourceLocation {
                            file: values.file.clone(),
                            line,
                            column,
                        },
                        format!(
                            "environment '{env}' is not one of this repository's ({}): \
                             overrides are written under an environment's id",
                            known.iter().copied().collect::<Vec<_>>().join(", ")
                        ),
                    ));
                }
            }
        }
        for (at, reason) in errors {
            self.error(at, LoadErrorKind::Invalid(reason));
        }
    }

    /// `workloads/<app>/values.yaml`: `values: {KEY: VALUE}` and `environments: {ENV: {KEY:
    /// VALUE}}`, keys plain names (they are read as `${values.KEY}`).
    fn app_values(&mut self, path: &str, app: &str, text: &str) {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct ValuesFile {
            #[serde(default)]
            values: BTreeMap<String, Value>,
            #[serde(default)]
            environments: BTreeMap<String, BTreeMap<String, Value>>,
        }
        if let Err(reason) = check_identifier(app) {
            self.error(
                SourceLocation::file(path),
                LoadErrorKind::Invalid(format!("app folder: {reason}")),
            );
            return;
        }
        let Some(file): Option<ValuesFile> =
            self.parse_yaml(path, text, 0, "an app's values (values, environments)")
        else {
            return;
        };
        let keys = file
            .values
            .keys()
            .map(|k| (vec!["values", k.as_str()], k))
            .chain(file.environments.iter().flat_map(|(env, over)| {
                over.keys()
                    .map(move |k| (vec!["environments", env.as_str(), k.as_str()], k))
            }));
        let mut bad = Vec::new();
        for (at, key) in keys {
            if let Err(reason) = check_identifier(key) {
                let (line, column) = yaml::key_location(text, &at).unzip();
                bad.push((
                    SourceLocation {
                        file: path.to_owned(),
                        line,
                        column,
                    },
                    format!("value '{key}': {reason}"),
                ));
            }
        }
        if !bad.is_empty() {
            for (at, reason) in bad {
                self.error(at, LoadErrorKind::Invalid(reason));
            }
            return;
        }
        self.repo.values.insert(
            app.to_owned(),
            Arc::new(super::AppValues {
                file: path.to_owned(),
                source: Arc::from(text),
                values: file.values,
                environments: file.environments,
            }),
        );
    }

    /// The `containers.*.files` entries: the `source` files to read once every file is known
    /// (checked to stay in the app's folder), and the inline `content`s with `noExpand: true`,
    /// which are taken as written, by where they are.
    #[allow(clippy::type_complexity)]
    fn file_entries(
        &mut self,
        path: &str,
        app: &str,
        text: &str,
        raw: &Value,
    ) -> (
        Vec<super::FileSource>,
        Vec<(Vec<super::template::Step>, Value)>,
    ) {
        use super::template::Step;
        let mut out = Vec::new();
        let mut as_written = Vec::new();
        let Some(Value::Object(containers)) = raw.get("containers") else {
            return (out, as_written);
        };
        for (container, c) in containers {
            let entries: Vec<(Step, String, &Value)> = match c.get("files") {
                Some(Value::Object(map)) => map
                    .iter()
                    .map(|(target, e)| (Step::Key(target.clone()), target.clone(), e))
                    .collect(),
                Some(Value::Array(items)) => items
                    .iter()
                    .enumerate()
                    .map(|(i, e)| (Step::Index(i), i.to_string(), e))
                    .collect(),
                _ => continue,
            };
            for (step, key, entry) in entries {
                let at = vec![
                    Step::Key("containers".into()),
                    Step::Key(container.clone()),
                    Step::Key("files".into()),
                    step,
                ];
                let no_expand = entry.get("noExpand") == Some(&Value::Bool(true));
                if no_expand && let Some(content) = entry.get("content").filter(|c| c.is_string()) {
                    let mut content_at = at.clone();
                    content_at.push(Step::Key("content".into()));
                    as_written.push((content_at, content.clone()));
                }
                if let Some(mode) = entry.get("mode") {
                    let keys = [
                        "containers",
                        container.as_str(),
                        "files",
                        key.as_str(),
                        "mode",
                    ];
                    if mode.as_str().and_then(octal_mode).is_none() {
                        let (line, column) = yaml::key_location(text, &keys).unzip();
                        self.error(
                            SourceLocation {
                                file: path.into(),
                                line,
                                column,
                            },
                            LoadErrorKind::Invalid(format!(
                                "files mode {mode} is not a file mode: write it in octal as a \
                                 string, such as \"0644\""
                            )),
                        );
                    }
                }
                let Some(Value::String(source)) = entry.get("source") else {
                    continue;
                };
                let keys = [
                    "containers",
                    container.as_str(),
                    "files",
                    key.as_str(),
                    "source",
                ];
                let (line, column) = yaml::key_location(text, &keys).unzip();
                let location = SourceLocation {
                    file: path.into(),
                    line,
                    column,
                };
                match source_path(path, app, source) {
                    Ok(resolved) => out.push(super::FileSource {
                        at,
                        path: resolved,
                        no_expand,
                        location,
                    }),
                    Err(reason) => self.error(location, LoadErrorKind::Invalid(reason)),
                }
            }
        }
        (out, as_written)
    }

    fn definition(&mut self, path: &str, doc: &str, line_offset: usize) {
        let Some(file): Option<DefinitionFile> =
            self.parse_yaml(path, doc, line_offset, "a definition")
        else {
            return;
        };
        let at = |needle: &str| SourceLocation {
            file: path.to_owned(),
            line: line_of(doc, needle).map(|l| l + line_offset),
            column: None,
        };
        if file.api_version != DEFINITION_API_VERSION || file.kind != "Definition" {
            self.error(
                at("apiVersion"),
                LoadErrorKind::Invalid(format!(
                    "expected apiVersion '{DEFINITION_API_VERSION}' and kind 'Definition', found \
                     '{}' and '{}'",
                    file.api_version, file.kind
                )),
            );
            return;
        }
        let id = file.metadata.id;
        let location = at(&format!("id: {id}"));
        if let Err(reason) = check_identifier(&id) {
            self.error(
                location,
                LoadErrorKind::Invalid(format!("definition id: {reason}")),
            );
            return;
        }
        if let Some(first) = self.definition_ids.get(&id) {
            let first = first.clone();
            self.error(location, LoadErrorKind::DuplicateDefinition { id, first });
            return;
        }
        self.definition_ids.insert(id.clone(), location.clone());
        let _ = &file.metadata.annotations;
        let entity = file.entity;

        if entity.res_type == "workload"
            && let Some(Value::String(outputs)) = entity
                .driver_inputs
                .values
                .as_ref()
                .and_then(|v| v.pointer("/templates/outputs"))
        {
            // An `update` the workload's objects could not take is refused here when its path
            // is written out, rather than when the template renders.
            for (needle, reason) in super::workload_update::unsupported_paths_in(outputs) {
                self.error(
                    at(&needle),
                    LoadErrorKind::Invalid(format!("templates.outputs, update: {reason}")),
                );
            }
        }
        let mut template_errors = Vec::new();
        let values = parse_template(
            entity.driver_inputs.values.as_ref().unwrap_or(&Value::Null),
            Dialect::Definition,
            "driver_inputs.values",
            &mut template_errors,
        );
        let (secrets_value, stored) = match merge_secret_refs(
            entity.driver_inputs.secrets.unwrap_or(Value::Null),
            entity.driver_inputs.secret_refs,
        ) {
            Ok(v) => v,
            Err(reason) => {
                self.error(at("secret_refs"), LoadErrorKind::Invalid(reason));
                return;
            }
        };
        let mut secrets = parse_template(
            &secrets_value,
            Dialect::Definition,
            "driver_inputs.secrets",
            &mut template_errors,
        );
        for (path, secret) in stored {
            secrets.graft(&path, Template::Whole(Box::new(Expr::Stored(secret))));
        }
        let before = self.errors.len();
        self.errors
            .extend(placeholder_errors(path, doc, line_offset, template_errors));

        let mut provision = Vec::new();
        for (key, p) in entity.provision {
            match parse_provision_key(&key) {
                Ok((res_type, class, id)) => provision.push(Provision {
                    key,
                    res_type,
                    class,
                    id,
                    is_dependent: p.is_dependent,
                    match_dependents: p.match_dependents,
                    params: p.params.unwrap_or(Value::Null),
                }),
                Err(reason) => {
                    let loc = at(&key);
                    self.error(
                        loc,
                        LoadErrorKind::Invalid(format!("provision key '{key}': {reason}")),
                    );
                }
            }
        }
        if self.errors.len() > before {
            return;
        }
        let driver_account = match entity.driver_account {
            None => None,
            Some(text) => match super::placeholder::parse_account_ref(&text) {
                Ok(None) => Some(super::DriverAccount::Named(text)),
                Ok(Some(desc)) => Some(super::DriverAccount::Of {
                    written: desc.to_string(),
                    desc,
                }),
                Err(reason) => {
                    self.error(at("driver_account"), LoadErrorKind::Invalid(reason));
                    return;
                }
            },
        };
        let deletion_policy = match entity.deletion_policy.as_deref() {
            None | Some("delete") => crate::records::DeletionPolicy::Delete,
            Some("orphan") => crate::records::DeletionPolicy::Orphan,
            Some(other) => {
                self.error(
                    at("deletion_policy"),
                    LoadErrorKind::Invalid(format!(
                        "deletion_policy '{other}' is not one of delete, orphan"
                    )),
                );
                return;
            }
        };
        let mut depends_on = Vec::new();
        for key in &entity.depends_on {
            match parse_provision_key(key) {
                Ok((res_type, class, id)) => depends_on.push(super::DependsOn {
                    key: key.clone(),
                    res_type,
                    class,
                    id,
                }),
                Err(reason) => {
                    self.error(
                        at(key),
                        LoadErrorKind::Invalid(format!("depends_on '{key}': {reason}")),
                    );
                    return;
                }
            }
        }
        let criteria = entity
            .criteria
            .into_iter()
            .map(|c| Criterion {
                res_id: c.res_id,
                env_id: c.env_id,
                app_id: c.app_id,
                env_type: c.env_type,
                class: c.class.unwrap_or_else(|| DEFAULT_CLASS.to_owned()),
            })
            .collect();
        self.repo.definitions.push(Definition {
            name: entity.name.unwrap_or_else(|| id.clone()),
            id,
            res_type: entity.res_type,
            driver_type: entity.driver_type,
            driver_account,
            deletion_policy,
            auto_update: entity.auto_update.unwrap_or(true),
            depends_on,
            labels: file.metadata.labels.clone().unwrap_or_default(),
            weight: entity.weight.unwrap_or(0),
            default: entity.default,
            provides: entity.provides,
            values,
            secrets,
            provision,
            criteria,
            location,
            source: Arc::from(doc),
            line_offset,
        });
    }

    /// Two definitions of one type with an equal rule would make matching a coin toss.
    fn check_equal_criteria(&mut self) {
        let mut seen: HashMap<(&str, &Criterion), &Definition> = HashMap::new();
        let mut found = Vec::new();
        for def in &self.repo.definitions {
            for rule in &def.criteria {
                match seen.get(&(def.res_type.as_str(), rule)) {
                    Some(first) if first.id != def.id => found.push(LoadError {
                        location: def.locate("criteria"),
                        kind: LoadErrorKind::EqualCriteria {
                            res_type: def.res_type.clone(),
                            criteria: rule.to_string(),
                            first: first.id.clone(),
                            first_location: first.locate("criteria"),
                            second: def.id.clone(),
                        },
                    }),
                    Some(_) => {}
                    None => {
                        seen.insert((def.res_type.as_str(), rule), def);
                    }
                }
            }
        }
        self.errors.extend(found);
        // One default per type, or choosing it would be a coin toss.
        let mut defaults: HashMap<&str, &Definition> = HashMap::new();
        let mut twice = Vec::new();
        for def in self.repo.definitions.iter().filter(|d| d.default) {
            if let Some(first) = defaults.insert(def.res_type.as_str(), def) {
                twice.push(LoadError {
                    location: def.locate("default"),
                    kind: LoadErrorKind::Invalid(format!(
                        "definitions '{}' ({}) and '{}' are both the default for type '{}': keep one",
                        first.id,
                        first.locate("default"),
                        def.id,
                        def.res_type
                    )),
                });
            }
        }
        self.errors.extend(twice);
    }

    /// Parses one YAML document of `path` (which starts after `line_offset` lines of the
    /// file); `kind` names the file in messages ("an environment file").
    /// `text` read as a `kind` file, with the limits of its kind; the error is the caller's.
    fn try_yaml<T: serde::de::DeserializeOwned>(
        &self,
        text: &str,
        kind: &str,
    ) -> Result<T, yaml::YamlError> {
        let limits = if kind == SETTINGS_KIND {
            Limits::default()
        } else {
            self.limits
        };
        let doc = Doc {
            kind,
            setting: Some(VALUE_SIZE_SETTING),
        };
        yaml::from_str::<T>(text, &limits, doc)
    }

    fn parse_yaml<T: serde::de::DeserializeOwned>(
        &mut self,
        path: &str,
        text: &str,
        line_offset: usize,
        kind: &str,
    ) -> Option<T> {
        match self.try_yaml::<T>(text, kind) {
            Ok(v) => Some(v),
            Err(e) => {
                self.error(
                    SourceLocation {
                        file: path.to_owned(),
                        line: e.line.map(|l| l + line_offset),
                        column: e.line.and(e.column),
                    },
                    LoadErrorKind::Yaml(e.message),
                );
                None
            }
        }
    }
}

enum FileKind {
    Settings,
    Environment,
    Workload(String),
    /// `workloads/<app>/values.yaml`: not a workload, the app's values.
    AppValues(String),
    Definitions,
}

/// Whether a link at repository path `link` pointing to `target` resolves outside the
/// repository: an absolute target, or more `..` than the link has folders above it.
fn link_leaves_repository(link: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let mut folders: Vec<&str> = link.split('/').collect();
    folders.pop();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if folders.pop().is_none() {
                    return true;
                }
            }
            name => folders.push(name),
        }
    }
    false
}

/// Splits a multi-document YAML file; yields each document with the number of lines before it.
fn split_documents(text: &str) -> Vec<(usize, &str)> {
    let mut docs = Vec::new();
    let mut start_byte = 0;
    let mut start_line = 0;
    let mut byte = 0;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed.starts_with("--- ") {
            docs.push((start_line, &text[start_byte..byte]));
            start_byte = byte + line.len();
            start_line = i + 1;
        }
        byte += line.len();
    }
    docs.push((start_line, &text[start_byte..]));
    docs.into_iter()
        .filter(|(_, d)| {
            d.lines().any(|l| {
                !l.trim().is_empty() && !l.trim_start().starts_with('#') && l.trim() != "..."
            })
        })
        .collect()
}

/// The sections of a Score file that are present but empty (`variables:` with nothing under
/// it), each as its path of keys. Score's schema wants a mapping (or list) there, so
/// score-compose and score-k8s refuse such a file; gitplane would otherwise hand `null` to the
/// workload's driver. Sections gitplane reads itself (`resources`, `metadata`) are checked by
/// their types.
fn empty_score_sections(raw: &Value) -> Vec<Vec<String>> {
    const CONTAINER_SECTIONS: [&str; 9] = [
        "variables",
        "files",
        "volumes",
        "resources",
        "before",
        "command",
        "args",
        "livenessProbe",
        "readinessProbe",
    ];
    let mut out = Vec::new();
    let path = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
    if let Some(containers) = raw.get("containers").and_then(Value::as_object) {
        for (name, container) in containers {
            match container {
                Value::Null => out.push(path(&["containers", name])),
                Value::Object(sections) => {
                    for key in CONTAINER_SECTIONS {
                        if sections.get(key).is_some_and(Value::is_null) {
                            out.push(path(&["containers", name, key]));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    match raw.get("service") {
        Some(Value::Null) => out.push(path(&["service"])),
        Some(service) if service.get("ports").is_some_and(Value::is_null) => {
            out.push(path(&["service", "ports"]))
        }
        _ => {}
    }
    if raw
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .is_some_and(Value::is_null)
    {
        out.push(path(&["metadata", "annotations"]));
    }
    out
}

/// What to write instead of the empty Score section at `path`.
fn empty_section_advice(path: &[&str]) -> &'static str {
    if let ["containers", _] = path {
        return "`image: ...` and the container's other settings indented under it";
    }
    match path.last().copied().unwrap_or_default() {
        "variables" => "`NAME: value` lines indented under it, or `{}` for none",
        "command" | "args" => "`- item` lines indented under it, or `[]` for none",
        "files" | "volumes" => "`TARGET-PATH:` entries indented under it, or `{}` for none",
        "livenessProbe" | "readinessProbe" => "`httpGet:` or `exec:` indented under it",
        "service" => "`ports:` indented under it",
        _ => "`key: value` lines indented under it, or `{}` for none",
    }
}

/// `criteria:` is a list of rules. An empty mapping is no rules, as Humanitec's own exports
/// write it (its generated Terraform twin has no criteria at all); a mapping with fields is
/// refused with what to write, since it reads as one rule but the Orchestrator takes a list.
fn criteria_list<'de, D>(deserializer: D) -> Result<Vec<CriterionFile>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Rules;
    impl<'de> serde::de::Visitor<'de> for Rules {
        type Value = Vec<CriterionFile>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of matching rules")
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Vec::<CriterionFile>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            if map.next_key::<serde::de::IgnoredAny>()?.is_none() {
                return Ok(Vec::new());
            }
            Err(serde::de::Error::custom(CRITERIA_NOT_A_LIST))
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Err(E::custom(CRITERIA_EMPTY))
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Err(E::custom(CRITERIA_EMPTY))
        }
    }
    deserializer.deserialize_any(Rules)
}

const CRITERIA_NOT_A_LIST: &str = "`criteria` is a list of rules, and this is one rule written \
     as a mapping: put `- ` before it (`- {env_type: production}`), or write \
     `criteria: [{env_type: production}]`; `- {}` matches every resource of class default";
const CRITERIA_EMPTY: &str = "`criteria` is empty: write rules as `- {env_type: production}` \
     lines indented under it (`- {}` matches every resource of class default), or `[]` for \
     none, or remove the key";

/// What a Score resource's gitplane annotations ask for; an ambiguous combination is an error.
fn choice_of(res: &ScoreResourceFile) -> Result<super::Choice, String> {
    use super::{
        CLASS_REF_ANNOTATION, Choice, INTERFACE_ANNOTATION, RESOURCE_REF_ANNOTATION,
        SELECTOR_ANNOTATION,
    };
    let annotations = res
        .metadata
        .as_ref()
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object);
    let get = |key: &str| -> Result<Option<String>, String> {
        match annotations.and_then(|a| a.get(key)) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(format!("annotation {key} must be a string")),
        }
    };
    let selector = get(SELECTOR_ANNOTATION)?;
    let class_ref = get(CLASS_REF_ANNOTATION)?;
    let resource_ref = get(RESOURCE_REF_ANNOTATION)?;
    if let Some(text) = get(INTERFACE_ANNOTATION)? {
        if selector.is_some() || class_ref.is_some() || resource_ref.is_some() {
            return Err(format!(
                "{INTERFACE_ANNOTATION} chooses by the outputs' $ids: it takes no selector, \
                 class-ref or resource-ref"
            ));
        }
        return Ok(Choice::Interface(key_values(&text, "interface")?));
    }
    let given = [
        selector.is_some(),
        class_ref.is_some(),
        resource_ref.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if given > 1 {
        return Err(format!(
            "choose one of {SELECTOR_ANNOTATION}, {CLASS_REF_ANNOTATION} and \
             {RESOURCE_REF_ANNOTATION}"
        ));
    }
    if given == 1 && res.class.is_some() {
        return Err(format!(
            "a class and a {} annotation both choose the definition: keep one",
            if selector.is_some() {
                SELECTOR_ANNOTATION
            } else if class_ref.is_some() {
                CLASS_REF_ANNOTATION
            } else {
                RESOURCE_REF_ANNOTATION
            }
        ));
    }
    if let Some(name) = resource_ref {
        if res.id.is_some() || res.params.is_some() {
            return Err(format!(
                "{RESOURCE_REF_ANNOTATION} binds an existing resource: it takes no id or params"
            ));
        }
        return Ok(Choice::Resource(name));
    }
    if let Some(def) = class_ref {
        return Ok(Choice::Definition(def));
    }
    if let Some(text) = selector {
        return Ok(Choice::Labels(key_values(&text, "selector")?));
    }
    Ok(Choice::Criteria)
}

fn check_threshold(threshold: f64) -> Result<f64, String> {
    if (0.0..=100.0).contains(&threshold) {
        Ok(threshold)
    } else {
        Err(format!(
            "deletion_guard.threshold {threshold} is not a percentage between 0 and 100"
        ))
    }
}

impl EnvironmentDefaults {
    /// Sets on `env` each default its file did not set itself.
    fn fill(&self, env: &mut Environment, explicit: Explicit) {
        if let (false, Some(types)) = (explicit.implicit_resources, &self.implicit_resources) {
            env.implicit_resources = types.clone();
        }
        if let (false, Some(schedule)) = (explicit.schedule, &self.schedule) {
            env.schedule = Some(schedule.clone());
        }
        if let (false, Some(drift)) = (explicit.drift, self.drift) {
            env.drift = drift;
        }
        if let (false, Some(threshold)) = (explicit.threshold, self.threshold) {
            env.deletion_threshold = threshold;
        }
    }
}

/// `k=v,k2=v2` into a map; empty or malformed is an error.
fn key_values(text: &str, what: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{what} '{text}': expected key=value pairs, got '{pair}'"))?;
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    if out.is_empty() {
        return Err(format!("{what} '{text}' names nothing"));
    }
    Ok(out)
}

/// A `secret_refs` leaf `{store, ref}` and the keys that lead to it.
type StoredLeaf = (Vec<String>, StoreRef);

/// `secret_refs` leaves are `{value: ...}` (a literal or a placeholder) or `{store, ref,
/// version}`; they join `secrets`. A store leaf is left `null` in the value and returned with
/// its path, to be put back once the value's placeholders are parsed.
fn merge_secret_refs(
    secrets: Value,
    refs: Option<Value>,
) -> Result<(Value, Vec<StoredLeaf>), String> {
    let Some(refs) = refs else {
        return Ok((secrets, Vec::new()));
    };
    fn flatten(
        v: Value,
        path: &mut Vec<String>,
        stored: &mut Vec<StoredLeaf>,
    ) -> Result<Value, String> {
        let at = || format!("secret_refs.{}", path.join("."));
        match v {
            Value::Object(map) if map.contains_key("store") || map.contains_key("ref") => {
                stored.push((
                    path.clone(),
                    store_ref(&map).map_err(|e| format!("{}: {e}", at()))?,
                ));
                Ok(Value::Null)
            }
            Value::Object(mut map) if map.len() == 1 && map.contains_key("value") => {
                Ok(map.remove("value").unwrap_or(Value::Null))
            }
            Value::Object(map) => map
                .into_iter()
                .map(|(k, v)| {
                    path.push(k.clone());
                    let child = flatten(v, path, stored);
                    path.pop();
                    Ok((k, child?))
                })
                .collect::<Result<serde_json::Map<_, _>, _>>()
                .map(Value::Object),
            _ => Err(format!(
                "{}: expected {{value: ...}}, {{store: NAME, ref: REF}} or an object of them",
                at()
            )),
        }
    }
    if let Value::Object(map) = &refs
        && ["store", "ref", "value"]
            .iter()
            .any(|k| map.contains_key(*k))
    {
        return Err(
            "secret_refs maps each secret's name to {value: ...} or {store, ref}: \
                    write `secret_refs: {NAME: ...}`"
                .to_owned(),
        );
    }
    let mut stored = Vec::new();
    let refs = flatten(refs, &mut Vec::new(), &mut stored)?;
    let merged = match (secrets, refs) {
        (Value::Null, refs) => refs,
        (Value::Object(mut s), Value::Object(r)) => {
            for (k, v) in r {
                if s.contains_key(&k) {
                    return Err(format!(
                        "'{k}' is set in both secrets and secret_refs: keep one"
                    ));
                }
                s.insert(k, v);
            }
            Value::Object(s)
        }
        _ => return Err("secrets and secret_refs must both be objects".into()),
    };
    Ok((merged, stored))
}

/// `{store: NAME, ref: REF, version: V}`, checked; `store` may be left out for the default store.
fn store_ref(map: &serde_json::Map<String, Value>) -> Result<StoreRef, String> {
    if let Some(extra) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "store" | "ref" | "version"))
    {
        return Err(if extra == "value" {
            "give either value or store and ref, not both".to_owned()
        } else {
            format!("unknown key '{extra}' (a store reference has store, ref and version)")
        });
    }
    let text = |key: &str| match map.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Some(Value::Number(n)) if key == "version" => Ok(Some(n.to_string())),
        None => Ok(None),
        Some(_) => Err(format!("'{key}' must be a non-empty string")),
    };
    // Without `store`, HPO reads the ref from the organisation's primary store; gitplane from
    // the host's default store, chosen when the commit is checked against the host.
    let Some(reference) = text("ref")? else {
        return Err(
            "a store reference needs a ref: write {ref: REF} (the host's default \
                    store) or {store: NAME, ref: REF}"
                .to_owned(),
        );
    };
    Ok(StoreRef {
        store: text("store")?.unwrap_or_default(),
        reference,
        version: text("version")?,
    })
}

/// `TYPE[.CLASS][#ID]`.
fn parse_provision_key(key: &str) -> Result<(String, Option<String>, Option<String>), String> {
    // Reuse the placeholder grammar's descriptor rules.
    let probe = format!("${{resources['{key}'].outputs.x}}");
    match parse_string(&probe, Dialect::Definition) {
        Ok(ParsedString::Whole(super::placeholder::Expr::Resource { desc, .. }))
            if desc.selectors.is_empty() =>
        {
            Ok((desc.res_type, desc.class, desc.id))
        }
        Ok(_) => Err("expected TYPE[.CLASS][#ID]".into()),
        Err(e) => Err(e.reason),
    }
}

fn file_stem(path: &str) -> &str {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_suffix(".yaml")
        .or_else(|| name.strip_suffix(".yml"))
        .unwrap_or(name)
}

/// Ids of environments, apps, workloads and definitions end up in res_ids and file names.
fn check_identifier(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 100
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "'{id}' is not a valid id: use letters, digits, '-' and '_', starting with a letter or digit"
        ))
    }
}

/// The repository path of a Score `files[].source`, relative to the Score file at `score`;
/// refused when it leaves the app's folder, which is all gitplane reads of an app.
fn source_path(score: &str, app: &str, source: &str) -> Result<String, String> {
    let shown: String = source.chars().take(200).collect();
    if source.starts_with('/') {
        return Err(format!(
            "files source '{shown}' is an absolute path: write it relative to the Score file, \
             within workloads/{app}/"
        ));
    }
    let mut parts: Vec<&str> = score.split('/').collect();
    parts.pop();
    for part in source.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    let app_dir = ["workloads", app];
    if parts.len() <= 2 || parts[..2] != app_dir {
        return Err(format!(
            "files source '{shown}' is outside workloads/{app}/: gitplane reads an app's files \
             from its own folder only; put the file there"
        ));
    }
    Ok(parts.join("/"))
}

/// A Score file mode (`"0644"`, `"600"`) as the number Kubernetes takes.
pub fn octal_mode(mode: &str) -> Option<u32> {
    if mode.is_empty() || mode.len() > 4 {
        return None;
    }
    u32::from_str_radix(mode, 8).ok()
}

/// The JSON pointer of a path of steps.
fn json_pointer(at: &[super::template::Step]) -> String {
    use super::template::Step;
    at.iter()
        .map(|step| match step {
            Step::Key(k) => format!("/{}", k.replace('~', "~0").replace('/', "~1")),
            Step::Index(i) => format!("/{i}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_keep_their_line_offsets() {
        let text = "a: 1\n---\nb: 2\nc: 3\n--- \n# only a comment\n---\nd: 4\n";
        let docs = split_documents(text);
        assert_eq!(
            docs,
            vec![(0, "a: 1\n"), (2, "b: 2\nc: 3\n"), (7, "d: 4\n")]
        );
    }

    #[test]
    fn secret_refs_join_secrets() {
        let (merged, stored) = merge_secret_refs(
            serde_json::json!({"a": 1}),
            Some(serde_json::json!({"b": {"value": "x"}, "c": {"d": {"value": "${y}"}}})),
        )
        .unwrap();
        assert_eq!(
            merged,
            serde_json::json!({"a": 1, "b": "x", "c": {"d": "${y}"}})
        );
        assert!(stored.is_empty());
    }

    #[test]
    fn secret_refs_name_stores() {
        let (merged, stored) = merge_secret_refs(
            Value::Null,
            Some(serde_json::json!({
                "b": {"store": "vault", "ref": "db/prod#password", "version": 3},
                "c": {"d": {"store": "files", "ref": "token"}}
            })),
        )
        .unwrap();
        assert_eq!(merged, serde_json::json!({"b": null, "c": {"d": null}}));
        let stored: Vec<(String, String)> = stored
            .into_iter()
            .map(|(path, r)| (path.join("."), r.to_string()))
            .collect();
        assert_eq!(
            stored,
            [
                (
                    "b".into(),
                    "store 'vault' ref 'db/prod#password' version 3".into()
                ),
                ("c.d".into(), "store 'files' ref 'token'".into()),
            ]
        );
        for (bad, reason) in [
            (serde_json::json!({"store": "vault"}), "needs a ref"),
            (
                serde_json::json!({"store": "", "ref": "x"}),
                "'store' must be a non-empty string",
            ),
            (
                serde_json::json!({"store": "v", "ref": ""}),
                "'ref' must be a non-empty string",
            ),
            (
                serde_json::json!({"store": "v", "ref": "x", "value": "y"}),
                "either value or store",
            ),
            (
                serde_json::json!({"store": "v", "ref": "x", "key": "y"}),
                "unknown key 'key'",
            ),
        ] {
            let err = merge_secret_refs(Value::Null, Some(serde_json::json!({"p": {"q": bad}})))
                .unwrap_err();
            assert!(err.starts_with("secret_refs.p.q: "), "{err}");
            assert!(err.contains(reason), "{err}");
        }
        // Without a store, the host's default store serves the ref.
        let (_, stored) = merge_secret_refs(
            Value::Null,
            Some(serde_json::json!({"password": {"ref": "db/password"}})),
        )
        .unwrap();
        assert_eq!(stored.len(), 1);
        assert!(stored[0].1.in_default_store());
        assert_eq!(
            stored[0].1.to_string(),
            "the default store, ref 'db/password'"
        );
        // The secrets need names: a bare reference would make them one string.
        for bare in [
            serde_json::json!({"store": "v", "ref": "x"}),
            serde_json::json!({"value": "x"}),
        ] {
            let err = merge_secret_refs(Value::Null, Some(bare)).unwrap_err();
            assert!(err.contains("write `secret_refs: {NAME: ...}`"), "{err}");
        }
    }

    fn load_errors(entries: &[(&str, &str)]) -> Vec<String> {
        let files: BTreeMap<String, Vec<u8>> = entries
            .iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect();
        match crate::model::load(&files) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.iter().map(ToString::to_string).collect(),
        }
    }

    const ENV: (&str, &str) = ("environments/dev.yaml", "type: development\n");

    fn def(id: &str, criteria: &str) -> String {
        format!(
            "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: {id}\n\
             entity:\n  type: postgres\n  driver_type: echo\n  criteria:\n{criteria}"
        )
    }

    #[test]
    fn equal_criteria_for_one_type_are_an_error() {
        let errors = load_errors(&[
            ENV,
            (
                "definitions/a.yaml",
                &def("pg-a", "    - env_type: development\n"),
            ),
            (
                "definitions/b.yaml",
                &def("pg-b", "    - {env_type: development, class: default}\n"),
            ),
        ]);
        assert_eq!(
            errors,
            [
                "definitions/b.yaml:8: definitions 'pg-a' (definitions/a.yaml:8) and 'pg-b' have equal criteria \
              {env_type: development, class: default} for type 'postgres': make one rule more \
              specific or remove it"
            ]
        );
    }

    #[test]
    fn duplicate_definition_ids_name_both_places() {
        let two = format!(
            "{}---\n{}",
            def("pg", "    - {}\n"),
            def("pg", "    - {}\n")
        );
        let errors = load_errors(&[ENV, ("definitions/pg.yaml", &two)]);
        assert_eq!(
            errors,
            ["definitions/pg.yaml:14: definition id 'pg' is already used in definitions/pg.yaml:4"]
        );
    }

    #[test]
    fn every_error_of_a_commit_is_reported() {
        let errors = load_errors(&[
            ("environments/dev.yaml", "id: prod\ntype: development\n"),
            ("environments/test.yaml", "typo: development\n"),
            ("workloads/app/deep/w.yaml", "x: 1\n"),
            (
                "workloads/app/w.yaml",
                "apiVersion: score.dev/v1\nmetadata: {name: w}\ncontainers: {}\n",
            ),
            (
                "definitions/bad.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {id: x}\nentity: {type: a, driver_type: b}\n",
            ),
            ("definitions/bin.yaml", "\u{0}"),
        ]);
        let expected = [
            "definitions/bad.yaml:1: expected apiVersion 'entity.humanitec.io/v1b1' and kind 'Definition', found 'v1' and 'Pod'",
            "definitions/bin.yaml",
            "environments/dev.yaml:1: environment id 'prod' differs from the file name",
            "environments/test.yaml:1:1: unknown field `typo`",
            "workloads/app/deep/w.yaml: misplaced file",
            "workloads/app/w.yaml:1: apiVersion 'score.dev/v1' is not supported: use 'score.dev/v1b1'",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (got, want) in errors.iter().zip(expected) {
            assert!(got.starts_with(want), "{got} should start with {want}");
        }
    }

    fn load_ok(entries: &[(&str, &str)]) -> crate::model::Repository {
        let files: BTreeMap<String, Vec<u8>> = entries
            .iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect();
        crate::model::load(&files).unwrap()
    }

    #[test]
    fn environment_defaults_fill_what_an_environment_does_not_say() {
        let settings = "# repository-wide settings\nenvironment_defaults:\n  \
                        implicit_resources: [base-env, k8s-namespace]\n  \
                        schedule: \"*/30 * * * *\"\n  deletion_guard: {threshold: 20}\n";
        let repo = load_ok(&[
            ("gitplane.yaml", settings),
            ("environments/dev.yaml", "type: development\n"),
            (
                "environments/prod.yaml",
                "type: production\nimplicit_resources: []\nschedule: \"0 3 * * *\"\n\
                 deletion_guard: {threshold: 5}\n",
            ),
        ]);
        let env = |id: &str| repo.environments.iter().find(|e| e.id == id).unwrap();
        let dev = env("dev");
        assert_eq!(dev.implicit_resources, ["base-env", "k8s-namespace"]);
        assert_eq!(dev.schedule.as_ref().unwrap().text, "*/30 * * * *");
        assert_eq!(dev.deletion_threshold, 20.0);
        let prod = env("prod");
        assert!(prod.implicit_resources.is_empty());
        assert_eq!(prod.schedule.as_ref().unwrap().text, "0 3 * * *");
        assert_eq!(prod.deletion_threshold, 5.0);
        // `null` says "no drift runs here" over the default.
        let repo = load_ok(&[
            ("gitplane.yaml", settings),
            (
                "environments/dev.yaml",
                "type: development\nschedule: null\n",
            ),
        ]);
        assert!(repo.environments[0].schedule.is_none());

        // Without settings, or with an empty file, the built-in defaults hold.
        for files in [vec![ENV], vec![("gitplane.yaml", "# nothing yet\n"), ENV]] {
            let repo = load_ok(&files);
            let dev = &repo.environments[0];
            assert_eq!(dev.implicit_resources, ["base-env"]);
            assert!(dev.schedule.is_none());
            assert_eq!(
                dev.deletion_threshold,
                crate::model::DEFAULT_DELETION_THRESHOLD
            );
        }
    }

    #[test]
    fn drift_mode_is_correct_unless_a_file_or_the_defaults_say_detect() {
        use crate::model::DriftMode;
        let repo = load_ok(&[ENV]);
        assert_eq!(repo.environments[0].drift, DriftMode::Correct);
        let repo = load_ok(&[(
            "environments/dev.yaml",
            "type: development\ndrift: detect\n",
        )]);
        assert_eq!(repo.environments[0].drift, DriftMode::Detect);
        let settings = "environment_defaults:\n  drift: detect\n";
        let repo = load_ok(&[
            ("gitplane.yaml", settings),
            ("environments/dev.yaml", "type: development\n"),
            (
                "environments/prod.yaml",
                "type: production\ndrift: correct\n",
            ),
        ]);
        let env = |id: &str| repo.environments.iter().find(|e| e.id == id).unwrap();
        assert_eq!(env("dev").drift, DriftMode::Detect);
        assert_eq!(env("prod").drift, DriftMode::Correct);
    }

    #[test]
    fn a_bad_drift_mode_names_its_line() {
        let errors = load_errors(&[(
            "environments/dev.yaml",
            "type: development\n# drift: how drift runs go\ndrift: fix\n",
        )]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("environments/dev.yaml:3: drift 'fix' is not a drift mode"),
            "{errors:?}"
        );
        let errors = load_errors(&[
            ("gitplane.yaml", "environment_defaults:\n  drift: Detect\n"),
            ENV,
        ]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("gitplane.yaml:2: drift 'Detect'"),
            "{errors:?}"
        );
    }

    #[test]
    fn bad_settings_name_their_line() {
        for (settings, expected) in [
            (
                "environment_defaults:\n  schedule: every day\n",
                "gitplane.yaml:2: ",
            ),
            (
                "environment_defaults:\n  deletion_guard:\n    threshold: 120\n",
                "gitplane.yaml:3: deletion_guard.threshold 120 is not a percentage between 0 and 100",
            ),
            (
                "environment_defaults:\n  implicit_resource: [x]\n",
                "gitplane.yaml:2:",
            ),
            ("concurrency: 4\n", "gitplane.yaml:1:"),
            (
                "# the schedule: drift runs\nenvironment_defaults:\n  schedule: every day\n",
                "gitplane.yaml:3: ",
            ),
        ] {
            let errors = load_errors(&[("gitplane.yaml", settings), ENV]);
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].starts_with(expected), "{errors:?}");
        }
        let errors = load_errors(&[("gitplane.yaml", "concurrency: 4\n"), ENV]);
        assert!(
            errors[0].contains("unknown field `concurrency`"),
            "{errors:?}"
        );
        // Every error at once.
        let errors = load_errors(&[
            (
                "gitplane.yaml",
                "environment_defaults:\n  deletion_guard: {threshold: 300}\n  schedule: soon\n",
            ),
            ENV,
        ]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].starts_with("gitplane.yaml:2: deletion_guard.threshold 300"),
            "{errors:?}"
        );
        assert!(errors[1].starts_with("gitplane.yaml:3: "), "{errors:?}");
    }

    #[test]
    fn a_key_value_is_found_on_its_own_line() {
        use crate::model::{line_of, line_of_key_value};
        let text = "# ref: db is in a comment\nsecrets:\n  dsn: postgres://app@db\n  \
                    other: {store: files, ref: db/other}\n  xref: db\n  \
                    mine: {store: files, ref: db}\n  quoted: {ref: 'db/prod#password'}\n  \
                    block:\n    ref: \"x y\"   # why\n    plain: ref: z\n";
        assert_eq!(line_of_key_value(text, "ref", "db"), Some(6));
        assert_eq!(line_of_key_value(text, "ref", "db/prod#password"), Some(7));
        assert_eq!(line_of_key_value(text, "ref", "x y"), Some(9));
        assert_eq!(line_of_key_value(text, "ref", "z"), Some(10));
        assert_eq!(line_of_key_value(text, "ref", "nowhere"), None);
        // line_of skips comments unless only a comment has the needle.
        assert_eq!(line_of(text, "ref: db"), Some(4));
        assert_eq!(line_of(text, "in a comment"), Some(1));
    }

    #[test]
    fn humanitec_exports_load_unchanged() {
        let text = "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: pg\n\
                    entity:\n  name: pg\n  type: postgres\n  driver_type: humanitec/echo\n\
                    \x20 driver_account: aws\n  driver_inputs:\n    values: {a: 1}\n    \
                    secret_refs:\n      password: {value: x}\n  criteria:\n    - id: abc\n      \
                    app_id: shop\n";
        let files: BTreeMap<String, Vec<u8>> = [ENV, ("definitions/pg.yaml", text)]
            .iter()
            .map(|(p, t)| (p.to_string(), t.as_bytes().to_vec()))
            .collect();
        let repo = crate::model::load(&files).unwrap();
        let d = &repo.definitions[0];
        assert_eq!(
            d.driver_account,
            Some(crate::model::DriverAccount::Named("aws".into()))
        );
        assert_eq!(d.criteria[0].app_id.as_deref(), Some("shop"));
        assert_eq!(
            d.secrets.literal(),
            Some(serde_json::json!({"password": "x"}))
        );
    }

    struct WithLinks(BTreeMap<String, Vec<u8>>, BTreeMap<String, String>);

    impl crate::model::Sources for WithLinks {
        fn contents(&self) -> &BTreeMap<String, Vec<u8>> {
            &self.0
        }
        fn links(&self) -> &BTreeMap<String, String> {
            &self.1
        }
    }

    #[test]
    fn symbolic_links_are_reported_not_followed() {
        let files = BTreeMap::from([(ENV.0.to_owned(), ENV.1.as_bytes().to_vec())]);
        let links = BTreeMap::from(
            [
                ("definitions/evil.yaml", "/etc/passwd"),
                ("definitions/up.yaml", "../../outside.yaml"),
                ("workloads/shop2", "shop"),
                ("definitions/README.md", "/anywhere"),
            ]
            .map(|(a, b)| (a.to_owned(), b.to_owned())),
        );
        let errors: Vec<String> = crate::model::load(&WithLinks(files, links))
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(errors.len(), 3, "{errors:#?}");
        assert!(errors[0].starts_with(
            "definitions/evil.yaml: a symbolic link to '/etc/passwd', which is outside the \
             repository"
        ));
        assert!(errors[1].starts_with(
            "definitions/up.yaml: a symbolic link to '../../outside.yaml', which is outside"
        ));
        assert!(errors[2].starts_with(
            "workloads/shop2: a symbolic link to 'shop': gitplane does not follow links"
        ));
        assert!(!link_leaves_repository("definitions/a/b.yaml", "../c.yaml"));
        assert!(!link_leaves_repository(
            "definitions/b.yaml",
            "../environments/x.yaml"
        ));
        assert!(link_leaves_repository("definitions/b.yaml", "../../x.yaml"));
        assert!(link_leaves_repository("gitplane.yaml", "../x"));
    }

    #[test]
    fn schedules_speak_of_the_expression_as_written() {
        for (schedule, want) in [
            (
                "60 * * * *",
                "schedule '60 * * * *': the minute (field 1) is 60, but it runs from 0 to 59",
            ),
            (
                "0 25 * * *",
                "schedule '0 25 * * *': the hour (field 2) is 25, but it runs from 0 to 23",
            ),
            (
                "0 3 * * 8",
                "the day of the week (field 5) is 8, but it runs from 0 to 7 (0 and 7 are \
                 Sunday) or SUN-SAT",
            ),
            (
                "0 0 3 * * 0",
                "the day of the week (field 6) is 0, but it runs from 1 to 7 (1 is Sunday)",
            ),
            (
                "0 3 * 13 *",
                "the month (field 4) is 13, but it runs from 1 to 12 or JAN-DEC",
            ),
            ("*/0 * * * *", "the minute (field 1) has the step '/0'"),
            (
                "0 x * * *",
                "the hour (field 2) is 'x', which is not a number from 0 to 23",
            ),
            ("every day", "schedule 'every day' has 2 field(s): write 5"),
            ("61 0 3 * * *", "the second (field 1) is 61"),
        ] {
            let err = crate::model::Schedule::parse(schedule).unwrap_err();
            assert!(err.contains(want), "{schedule}: {err}");
            assert!(!err.contains("must be less than"), "{err}");
        }
        for ok in [
            "0 3 * * *",
            "*/15 1-5 * JAN-MAR MON-FRI",
            "0 0 3 * * *",
            "0 3 * * 1,7",
        ] {
            crate::model::Schedule::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn crontab_days_of_the_week_count_from_sunday_as_0() {
        use chrono::{Datelike, TimeZone, Weekday};
        // A Sunday.
        let start = chrono::Utc
            .with_ymd_and_hms(2026, 11, 22, 12, 0, 0)
            .unwrap();
        let days = |text: &str| -> Vec<Weekday> {
            let schedule = crate::model::Schedule::parse(text).unwrap();
            let mut days: Vec<Weekday> = schedule
                .cron
                .after(&start)
                .take(7)
                .map(|t| t.weekday())
                .collect();
            days.sort_by_key(Weekday::num_days_from_sunday);
            days.dedup();
            days
        };
        use Weekday::*;
        assert_eq!(days("0 3 * * 1-5"), [Mon, Tue, Wed, Thu, Fri]);
        assert_eq!(days("0 3 * * 0"), [Sun]);
        assert_eq!(days("0 3 * * 7"), [Sun]);
        assert_eq!(days("0 3 * * 5-7"), [Sun, Fri, Sat]);
        assert_eq!(days("0 3 * * 0-6/2"), [Sun, Tue, Thu, Sat]);
        assert_eq!(days("0 3 * * MON,wed"), [Mon, Wed]);
        assert_eq!(days("0 3 * * *").len(), 7);
    }

    #[test]
    fn limits_come_from_the_settings() {
        let big = format!("type: development\nextra_note: {}\n", "x".repeat(70 * 1024));
        let errors = load_errors(&[("environments/dev.yaml", &big)]);
        assert!(
            errors[0].starts_with("environments/dev.yaml:2:13: this string is 70 KiB"),
            "{errors:?}"
        );
        assert!(errors[0].contains("limits.value_size in gitplane.yaml"));
        // Raised in gitplane.yaml, the value loads (and the unknown key is the only error).
        let errors = load_errors(&[
            ("gitplane.yaml", "limits:\n  value_size: 128KiB\n"),
            ("environments/dev.yaml", &big),
        ]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("unknown field `extra_note`"),
            "{errors:?}"
        );
        let small = "limits: {file_size: 1KiB, value_size: 16}\n";
        let errors = load_errors(&[
            ("gitplane.yaml", small),
            ("environments/dev.yaml", "type: developmentdevelopment\n"),
            ("definitions/big.yaml", &format!("# {}\n", "x".repeat(2000))),
        ]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].starts_with("definitions/big.yaml:1: the file is 2.0 KiB"));
        assert!(errors[1].starts_with("environments/dev.yaml:1:7: this string is 22 bytes"));
        for (settings, want) in [
            (
                "limits: {file_size: 0}\n",
                "gitplane.yaml:1: limits.file_size must be more than 0",
            ),
            (
                "limits:\n  value_size: 2MiB\n",
                "gitplane.yaml:2: limits.value_size 2 MiB is larger than limits.file_size 1 MiB",
            ),
            (
                "limits:\n  file_size: lots\n",
                "gitplane.yaml:2: limits.file_size: 'lots' is not a size",
            ),
            (
                "limits:\n  file_size: 1GiB\n",
                "gitplane.yaml:2: limits.file_size: '1GiB' is not a size",
            ),
            (
                "limits:\n  file_size: 128MiB\n",
                "gitplane.yaml:2: limits.file_size 128 MiB is more than gitplane reads (64 MiB)",
            ),
            (
                "limits: {max: 1}\n",
                "gitplane.yaml:1:10: unknown field `max`",
            ),
            (
                "limits:\n  file_size: [1]\n",
                "gitplane.yaml:2:14: `file_size` must be a size, such as 65536, 64KiB or 1MiB, \
                 not a list",
            ),
        ] {
            let errors = load_errors(&[("gitplane.yaml", settings), ENV]);
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(errors[0].starts_with(want), "{errors:?}");
        }
    }

    const SCORE_HEAD: &str = "apiVersion: score.dev/v1b1\nmetadata:\n  name: web\n";

    #[test]
    fn older_score_properties_load_with_their_defaults() {
        let web = format!(
            "{SCORE_HEAD}containers:\n  main:\n    image: x\nresources:\n  db:\n    \
             type: postgres\n    properties:\n      host:\n      port:\n        type: integer\n        \
             default: 5432\n        required: true\n      password:\n        secret: true\n        \
             description: the admin's\n"
        );
        let repo = load_ok(&[ENV, ("workloads/shop/web.yaml", &web)]);
        let db = &repo.apps["shop"].workloads["web"].resources["db"];
        assert_eq!(db.properties["host"], crate::model::Property::default());
        assert_eq!(db.properties["port"].default, Some(serde_json::json!(5432)));
        assert!(db.properties["password"].secret);
        assert!(!db.properties["port"].secret);
        // A misspelt setting is an error at its line, like any unknown key.
        let typo = web.replace("        secret: true\n", "        secert: true\n");
        let errors = load_errors(&[ENV, ("workloads/shop/web.yaml", &typo)]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("workloads/shop/web.yaml:17:9: unknown field `secert`"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_org_setting_names_the_organisation() {
        let repo = load_ok(&[ENV]);
        assert_eq!(repo.org, crate::model::DEFAULT_ORG);
        let repo = load_ok(&[("gitplane.yaml", "org: acme-corp\n"), ENV]);
        assert_eq!(repo.org, "acme-corp");
        let errors = load_errors(&[("gitplane.yaml", "# who we are\norg: acme corp\n"), ENV]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("gitplane.yaml:2: org: 'acme corp' is not a valid id"),
            "{errors:?}"
        );
    }

    #[test]
    fn criteria_written_as_a_mapping() {
        let with = |criteria: &str| {
            format!(
                "apiVersion: entity.humanitec.io/v1b1\nkind: Definition\nmetadata:\n  id: pg\n\
                 entity:\n  type: postgres\n  driver_type: echo\n{criteria}"
            )
        };
        // Humanitec's exports write no rules as `{}`.
        let repo = load_ok(&[ENV, ("definitions/pg.yaml", &with("  criteria: {}\n"))]);
        assert!(repo.definitions[0].criteria.is_empty());
        let repo = load_ok(&[ENV, ("definitions/pg.yaml", &with("  criteria: []\n"))]);
        assert!(repo.definitions[0].criteria.is_empty());
        let errors = load_errors(&[
            ENV,
            (
                "definitions/pg.yaml",
                &with("  criteria: {env_type: production}\n"),
            ),
        ]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(
                "definitions/pg.yaml:8:13: `criteria` is a list of rules, and this is one rule \
                 written as a mapping: put `- ` before it"
            ),
            "{errors:?}"
        );
        assert!(errors[0].contains("`- {}` matches every resource of class default"));
        let errors = load_errors(&[ENV, ("definitions/pg.yaml", &with("  criteria:\n"))]);
        assert!(
            errors[0].starts_with("definitions/pg.yaml:8:11: `criteria` is empty: write rules as"),
            "{errors:?}"
        );
        // Inside the list, rules are checked as before.
        let errors = load_errors(&[
            ENV,
            (
                "definitions/pg.yaml",
                &with("  criteria:\n    - {env: x}\n"),
            ),
        ]);
        assert!(
            errors[0].starts_with("definitions/pg.yaml:9:8: unknown field `env`"),
            "{errors:?}"
        );
    }

    #[test]
    fn a_score_file_holds_one_workload() {
        let two = format!(
            "{SCORE_HEAD}containers:\n  main:\n    image: x\n---\n# the worker\n{}",
            SCORE_HEAD.replace("web", "worker") + "containers:\n  main:\n    image: y\n"
        );
        let errors = load_errors(&[ENV, ("workloads/shop/web.yaml", &two)]);
        assert_eq!(
            errors,
            [
                "workloads/shop/web.yaml:7:1: a second YAML document starts at this `---` line, \
              but gitplane reads one workload per Score file: move what follows to a file of its \
              own in workloads/shop/ (any name ending in .yaml), or remove the `---` line"
            ]
        );
        // A `---` that opens the only document is fine.
        load_ok(&[
            ENV,
            (
                "workloads/shop/web.yaml",
                &format!("---\n{SCORE_HEAD}containers:\n  main:\n    image: x\n"),
            ),
        ]);
    }

    #[test]
    fn a_score_file_read_from_its_tree_is_the_one_read_from_its_text() {
        // `class: 2` is a number in the tree and text for the file: the text decides.
        let web = format!(
            "{SCORE_HEAD}containers:\n  main:\n    image: x\nresources:\n  db:\n    type: postgres\n    \
             class: 2\n  dns:\n    type: dns\n    id: dns\n"
        );
        let repo = load_ok(&[ENV, ("workloads/shop/web.yaml", &web)]);
        let workload = &repo.apps["shop"].workloads["web"];
        assert_eq!(workload.resources["db"].class, "2");
        assert_eq!(workload.resources["dns"].id.as_deref(), Some("dns"));
        // A key Score does not have is refused at its line, from the text.
        let bad = format!("{SCORE_HEAD}containers:\n  main:\n    image: x\nextra: 1\n");
        let errors = load_errors(&[ENV, ("workloads/shop/web.yaml", &bad)]);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("workloads/shop/web.yaml:7"),
            "{errors:?}"
        );
    }

    #[test]
    fn empty_score_sections_are_refused_at_their_key() {
        let web = format!(
            "{SCORE_HEAD}containers:\n  main:\n    image: x\n    variables: {{}}\n  side:\n    \
             image: y\n    variables:\n    command: []\nservice:\n  ports:\n"
        );
        let errors = load_errors(&[ENV, ("workloads/shop/web.yaml", &web)]);
        assert_eq!(errors.len(), 2, "{errors:?}");
        let bare = format!("{SCORE_HEAD}containers:\n  main:\n");
        assert_eq!(
            load_errors(&[ENV, ("workloads/shop/web.yaml", &bare)]),
            [
                "workloads/shop/web.yaml:5:3: `main` is empty, which Score does not allow \
              (score-compose and score-k8s refuse it too): write `image: ...` and the \
              container's other settings indented under it, or remove the key"
            ]
        );
        assert!(
            errors[0].starts_with(
                "workloads/shop/web.yaml:10:5: `variables` is empty, which Score does not allow \
                 (score-compose and score-k8s refuse it too): write `NAME: value` lines indented \
                 under it, or `{}` for none, or remove the key"
            ),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("workloads/shop/web.yaml:13:3: `ports` is empty"),
            "{errors:?}"
        );
    }

    #[test]
    fn provision_keys() {
        assert_eq!(
            parse_provision_key("aws-policy.strict#common").unwrap(),
            (
                "aws-policy".into(),
                Some("strict".into()),
                Some("common".into())
            )
        );
        assert_eq!(
            parse_provision_key("aws-policy").unwrap(),
            ("aws-policy".into(), None, None)
        );
        assert!(parse_provision_key("a>b").is_err());
    }

    #[test]
    fn a_files_source_is_relative_to_the_score_file_and_stays_in_the_app() {
        let at = "workloads/shop/web.yaml";
        assert_eq!(
            super::source_path(at, "shop", "./conf/../nginx.conf"),
            Ok("workloads/shop/nginx.conf".to_owned())
        );
        assert!(super::source_path(at, "shop", "../other/x").is_err());
        assert!(super::source_path(at, "shop", "/etc/passwd").is_err());
        assert!(super::source_path(at, "shop", "..").is_err());
        assert_eq!(super::octal_mode("0640"), Some(0o640));
        assert_eq!(super::octal_mode("0999"), None);
    }
}
