//! Reads a Terraform definition's `driver_inputs` (Humanitec's names) into checked values.
//!
//! Messages name keys and kinds, never values: any of them may be secret.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use gitplane_core::model::template::kind_of;

/// The most files a definition may write into the working directory.
const MAX_FILES: usize = 1_000;

/// Inputs of Humanitec's runner drivers that mean nothing on one host: accepted and ignored.
const IGNORED: [&str; 3] = ["runner", "runner_mode", "use_default_backend"];

/// Files gitplane writes itself: a definition's `files` may not take their names.
pub(super) const VARIABLES_FILE: &str = "zz-gitplane.auto.tfvars.json";
pub(super) const STATE_FILE: &str = "terraform.tfstate";

/// Everything a call needs from the request, checked.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Inputs {
    pub code: Code,
    /// `values.files` and `secrets.files`, by relative path.
    pub files: BTreeMap<String, File>,
    /// `values.variables`, `secrets.variables` and those `credentials_config` maps.
    pub variables: Map<String, Value>,
    /// Environment variables `credentials_config.environment` maps from the account.
    pub environment: BTreeMap<String, String>,
    /// `credentials_config.file`: where the whole account's credentials are written.
    pub credentials_file: Option<(String, String)>,
    pub append_logs_to_error: bool,
    pub manifests_output: Option<String>,
}

/// Where the Terraform code comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Code {
    /// `values.script`: the root module's `main.tf`.
    Script(String),
    /// `values.source` (and `secrets.source`): a folder or a git repository.
    Source(Source),
    /// Only `files`: they hold the code.
    Files,
}

/// `source`: a git repository (or a folder on the host) and the module's path in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Source {
    pub url: String,
    /// The module's folder inside the repository; `None`: its root.
    pub path: Option<String>,
    /// A branch, tag, ref or commit (`rev`, or `ref` / `branch` as some definitions say).
    pub rev: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ssh_key: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct File {
    pub contents: String,
    /// From `secrets.files` (or the account): written readable by its owner alone.
    pub secret: bool,
}

/// A definition whose inputs this driver cannot run. The text names keys, never values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct InputError(pub String);

impl Inputs {
    /// Checks `values`, `secrets` and the account against what the driver understands.
    pub fn parse(
        values: &Value,
        secrets: &Value,
        account: Option<&Value>,
    ) -> Result<Inputs, InputError> {
        let empty = Map::new();
        let values = object_or_empty(values, "values")?.unwrap_or(&empty);
        let secrets = object_or_empty(secrets, "secrets")?.unwrap_or(&empty);
        check_keys(
            values,
            "values",
            &[
                "script",
                "source",
                "variables",
                "files",
                "credentials_config",
                "append_logs_to_error",
                "manifests_output",
            ],
        )?;
        check_keys(
            secrets,
            "secrets",
            &["script", "source", "variables", "files"],
        )?;

        let script = match (
            string_at(values, "values", "script")?,
            string_at(secrets, "secrets", "script")?,
        ) {
            (Some(_), Some(_)) => {
                return Err(InputError(
                    "values.script and secrets.script are both set: keep one".into(),
                ));
            }
            (a, b) => a.or(b),
        };
        let source = merged_object(values, secrets, "source")?;
        let source = if source.is_empty() {
            None
        } else {
            Some(Source::parse(&source)?)
        };
        let mut files = BTreeMap::new();
        for (map, secret) in [(values, false), (secrets, true)] {
            let from = if secret { "secrets" } else { "values" };
            let Some(object) = object_at(map, from, "files")? else {
                continue;
            };
            for (path, contents) in object {
                let Value::String(contents) = contents else {
                    return Err(InputError(format!(
                        "{from}.files.{path} must be a string (the file's text), got {}",
                        kind_of(contents)
                    )));
                };
                check_relative_path(path, &format!("{from}.files"))?;
                let file = File {
                    contents: contents.clone(),
                    secret,
                };
                if files.insert(path.clone(), file).is_some() {
                    return Err(InputError(format!(
                        "the file {path} is in both values.files and secrets.files: keep one"
                    )));
                }
            }
        }
        if files.len() > MAX_FILES {
            return Err(InputError(format!(
                "{} files are more than the {MAX_FILES} a definition may write",
                files.len()
            )));
        }
        let code = match (script, source) {
            (Some(_), Some(_)) => {
                return Err(InputError(
                    "script and source are both set: give the code one way".into(),
                ));
            }
            (Some(script), None) => {
                if files.contains_key("main.tf") {
                    return Err(InputError(
                        "files.main.tf would replace the script, which is written to main.tf"
                            .into(),
                    ));
                }
                Code::Script(script)
            }
            (None, Some(source)) => Code::Source(source),
            (None, None) if files.keys().any(|f| is_code_file(f)) => Code::Files,
            (None, None) => {
                return Err(InputError(
                    "no Terraform code: set values.script, values.source, or .tf files in \
                     values.files"
                        .into(),
                ));
            }
        };

        let mut variables = Map::new();
        for (map, from) in [(values, "values"), (secrets, "secrets")] {
            for (name, value) in object_at(map, from, "variables")?.into_iter().flatten() {
                if variables.insert(name.clone(), value.clone()).is_some() {
                    return Err(InputError(format!(
                        "the variable {name} is in both values.variables and secrets.variables: \
                         keep one"
                    )));
                }
            }
        }

        let mut inputs = Inputs {
            code,
            files,
            variables,
            environment: BTreeMap::new(),
            credentials_file: None,
            append_logs_to_error: flag(values, "append_logs_to_error")?,
            manifests_output: string_at(values, "values", "manifests_output")?,
        };
        if let Some(config) = object_at(values, "values", "credentials_config")? {
            inputs.map_credentials(config, account)?;
        }
        for name in [VARIABLES_FILE, STATE_FILE] {
            if inputs.files.contains_key(name)
                || inputs
                    .credentials_file
                    .as_ref()
                    .is_some_and(|(f, _)| f == name)
            {
                return Err(InputError(format!(
                    "the file name {name} is gitplane's own: choose another"
                )));
            }
        }
        Ok(inputs)
    }

    /// `credentials_config`: `environment` and `variables` map names to keys of the account's
    /// credentials (`"*"`: all of them, as JSON); `file` names a file that receives all of them.
    fn map_credentials(
        &mut self,
        config: &Map<String, Value>,
        account: Option<&Value>,
    ) -> Result<(), InputError> {
        check_keys(
            config,
            "values.credentials_config",
            &["environment", "variables", "file"],
        )?;
        let Some(account) = account else {
            return Err(InputError(
                "values.credentials_config maps the resource account's credentials, but the \
                 definition names no driver_account"
                    .into(),
            ));
        };
        let at = "values.credentials_config";
        for (name, key) in object_at(config, at, "environment")?.into_iter().flatten() {
            let where_ = format!("{at}.environment.{name}");
            if !is_env_name(name) || matches!(name.as_str(), "PATH" | "HOME") {
                return Err(InputError(format!(
                    "{where_}: {name} cannot be set: use a name of letters, digits and _ other \
                     than PATH and HOME"
                )));
            }
            let value = credential(account, key, &where_)?;
            let text = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
            self.environment.insert(name.clone(), text);
        }
        for (name, key) in object_at(config, at, "variables")?.into_iter().flatten() {
            let where_ = format!("{at}.variables.{name}");
            let value = credential(account, key, &where_)?;
            if self.variables.insert(name.clone(), value).is_some() {
                return Err(InputError(format!(
                    "{where_}: the variable {name} is set in variables too: keep one"
                )));
            }
        }
        if let Some(file) = string_at(config, at, "file")? {
            check_relative_path(&file, &format!("{at}.file"))?;
            if self.files.contains_key(&file) {
                return Err(InputError(format!(
                    "{at}.file: {file} is in files too: keep one"
                )));
            }
            let contents = match account {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            self.credentials_file = Some((file, contents));
        }
        Ok(())
    }

    /// Every value a message or a log must not show: secret inputs, and whatever came from
    /// the account.
    pub fn secret_values<'a>(
        &'a self,
        secrets: &'a Value,
        account: Option<&'a Value>,
    ) -> Vec<String> {
        let mut list =
            super::super::exec::redaction_list([Some(secrets), account].into_iter().flatten());
        // Credentials mapped into the environment are strings now: `"*"` made one of a whole
        // account, and it must go too.
        let mapped: Vec<Value> = self
            .environment
            .values()
            .map(|v| Value::String(v.clone()))
            .chain(
                self.credentials_file
                    .iter()
                    .map(|(_, c)| Value::String(c.clone())),
            )
            .collect();
        list.extend(super::super::exec::redaction_list(&mapped));
        list.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        list.dedup();
        list
    }
}

impl Source {
    fn parse(source: &Map<String, Value>) -> Result<Source, InputError> {
        check_keys(
            source,
            "source",
            &[
                "url", "path", "rev", "ref", "branch", "username", "password", "ssh_key",
            ],
        )?;
        let text = |key: &str| string_at(source, "source", key);
        let Some(url) = text("url")? else {
            return Err(InputError(
                "source has no url: give the git repository's URL (or a folder's absolute path)"
                    .into(),
            ));
        };
        let mut revs = Vec::new();
        for key in ["rev", "ref", "branch"] {
            if let Some(rev) = text(key)? {
                revs.push(rev);
            }
        }
        if revs.len() > 1 {
            return Err(InputError(
                "source sets more than one of rev, ref and branch: keep one".into(),
            ));
        }
        let rev = revs.pop();
        if rev
            .as_deref()
            .is_some_and(|r| r.is_empty() || r.starts_with('-') || r.contains(['\0', '\n']))
        {
            return Err(InputError(
                "source.rev must be a branch, tag, ref or commit id".into(),
            ));
        }
        let path = match text("path")? {
            None => None,
            Some(p) => {
                let trimmed = p.trim_matches('/');
                if trimmed.is_empty() || trimmed == "." {
                    None
                } else {
                    check_relative_path(trimmed, "source.path")?;
                    Some(trimmed.to_owned())
                }
            }
        };
        if url.starts_with('-') || url.contains(['\0', '\n']) {
            return Err(InputError("source.url is not a URL or a path".into()));
        }
        Ok(Source {
            url,
            path,
            rev,
            username: text("username")?,
            password: text("password")?,
            ssh_key: text("ssh_key")?,
        })
    }
}

/// Whether Terraform reads `path` as code of the root module.
pub(super) fn is_code_file(path: &str) -> bool {
    !path.contains('/') && (path.ends_with(".tf") || path.ends_with(".tf.json"))
}

/// A path inside the working directory: relative, no `.` or `..`, no empty part.
fn check_relative_path(path: &str, at: &str) -> Result<(), InputError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\0')
        || path
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == ".." || part.len() > 255);
    if bad {
        return Err(InputError(format!(
            "{at}: '{path}' must be a relative path inside the working directory (no '..', \
             no leading '/')"
        )));
    }
    Ok(())
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The credential `key` names: `"*"` is all of them, as JSON text unless they are text already.
fn credential(account: &Value, key: &Value, at: &str) -> Result<Value, InputError> {
    let Value::String(key) = key else {
        return Err(InputError(format!(
            "{at} must name a key of the account's credentials (a string), got {}",
            kind_of(key)
        )));
    };
    if key == "*" {
        return Ok(match account {
            Value::String(s) => Value::String(s.clone()),
            other => Value::String(other.to_string()),
        });
    }
    match account {
        Value::Object(map) => map.get(key).cloned().ok_or_else(|| {
            InputError(format!(
                "{at} names '{key}', which the resource account's credentials do not have \
                 (they have: {})",
                map.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        }),
        _ => Err(InputError(format!(
            "{at} names '{key}', but the resource account's credentials are not a JSON object: \
             only \"*\" (all of them) can be used"
        ))),
    }
}

fn object_or_empty<'v>(
    value: &'v Value,
    at: &str,
) -> Result<Option<&'v Map<String, Value>>, InputError> {
    match value {
        Value::Null => Ok(None),
        Value::Object(map) => Ok(Some(map)),
        other => Err(InputError(format!(
            "driver_inputs.{at} must be a mapping, got {}",
            kind_of(other)
        ))),
    }
}

fn check_keys(map: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), InputError> {
    for key in map.keys() {
        if key == "providers" {
            return Err(InputError(format!(
                "{at}.providers is not supported: map the resource account's credentials with \
                 values.credentials_config (environment, variables or file) instead"
            )));
        }
        if !known.contains(&key.as_str()) && !IGNORED.contains(&key.as_str()) {
            return Err(InputError(format!(
                "{at}.{key} is not an input of the terraform driver (known: {})",
                known.join(", ")
            )));
        }
    }
    Ok(())
}

fn object_at<'v>(
    map: &'v Map<String, Value>,
    at: &str,
    key: &str,
) -> Result<Option<&'v Map<String, Value>>, InputError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object)),
        Some(other) => Err(InputError(format!(
            "{at}.{key} must be a mapping, got {}",
            kind_of(other)
        ))),
    }
}

fn string_at(map: &Map<String, Value>, at: &str, key: &str) -> Result<Option<String>, InputError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(InputError(format!(
            "{at}.{key} must be a string, got {}",
            kind_of(other)
        ))),
    }
}

/// `values.KEY` and `secrets.KEY` as one mapping; a key in both is an error.
fn merged_object(
    values: &Map<String, Value>,
    secrets: &Map<String, Value>,
    key: &str,
) -> Result<Map<String, Value>, InputError> {
    let mut merged = Map::new();
    for (map, at) in [(values, "values"), (secrets, "secrets")] {
        for (k, v) in object_at(map, at, key)?.into_iter().flatten() {
            if v.is_null() {
                continue;
            }
            if merged.insert(k.clone(), v.clone()).is_some() {
                return Err(InputError(format!(
                    "{key}.{k} is in both values.{key} and secrets.{key}: keep one"
                )));
            }
        }
    }
    Ok(merged)
}

/// A boolean input; `"true"` and `"false"` count, since placeholders render text.
fn flag(map: &Map<String, Value>, key: &str) -> Result<bool, InputError> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" => Ok(true),
        Some(Value::String(s)) if s == "false" => Ok(false),
        Some(other) => Err(InputError(format!(
            "values.{key} must be true or false, got {}",
            kind_of(other)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn parse(values: Value, secrets: Value, account: Option<Value>) -> Result<Inputs, String> {
        Inputs::parse(&values, &secrets, account.as_ref()).map_err(|e| e.0)
    }

    #[test]
    fn a_script_with_variables_files_and_credentials() {
        let account = json!({"AccessKeyId": "AKIA-1", "SecretAccessKey": "sk-2"});
        let inputs = parse(
            json!({
                "script": "resource \"terraform_data\" \"x\" {}",
                "variables": {"region": "eu-west-1", "size": 3},
                "files": {"extra.tf": "# more", "conf/app.json": "{}"},
                "credentials_config": {
                    "environment": {"AWS_ACCESS_KEY_ID": "AccessKeyId"},
                    "variables": {"secret_key": "SecretAccessKey", "all": "*"},
                    "file": "credentials.json"
                },
                "append_logs_to_error": "true",
                "manifests_output": "manifests",
                "runner_mode": "custom-kubernetes"
            }),
            json!({"variables": {"password": "pw-123456"}, "files": {"key.pem": "KEY"}}),
            Some(account.clone()),
        )
        .unwrap();
        assert_eq!(
            inputs.code,
            Code::Script("resource \"terraform_data\" \"x\" {}".into())
        );
        assert_eq!(
            Value::Object(inputs.variables.clone()),
            json!({
                "region": "eu-west-1", "size": 3, "password": "pw-123456",
                "secret_key": "sk-2", "all": account.to_string()
            })
        );
        assert_eq!(inputs.environment["AWS_ACCESS_KEY_ID"], "AKIA-1");
        assert_eq!(
            inputs.credentials_file,
            Some(("credentials.json".into(), account.to_string()))
        );
        assert!(inputs.files["key.pem"].secret);
        assert!(!inputs.files["conf/app.json"].secret);
        assert!(inputs.append_logs_to_error);
        assert_eq!(inputs.manifests_output.as_deref(), Some("manifests"));
        let secrets = json!({"variables": {"password": "pw-123456"}});
        let hidden = inputs.secret_values(&secrets, Some(&account));
        for secret in ["pw-123456", "AKIA-1", "sk-2"] {
            assert!(hidden.iter().any(|h| h == secret), "{secret} in {hidden:?}");
        }
        assert!(hidden.contains(&account.to_string()));
    }

    #[test]
    fn a_source_merges_its_secret_half_and_takes_any_name_of_rev() {
        let inputs = parse(
            json!({"source": {"url": "https://git.example.com/m.git", "path": "/modules/db/", "branch": "refs/heads/main"}}),
            json!({"source": {"password": "tok-1"}}),
            None,
        )
        .unwrap();
        assert_eq!(
            inputs.code,
            Code::Source(Source {
                url: "https://git.example.com/m.git".into(),
                path: Some("modules/db".into()),
                rev: Some("refs/heads/main".into()),
                username: None,
                password: Some("tok-1".into()),
                ssh_key: None,
            })
        );
        // An empty source, as some definitions carry beside a script, is no source.
        let inputs = parse(json!({"script": "x", "source": {}}), Value::Null, None).unwrap();
        assert_eq!(inputs.code, Code::Script("x".into()));
        let inputs = parse(json!({"files": {"main.tf": "x"}}), Value::Null, None).unwrap();
        assert_eq!(inputs.code, Code::Files);
    }

    #[test]
    fn mistakes_are_named_without_values() {
        let cases: &[(Value, Value, Option<Value>, &str)] = &[
            (json!({}), Value::Null, None, "no Terraform code"),
            (
                json!({"script": "x", "scirpt": "y"}),
                Value::Null,
                None,
                "values.scirpt is not an input of the terraform driver",
            ),
            (
                json!({"script": "x", "providers": {}}),
                Value::Null,
                None,
                "values.providers is not supported",
            ),
            (
                json!({"script": "x", "source": {"url": "u"}}),
                Value::Null,
                None,
                "script and source are both set",
            ),
            (
                json!({"source": {"path": "x"}}),
                Value::Null,
                None,
                "source has no url",
            ),
            (
                json!({"source": {"url": "u", "path": "../etc"}}),
                Value::Null,
                None,
                "source.path: '../etc' must be a relative path",
            ),
            (
                json!({"source": {"url": "u", "rev": "--upload-pack=x"}}),
                Value::Null,
                None,
                "source.rev must be a branch",
            ),
            (
                json!({"script": "x", "files": {"/etc/passwd": "x"}}),
                Value::Null,
                None,
                "values.files: '/etc/passwd' must be a relative path",
            ),
            (
                json!({"script": "x", "files": {"a/../../b": "x"}}),
                Value::Null,
                None,
                "must be a relative path",
            ),
            (
                json!({"script": "x", "files": {"terraform.tfstate": "{}"}}),
                Value::Null,
                None,
                "the file name terraform.tfstate is gitplane's own",
            ),
            (
                json!({"script": "x", "variables": {"a": 1}}),
                json!({"variables": {"a": "s3cr3t-value"}}),
                None,
                "the variable a is in both values.variables and secrets.variables",
            ),
            (
                json!({"script": "x", "credentials_config": {"environment": {"A": "k"}}}),
                Value::Null,
                None,
                "names no driver_account",
            ),
            (
                json!({"script": "x", "credentials_config": {"environment": {"A": "missing"}}}),
                Value::Null,
                Some(json!({"k": "acct-s3cr3t"})),
                "names 'missing', which the resource account's credentials do not have (they \
                 have: k)",
            ),
            (
                json!({"script": "x", "credentials_config": {"environment": {"PATH": "k"}}}),
                Value::Null,
                Some(json!({"k": "v"})),
                "PATH cannot be set",
            ),
            (
                json!({"script": "x", "credentials_config": {"variables": {"v": "k"}}}),
                Value::Null,
                Some(json!("plain-token")),
                "only \"*\" (all of them) can be used",
            ),
            (
                json!({"script": "x", "append_logs_to_error": "yes"}),
                Value::Null,
                None,
                "values.append_logs_to_error must be true or false, got a string",
            ),
            (
                json!({"script": "x", "files": {"a.tf": 5}}),
                Value::Null,
                None,
                "values.files.a.tf must be a string",
            ),
        ];
        for (values, secrets, account, expected) in cases {
            let err = parse(values.clone(), secrets.clone(), account.clone()).unwrap_err();
            assert!(err.contains(expected), "{values}: {err}");
            for secret in ["s3cr3t", "plain-token"] {
                assert!(!err.contains(secret), "{err}");
            }
        }
    }
}
