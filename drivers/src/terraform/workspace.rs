//! The private working directory of one call: the root module's code, the definition's files,
//! the variables, and the state gitplane kept; and what Terraform left there.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tempfile::TempDir;

use super::inputs::{Code, Inputs, STATE_FILE, VARIABLES_FILE, is_code_file};

/// The largest state gitplane keeps for one resource (in its driver cookie).
pub(super) const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;
/// The most a local source folder copied into the working directory may hold.
const MAX_COPY_BYTES: u64 = 256 * 1024 * 1024;
const MAX_COPY_ENTRIES: usize = 20_000;
const MAX_COPY_DEPTH: usize = 64;

/// Where a failed apply that could not write `terraform.tfstate` leaves the state.
const ERRORED_STATE_FILE: &str = "errored.tfstate";
const BACKUP_STATE_FILE: &str = "terraform.tfstate.backup";

/// One call's working directory, removed when dropped.
pub(super) struct Workspace {
    _dir: TempDir,
    /// Where Terraform runs: the root module.
    pub root: PathBuf,
    /// Whether the root module declares a `backend` (or `cloud`) block: its state is kept
    /// there, not by gitplane.
    pub backend: bool,
}

impl Workspace {
    /// A new private directory (0700); `place` puts the code of a `source` into the folder it
    /// is given (fetching or copying it).
    pub fn create(
        inputs: &Inputs,
        place: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<Workspace, String> {
        let dir = tempfile::Builder::new()
            .prefix("gitplane-terraform-")
            .tempdir()
            .and_then(|dir| {
                // Variables, credentials and state go in here: nobody else may look.
                fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).map(|()| dir)
            })
            .map_err(|e| format!("cannot create a working directory: {e}"))?;
        let code = dir.path().join("code");
        let root = match &inputs.code {
            Code::Script(script) => {
                make_dir(&code)?;
                write_file(&code, "main.tf", script, false)?;
                code
            }
            Code::Files => {
                make_dir(&code)?;
                code
            }
            Code::Source(source) => {
                place(&code)?;
                let root = match &source.path {
                    Some(path) => code.join(path),
                    None => code.clone(),
                };
                // A symlink in the fetched code must not lead the module out of the directory.
                let inside = root
                    .canonicalize()
                    .ok()
                    .zip(code.canonicalize().ok())
                    .is_some_and(|(root, code)| root.starts_with(code));
                if !inside || !root.is_dir() {
                    return Err(format!(
                        "source.path '{}' is not a folder of the source",
                        source.path.as_deref().unwrap_or_default()
                    ));
                }
                root
            }
        };
        for (path, file) in &inputs.files {
            write_file(&root, path, &file.contents, file.secret)?;
        }
        if let Some((path, contents)) = &inputs.credentials_file {
            write_file(&root, path, contents, true)?;
        }
        if !inputs.variables.is_empty() {
            let text = serde_json::to_string(&inputs.variables)
                .map_err(|e| format!("cannot encode the variables: {e}"))?;
            write_file(&root, VARIABLES_FILE, &text, true)?;
        }
        let backend = declares_backend(&root);
        Ok(Workspace {
            _dir: dir,
            root,
            backend,
        })
    }

    /// The folder the workspace lives in.
    #[cfg(test)]
    pub fn path(&self) -> &Path {
        self._dir.path()
    }

    /// Puts the state gitplane kept where Terraform's local backend reads it.
    pub fn write_state(&self, state: &str) -> Result<(), String> {
        write_file(&self.root, STATE_FILE, state, true)
    }

    /// The state Terraform left: `errored.tfstate` when it could not write its state file,
    /// else `terraform.tfstate`, else its backup (a state file cut short by a kill is not
    /// JSON). `None` when none is there or readable.
    pub fn read_state(&self) -> Result<Option<String>, String> {
        for name in [ERRORED_STATE_FILE, STATE_FILE, BACKUP_STATE_FILE] {
            let path = self.root.join(name);
            let Ok(meta) = fs::symlink_metadata(&path) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            if meta.len() > MAX_STATE_BYTES {
                return Err(format!(
                    "Terraform's state for this resource is {} bytes, more than the {} MiB \
                     gitplane keeps: declare a backend in the module to keep it there",
                    meta.len(),
                    MAX_STATE_BYTES / 1024 / 1024
                ));
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            if matches!(serde_json::from_str::<Value>(&text), Ok(Value::Object(_))) {
                return Ok(Some(text));
            }
        }
        Ok(None)
    }
}

/// Whether a kept state tracks nothing: destroying it has nothing to do.
pub(super) fn state_is_empty(state: &str) -> bool {
    match serde_json::from_str::<Value>(state) {
        Ok(Value::Object(map)) => match map.get("resources") {
            None | Some(Value::Null) => true,
            Some(Value::Array(resources)) => resources.is_empty(),
            Some(_) => false,
        },
        _ => false,
    }
}

/// Whether a kept cookie is a Terraform state at all (it may be another driver's, when a
/// definition changed its driver).
pub(super) fn looks_like_state(cookie: &str) -> bool {
    matches!(
        serde_json::from_str::<Value>(cookie),
        Ok(Value::Object(map)) if map.contains_key("version") && map.contains_key("lineage")
            || matches!(map.get("version"), Some(Value::Number(_)))
    )
}

/// Whether the `.tf` and `.tf.json` files of `root` declare a `backend` or a `cloud` block.
/// A simple scan (comments removed), not a parser: Terraform itself allows only these blocks
/// inside `terraform {}`, and nothing else of the language is spelled that way.
fn declares_backend(root: &Path) -> bool {
    let Ok(entries) = fs::read_dir(root) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !is_code_file(&name) {
            return false;
        }
        let Ok(text) = fs::read_to_string(entry.path()) else {
            return false;
        };
        if name.ends_with(".tf.json") {
            json_declares_backend(&text)
        } else {
            hcl_declares_backend(&text)
        }
    })
}

pub(super) fn hcl_declares_backend(text: &str) -> bool {
    let tokens = tokens(text);
    tokens
        .windows(3)
        .any(|w| matches!(w, [Token::Word("backend"), Token::Text, Token::Open]))
        || tokens
            .windows(2)
            .any(|w| matches!(w, [Token::Word("cloud"), Token::Open]))
}

/// What [`hcl_declares_backend`] needs of the language: words, strings and opening braces,
/// with comments skipped.
#[derive(Debug, PartialEq, Eq)]
enum Token<'a> {
    Word(&'a str),
    Text,
    Open,
    Other,
}

fn tokens(text: &str) -> Vec<Token<'_>> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_to = |from: usize, end: &str| {
        text[from..]
            .find(end)
            .map_or(text.len(), |at| from + at + end.len())
    };
    while i < bytes.len() {
        let rest = &text[i..];
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c == b'#' || rest.starts_with("//") {
            i = skip_to(i, "\n");
        } else if rest.starts_with("/*") {
            i = skip_to(i + 2, "*/");
        } else if c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' && bytes[i] != b'\n' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push(Token::Text);
        } else if c == b'{' {
            out.push(Token::Open);
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'-')
            {
                i += 1;
            }
            out.push(Token::Word(&text[start..i]));
        } else {
            out.push(Token::Other);
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

fn json_declares_backend(text: &str) -> bool {
    let Ok(Value::Object(doc)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let blocks: Vec<&Value> = match doc.get("terraform") {
        Some(Value::Array(items)) => items.iter().collect(),
        Some(block) => vec![block],
        None => Vec::new(),
    };
    blocks.iter().any(|b| {
        b.as_object()
            .is_some_and(|b| b.contains_key("backend") || b.contains_key("cloud"))
    })
}

fn make_dir(path: &Path) -> Result<(), String> {
    fs::create_dir_all(path).map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// Writes `contents` to `root/rel`, creating folders; never through a symlink (code fetched
/// from a repository may hold one pointing anywhere), and readable by its owner alone when
/// `secret`.
fn write_file(root: &Path, rel: &str, contents: &str, secret: bool) -> Result<(), String> {
    let mut dir = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    let (name, folders) = parts.split_last().ok_or("an empty file name")?;
    for part in folders {
        dir.push(part);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "cannot write the file {rel}: {part} is not a folder"
                ));
            }
            Err(_) => make_dir(&dir)?,
        }
    }
    let path = dir.join(name);
    if fs::symlink_metadata(&path).is_ok_and(|m| !m.is_file()) {
        return Err(format!(
            "cannot write the file {rel}: a link or folder is in its place"
        ));
    }
    let mode = if secret { 0o600 } else { 0o644 };
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .open(&path)
        .map_err(|e| format!("cannot write the file {rel}: {e}"))?;
    // An existing file keeps its mode through `open`: set it.
    file.set_permissions(fs::Permissions::from_mode(mode))
        .and_then(|()| file.write_all(contents.as_bytes()))
        .map_err(|e| format!("cannot write the file {rel}: {e}"))
}

/// Copies the folder `from` to `to` (which must not exist): files, folders and symlinks as
/// they are, without `.git` and `.terraform`, within the size limits.
pub(super) fn copy_folder(from: &Path, to: &Path) -> Result<(), String> {
    let mut budget = (MAX_COPY_ENTRIES, MAX_COPY_BYTES);
    copy_into(from, to, 0, &mut budget)
        .map_err(|e| format!("cannot copy the source folder {}: {e}", from.display()))
}

fn copy_into(
    from: &Path,
    to: &Path,
    depth: usize,
    budget: &mut (usize, u64),
) -> Result<(), String> {
    if depth > MAX_COPY_DEPTH {
        return Err(format!(
            "it is nested more than {MAX_COPY_DEPTH} folders deep"
        ));
    }
    fs::create_dir(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| e.to_string())?;
        let name = entry.file_name();
        if name == ".git" || name == ".terraform" {
            continue;
        }
        budget.0 = budget.0.checked_sub(1).ok_or(format!(
            "it holds more than {MAX_COPY_ENTRIES} files and folders"
        ))?;
        let source = entry.path();
        let target = to.join(&name);
        let kind = entry.file_type().map_err(|e| e.to_string())?;
        if kind.is_dir() {
            copy_into(&source, &target, depth + 1, budget)?;
        } else if kind.is_symlink() {
            let link = fs::read_link(&source).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(link, &target).map_err(|e| e.to_string())?;
        } else if kind.is_file() {
            let size = entry.metadata().map_err(|e| e.to_string())?.len();
            budget.1 = budget.1.checked_sub(size).ok_or(format!(
                "it holds more than {} MiB",
                MAX_COPY_BYTES / 1024 / 1024
            ))?;
            fs::copy(&source, &target).map_err(|e| format!("{}: {e}", source.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::Map;

    use super::super::inputs::File;
    use super::*;

    fn inputs(code: Code) -> Inputs {
        Inputs {
            code,
            files: BTreeMap::new(),
            variables: Map::new(),
            environment: BTreeMap::new(),
            credentials_file: None,
            append_logs_to_error: false,
            manifests_output: None,
        }
    }

    #[test]
    fn backends_are_found_in_code_not_in_comments() {
        let yes = [
            "terraform {\n  backend \"s3\" {\n    bucket = \"b\"\n  }\n}\n",
            "terraform { backend \"local\" {} }",
            "terraform {\n  cloud {\n    organization = \"o\"\n  }\n}",
            "terraform{cloud{}}",
        ];
        for text in yes {
            assert!(hcl_declares_backend(text), "{text}");
        }
        let no = [
            "# backend \"s3\" {}\nresource \"x\" \"y\" {}",
            "// backend \"s3\" {}\n",
            "/* terraform { backend \"s3\" {} } */\nvariable \"backend\" {}",
            "resource \"aws_lb\" \"backend\" {\n  name = \"backend\"\n}",
            "output \"cloud\" { value = var.cloud }",
            "locals {\n  cloud = {\n    a = 1\n  }\n  p = \"/*\"\n}\n",
            "locals { s = \"backend \\\"x\\\" {\" }",
        ];
        for text in no {
            assert!(!hcl_declares_backend(text), "{text}");
        }
        assert!(json_declares_backend(
            r#"{"terraform": {"backend": {"s3": {}}}}"#
        ));
        assert!(json_declares_backend(
            r#"{"terraform": [{"required_version": ">= 1"}, {"cloud": {}}]}"#
        ));
        assert!(!json_declares_backend(r#"{"resource": {"backend": {}}}"#));
    }

    #[test]
    fn files_land_inside_the_module_and_secrets_are_private() {
        let mut inputs = inputs(Code::Script("# main".into()));
        inputs.files.insert(
            "conf/app.json".into(),
            File {
                contents: "{}".into(),
                secret: false,
            },
        );
        inputs.files.insert(
            "backend.tf".into(),
            File {
                contents: "terraform {\n  backend \"local\" {}\n}\n".into(),
                secret: true,
            },
        );
        inputs
            .variables
            .insert("token".into(), Value::String("t".into()));
        let ws = Workspace::create(&inputs, |_| unreachable!()).unwrap();
        let mode = |rel: &str| {
            fs::metadata(ws.root.join(rel))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(
            fs::read_to_string(ws.root.join("main.tf")).unwrap(),
            "# main"
        );
        assert_eq!(mode("conf/app.json"), 0o644);
        assert_eq!(mode("backend.tf"), 0o600);
        assert_eq!(mode(VARIABLES_FILE), 0o600);
        assert_eq!(
            fs::metadata(ws.path()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert!(ws.backend);
        let path = ws.path().to_owned();
        drop(ws);
        assert!(!path.exists(), "the working directory is removed");
    }

    #[test]
    fn a_symlink_in_fetched_code_is_never_written_through() {
        let outside = tempfile::tempdir().unwrap();
        let mut inputs = inputs(Code::Source(super::super::inputs::Source {
            url: "/x".into(),
            path: None,
            rev: None,
            username: None,
            password: None,
            ssh_key: None,
        }));
        inputs.files.insert(
            "escape/owned.txt".into(),
            File {
                contents: "x".into(),
                secret: false,
            },
        );
        let target = outside.path().to_owned();
        let err = Workspace::create(&inputs, |code| {
            fs::create_dir(code).unwrap();
            std::os::unix::fs::symlink(&target, code.join("escape")).unwrap();
            Ok(())
        })
        .err()
        .unwrap();
        assert!(err.contains("escape is not a folder"), "{err}");
        assert!(!outside.path().join("owned.txt").exists());
    }

    #[test]
    fn the_state_read_back_falls_back_to_a_whole_file() {
        let ws = Workspace::create(&inputs(Code::Files), |_| unreachable!()).unwrap();
        assert_eq!(ws.read_state().unwrap(), None);
        ws.write_state(r#"{"version": 4, "lineage": "l", "resources": []}"#)
            .unwrap();
        assert!(ws.read_state().unwrap().unwrap().contains("lineage"));
        // Cut short by a kill: the backup is the state to keep.
        fs::write(ws.root.join(STATE_FILE), r#"{"version": 4, "lin"#).unwrap();
        fs::write(ws.root.join(BACKUP_STATE_FILE), r#"{"version": 4, "b": 1}"#).unwrap();
        assert_eq!(
            ws.read_state().unwrap().as_deref(),
            Some(r#"{"version": 4, "b": 1}"#)
        );
        fs::write(
            ws.root.join(ERRORED_STATE_FILE),
            r#"{"version": 4, "e": 1}"#,
        )
        .unwrap();
        assert_eq!(
            ws.read_state().unwrap().as_deref(),
            Some(r#"{"version": 4, "e": 1}"#)
        );
        assert!(state_is_empty(r#"{"version": 4, "resources": []}"#));
        assert!(!state_is_empty(r#"{"version": 4, "resources": [{}]}"#));
        assert!(looks_like_state(r#"{"version": 4, "lineage": "x"}"#));
        assert!(!looks_like_state("some-other-drivers-cookie"));
    }

    #[test]
    fn a_folder_is_copied_without_git_and_terraform_data() {
        let from = tempfile::tempdir().unwrap();
        fs::create_dir_all(from.path().join("mod/.terraform/providers")).unwrap();
        fs::create_dir_all(from.path().join(".git")).unwrap();
        fs::write(from.path().join("mod/main.tf"), "# m").unwrap();
        fs::write(from.path().join("mod/.terraform/providers/big"), "x").unwrap();
        std::os::unix::fs::symlink("main.tf", from.path().join("mod/link.tf")).unwrap();
        let to = tempfile::tempdir().unwrap();
        let target = to.path().join("copy");
        copy_folder(from.path(), &target).unwrap();
        assert_eq!(
            fs::read_to_string(target.join("mod/main.tf")).unwrap(),
            "# m"
        );
        assert_eq!(
            fs::read_link(target.join("mod/link.tf")).unwrap(),
            PathBuf::from("main.tf")
        );
        assert!(!target.join("mod/.terraform").exists());
        assert!(!target.join(".git").exists());
    }
}
