//! Browser sessions of the status page: `POST /login` trades the token for a random session
//! id kept in memory, so the cookie a browser holds never carries the token.
//!
//! A session lasts [`LIFETIME`] and belongs to the token it was opened with: once SIGHUP
//! rotates the token, the sessions of the old one end. A restart ends them all.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// How long a session lasts from sign-in.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; the one closest to its end makes room for a new one.
const MAX_SESSIONS: usize = 1024;

/// The sessions open now, by the digest of their id (looking one up reveals nothing of the
/// ids through timing).
#[derive(Default)]
pub struct Sessions {
    open: Mutex<HashMap<[u8; 32], Session>>,
}

struct Session {
    ends: Instant,
    /// The digest of the token the session was opened with.
    token: [u8; 32],
}

/// A session id could not be made: the system gave no random bytes.
#[derive(Debug, thiserror::Error)]
#[error("cannot make a session: no random bytes: {0}")]
pub struct SessionError(getrandom::Error);

impl Sessions {
    /// Opens a session for `token`, the one in force: its id, 64 hex digits.
    pub fn open(&self, token: &str) -> Result<String, SessionError> {
        self.open_until(token, Instant::now() + LIFETIME)
    }

    fn open_until(&self, token: &str, ends: Instant) -> Result<String, SessionError> {
        let mut id = [0u8; 32];
        getrandom::getrandom(&mut id).map_err(SessionError)?;
        let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.len() >= MAX_SESSIONS {
            let now = Instant::now();
            open.retain(|_, s| s.ends > now);
        }
        if open.len() >= MAX_SESSIONS
            && let Some(first) = open.iter().min_by_key(|(_, s)| s.ends).map(|(k, _)| *k)
        {
            open.remove(&first);
        }
        open.insert(
            digest(&id),
            Session {
                ends,
                token: digest(token),
            },
        );
        Ok(id)
    }

    /// Whether `id` is an open session of `token`, the token in force now. A session that
    /// ended, or was opened with another token, is forgotten.
    pub fn check(&self, id: &str, token: &str) -> bool {
        if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return false;
        }
        let key = digest(id);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let Some(session) = open.get(&key) else {
            return false;
        };
        let valid =
            session.ends > Instant::now() && bool::from(session.token.ct_eq(&digest(token)));
        if !valid {
            open.remove(&key);
        }
        valid
    }
}

fn digest(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_belongs_to_its_token_and_ends() {
        let sessions = Sessions::default();
        let id = sessions.open("tok-1").unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("tok-1"));
        assert!(sessions.check(&id, "tok-1"));
        assert!(sessions.check(&id, "tok-1"), "checking does not end it");
        let mut wrong = id.clone();
        wrong.replace_range(63.., if id.ends_with('0') { "1" } else { "0" });
        assert!(!sessions.check(&wrong, "tok-1"));
        assert!(!sessions.check("tok-1", "tok-1"), "the token is no session");
        // The token rotated: the session ended, and stays ended if it comes back.
        assert!(!sessions.check(&id, "tok-2"));
        assert!(!sessions.check(&id, "tok-1"));
        let other = sessions.open("tok-1").unwrap();
        assert_ne!(other, id);
        // Ended by time.
        let old = sessions
            .open_until("tok-1", Instant::now() - Duration::from_secs(1))
            .unwrap();
        assert!(!sessions.check(&old, "tok-1"));
    }

    #[test]
    fn sessions_are_bounded() {
        let sessions = Sessions::default();
        let first = sessions
            .open_until("t", Instant::now() + Duration::from_secs(60))
            .unwrap();
        let ids: Vec<String> = (0..MAX_SESSIONS)
            .map(|_| sessions.open("t").unwrap())
            .collect();
        assert_eq!(sessions.open.lock().unwrap().len(), MAX_SESSIONS);
        assert!(
            !sessions.check(&first, "t"),
            "the closest to its end made room"
        );
        assert!(ids.iter().all(|id| sessions.check(id, "t")));
    }
}
