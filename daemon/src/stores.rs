//! Secret stores on the host: where `secret_refs: {store, ref}` values are read from, just before a plan.
//!
//! A Resource Definition names a store and a ref; which stores exist, and where they are, is
//! host config and never in git, so a config repo can only reach the directories and servers
//! the host chose. Each read goes to the store (there is no cache), so a rotated secret is seen
//! by the next plan.
//!
//! A ref that names no store (`secret_refs: {ref: REF}`, HPO's "the organisation's primary
//! store") is read from the host's default store: the one marked `primary: true`, or the only
//! store when just one is configured.
//!
//! Error messages name the store, the ref and what to fix. A [`StoreError`] never holds a secret
//! value or the Vault token, so neither its `Display` nor its `Debug` can leak one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;

use crate::drivers::{encode_path_segment, one_line};
use crate::model::template::kind_of;
use ureq::Agent;

/// The largest secret file a dir store reads, in bytes.
const MAX_SECRET_FILE_BYTES: u64 = 1024 * 1024;
/// The largest Vault token file read, in bytes.
const MAX_TOKEN_FILE_BYTES: u64 = 64 * 1024;
/// The largest `200` answer accepted from Vault, in bytes.
const MAX_VAULT_ANSWER_BYTES: u64 = 10 * 1024 * 1024;
/// How much of an error answer is read for its `errors`, in bytes.
const MAX_ERROR_ANSWER_BYTES: u64 = 64 * 1024;
const TOKEN_HEADER: &str = "X-Vault-Token";

/// One configured store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// `{dir: PATH}`: REF is a file path relative to PATH; the value is the file's text, one
    /// trailing newline removed. Works with systemd's `LoadCredential=` directory.
    Dir { path: PathBuf },
    /// `{vault: {url, token_file, mount, timeout}}`: HashiCorp Vault KV version 2.
    Vault {
        url: String,
        token_file: PathBuf,
        mount: String,
        timeout: Duration,
    },
}

/// The stores of the host config, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SecretStores {
    stores: BTreeMap<String, StoreConfig>,
    /// The store marked `primary: true`, which serves refs that name no store.
    primary: Option<String>,
}

impl SecretStores {
    pub fn new(stores: BTreeMap<String, StoreConfig>) -> Self {
        SecretStores {
            stores,
            primary: None,
        }
    }

    /// Makes `primary` (a configured store) the one that serves refs naming no store.
    pub fn with_primary(mut self, primary: Option<String>) -> Self {
        self.primary = primary;
        self
    }

    /// Each store's name and kind, one line each, sorted, and which store serves refs that
    /// name none: what decides which refs a commit may name.
    pub fn describe(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .stores
            .iter()
            .map(|(name, config)| match config {
                StoreConfig::Dir { .. } => format!("store\0{name}\0dir"),
                StoreConfig::Vault { .. } => format!("store\0{name}\0vault"),
            })
            .collect();
        if let Ok(default) = self.default_store() {
            lines.push(format!("default-store\0{default}"));
        }
        lines
    }

    /// The store that serves refs naming none: the one marked `primary`, else the only one.
    pub fn default_store(&self) -> Result<&str, StoreError> {
        if let Some(primary) = &self.primary {
            return Ok(primary);
        }
        match (self.stores.len(), self.stores.keys().next()) {
            (1, Some(only)) => Ok(only),
            _ => Err(StoreError::NoDefaultStore {
                configured: self.names().map(str::to_owned).collect(),
            }),
        }
    }

    /// The store a ref is read from: the one it names, or the default for an empty name.
    fn resolve<'a>(&'a self, store: &'a str) -> Result<&'a str, StoreError> {
        if store.is_empty() {
            self.default_store()
        } else {
            Ok(store)
        }
    }

    /// Configured store names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.stores.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.stores.contains_key(name)
    }

    /// Reads one secret now (no caching: a rotated secret is seen on the next read).
    ///
    /// A dir store gives a JSON string; a Vault store gives the secret's whole `data` object,
    /// or with `PATH#FIELD` that field's value.
    pub fn read(
        &self,
        store: &str,
        reference: &str,
        version: Option<&str>,
    ) -> Result<Value, StoreError> {
        let store = self.resolve(store)?;
        match self.open(store)? {
            Store::Dir(dir) => read_dir_secret(store, dir, reference, version),
            Store::Vault(vault) => vault.read(reference, version),
        }
    }

    /// Checks a reference without reading anything: the store is configured, and the ref and
    /// version are ones it can serve. What `validate` can say before any secret is read.
    pub fn check(
        &self,
        store: &str,
        reference: &str,
        version: Option<&str>,
    ) -> Result<(), StoreError> {
        let store = self.resolve(store)?;
        match self.open(store)? {
            Store::Dir(dir) => {
                check_dir_ref(store, dir, reference, version)?;
                check_dir_on_disk(store, dir, reference)
            }
            Store::Vault(vault) => vault.check(reference, version).map(drop),
        }
    }

    /// Reads every secret of `wanted` (store, ref, version), [`PARALLEL_READS`] at a time.
    ///
    /// Fields of one Vault secret (`PATH#a`, `PATH#b`, one version) come from one read, so they
    /// belong to the same version even while it is being rotated. Once a store cannot be
    /// reached, its other reads fail at once with that error rather than each waiting out its
    /// time-out.
    pub fn read_all<'a>(
        &'a self,
        wanted: &[(&'a str, &'a str, Option<&'a str>)],
    ) -> Vec<Result<Value, StoreError>> {
        // What to fetch for each wanted secret: a Vault secret's path without its field.
        let plans: Vec<Result<(Fetch<'a>, Option<&'a str>), StoreError>> = wanted
            .iter()
            .map(|&(store, reference, version)| {
                let store = self.resolve(store)?;
                let field = match self.get(store)? {
                    StoreConfig::Vault { .. } => {
                        self.check(store, reference, version)?;
                        reference.split_once('#').map(|(_, field)| field)
                    }
                    StoreConfig::Dir { .. } => None,
                };
                let reference = match field {
                    Some(_) => reference
                        .split_once('#')
                        .map_or(reference, |(path, _)| path),
                    None => reference,
                };
                Ok(((store, reference, version), field))
            })
            .collect();
        let mut fetches: Vec<Fetch<'_>> = plans
            .iter()
            .filter_map(|p| p.as_ref().ok().map(|(fetch, _)| *fetch))
            .collect();
        fetches.sort();
        fetches.dedup();
        let fetched = self.fetch_all(&fetches);
        plans
            .into_iter()
            .map(|plan| {
                let (fetch, field) = plan?;
                let index =
                    fetches
                        .binary_search(&fetch)
                        .map_err(|_| StoreError::Misconfigured {
                            store: fetch.0.to_owned(),
                            reason: "a secret was not read (this is a bug in gitplane)".to_owned(),
                        })?;
                let value = fetched[index].clone()?;
                match field {
                    None => Ok(value),
                    Some(field) => field_of(fetch.0, fetch.1, field, value),
                }
            })
            .collect()
    }

    /// Reads each fetch once, in threads; a store that could not be reached is not asked again.
    fn fetch_all(&self, fetches: &[Fetch<'_>]) -> Vec<Result<Value, StoreError>> {
        if fetches.is_empty() {
            return Vec::new();
        }
        let unreachable: Mutex<BTreeMap<&str, StoreError>> = Mutex::new(BTreeMap::new());
        let per_thread = fetches.len().div_ceil(PARALLEL_READS);
        std::thread::scope(|scope| {
            let workers: Vec<_> = fetches
                .chunks(per_thread)
                .map(|chunk| {
                    let unreachable = &unreachable;
                    scope.spawn(move || {
                        chunk
                            .iter()
                            .map(|&(store, reference, version)| {
                                let down = unreachable
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .get(store)
                                    .cloned();
                                if let Some(error) = down {
                                    return Err(error);
                                }
                                let result = self.read(store, reference, version);
                                if let Err(e @ StoreError::Unreachable { .. }) = &result {
                                    unreachable
                                        .lock()
                                        .unwrap_or_else(|e| e.into_inner())
                                        .insert(store, e.clone());
                                }
                                result
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| match w.join() {
                    Ok(results) => results,
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect()
        })
    }

    fn get(&self, store: &str) -> Result<&StoreConfig, StoreError> {
        self.stores
            .get(store)
            .ok_or_else(|| StoreError::UnknownStore {
                store: store.to_owned(),
                configured: self.names().map(str::to_owned).collect(),
            })
    }

    fn open<'a>(&'a self, store: &'a str) -> Result<Store<'a>, StoreError> {
        Ok(match self.get(store)? {
            StoreConfig::Dir { path } => Store::Dir(path),
            StoreConfig::Vault {
                url,
                token_file,
                mount,
                timeout,
            } => Store::Vault(VaultRead {
                store,
                url,
                token_file,
                mount,
                timeout: *timeout,
            }),
        })
    }
}

/// Why no store is the default, and what to configure.
fn no_default_advice(configured: &[String]) -> String {
    if configured.is_empty() {
        "the host config has no secret stores: add one under secret_stores in the host \
         config, or name the store with `store: NAME`"
            .to_owned()
    } else {
        format!(
            "the host config marks none of its stores ({}) as the default: add \
             `primary: true` to one of them under secret_stores in the host config, or name the \
             store with `store: NAME`",
            configured.join(", ")
        )
    }
}

/// A configured store, ready to check or read a reference.
enum Store<'a> {
    Dir(&'a Path),
    Vault(VaultRead<'a>),
}

/// One read from a store: store, ref (a Vault path without its field), version.
type Fetch<'a> = (&'a str, &'a str, Option<&'a str>);

/// How many secrets are read at once: reads wait on the network, and a few at a time keep a
/// plan's delay near that of one read.
pub const PARALLEL_READS: usize = 8;

/// One field of a Vault secret's whole `data`.
fn field_of(store: &str, path: &str, field: &str, data: Value) -> Result<Value, StoreError> {
    let Value::Object(mut data) = data else {
        return Err(StoreError::BadAnswer {
            store: store.to_owned(),
            reference: path.to_owned(),
            reason: "data.data is not an object".to_owned(),
        });
    };
    data.remove(field).ok_or_else(|| StoreError::MissingField {
        store: store.to_owned(),
        path: path.to_owned(),
        field: field.to_owned(),
        available: data.keys().cloned().collect(),
    })
}

/// Why a secret could not be read. No variant holds a secret value or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error(
        "secret store '{store}' is not configured in the host config ({})",
        configured_list(.configured)
    )]
    UnknownStore {
        store: String,
        configured: Vec<String>,
    },
    /// A ref names no store, and the host config says no store serves such refs.
    #[error(
        "this ref names no store, so it is read from the host's default secret store, but {}",
        no_default_advice(.configured)
    )]
    NoDefaultStore { configured: Vec<String> },
    /// The host config gives the store something it cannot work with.
    #[error("secret store '{store}' is misconfigured in the host config: {reason}")]
    Misconfigured { store: String, reason: String },
    #[error("secret store '{store}' cannot use ref '{reference}': {reason}")]
    InvalidRef {
        store: String,
        reference: String,
        reason: String,
    },
    #[error("secret store '{store}' cannot read version '{version}' of '{reference}': {reason}")]
    InvalidVersion {
        store: String,
        reference: String,
        version: String,
        reason: String,
    },
    #[error("secret store '{store}' has no secret at '{reference}' ({detail})")]
    NotFound {
        store: String,
        reference: String,
        detail: String,
    },
    /// A dir-store ref that a symlink leads out of the store's directory.
    #[error(
        "secret store '{store}' refuses ref '{reference}': it resolves to {} outside the store directory {}",
        .resolved.display(),
        .dir.display()
    )]
    Escapes {
        store: String,
        reference: String,
        resolved: PathBuf,
        dir: PathBuf,
    },
    #[error("secret store '{store}' cannot open its directory {}: {kind}", .dir.display())]
    DirUnavailable {
        store: String,
        dir: PathBuf,
        kind: io::ErrorKind,
    },
    #[error("secret store '{store}' cannot read '{reference}' from {}: {kind}", .path.display())]
    Io {
        store: String,
        reference: String,
        path: PathBuf,
        kind: io::ErrorKind,
    },
    /// The file is there but is not a secret's text.
    #[error("secret store '{store}' cannot use the secret at '{reference}': {reason}")]
    Unusable {
        store: String,
        reference: String,
        reason: String,
    },
    #[error("secret store '{store}' has no usable Vault token: the token file {} {problem}", .path.display())]
    Token {
        store: String,
        path: PathBuf,
        problem: String,
    },
    #[error(
        "secret store '{store}' denied reading '{reference}' (HTTP 403 permission denied): check \
         that the token in {} is valid and that its policy allows 'read' on '{policy_path}'",
        .token_file.display()
    )]
    PermissionDenied {
        store: String,
        reference: String,
        token_file: PathBuf,
        /// The API path a policy must grant, `MOUNT/data/PATH`.
        policy_path: String,
    },
    #[error(
        "secret store '{store}' has no field '{field}' in the secret at '{path}' ({})",
        field_list(.available)
    )]
    MissingField {
        store: String,
        path: String,
        field: String,
        /// The secret's field names, never their values.
        available: Vec<String>,
    },
    /// Any other status; `explanation` is Vault's `errors`, which never carry secret values.
    #[error("secret store '{store}' answered HTTP {status} for '{reference}'{}", explanation_suffix(.explanation))]
    Http {
        store: String,
        reference: String,
        status: u16,
        explanation: String,
    },
    #[error("secret store '{store}' could not be reached at {url}: {reason}")]
    Unreachable {
        store: String,
        url: String,
        reason: String,
    },
    /// A `200` that is not a KV v2 read; `reason` never quotes the body.
    #[error(
        "secret store '{store}' gave an unexpected answer for '{reference}' (HTTP 200): {reason}"
    )]
    BadAnswer {
        store: String,
        reference: String,
        reason: String,
    },
}

fn configured_list(configured: &[String]) -> String {
    if configured.is_empty() {
        "none configured".to_owned()
    } else {
        format!("configured: {}", configured.join(", "))
    }
}

fn field_list(available: &[String]) -> String {
    if available.is_empty() {
        "the secret has no fields".to_owned()
    } else {
        format!("fields: {}", available.join(", "))
    }
}

fn explanation_suffix(explanation: &str) -> String {
    if explanation.is_empty() {
        String::new()
    } else {
        format!(": {explanation}")
    }
}

/// A dir store's ref names a file inside its directory, and a dir store has no versions.
fn check_dir_ref(
    store: &str,
    dir: &Path,
    reference: &str,
    version: Option<&str>,
) -> Result<(), StoreError> {
    let invalid_ref = |reason: &str| StoreError::InvalidRef {
        store: store.to_owned(),
        reference: reference.to_owned(),
        reason: reason.to_owned(),
    };
    if reference.is_empty() {
        return Err(invalid_ref(
            "the ref is empty; it names a file in the store directory",
        ));
    }
    if reference.contains('\0') {
        return Err(invalid_ref("it contains a NUL byte"));
    }
    for component in Path::new(reference).components() {
        match component {
            Component::Prefix(_) | Component::RootDir => {
                return Err(invalid_ref(&format!(
                    "it is an absolute path; write it relative to the store directory {}",
                    dir.display()
                )));
            }
            Component::ParentDir => {
                return Err(invalid_ref("'..' is not allowed in a ref"));
            }
            Component::CurDir | Component::Normal(_) => {}
        }
    }
    if let Some(version) = version {
        return Err(StoreError::InvalidVersion {
            store: store.to_owned(),
            reference: reference.to_owned(),
            version: version.to_owned(),
            reason: "a dir store keeps one version of each secret; remove 'version' from the \
                     secret_ref"
                .to_owned(),
        });
    }

    Ok(())
}

/// What the file system says about a dir store's ref, without opening the secret: the store's
/// directory exists, and the ref does not lead (through a symlink) out of it or to a folder. A
/// secret file that is not there yet is left to the read, as is whatever this user may not look
/// at (the pre-receive hook runs as the pushing user, not as the service).
fn check_dir_on_disk(store: &str, dir: &Path, reference: &str) -> Result<(), StoreError> {
    let canonical_dir = match dir.canonicalize() {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(StoreError::Misconfigured {
                store: store.to_owned(),
                reason: format!(
                    "its directory {} does not exist: create it, or correct \
                     secret_stores.{store}.dir",
                    dir.display()
                ),
            });
        }
        Err(_) => return Ok(()),
    };
    if !canonical_dir.is_dir() {
        return Err(StoreError::Misconfigured {
            store: store.to_owned(),
            reason: format!(
                "{} is not a directory: secret_stores.{store}.dir names the folder that holds \
                 the secret files",
                dir.display()
            ),
        });
    }
    let Ok(target) = dir.join(reference).canonicalize() else {
        return Ok(());
    };
    let target = inside_store(store, reference, target, canonical_dir)?;
    if target.is_dir() {
        return Err(StoreError::Unusable {
            store: store.to_owned(),
            reference: reference.to_owned(),
            reason: format!("{} is a directory, not a file", target.display()),
        });
    }
    Ok(())
}

/// `target` (a ref's canonical path), if it lies inside the store's `canonical_dir`: a symlink
/// in the directory must not hand out a file the host never put there.
fn inside_store(
    store: &str,
    reference: &str,
    target: PathBuf,
    canonical_dir: PathBuf,
) -> Result<PathBuf, StoreError> {
    if target.starts_with(&canonical_dir) {
        Ok(target)
    } else {
        Err(StoreError::Escapes {
            store: store.to_owned(),
            reference: reference.to_owned(),
            resolved: target,
            dir: canonical_dir,
        })
    }
}

/// A dir store's secret: the file's text as a JSON string, one trailing newline removed.
fn read_dir_secret(
    store: &str,
    dir: &Path,
    reference: &str,
    version: Option<&str>,
) -> Result<Value, StoreError> {
    check_dir_ref(store, dir, reference, version)?;

    let canonical_dir = dir.canonicalize().map_err(|e| StoreError::DirUnavailable {
        store: store.to_owned(),
        dir: dir.to_owned(),
        kind: e.kind(),
    })?;
    let joined = dir.join(reference);
    let io_error = |path: &Path, error: io::Error| {
        if error.kind() == io::ErrorKind::NotFound {
            StoreError::NotFound {
                store: store.to_owned(),
                reference: reference.to_owned(),
                detail: format!("no file {}", joined.display()),
            }
        } else {
            StoreError::Io {
                store: store.to_owned(),
                reference: reference.to_owned(),
                path: path.to_owned(),
                kind: error.kind(),
            }
        }
    };
    // Resolving symlinks before the check is what keeps a link inside the directory from
    // handing out a file the host never put there.
    let target = joined.canonicalize().map_err(|e| io_error(&joined, e))?;
    if target == canonical_dir {
        return Err(StoreError::InvalidRef {
            store: store.to_owned(),
            reference: reference.to_owned(),
            reason: "it names the store directory itself, not a file".to_owned(),
        });
    }
    let target = inside_store(store, reference, target, canonical_dir)?;
    let unusable = |reason: String| StoreError::Unusable {
        store: store.to_owned(),
        reference: reference.to_owned(),
        reason,
    };
    let metadata = std::fs::metadata(&target).map_err(|e| io_error(&target, e))?;
    // Opening a FIFO or a device could block the plan or never end.
    if metadata.is_dir() {
        return Err(unusable(format!(
            "{} is a directory, not a file",
            target.display()
        )));
    }
    if !metadata.is_file() {
        return Err(unusable(format!(
            "{} is not a regular file",
            target.display()
        )));
    }
    let mut bytes = Vec::new();
    File::open(&target)
        .and_then(|file| file.take(MAX_SECRET_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| io_error(&target, e))?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        return Err(unusable(format!(
            "{} is larger than {MAX_SECRET_FILE_BYTES} bytes",
            target.display()
        )));
    }
    let mut text = String::from_utf8(bytes).map_err(|_| {
        unusable(format!(
            "{} is not UTF-8 text (base64-encode binary secrets)",
            target.display()
        ))
    })?;
    if text.ends_with("\r\n") {
        text.truncate(text.len() - 2);
    } else if text.ends_with('\n') {
        text.truncate(text.len() - 1);
    }
    Ok(Value::String(text))
}

/// One read from a Vault KV v2 store, for building its request and its error messages.
struct VaultRead<'a> {
    store: &'a str,
    url: &'a str,
    token_file: &'a Path,
    mount: &'a str,
    timeout: Duration,
}

impl VaultRead<'_> {
    /// The path, field and mount of a reference, checked without any request.
    fn check<'r>(
        &self,
        reference: &'r str,
        version: Option<&str>,
    ) -> Result<(&'r str, Option<&'r str>, &str), StoreError> {
        let (path, field) = match reference.split_once('#') {
            Some((path, field)) => (path, Some(field)),
            None => (reference, None),
        };
        self.check_path(reference, path)?;
        if field == Some("") {
            return Err(self.invalid_ref(
                reference,
                "nothing follows '#'; write PATH#FIELD for one field or PATH for the whole secret",
            ));
        }
        if let Some(version) = version
            && (version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(StoreError::InvalidVersion {
                store: self.store.to_owned(),
                reference: reference.to_owned(),
                version: version.to_owned(),
                reason: "Vault KV versions are whole numbers, like '3'".to_owned(),
            });
        }
        let mount = self.mount.trim_matches('/');
        if mount.is_empty() {
            return Err(StoreError::Misconfigured {
                store: self.store.to_owned(),
                reason: "the Vault mount is empty".to_owned(),
            });
        }
        Ok((path, field, mount))
    }

    fn read(&self, reference: &str, version: Option<&str>) -> Result<Value, StoreError> {
        let (path, field, mount) = self.check(reference, version)?;
        let token = self.token()?;
        let url = vault_url(self.url, mount, path, version);

        let agent: Agent = Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(self.timeout))
            // A redirect would resend the token to a server the host config does not name.
            .max_redirects(0)
            .build()
            .into();
        let mut response = agent
            .get(&url)
            .header(TOKEN_HEADER, &token)
            .call()
            .map_err(|e| self.unreachable(&url, e, "no answer"))?;
        let status = response.status().as_u16();
        match status {
            200 => {
                let bytes = self.read_answer(&url, path, &mut response)?;
                self.value(path, field, version, &bytes)
            }
            404 => {
                let bytes = read_error_answer(&mut response);
                Err(self.not_found(path, version, serde_json::from_slice(&bytes).ok(), 404))
            }
            403 => Err(StoreError::PermissionDenied {
                store: self.store.to_owned(),
                reference: path.to_owned(),
                token_file: self.token_file.to_owned(),
                policy_path: format!("{mount}/data/{path}"),
            }),
            _ => {
                let bytes = read_error_answer(&mut response);
                let mut explanation = vault_errors(&bytes);
                if (300..400).contains(&status) && explanation.is_empty() {
                    explanation = "redirects are not followed; set url to the server that \
                                   answers (the active node)"
                        .to_owned();
                }
                Err(StoreError::Http {
                    store: self.store.to_owned(),
                    reference: path.to_owned(),
                    status,
                    explanation,
                })
            }
        }
    }

    fn invalid_ref(&self, reference: &str, reason: &str) -> StoreError {
        StoreError::InvalidRef {
            store: self.store.to_owned(),
            reference: reference.to_owned(),
            reason: reason.to_owned(),
        }
    }

    /// A PATH that stays one secret under the mount, whatever a proxy or Vault normalizes.
    fn check_path(&self, reference: &str, path: &str) -> Result<(), StoreError> {
        let reason = if path.is_empty() {
            "the path is empty; write PATH or PATH#FIELD"
        } else if path.starts_with('/') {
            "the path starts with '/'; write it relative to the mount"
        } else if path.contains('?') {
            "'?' is not allowed in the path"
        } else if path.split('/').any(|s| s == ".." || s == ".") {
            "'.' and '..' segments are not allowed in the path"
        } else if path.split('/').any(str::is_empty) {
            "the path has an empty segment ('//' or a trailing '/')"
        } else {
            return Ok(());
        };
        Err(self.invalid_ref(reference, reason))
    }

    /// The token, read now so that a renewed token file is used without a restart.
    fn token(&self) -> Result<String, StoreError> {
        let problem = |problem: String| StoreError::Token {
            store: self.store.to_owned(),
            path: self.token_file.to_owned(),
            problem,
        };
        let mut bytes = Vec::new();
        File::open(self.token_file)
            .and_then(|file| file.take(MAX_TOKEN_FILE_BYTES + 1).read_to_end(&mut bytes))
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    problem("does not exist".to_owned())
                } else {
                    problem(format!("cannot be read: {}", e.kind()))
                }
            })?;
        if bytes.len() as u64 > MAX_TOKEN_FILE_BYTES {
            return Err(problem(format!(
                "is larger than {MAX_TOKEN_FILE_BYTES} bytes"
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| problem("is not UTF-8 text".to_owned()))?;
        let token = text.trim();
        if token.is_empty() {
            return Err(problem("is empty".to_owned()));
        }
        // Checked here so that no HTTP library error can end up quoting the token.
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(problem(
                "holds characters that cannot go in an HTTP header (spaces, control or \
                 non-ASCII characters)"
                    .to_owned(),
            ));
        }
        Ok(token.to_owned())
    }

    fn unreachable(&self, url: &str, error: ureq::Error, what: &str) -> StoreError {
        let reason = match error {
            ureq::Error::Timeout(_) => format!("{what} within {:?}", self.timeout),
            // The token is checked to be header-safe, so only the URL can be what is invalid.
            ureq::Error::BadUri(_) | ureq::Error::Http(_) => {
                return StoreError::Misconfigured {
                    store: self.store.to_owned(),
                    reason: format!(
                        "the Vault url '{}' does not make a valid URL ({error})",
                        self.url
                    ),
                };
            }
            other => other.to_string(),
        };
        StoreError::Unreachable {
            store: self.store.to_owned(),
            url: url.to_owned(),
            reason,
        }
    }

    fn read_answer(
        &self,
        url: &str,
        path: &str,
        response: &mut ureq::http::Response<ureq::Body>,
    ) -> Result<Vec<u8>, StoreError> {
        let mut bytes = Vec::new();
        response
            .body_mut()
            .as_reader()
            .take(MAX_VAULT_ANSWER_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| {
                self.unreachable(url, ureq::Error::from(e), "the whole answer did not arrive")
            })?;
        if bytes.len() as u64 > MAX_VAULT_ANSWER_BYTES {
            return Err(StoreError::BadAnswer {
                store: self.store.to_owned(),
                reference: path.to_owned(),
                reason: format!("the body exceeds {MAX_VAULT_ANSWER_BYTES} bytes"),
            });
        }
        Ok(bytes)
    }

    /// The value in a `200` answer: `data.data`, or one field of it.
    fn value(
        &self,
        path: &str,
        field: Option<&str>,
        version: Option<&str>,
        bytes: &[u8],
    ) -> Result<Value, StoreError> {
        let bad = |reason: String| StoreError::BadAnswer {
            store: self.store.to_owned(),
            reference: path.to_owned(),
            reason,
        };
        // Parse errors only give a position: the body holds the secret.
        let body: Value = serde_json::from_slice(bytes).map_err(|e| {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                bad("the body is empty".to_owned())
            } else {
                bad(format!(
                    "invalid JSON at line {} column {}",
                    e.line(),
                    e.column()
                ))
            }
        })?;
        let data = match body.get("data").and_then(|d| d.get("data")) {
            Some(Value::Object(data)) => data,
            Some(Value::Null) => {
                return Err(self.not_found(path, version, Some(body.clone()), 200));
            }
            Some(other) => {
                return Err(bad(format!(
                    "data.data is {}, not an object (is the mount a KV version 2 engine?)",
                    kind_of(other)
                )));
            }
            None => {
                return Err(bad(
                    "data.data is missing (is the mount a KV version 2 engine?)".to_owned(),
                ));
            }
        };
        let Some(field) = field else {
            return Ok(Value::Object(data.clone()));
        };
        data.get(field)
            .cloned()
            .ok_or_else(|| StoreError::MissingField {
                store: self.store.to_owned(),
                path: path.to_owned(),
                field: field.to_owned(),
                available: data.keys().cloned().collect(),
            })
    }

    /// No secret: says whether the version asked for was deleted or destroyed, when Vault says.
    fn not_found(
        &self,
        path: &str,
        version: Option<&str>,
        body: Option<Value>,
        status: u16,
    ) -> StoreError {
        let metadata = body.as_ref().and_then(|b| b.pointer("/data/metadata"));
        let which = match version {
            Some(version) => format!("version {version}"),
            None => "its latest version".to_owned(),
        };
        let destroyed = metadata
            .and_then(|m| m.get("destroyed"))
            .and_then(Value::as_bool)
            == Some(true);
        let deleted_at = metadata
            .and_then(|m| m.get("deletion_time"))
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty());
        let detail = if destroyed {
            format!("{which} was destroyed, HTTP {status}")
        } else if let Some(at) = deleted_at {
            format!("{which} was deleted at {}, HTTP {status}", one_line(at))
        } else if let Some(version) = version {
            format!("version {version}, HTTP {status}")
        } else {
            format!("HTTP {status}")
        };
        StoreError::NotFound {
            store: self.store.to_owned(),
            reference: path.to_owned(),
            detail,
        }
    }
}

/// `{url}/v1/{mount}/data/{path}[?version=V]`, each segment percent-encoded.
fn vault_url(base: &str, mount: &str, path: &str, version: Option<&str>) -> String {
    let mut url = format!("{}/v1/", base.trim_end_matches('/'));
    url.push_str(&encode_segments(mount));
    url.push_str("/data/");
    url.push_str(&encode_segments(path));
    if let Some(version) = version {
        let _ = write!(url, "?version={version}");
    }
    url
}

/// Percent-encodes all but unreserved characters within each `/`-separated segment.
fn encode_segments(path: &str) -> String {
    path.split('/')
        .map(encode_path_segment)
        .collect::<Vec<_>>()
        .join("/")
}

/// The start of an error answer; unreadable only costs the explanation.
fn read_error_answer(response: &mut ureq::http::Response<ureq::Body>) -> Vec<u8> {
    let mut bytes = Vec::new();
    let _ = response
        .body_mut()
        .as_reader()
        .take(MAX_ERROR_ANSWER_BYTES)
        .read_to_end(&mut bytes);
    bytes
}

/// Vault's `errors` strings, joined and cut. Only that array is used: the rest of a body
/// (say, from a proxy in front of Vault) is not known to be free of secrets.
fn vault_errors(bytes: &[u8]) -> String {
    let Ok(body) = serde_json::from_slice::<Value>(bytes) else {
        return String::new();
    };
    let Some(errors) = body.get("errors").and_then(Value::as_array) else {
        return String::new();
    };
    let joined = errors
        .iter()
        .filter_map(Value::as_str)
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    one_line(&joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::net::TcpListener;
    use std::time::Instant;

    use gitplane_testkit::{HttpServer, Reply};
    use serde_json::json;

    const TOKEN: &str = "s.root-token-4b1d";
    const OLD_PASSWORD: &str = "old-pass-1111";
    const NEW_PASSWORD: &str = "new-pass-2222";

    /// A Vault KV v2 engine mounted at `secret`, answering `GET /v1/secret/data/PATH` on
    /// 127.0.0.1 until dropped.
    struct FakeVault {
        url: String,
        server: HttpServer,
    }

    impl FakeVault {
        fn start() -> Self {
            let server = HttpServer::start(|request| {
                let (status, body) =
                    kv_answer(&request.method, &request.url, request.header(TOKEN_HEADER));
                Reply::json(status, &body)
            });
            FakeVault {
                url: server.url.clone(),
                server,
            }
        }

        /// The URL of each request, query included.
        fn seen(&self) -> Vec<String> {
            self.server
                .requests()
                .into_iter()
                .map(|logged| logged.request.url)
                .collect()
        }
    }

    /// What Vault answers: `db/prod` has versions 1 and 2, `apps/old` has one deleted version,
    /// `broken` is a server error.
    fn kv_answer(method: &str, url: &str, token: Option<&str>) -> (u16, Value) {
        if method != "GET" {
            return (405, json!({"errors": []}));
        }
        if token != Some(TOKEN) {
            return (403, json!({"errors": ["permission denied"]}));
        }
        let (path, query) = url.split_once('?').unwrap_or((url, ""));
        let version: Option<u64> = query
            .strip_prefix("version=")
            .map(|v| v.parse().expect("a numeric version"))
            .filter(|v| *v != 0);
        let metadata = |version: u64, deleted: &str| {
            json!({
                "created_time": "2024-05-01T10:00:00Z",
                "custom_metadata": null,
                "deletion_time": deleted,
                "destroyed": false,
                "version": version,
            })
        };
        let found = |data: Value, version: u64| {
            (
                200,
                json!({
                    "request_id": "0c3e",
                    "lease_id": "",
                    "renewable": false,
                    "lease_duration": 0,
                    "data": {"data": data, "metadata": metadata(version, "")},
                }),
            )
        };
        match (path, version) {
            ("/v1/secret/data/db/prod", Some(1)) => {
                found(json!({"user": "app", "password": OLD_PASSWORD}), 1)
            }
            ("/v1/secret/data/db/prod", None | Some(2)) => found(
                json!({"user": "app", "password": NEW_PASSWORD, "port": 5432}),
                2,
            ),
            ("/v1/secret/data/apps/old", None | Some(1)) => (
                404,
                json!({"data": {"data": null, "metadata": metadata(1, "2024-06-01T12:00:00Z")}}),
            ),
            ("/v1/secret/data/broken", _) => (
                500,
                json!({"errors": ["internal error", "storage backend unavailable"]}),
            ),
            _ => (404, json!({"errors": []})),
        }
    }

    fn vault_stores(url: &str, token_file: &Path, timeout: Duration) -> SecretStores {
        SecretStores::new(BTreeMap::from([(
            "vault".to_owned(),
            StoreConfig::Vault {
                url: url.to_owned(),
                token_file: token_file.to_owned(),
                mount: "secret".to_owned(),
                timeout,
            },
        )]))
    }

    /// A fake Vault, a token file holding `token`, and a store `vault` for both.
    fn vault_with_token(token: &str) -> (FakeVault, tempfile::TempDir, SecretStores) {
        let vault = FakeVault::start();
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let stores = vault_stores(&vault.url, &token_file, Duration::from_secs(5));
        (vault, dir, stores)
    }

    /// A store `creds` over a fresh directory.
    fn dir_store() -> (tempfile::TempDir, SecretStores) {
        let dir = tempfile::tempdir().unwrap();
        let stores = SecretStores::new(BTreeMap::from([(
            "creds".to_owned(),
            StoreConfig::Dir {
                path: dir.path().to_owned(),
            },
        )]));
        (dir, stores)
    }

    fn no_secret_in(message: &str) {
        for secret in [
            TOKEN,
            OLD_PASSWORD,
            NEW_PASSWORD,
            "wrong-token-9z9z",
            "dir-secret",
        ] {
            assert!(
                !message.contains(secret),
                "secret {secret:?} in {message:?}"
            );
        }
    }

    #[test]
    fn dir_store_reads_the_file_without_one_trailing_newline() {
        let (dir, stores) = dir_store();
        std::fs::create_dir(dir.path().join("db")).unwrap();
        std::fs::write(dir.path().join("db/password"), "dir-secret\n").unwrap();
        std::fs::write(dir.path().join("crlf"), "dir-secret\r\n").unwrap();
        std::fs::write(dir.path().join("two"), "dir-secret\n\n").unwrap();
        std::fs::write(dir.path().join("none"), "dir-secret").unwrap();
        std::fs::write(dir.path().join("empty"), "").unwrap();
        for (reference, expected) in [
            ("db/password", "dir-secret"),
            ("./db/password", "dir-secret"),
            ("crlf", "dir-secret"),
            ("two", "dir-secret\n"),
            ("none", "dir-secret"),
            ("empty", ""),
        ] {
            assert_eq!(
                stores.read("creds", reference, None),
                Ok(json!(expected)),
                "{reference}"
            );
        }
    }

    #[test]
    fn dir_store_sees_a_rotated_secret_on_the_next_read() {
        let (dir, stores) = dir_store();
        std::fs::write(dir.path().join("key"), "first\n").unwrap();
        assert_eq!(stores.read("creds", "key", None), Ok(json!("first")));
        std::fs::write(dir.path().join("key"), "second\n").unwrap();
        assert_eq!(stores.read("creds", "key", None), Ok(json!("second")));
    }

    #[test]
    fn dir_store_refuses_refs_that_leave_the_directory() {
        let (dir, stores) = dir_store();
        let shown = dir.path().display();
        let cases = [
            ("../x", "'..' is not allowed in a ref".to_owned()),
            ("db/../../x", "'..' is not allowed in a ref".to_owned()),
            (
                "/etc/passwd",
                format!("it is an absolute path; write it relative to the store directory {shown}"),
            ),
            (
                "",
                "the ref is empty; it names a file in the store directory".to_owned(),
            ),
            (
                ".",
                "it names the store directory itself, not a file".to_owned(),
            ),
        ];
        for (reference, reason) in cases {
            let error = stores.read("creds", reference, None).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!("secret store 'creds' cannot use ref '{reference}': {reason}")
            );
        }
    }

    #[cfg(unix)]
    #[test]
    fn check_finds_on_disk_what_apply_would_fail_on_without_reading_a_secret() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "s3cret").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        std::fs::create_dir(dir.path().join("folder")).unwrap();
        let stores = SecretStores::new(BTreeMap::from([
            (
                "files".to_owned(),
                StoreConfig::Dir {
                    path: dir.path().to_owned(),
                },
            ),
            (
                "gone".to_owned(),
                StoreConfig::Dir {
                    path: dir.path().join("nowhere"),
                },
            ),
        ]));
        let err = stores.check("files", "link", None).unwrap_err().to_string();
        assert!(
            err.starts_with("secret store 'files' refuses ref 'link': it resolves to"),
            "{err}"
        );
        assert!(!err.contains("s3cret"));
        let err = stores
            .check("files", "folder", None)
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("is a directory, not a file"), "{err}");
        let err = stores.check("gone", "x", None).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "secret store 'gone' is misconfigured in the host config: its directory {} \
                 does not exist: create it, or correct secret_stores.gone.dir",
                dir.path().join("nowhere").display()
            )
        );
        // A secret not written yet is the read's business: the store may get it later.
        stores.check("files", "not-yet", None).unwrap();
    }

    #[test]
    fn dir_store_refuses_a_symlink_that_points_outside() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "dir-secret\n").unwrap();
        let (dir, stores) = dir_store();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("subdir")).unwrap();
        // A link that stays inside is fine.
        std::fs::write(dir.path().join("real"), "dir-secret\n").unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("alias")).unwrap();
        assert_eq!(stores.read("creds", "alias", None), Ok(json!("dir-secret")));

        let inside = dir.path().canonicalize().unwrap();
        let target = outside.path().canonicalize().unwrap().join("secret");
        for reference in ["link", "subdir/secret"] {
            let error = stores.read("creds", reference, None).unwrap_err();
            assert_eq!(
                error.to_string(),
                format!(
                    "secret store 'creds' refuses ref '{reference}': it resolves to {} outside \
                     the store directory {}",
                    target.display(),
                    inside.display()
                )
            );
            no_secret_in(&error.to_string());
        }
    }

    #[test]
    fn dir_store_missing_file_names_the_path() {
        let (dir, stores) = dir_store();
        let error = stores.read("creds", "db/password", None).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "secret store 'creds' has no secret at 'db/password' (no file {})",
                dir.path().join("db/password").display()
            )
        );
    }

    #[test]
    fn dir_store_missing_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone");
        let stores = SecretStores::new(BTreeMap::from([(
            "creds".to_owned(),
            StoreConfig::Dir {
                path: missing.clone(),
            },
        )]));
        let error = stores.read("creds", "key", None).unwrap_err();
        assert_eq!(
            error,
            StoreError::DirUnavailable {
                store: "creds".to_owned(),
                dir: missing.clone(),
                kind: io::ErrorKind::NotFound,
            }
        );
        assert!(
            error.to_string().starts_with(&format!(
                "secret store 'creds' cannot open its directory {}: ",
                missing.display()
            )),
            "{error}"
        );
    }

    #[test]
    fn dir_store_refuses_a_version() {
        let (dir, stores) = dir_store();
        std::fs::write(dir.path().join("key"), "dir-secret").unwrap();
        let error = stores.read("creds", "key", Some("2")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "secret store 'creds' cannot read version '2' of 'key': a dir store keeps one \
             version of each secret; remove 'version' from the secret_ref"
        );
    }

    #[test]
    fn dir_store_refuses_non_utf8_and_directories() {
        let (dir, stores) = dir_store();
        std::fs::write(dir.path().join("binary"), [0xff, 0xfe, b'x']).unwrap();
        std::fs::create_dir(dir.path().join("db")).unwrap();
        let error = stores.read("creds", "binary", None).unwrap_err();
        let path = dir.path().canonicalize().unwrap();
        assert_eq!(
            error.to_string(),
            format!(
                "secret store 'creds' cannot use the secret at 'binary': {} is not UTF-8 text \
                 (base64-encode binary secrets)",
                path.join("binary").display()
            )
        );
        let error = stores.read("creds", "db/", None).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "secret store 'creds' cannot use the secret at 'db/': {} is a directory, not a file",
                path.join("db").display()
            )
        );
    }

    #[test]
    fn vault_reads_the_whole_secret() {
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        assert_eq!(
            stores.read("vault", "db/prod", None),
            Ok(json!({"user": "app", "password": NEW_PASSWORD, "port": 5432}))
        );
        assert_eq!(vault.seen(), vec!["/v1/secret/data/db/prod"]);
    }

    #[test]
    fn vault_reads_one_field() {
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        assert_eq!(
            stores.read("vault", "db/prod#password", None),
            Ok(json!(NEW_PASSWORD))
        );
        assert_eq!(stores.read("vault", "db/prod#port", None), Ok(json!(5432)));
        assert_eq!(vault.seen(), vec!["/v1/secret/data/db/prod"; 2]);
    }

    #[test]
    fn vault_missing_field_lists_the_field_names_only() {
        let (_vault, _dir, stores) = vault_with_token(TOKEN);
        let error = stores.read("vault", "db/prod#passwd", None).unwrap_err();
        let message = error.to_string();
        assert_eq!(
            message,
            "secret store 'vault' has no field 'passwd' in the secret at 'db/prod' \
             (fields: password, port, user)"
        );
        no_secret_in(&message);
        no_secret_in(&format!("{error:?}"));
        assert!(!message.contains("5432"), "{message}");
        assert!(
            !message.contains("app,") && !message.contains("'app'"),
            "{message}"
        );
    }

    #[test]
    fn vault_reads_an_older_version() {
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        assert_eq!(
            stores.read("vault", "db/prod#password", Some("1")),
            Ok(json!(OLD_PASSWORD))
        );
        assert_eq!(
            stores.read("vault", "db/prod#password", Some("2")),
            Ok(json!(NEW_PASSWORD))
        );
        assert_eq!(
            vault.seen(),
            vec![
                "/v1/secret/data/db/prod?version=1",
                "/v1/secret/data/db/prod?version=2"
            ]
        );
        let error = stores.read("vault", "db/prod", Some("v1")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "secret store 'vault' cannot read version 'v1' of 'db/prod': Vault KV versions are \
             whole numbers, like '3'"
        );
        // Refused before any request.
        assert_eq!(vault.seen().len(), 2);
    }

    #[test]
    fn vault_404_says_which_secret_and_version() {
        let (_vault, _dir, stores) = vault_with_token(TOKEN);
        let message = |reference: &str, version: Option<&str>| {
            stores
                .read("vault", reference, version)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            message("db/staging", None),
            "secret store 'vault' has no secret at 'db/staging' (HTTP 404)"
        );
        assert_eq!(
            message("db/prod#password", Some("3")),
            "secret store 'vault' has no secret at 'db/prod' (version 3, HTTP 404)"
        );
        assert_eq!(
            message("apps/old", None),
            "secret store 'vault' has no secret at 'apps/old' (its latest version was deleted \
             at 2024-06-01T12:00:00Z, HTTP 404)"
        );
        assert_eq!(
            message("apps/old", Some("1")),
            "secret store 'vault' has no secret at 'apps/old' (version 1 was deleted at \
             2024-06-01T12:00:00Z, HTTP 404)"
        );
    }

    #[test]
    fn vault_403_points_at_the_token_and_does_not_show_it() {
        let (_vault, dir, stores) = vault_with_token("wrong-token-9z9z");
        let error = stores.read("vault", "db/prod#password", None).unwrap_err();
        let message = error.to_string();
        assert_eq!(
            message,
            format!(
                "secret store 'vault' denied reading 'db/prod' (HTTP 403 permission denied): \
                 check that the token in {} is valid and that its policy allows 'read' on \
                 'secret/data/db/prod'",
                dir.path().join("vault-token").display()
            )
        );
        no_secret_in(&message);
        no_secret_in(&format!("{error:?}"));
    }

    #[test]
    fn vault_other_statuses_carry_vaults_errors() {
        let (_vault, _dir, stores) = vault_with_token(TOKEN);
        let error = stores.read("vault", "broken", None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "secret store 'vault' answered HTTP 500 for 'broken': internal error; storage \
             backend unavailable"
        );
        assert_eq!(one_line(&"é".repeat(301)), format!("{}…", "é".repeat(300)));
        assert_eq!(vault_errors(br#"{"errors": ["a\nb", 3, " c "]}"#), "a b; c");
        assert_eq!(vault_errors(b"<html>secret</html>"), "");
    }

    #[test]
    fn vault_token_file_problems_name_the_file() {
        let vault = FakeVault::start();
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        let stores = vault_stores(&vault.url, &token_file, Duration::from_secs(5));
        let shown = token_file.display();
        let message = || {
            stores
                .read("vault", "db/prod", None)
                .unwrap_err()
                .to_string()
        };

        assert_eq!(
            message(),
            format!(
                "secret store 'vault' has no usable Vault token: the token file {shown} does \
                 not exist"
            )
        );
        std::fs::write(&token_file, " \n").unwrap();
        assert_eq!(
            message(),
            format!(
                "secret store 'vault' has no usable Vault token: the token file {shown} is empty"
            )
        );
        std::fs::write(&token_file, "wrong-token-9z9z extra\n").unwrap();
        let error = message();
        assert!(error.ends_with("holds characters that cannot go in an HTTP header (spaces, control or non-ASCII characters)"), "{error}");
        no_secret_in(&error);
        assert!(vault.seen().is_empty());

        // The file is read at each read, so a renewed token is used at once.
        std::fs::write(&token_file, format!("  {TOKEN}\n")).unwrap();
        assert_eq!(stores.read("vault", "db/prod#user", None), Ok(json!("app")));
    }

    #[test]
    fn vault_refuses_bad_paths_before_any_request() {
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        for (reference, reason) in [
            ("", "the path is empty; write PATH or PATH#FIELD"),
            ("#password", "the path is empty; write PATH or PATH#FIELD"),
            (
                "/db/prod",
                "the path starts with '/'; write it relative to the mount",
            ),
            (
                "db/../sys",
                "'.' and '..' segments are not allowed in the path",
            ),
            (
                "db/./prod",
                "'.' and '..' segments are not allowed in the path",
            ),
            ("db?list=true", "'?' is not allowed in the path"),
            (
                "db//prod",
                "the path has an empty segment ('//' or a trailing '/')",
            ),
            (
                "db/",
                "the path has an empty segment ('//' or a trailing '/')",
            ),
            (
                "db/prod#",
                "nothing follows '#'; write PATH#FIELD for one field or PATH for the whole secret",
            ),
        ] {
            assert_eq!(
                stores
                    .read("vault", reference, None)
                    .unwrap_err()
                    .to_string(),
                format!("secret store 'vault' cannot use ref '{reference}': {reason}")
            );
        }
        assert!(vault.seen().is_empty());
    }

    #[test]
    fn vault_urls_join_with_one_slash_and_encode_segments() {
        assert_eq!(
            vault_url("http://v:8200/", "secret", "db/prod", None),
            "http://v:8200/v1/secret/data/db/prod"
        );
        assert_eq!(
            vault_url("http://v:8200", "kv/team", "a b/c%d", Some("4")),
            "http://v:8200/v1/kv/team/data/a%20b/c%25d?version=4"
        );
    }

    #[test]
    fn vault_unreachable_url_fails_quickly_and_names_the_url() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let stores = vault_stores(&url, &token_file, Duration::from_secs(5));
        let started = Instant::now();
        let error = stores.read("vault", "db/prod", None).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let message = error.to_string();
        assert!(
            message.starts_with(&format!(
                "secret store 'vault' could not be reached at {url}/v1/secret/data/db/prod: "
            )),
            "{message}"
        );
        no_secret_in(&message);
    }

    #[test]
    fn vault_that_does_not_answer_times_out() {
        // Connections are queued by the kernel but never answered.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let stores = vault_stores(&url, &token_file, Duration::from_millis(200));
        let started = Instant::now();
        let error = stores.read("vault", "db/prod", None).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_millis(1_500),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            error.to_string(),
            format!(
                "secret store 'vault' could not be reached at {url}/v1/secret/data/db/prod: \
                 no answer within 200ms"
            )
        );
        drop(listener);
    }

    #[test]
    fn read_all_takes_fields_of_one_secret_from_one_answer() {
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        let results = stores.read_all(&[
            ("vault", "db/prod#user", None),
            ("vault", "db/prod#password", None),
            ("vault", "db/prod#password", Some("1")),
            ("vault", "db/prod#nope", None),
            ("vault", "db/../x", None),
            ("elsewhere", "x", None),
        ]);
        let mut seen = vault.seen();
        seen.sort();
        assert_eq!(
            seen,
            [
                "/v1/secret/data/db/prod",
                "/v1/secret/data/db/prod?version=1"
            ]
        );
        assert_eq!(results[0], Ok(json!("app")));
        assert_eq!(results[1], Ok(json!(NEW_PASSWORD)));
        assert_eq!(results[2], Ok(json!(OLD_PASSWORD)));
        assert!(
            matches!(&results[3], Err(StoreError::MissingField { field, .. }) if field == "nope"),
            "{:?}",
            results[3]
        );
        assert!(
            matches!(results[4], Err(StoreError::InvalidRef { .. })),
            "{:?}",
            results[4]
        );
        assert!(
            matches!(results[5], Err(StoreError::UnknownStore { .. })),
            "{:?}",
            results[5]
        );
    }

    #[test]
    fn read_all_gives_up_on_a_store_that_does_not_answer() {
        // Connections are queued by the kernel but never answered.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let stores = vault_stores(&url, &token_file, Duration::from_millis(300));
        let paths: Vec<String> = (0..64).map(|i| format!("svc/{i}#password")).collect();
        let wanted: Vec<(&str, &str, Option<&str>)> =
            paths.iter().map(|p| ("vault", p.as_str(), None)).collect();
        let started = Instant::now();
        let results = stores.read_all(&wanted);
        // 64 reads one time-out after another would take 19 s; each thread waits once.
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(results.len(), 64);
        assert!(
            results
                .iter()
                .all(|r| matches!(r, Err(StoreError::Unreachable { .. }))),
            "{results:?}"
        );
        drop(listener);
    }

    #[test]
    fn check_says_what_cannot_be_read_without_reading() {
        let (dir, stores) = dir_store();
        std::fs::write(dir.path().join("present"), "x").unwrap();
        assert_eq!(stores.check("creds", "present", None), Ok(()));
        // Existence is only known by reading: check does not look.
        assert_eq!(stores.check("creds", "absent", None), Ok(()));
        assert!(matches!(
            stores.check("creds", "../x", None),
            Err(StoreError::InvalidRef { .. })
        ));
        assert!(matches!(
            stores.check("creds", "present", Some("2")),
            Err(StoreError::InvalidVersion { .. })
        ));
        let (vault, _dir, stores) = vault_with_token(TOKEN);
        assert_eq!(stores.check("vault", "db/prod#password", Some("3")), Ok(()));
        assert!(matches!(
            stores.check("vault", "db/prod#", None),
            Err(StoreError::InvalidRef { .. })
        ));
        assert!(matches!(
            stores.check("vault", "db/prod", Some("latest")),
            Err(StoreError::InvalidVersion { .. })
        ));
        assert!(vault.seen().is_empty(), "check made a request");
    }

    #[test]
    fn vault_invalid_url_is_a_host_config_error() {
        let dir = tempfile::tempdir().unwrap();
        let token_file = dir.path().join("vault-token");
        std::fs::write(&token_file, TOKEN).unwrap();
        let stores = vault_stores("not a url", &token_file, Duration::from_secs(5));
        let message = stores
            .read("vault", "db/prod", None)
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(
                "secret store 'vault' is misconfigured in the host config: the Vault url 'not a \
                 url' does not make a valid URL ("
            ),
            "{message}"
        );
        no_secret_in(&message);
    }

    #[test]
    fn unknown_store_lists_the_configured_names() {
        let stores = SecretStores::new(BTreeMap::from([
            (
                "b".to_owned(),
                StoreConfig::Dir {
                    path: PathBuf::from("/run/credentials/b"),
                },
            ),
            (
                "a".to_owned(),
                StoreConfig::Dir {
                    path: PathBuf::from("/run/credentials/a"),
                },
            ),
        ]));
        assert_eq!(stores.names().collect::<Vec<_>>(), vec!["a", "b"]);
        assert!(stores.contains("a"));
        assert!(!stores.contains("x"));
        assert_eq!(
            stores.read("x", "key", None).unwrap_err().to_string(),
            "secret store 'x' is not configured in the host config (configured: a, b)"
        );
        assert_eq!(
            SecretStores::default()
                .read("x", "key", None)
                .unwrap_err()
                .to_string(),
            "secret store 'x' is not configured in the host config (none configured)"
        );
    }

    #[test]
    fn refs_naming_no_store_read_the_default_store() {
        let (dir, stores) = dir_store();
        std::fs::write(dir.path().join("token"), "dir-secret\n").unwrap();
        // The only store serves them.
        assert_eq!(stores.default_store(), Ok("creds"));
        assert_eq!(stores.read("", "token", None), Ok(json!("dir-secret")));
        assert_eq!(stores.check("", "token", None), Ok(()));
        let both = stores.read_all(&[("", "token", None), ("creds", "token", None)]);
        assert_eq!(both, [Ok(json!("dir-secret")), Ok(json!("dir-secret"))]);
        assert!(
            stores
                .describe()
                .contains(&"default-store\0creds".to_owned())
        );
        // Among several, the one marked primary; with none marked, an error that says what to
        // configure.
        let mut configs: BTreeMap<String, StoreConfig> = BTreeMap::new();
        for name in ["creds", "other"] {
            configs.insert(
                name.to_owned(),
                StoreConfig::Dir {
                    path: dir.path().to_owned(),
                },
            );
        }
        let several = SecretStores::new(configs.clone());
        let error = several.read("", "token", None).unwrap_err();
        assert_eq!(
            error.to_string(),
            "this ref names no store, so it is read from the host's default secret store, but \
             the host config marks none of its stores (creds, other) as the default: add \
             `primary: true` to one of them under secret_stores in the host config, or name \
             the store with `store: NAME`"
        );
        assert!(several.check("", "token", None).is_err());
        assert!(
            !several
                .describe()
                .iter()
                .any(|l| l.starts_with("default-store"))
        );
        let primary = SecretStores::new(configs).with_primary(Some("other".to_owned()));
        assert_eq!(primary.default_store(), Ok("other"));
        assert_eq!(primary.read("", "token", None), Ok(json!("dir-secret")));
        let none = SecretStores::default();
        assert!(
            none.read("", "token", None)
                .unwrap_err()
                .to_string()
                .contains("the host config has no secret stores: add one under secret_stores")
        );
    }
}
