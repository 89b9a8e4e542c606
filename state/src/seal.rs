//! Secrets sealed at rest: secret outputs and inputs and driver cookies are stored encrypted
//! with the host's state key, so a copy of the state file without its key shows none of them.
//!
//! XChaCha20-Poly1305 with a random 24-byte nonce per value (random nonces of that size never
//! repeat in practice, whatever the number of writes), and the value's table, column and GUResID
//! as associated data, so a sealed value moved to another row does not open. The key is read
//! when a secret is first sealed or opened, never by commands that read no secret. Sealing and
//! opening are SQL functions (`gp_seal`, `gp_open`) of the connection, so every query that
//! touches a secret column says so where it is written.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use chacha20poly1305::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rusqlite::Connection;
use rusqlite::functions::FunctionFlags;
use sha2::{Digest, Sha256};

/// What a sealed value starts with.
const SEALED: &str = "gp1:";
const NONCE_BYTES: usize = 24;

/// Where the state key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file holding the key as 64 hex digits; created (mode 0600) the first time a secret is
    /// sealed if it does not exist.
    File(PathBuf),
    /// A file someone else provides (a secret manager's agent): read, never created.
    Provided(PathBuf),
    /// A systemd credential (`LoadCredential=NAME:...`): `$CREDENTIALS_DIRECTORY/NAME`.
    Credential(String),
}

impl KeySource {
    /// The default: `<state>.key` beside the state file.
    pub fn beside(state: &Path) -> KeySource {
        let mut name = state.as_os_str().to_owned();
        name.push(".key");
        KeySource::File(PathBuf::from(name))
    }

    /// The file the key is read from.
    pub fn path(&self) -> Result<PathBuf, SealError> {
        match self {
            KeySource::File(p) | KeySource::Provided(p) => Ok(p.clone()),
            KeySource::Credential(name) => match std::env::var_os("CREDENTIALS_DIRECTORY") {
                Some(dir) => Ok(Path::new(&dir).join(name)),
                None => Err(SealError::Key {
                    path: PathBuf::from(format!("credential {name}")),
                    message: "CREDENTIALS_DIRECTORY is not set: run gitplane under systemd with \
                              LoadCredential, or name a key file (state_key: {file: PATH})"
                        .to_owned(),
                }),
            },
        }
    }
}

/// Why a secret could not be sealed or opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SealError {
    #[error("state key {path}: {message}")]
    Key { path: PathBuf, message: String },
    #[error(
        "state key {path} (key {found}) is not the key this state file's secrets were sealed \
         with (key {sealed_with}): configure the right one under state_key"
    )]
    WrongKey {
        path: PathBuf,
        found: String,
        sealed_with: String,
    },
    #[error("a sealed secret ({aad}) does not open with state key {key}: it was damaged or moved")]
    Damaged { aad: String, key: String },
}

/// A loaded state key.
#[derive(Clone)]
pub struct StateKey {
    cipher: XChaCha20Poly1305,
    /// The first 8 hex digits of the key's SHA-256: names the key in messages and in the file.
    pub id: String,
    bytes: [u8; 32],
}

impl std::fmt::Debug for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StateKey({})", self.id)
    }
}

impl StateKey {
    /// A new random key.
    pub fn generate() -> StateKey {
        let key = XChaCha20Poly1305::generate_key(&mut OsRng);
        StateKey::from_bytes(key.into())
    }

    fn from_bytes(bytes: [u8; 32]) -> StateKey {
        let digest = Sha256::digest(bytes);
        StateKey {
            cipher: XChaCha20Poly1305::new(&bytes.into()),
            id: hex(&digest[..4]),
            bytes,
        }
    }

    /// Parses a key file's text: 64 hex digits, surrounding white space ignored.
    pub fn parse(text: &str) -> Result<StateKey, String> {
        let text = text.trim();
        let bytes = unhex(text).filter(|b| b.len() == 32).ok_or(
            "a state key is 64 hex digits (32 bytes); generate one with `gitplane state rekey`",
        )?;
        let mut key = [0u8; 32];
        key.copy_from_slice(&bytes);
        Ok(StateKey::from_bytes(key))
    }

    /// Reads the key at `source`, creating a `File` key that does not exist yet.
    pub fn load_or_create(source: &KeySource) -> Result<StateKey, SealError> {
        let path = source.path()?;
        let path = path.as_path();
        let fail = |message: String| SealError::Key {
            path: path.to_owned(),
            message,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => StateKey::parse(&text).map_err(fail),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match source {
                KeySource::Provided(_) | KeySource::Credential(_) => {
                    Err(fail("no such file".to_owned()))
                }
                KeySource::File(_) => {
                    let key = StateKey::generate();
                    match key.write_new(path) {
                        Ok(()) => Ok(key),
                        // Another process created it first: use theirs.
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            let text =
                                std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
                            StateKey::parse(&text).map_err(fail)
                        }
                        Err(e) => Err(fail(format!("cannot create it: {e}"))),
                    }
                }
            },
            Err(e) => Err(fail(e.to_string())),
        }
    }

    /// Writes the key to a new file (readable by its owner alone), synced to disk, failing with
    /// `AlreadyExists` when the file is there.
    ///
    /// The key is written to a private temporary file beside it and then hard-linked into
    /// place, so the file appears whole or not at all: a process killed half-way leaves no
    /// empty key behind (which would lock the state away), and a process that loses a race to
    /// create it never reads a half-written one.
    pub fn write_new(&self, path: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let temporary = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(format!("{}\n", hex(&self.bytes)).as_bytes())?;
            file.sync_all()?;
            std::fs::hard_link(&temporary, path)
        })();
        let _ = std::fs::remove_file(&temporary);
        written?;
        // The new name is durable once its folder is.
        std::fs::File::open(dir)?.sync_all()
    }

    /// `plaintext` sealed for the place `aad` names.
    pub fn seal(&self, plaintext: &str, aad: &str) -> String {
        let nonce = XChaCha20Poly1305::generate_nonce(&mut OsRng);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext.as_bytes(),
                    aad: aad.as_bytes(),
                },
            )
            .expect("XChaCha20-Poly1305 seals any length gitplane stores");
        format!("{SEALED}{}:{}{}", self.id, hex(&nonce), hex(&sealed))
    }

    /// Opens a value [`StateKey::seal`] made for `aad`.
    pub fn open(&self, sealed: &str, aad: &str) -> Result<String, SealError> {
        let damaged = || SealError::Damaged {
            aad: aad.to_owned(),
            key: self.id.clone(),
        };
        let rest = sealed.strip_prefix(SEALED).ok_or_else(damaged)?;
        let (_, body) = rest.split_once(':').ok_or_else(damaged)?;
        let bytes = unhex(body)
            .filter(|b| b.len() > NONCE_BYTES)
            .ok_or_else(damaged)?;
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let plain = self
            .cipher
            .decrypt(
                XNonce::from_slice(nonce),
                Payload {
                    msg: ciphertext,
                    aad: aad.as_bytes(),
                },
            )
            .map_err(|_| damaged())?;
        String::from_utf8(plain).map_err(|_| damaged())
    }
}

/// Where a rekey writes the new key before it seals with it: `<key>.new`.
pub fn pending_key_path(key: &Path) -> PathBuf {
    let mut name = key.as_os_str().to_owned();
    name.push(".new");
    PathBuf::from(name)
}

/// The id of the key a sealed value names (`gp1:<key id>:...`).
pub fn sealed_with(sealed: &str) -> Option<&str> {
    sealed
        .strip_prefix(SEALED)?
        .split_once(':')
        .map(|(id, _)| id)
}

/// The key a connection seals and opens with, loaded on first use.
#[derive(Debug)]
pub(crate) struct Keyring {
    source: KeySource,
    key: Option<StateKey>,
    /// The key id the state file records, once known.
    pub(crate) sealed_with: Option<String>,
}

pub(crate) type SharedKeyring = Arc<Mutex<Keyring>>;

impl Keyring {
    pub(crate) fn new(source: KeySource, sealed_with: Option<String>) -> SharedKeyring {
        Arc::new(Mutex::new(Keyring {
            source,
            key: None,
            sealed_with,
        }))
    }

    /// A rekey that sealed every secret with the new key (`<key>.new`) but stopped before it
    /// put that key in place: put it there now.
    fn finish_rekey(&self, sealed_with: &str) -> Option<StateKey> {
        let KeySource::File(path) = &self.source else {
            return None;
        };
        let pending = pending_key_path(path);
        let key = StateKey::parse(&std::fs::read_to_string(&pending).ok()?).ok()?;
        if key.id != sealed_with {
            return None;
        }
        std::fs::rename(&pending, path).ok()?;
        Some(key)
    }

    /// Forgets the key in memory: the secrets are now sealed with `sealed_with`.
    pub(crate) fn forget_key(&mut self, sealed_with: Option<String>) {
        self.sealed_with = sealed_with;
        self.key = None;
    }

    /// Makes `key` the key, as after a rekey.
    pub(crate) fn set_key(&mut self, key: StateKey) {
        self.sealed_with = Some(key.id.clone());
        self.key = Some(key);
    }

    pub(crate) fn source(&self) -> &KeySource {
        &self.source
    }

    /// The key, loaded (or created) now if need be, and checked against the one the state
    /// file's secrets were sealed with.
    pub(crate) fn key(&mut self) -> Result<StateKey, SealError> {
        if let Some(key) = &self.key {
            return Ok(key.clone());
        }
        // With secrets sealed already, a missing key file is lost, not new: creating one
        // would only hide that.
        if let Some(sealed_with) = &self.sealed_with
            && let KeySource::File(path) = &self.source
            && !path.exists()
            && self.finish_rekey(sealed_with).is_none()
        {
            return Err(SealError::Key {
                path: path.clone(),
                message: format!(
                    "no such file, and the state file's secrets are sealed with key \
                     {sealed_with}: restore that key file (or name it under state_key)"
                ),
            });
        }
        let mut key = StateKey::load_or_create(&self.source)?;
        if let Some(sealed_with) = &self.sealed_with
            && *sealed_with != key.id
            && let Some(finished) = self.finish_rekey(sealed_with)
        {
            key = finished;
        }
        if let Some(sealed_with) = &self.sealed_with
            && *sealed_with != key.id
        {
            return Err(SealError::WrongKey {
                path: self.source.path()?,
                found: key.id,
                sealed_with: sealed_with.clone(),
            });
        }
        self.key = Some(key.clone());
        Ok(key)
    }
}

/// Registers `gp_seal(plaintext, aad)` and `gp_open(sealed, aad)` on `conn`. A value that is
/// not sealed yet (written before sealing existed) opens as itself.
pub(crate) fn register(conn: &Connection, keyring: &SharedKeyring) -> rusqlite::Result<()> {
    fn key_of(ring: &SharedKeyring) -> rusqlite::Result<StateKey> {
        ring.lock()
            .unwrap_or_else(|e| e.into_inner())
            .key()
            .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))
    }
    let flags = FunctionFlags::SQLITE_UTF8;
    let ring = keyring.clone();
    conn.create_scalar_function("gp_seal", 2, flags, move |ctx| {
        let Some(plain) = ctx.get::<Option<String>>(0)? else {
            return Ok(None);
        };
        let aad: String = ctx.get(1)?;
        Ok(Some(key_of(&ring)?.seal(&plain, &aad)))
    })?;
    let ring = keyring.clone();
    conn.create_scalar_function(
        "gp_open",
        2,
        flags | FunctionFlags::SQLITE_DETERMINISTIC,
        move |ctx| {
            let Some(sealed) = ctx.get::<Option<String>>(0)? else {
                return Ok(None);
            };
            if !sealed.starts_with(SEALED) {
                return Ok(Some(sealed));
            }
            let aad: String = ctx.get(1)?;
            key_of(&ring)?
                .open(&sealed, &aad)
                .map(Some)
                .map_err(|e| rusqlite::Error::UserFunctionError(Box::new(e)))
        },
    )?;
    Ok(())
}

/// Lower-case hex: sealing runs once per secret of every resource an apply writes, so this is
/// a table lookup rather than a `format!` per byte.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_writes_every_byte_as_two_lower_case_digits_that_read_back() {
        let all: Vec<u8> = (0..=255).collect();
        let text = hex(&all);
        assert_eq!(&text[..8], "00010203");
        assert_eq!(&text[text.len() - 4..], "feff");
        assert_eq!(hex(&[0x0f, 0xa5]), "0fa5");
        assert_eq!(unhex(&text), Some(all));
    }

    #[test]
    fn a_new_key_file_appears_whole_private_and_never_over_another() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.db.key");
        let key = StateKey::generate();
        key.write_new(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(StateKey::parse(&text).unwrap().id, key.id);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let other = StateKey::generate();
        let e = other.write_new(&path).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        // No temporary file is left behind, whichever way it went.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [std::ffi::OsString::from("state.db.key")]);
    }

    #[test]
    fn a_sealed_value_opens_only_with_its_key_and_place() {
        let key = StateKey::generate();
        let sealed = key.seal("{\"password\":\"hunter2\"}", "resource_secret.outputs:g1");
        assert!(!sealed.contains("hunter2"));
        assert_eq!(sealed_with(&sealed), Some(key.id.as_str()));
        assert_eq!(
            key.open(&sealed, "resource_secret.outputs:g1").unwrap(),
            "{\"password\":\"hunter2\"}"
        );
        // Moved to another row, or opened with another key: refused.
        assert!(key.open(&sealed, "resource_secret.outputs:g2").is_err());
        assert!(
            StateKey::generate()
                .open(&sealed, "resource_secret.outputs:g1")
                .is_err()
        );
        // Two seals of one value differ: a fresh nonce each time.
        assert_ne!(
            sealed,
            key.seal("{\"password\":\"hunter2\"}", "resource_secret.outputs:g1")
        );
    }

    #[test]
    fn a_key_file_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let source = KeySource::File(dir.path().join("state.key"));
        let key = StateKey::load_or_create(&source).unwrap();
        let mode = std::fs::metadata(source.path().unwrap())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(StateKey::load_or_create(&source).unwrap().id, key.id);
        let provided = KeySource::Provided(dir.path().join("missing"));
        assert!(
            StateKey::load_or_create(&provided)
                .unwrap_err()
                .to_string()
                .contains("no such file")
        );
        assert!(StateKey::parse("abc").is_err());
    }
}
