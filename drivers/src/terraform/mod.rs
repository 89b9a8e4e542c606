//! The `humanitec/terraform` driver: runs the host's `terraform` (or `tofu`) on a definition's
//! code, and keeps each resource's Terraform state in its driver cookie.
//!
//! A put is `init`, `apply` and `output -json` in a private working directory made for the
//! call (the inline `script`, a `source` folder or git repository, the definition's `files`, the
//! variables in a `*.auto.tfvars.json` file); a delete is `init` and `destroy` with the state
//! kept and the last inputs. The state goes in and out through the cookie, which gitplane seals
//! at rest; a module that declares its own `backend` keeps its state there instead. A failed
//! apply still returns the state it left, so nothing it made is forgotten.
//!
//! The programs run like the `exec` driver's (a clean environment, their own process group, a
//! time limit, within reach of [`super::kill_running`]); at the time limit Terraform is first
//! interrupted, as Ctrl-C would, so that it writes its state, then killed.

mod inputs;
mod source;
mod workspace;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::exec::{
    Exited, Keep, Program, RunFailure, describe_exit, redacted_tail, render_tail, run_program,
    with_tail,
};
use super::{
    Cookie, DeleteOutcome, Driver, DriverError, DriverRequest, Manifest, ManifestLocation,
    PutOutcome,
};
use inputs::{Code, InputError, Inputs};
use workspace::{Workspace, looks_like_state, state_is_empty};

/// How long one call (fetching the code, `init`, `apply`, `output`) may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How many calls may run at once by default: each Terraform run with its providers can take
/// hundreds of MiB.
pub const DEFAULT_CONCURRENCY: usize = 4;
/// How long an interrupted Terraform may take to write its state and exit before it is killed.
const INTERRUPT_GRACE: Duration = Duration::from_secs(30);
/// How much of Terraform's own output `append_logs_to_error` adds to a message.
const LOG_TAIL_BYTES: usize = 8_000;

/// Which program a driver type looks for first when the host config names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Terraform,
    OpenTofu,
}

/// The `driver_type`s of this driver: Humanitec's names of its Terraform and OpenTofu drivers
/// (the runner variants run the same code on one host), and a short one.
pub const DRIVER_TYPES: [(&str, Flavour); 5] = [
    ("terraform", Flavour::Terraform),
    ("humanitec/terraform", Flavour::Terraform),
    ("humanitec/terraform-runner", Flavour::Terraform),
    ("humanitec/terraform-container-runner", Flavour::Terraform),
    ("humanitec/opentofu-container-runner", Flavour::OpenTofu),
];

/// The host config's `terraform:` section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerraformConfig {
    /// The program; `None`: `terraform` on gitplane's PATH, else `tofu` (`tofu` first for the
    /// OpenTofu driver type).
    pub program: Option<PathBuf>,
    /// The time limit of one call.
    pub timeout: Duration,
    /// Calls at once; `None`: only the global limit.
    pub concurrency: Option<usize>,
    /// Variables of gitplane's environment Terraform may see, besides PATH (a plugin cache,
    /// proxies).
    pub env: Vec<String>,
    /// HOME for Terraform; `None`: the call's own working directory, so that a definition's
    /// `files` can hold `.terraformrc` or `.gitconfig`.
    pub home: Option<PathBuf>,
}

impl Default for TerraformConfig {
    fn default() -> Self {
        TerraformConfig {
            program: None,
            timeout: DEFAULT_TIMEOUT,
            concurrency: Some(DEFAULT_CONCURRENCY),
            env: Vec::new(),
            home: None,
        }
    }
}

/// Runs Terraform (or OpenTofu) once per call.
#[derive(Debug, Clone)]
pub struct TerraformDriver {
    config: TerraformConfig,
    flavour: Flavour,
}

impl TerraformDriver {
    pub fn new(config: TerraformConfig, flavour: Flavour) -> Self {
        TerraformDriver { config, flavour }
    }

    /// The program to run: the configured one, or the first of `terraform` and `tofu` on
    /// gitplane's PATH (looked up at each call, so installing one needs no restart).
    fn program(&self) -> Result<PathBuf, DriverError> {
        if let Some(program) = &self.config.program {
            return Ok(program.clone());
        }
        let names = match self.flavour {
            Flavour::Terraform => ["terraform", "tofu"],
            Flavour::OpenTofu => ["tofu", "terraform"],
        };
        let path = std::env::var_os("PATH").unwrap_or_default();
        names
            .iter()
            .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
            .find(|candidate| is_executable(candidate))
            .ok_or_else(|| {
                DriverError::final_error(
                    "neither terraform nor tofu is on gitplane's PATH: install one, or set \
                     terraform.program in the host config",
                )
            })
    }

    /// The facts of one call: the program, the deadline, what to hide.
    fn call(&self, request: &DriverRequest<'_>) -> Result<(Call<'_>, Inputs), DriverError> {
        let inputs = Inputs::parse(request.values, request.secrets, request.account)
            .map_err(|InputError(message)| DriverError::final_error(message))?;
        let mut redact = inputs.secret_values(request.secrets, request.account);
        if let Code::Source(source) = &inputs.code
            && let Some(userinfo) = url_userinfo(&source.url)
        {
            redact.insert(0, userinfo.to_owned());
        }
        Ok((
            Call {
                driver: self,
                config: &self.config,
                deadline: Instant::now() + self.config.timeout,
                redact,
                append_logs: inputs.append_logs_to_error,
            },
            inputs,
        ))
    }
}

/// The `output "NAME"` blocks of Terraform code given inline (`script`, `.tf` files), or `None`
/// when the code comes from a module source or in a form not read here (`.tf.json`).
fn script_outputs(values: &Value, secrets: &Value) -> Option<std::collections::BTreeSet<String>> {
    static OUTPUT: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"(?m)^\s*output\s+"([A-Za-z0-9_-]+)"\s*\{"#)
            .expect("a valid regular expression")
    });
    let mut texts = Vec::new();
    for inputs in [values, secrets] {
        if inputs.get("source").is_some_and(|s| !s.is_null()) {
            return None;
        }
        if let Some(script) = inputs.get("script") {
            texts.push(script.as_str()?);
        }
        if let Some(Value::Object(files)) = inputs.get("files") {
            for (path, contents) in files {
                if path.ends_with(".tf.json") {
                    return None;
                }
                if path.ends_with(".tf") {
                    texts.push(contents.as_str()?);
                }
            }
        }
    }
    if texts.is_empty() {
        return None;
    }
    Some(
        texts
            .iter()
            .flat_map(|t| OUTPUT.captures_iter(t).map(|c| c[1].to_owned()))
            .collect(),
    )
}

impl Driver for TerraformDriver {
    /// The outputs its code declares, when the code is in the definition.
    fn known_outputs(
        &self,
        values: &Value,
        secrets: &Value,
    ) -> Option<std::collections::BTreeSet<String>> {
        script_outputs(values, secrets)
    }

    fn put(&self, request: &DriverRequest<'_>) -> Result<PutOutcome, DriverError> {
        let (call, inputs) = self.call(request)?;
        let kept = request.cookie.filter(|c| looks_like_state(c));
        let ws = call.workspace(&inputs)?;
        let migrate = call.restore(&ws, kept)?;
        call.init(&ws, &inputs, migrate)?;
        let applied = call.terraform(
            &ws,
            &inputs,
            &["apply", "-auto-approve", "-input=false", "-no-color"],
            Keep::Tail,
        );
        // Whatever the apply did, the state it left must be kept.
        let cookie = call.cookie_after(&ws, kept, migrate)?;
        applied.map_err(|e| e.with_cookie(cookie.clone()))?;
        let shown = call
            .terraform(&ws, &inputs, &["output", "-json", "-no-color"], Keep::Whole)
            .map_err(|e| e.with_cookie(cookie.clone()))?;
        let stdout = shown.stdout.map_err(|e| {
            DriverError::final_error(format!("cannot read the output of `output -json`: {e}"))
                .with_cookie(cookie.clone())
        })?;
        let (outputs, secret_outputs, manifests) =
            split_outputs(&stdout, inputs.manifests_output.as_deref())
                .map_err(|message| DriverError::final_error(message).with_cookie(cookie.clone()))?;
        Ok(PutOutcome::Done {
            outputs,
            secret_outputs,
            cookie,
            manifests,
        })
    }

    fn delete(&self, request: &DriverRequest<'_>) -> Result<DeleteOutcome, DriverError> {
        let kept = request.cookie.filter(|c| looks_like_state(c));
        if kept.is_some_and(state_is_empty) {
            return Ok(DeleteOutcome::Done);
        }
        let (call, inputs) = self.call(request)?;
        let ws = call.workspace(&inputs)?;
        if kept.is_none() && !ws.backend {
            // Never applied, or its state already gone: nothing to destroy.
            return Ok(DeleteOutcome::Done);
        }
        let migrate = call.restore(&ws, kept)?;
        call.init(&ws, &inputs, migrate)?;
        let destroyed = call.terraform(
            &ws,
            &inputs,
            &["destroy", "-auto-approve", "-input=false", "-no-color"],
            Keep::Tail,
        );
        match destroyed {
            Ok(_) => Ok(DeleteOutcome::Done),
            Err(e) => {
                let cookie = call.cookie_after(&ws, kept, migrate)?;
                Err(e.with_cookie(cookie))
            }
        }
    }
}

/// One call: the program, its deadline, and what its messages must not show.
struct Call<'c> {
    driver: &'c TerraformDriver,
    config: &'c TerraformConfig,
    deadline: Instant,
    redact: Vec<String>,
    append_logs: bool,
}

impl Call<'_> {
    /// The working directory with the code, files and variables in place.
    fn workspace(&self, inputs: &Inputs) -> Result<Workspace, DriverError> {
        Workspace::create(inputs, |code| {
            let Code::Source(source) = &inputs.code else {
                return Ok(());
            };
            let private = code.parent().unwrap_or(code);
            source::place(source, code, private, &|args, dir, extra| {
                self.git(args, dir, extra)
            })
        })
        .map_err(|message| DriverError::final_error(self.hide(&message)))
    }

    /// Runs `git` for the source, within the call's deadline.
    fn git(&self, args: &[&str], dir: &Path, extra: &[(&str, String)]) -> Result<(), String> {
        let mut env = self.passed_env();
        // git runs with the host's git and SSH configuration (its known hosts, its credential
        // helpers), as gitplane's own fetches do.
        let home = self
            .config
            .home
            .clone()
            .map(OsString::from)
            .or_else(|| std::env::var_os("HOME"));
        env.extend(home.map(|h| ("HOME".to_owned(), h)));
        env.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), OsString::from(v))),
        );
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let what = format!("git {}", args.first().map_or("", String::as_str));
        match run_program(Program {
            program: "git".as_ref(),
            args: &args,
            env,
            dir: Some(dir),
            stdin: None,
            deadline: self.deadline,
            stdout: Keep::Tail,
            interrupt: None,
        }) {
            Ok(exited) if exited.status.success() => Ok(()),
            Ok(exited) => Err(with_tail(
                format!(
                    "fetching the source: {}",
                    describe_exit(&what, exited.status)
                ),
                &render_tail(&exited.stderr, &self.redact),
            )),
            Err(failure) => Err(self.failure_message(&what, failure)),
        }
    }

    /// Puts the kept state in place; returns whether `init` must move it into the module's
    /// own backend (a definition that declared one after gitplane kept its state).
    fn restore(&self, ws: &Workspace, kept: Option<&str>) -> Result<bool, DriverError> {
        let Some(state) = kept else {
            return Ok(false);
        };
        ws.write_state(state)
            .map_err(|message| DriverError::final_error(self.hide(&message)))?;
        Ok(ws.backend)
    }

    fn init(&self, ws: &Workspace, inputs: &Inputs, migrate: bool) -> Result<(), DriverError> {
        let mut args = vec!["init", "-input=false", "-no-color"];
        if migrate {
            args.extend(["-migrate-state", "-force-copy"]);
        }
        self.terraform(ws, inputs, &args, Keep::Tail).map(drop)
    }

    /// What to keep after a run: the state Terraform left, if it differs from the kept one.
    fn cookie_after(
        &self,
        ws: &Workspace,
        kept: Option<&str>,
        migrated: bool,
    ) -> Result<Cookie, DriverError> {
        if ws.backend {
            return Ok(if migrated {
                Cookie::Cleared
            } else {
                Cookie::Unchanged
            });
        }
        match ws.read_state() {
            Ok(Some(state)) if Some(state.as_str()) == kept => Ok(Cookie::Unchanged),
            Ok(Some(state)) => Ok(Cookie::Set(state)),
            Ok(None) => Ok(Cookie::Unchanged),
            Err(message) => Err(DriverError::final_error(message)),
        }
    }

    /// Runs the program with `args` in the module's folder; a failure's message ends with the
    /// end of its stderr (and, with `append_logs_to_error`, of its output), secrets removed.
    fn terraform(
        &self,
        ws: &Workspace,
        inputs: &Inputs,
        args: &[&str],
        stdout: Keep,
    ) -> Result<Exited, DriverError> {
        // Looked up only when needed: a delete with nothing to destroy runs no program.
        let program = self.driver.program()?;
        let name = program
            .file_name()
            .map_or_else(|| "terraform".into(), |n| n.to_string_lossy());
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        let what = format!("{name} {}", args[0]);
        let run = run_program(Program {
            program: program.as_os_str(),
            args: &args,
            env: self.terraform_env(ws, inputs),
            dir: Some(&ws.root),
            stdin: None,
            deadline: self.deadline,
            stdout,
            interrupt: Some(INTERRUPT_GRACE),
        });
        match run {
            Ok(exited) if exited.status.success() => Ok(exited),
            Ok(exited) => {
                let mut message = with_tail(
                    describe_exit(&what, exited.status),
                    &render_tail(&exited.stderr, &self.redact),
                );
                if self.append_logs
                    && let Ok(out) = &exited.stdout
                {
                    message.push_str(&format!(
                        "; output: {}",
                        redacted_tail(out, &self.redact, LOG_TAIL_BYTES)
                    ));
                }
                Err(DriverError::final_error(message))
            }
            Err(failure) => {
                let logs = match (&failure, self.append_logs) {
                    (RunFailure::TimedOut { stdout, .. }, true) => format!(
                        "; output: {}",
                        redacted_tail(stdout, &self.redact, LOG_TAIL_BYTES)
                    ),
                    _ => String::new(),
                };
                Err(DriverError::final_error(
                    self.failure_message(&what, failure) + &logs,
                ))
            }
        }
    }

    fn failure_message(&self, what: &str, failure: RunFailure) -> String {
        let limit = format!(
            "{:?} (the host config's terraform.timeout)",
            self.config.timeout
        );
        match failure {
            RunFailure::Start(e) => format!("cannot start {what}: {e}"),
            RunFailure::Wait(e) => format!("cannot wait for {what}: {e}"),
            RunFailure::TimedOut { stderr, .. } => with_tail(
                format!(
                    "{what} did not finish within {limit}: it was interrupted (so that it could \
                     save its state), then stopped with every process it started"
                ),
                &render_tail(&stderr, &self.redact),
            ),
            RunFailure::HeldOpen { stderr } => with_tail(
                format!(
                    "{what} exited, but a process it started kept its output open past {limit} \
                     and was killed"
                ),
                &render_tail(&stderr, &self.redact),
            ),
        }
    }

    /// What Terraform sees of the environment: PATH and the host config's names from
    /// gitplane's, its HOME, automation settings, and the credentials the definition maps.
    fn terraform_env(&self, ws: &Workspace, inputs: &Inputs) -> Vec<(String, OsString)> {
        let mut env = self.passed_env();
        let home = self.config.home.clone().unwrap_or_else(|| ws.root.clone());
        env.push(("HOME".to_owned(), home.into_os_string()));
        for (name, value) in [
            ("TF_IN_AUTOMATION", "1"),
            ("TF_INPUT", "0"),
            // No call home to HashiCorp's version check on every run.
            ("CHECKPOINT_DISABLE", "1"),
        ] {
            env.push((name.to_owned(), value.into()));
        }
        env.extend(
            inputs
                .environment
                .iter()
                .map(|(k, v)| (k.clone(), OsString::from(v))),
        );
        env
    }

    /// PATH and the variables the host config passes, from gitplane's environment.
    fn passed_env(&self) -> Vec<(String, OsString)> {
        std::iter::once("PATH")
            .chain(self.config.env.iter().map(String::as_str))
            .filter_map(|name| Some((name.to_owned(), std::env::var_os(name)?)))
            .collect()
    }

    fn hide(&self, message: &str) -> String {
        let mut text = message.to_owned();
        for secret in &self.redact {
            text = text.replace(secret.as_str(), "[redacted]");
        }
        text
    }
}

/// `terraform output -json` as outputs, secret outputs (the `sensitive` ones) and the
/// manifests of the `manifests_output` output.
fn split_outputs(
    stdout: &[u8],
    manifests_output: Option<&str>,
) -> Result<(Value, Value, Vec<Manifest>), String> {
    let shown: Map<String, Value> = serde_json::from_slice(stdout)
        .map_err(|e| format!("`output -json` did not print a JSON object: {e}"))?;
    if let Some(name) = manifests_output
        && !shown.contains_key(name)
    {
        return Err(format!(
            "manifests_output names the output {name}, which the module does not have"
        ));
    }
    let mut outputs = Map::new();
    let mut secrets = Map::new();
    let mut manifests = Vec::new();
    for (name, output) in shown {
        let Value::Object(mut output) = output else {
            return Err(format!(
                "`output -json`: the output {name} is not an object"
            ));
        };
        let value = output.remove("value").unwrap_or(Value::Null);
        if Some(name.as_str()) == manifests_output {
            manifests = parse_manifests(&value, &name)?;
        } else if output.get("sensitive") == Some(&Value::Bool(true)) {
            secrets.insert(name, value);
        } else {
            outputs.insert(name, value);
        }
    }
    Ok((Value::Object(outputs), Value::Object(secrets), manifests))
}

/// The manifests output: a list of `{location, data}` (named `manifest-1`, `manifest-2`, …)
/// or a map of them by name. Messages never quote a manifest: it may hold secrets.
fn parse_manifests(value: &Value, output: &str) -> Result<Vec<Manifest>, String> {
    let items: Vec<(String, &Value)> = match value {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| (format!("manifest-{}", i + 1), item))
            .collect(),
        Value::Object(map) => map.iter().map(|(k, v)| (k.clone(), v)).collect(),
        other => {
            return Err(format!(
                "the output {output} (manifests_output) must be a list or a map of \
                 {{location, data}}, got {}",
                gitplane_core::model::template::kind_of(other)
            ));
        }
    };
    items
        .into_iter()
        .map(|(name, item)| {
            let bad = |why: &str| format!("the output {output} (manifests_output), {name}: {why}");
            let Value::Object(item) = item else {
                return Err(bad("must be an object with location and data"));
            };
            let location = match item.get("location").and_then(Value::as_str) {
                Some("namespace") => ManifestLocation::Namespace,
                Some("cluster") => ManifestLocation::Cluster,
                Some("containers") => ManifestLocation::Containers,
                Some("volumes") => ManifestLocation::Volumes,
                _ => {
                    return Err(bad(
                        "location must be namespace, cluster, containers or volumes",
                    ));
                }
            };
            let data = match item.get("data") {
                Some(data @ Value::Object(_)) => data.clone(),
                _ => return Err(bad("data must be an object (the Kubernetes manifest)")),
            };
            Ok(Manifest {
                name,
                location,
                data,
            })
        })
        .collect()
}

/// The `user:password` of a URL, if it has one.
fn url_userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    authority
        .rsplit_once('@')
        .map(|(userinfo, _)| userinfo)
        .filter(|u| !u.is_empty())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests;
