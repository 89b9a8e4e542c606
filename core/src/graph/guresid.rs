//! GUResIDs: the stable, deterministic identity of a resource that drivers key on.

use std::fmt;

use sha2::{Digest, Sha256};

/// 40 lowercase hex characters: a hash of environment, app, type, class and res_id.
///
/// The same resource always gets the same GUResID, so a resource deleted and created again is
/// known to its driver under the same name, and a driver called twice never creates two.
///
/// Shared text: a graph refers to a resource from every placeholder that reads it, so copies
/// are counted references, not strings.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GuresId(std::sync::Arc<str>);

impl GuresId {
    /// Hashes a canonical encoding: a version tag and each field, NUL-separated. An app of
    /// `None` (a resource shared by every app) encodes as an empty field, which no app id can be.
    pub fn new(env: &str, app: Option<&str>, res_type: &str, class: &str, res_id: &str) -> Self {
        let mut hasher = Sha256::new();
        for field in [
            "gitplane/guresid/v1",
            env,
            app.unwrap_or(""),
            res_type,
            class,
            res_id,
        ] {
            hasher.update(field.as_bytes());
            hasher.update([0u8]);
        }
        let digest = hasher.finalize();
        GuresId(hex(&digest[..20]).into())
    }

    /// Takes a GUResID read back from state.
    pub fn from_recorded(s: String) -> Self {
        GuresId(s.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Lowercase hex of `bytes`; hashing ids is on the hot path of building large graphs, so this
/// avoids a `format!` per byte.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
    out
}

// The derived `Hash` and `Eq` are those of the string, so maps keyed by GUResID can be asked
// with the text read back from state.
impl std::borrow::Borrow<str> for GuresId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GuresId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forty_lowercase_hex_and_stable() {
        let a = GuresId::new(
            "development",
            Some("shop"),
            "postgres",
            "default",
            "shared.db",
        );
        assert_eq!(a.as_str().len(), 40);
        assert!(
            a.as_str()
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert_eq!(
            a,
            GuresId::new(
                "development",
                Some("shop"),
                "postgres",
                "default",
                "shared.db"
            )
        );
        // Pinned (sha256 of the NUL-terminated fields, computed with another tool): a change
        // here would orphan every resource ever recorded.
        assert_eq!(a.as_str(), "64564eec6dd8f74f9505fb536e5a41d9c3dcdc36");
    }

    #[test]
    fn every_field_counts_and_fields_do_not_run_together() {
        let base = GuresId::new("e", Some("a"), "t", "c", "r");
        for other in [
            GuresId::new("x", Some("a"), "t", "c", "r"),
            GuresId::new("e", None, "t", "c", "r"),
            GuresId::new("e", Some("a"), "x", "c", "r"),
            GuresId::new("e", Some("a"), "t", "x", "r"),
            GuresId::new("e", Some("a"), "t", "c", "x"),
            GuresId::new("e", Some("at"), "", "c", "r"),
        ] {
            assert_ne!(base, other);
        }
    }
}
