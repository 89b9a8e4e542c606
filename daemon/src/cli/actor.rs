//! Who runs a command that changes the state, and from which host: the `action` rows those
//! commands write and `gitplane history` shows.

use gitplane_state::{Action, Store};

use super::CliError;

/// The person (or job) behind a command, and the host it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Actor {
    pub name: String,
    pub host: String,
}

impl Actor {
    /// `--by` when given (and not blank), else the login name of the user the process runs as
    /// (from the user database, not `$USER`: a systemd unit or a root shell may have none set),
    /// else `uid:N`.
    pub(crate) fn of(by: Option<&str>) -> Actor {
        let name = by
            .map(str::trim)
            .filter(|b| !b.is_empty())
            .map(str::to_owned)
            .unwrap_or_else(|| {
                let uid = rustix::process::getuid().as_raw();
                login_name(uid).unwrap_or_else(|| format!("uid:{uid}"))
            });
        Actor {
            name,
            host: rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned(),
        }
    }

    /// Records that this actor ran `command` (on `env`, starting or releasing `deployment`).
    pub(crate) fn record(
        &self,
        store: &Store,
        command: &str,
        env: Option<&str>,
        deployment: Option<i64>,
        detail: &str,
    ) -> Result<(), CliError> {
        store.record_action(&Action {
            command,
            env,
            actor: &self.name,
            host: &self.host,
            deployment_id: deployment,
            detail: Some(detail),
        })?;
        Ok(())
    }
}

/// The login name of `uid` in the user database (`/etc/passwd`, LDAP, systemd's dynamic
/// users: whatever NSS is configured with), if it has one.
fn login_name(uid: u32) -> Option<String> {
    // getpwuid_r says ERANGE when the buffer is too small for the entry: grow it, within reason.
    let mut size = 1024;
    while size <= 1 << 20 {
        let mut buffer = vec![0u8; size];
        // SAFETY: `passwd` is plain data that getpwuid_r fills in; `buffer` outlives every
        // pointer it stores there (pw_name points into it), and it is read before `buffer`
        // is dropped; `found` is null or points at `passwd`.
        let (status, name) = unsafe {
            let mut passwd: libc::passwd = std::mem::zeroed();
            let mut found: *mut libc::passwd = std::ptr::null_mut();
            let status = libc::getpwuid_r(
                uid,
                &mut passwd,
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                &mut found,
            );
            let name = (status == 0 && !found.is_null() && !passwd.pw_name.is_null()).then(|| {
                std::ffi::CStr::from_ptr(passwd.pw_name)
                    .to_string_lossy()
                    .into_owned()
            });
            (status, name)
        };
        if status == libc::ERANGE {
            size *= 4;
            continue;
        }
        return name.filter(|n| !n.is_empty());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_wins_and_a_blank_one_falls_back_to_the_login_name() {
        assert_eq!(Actor::of(Some("alice")).name, "alice");
        let own = Actor::of(None);
        assert_eq!(Actor::of(Some("  ")).name, own.name);
        assert!(!own.name.is_empty() && !own.host.is_empty());
    }

    #[test]
    fn root_is_named_and_an_unknown_uid_is_not() {
        assert_eq!(login_name(0).as_deref(), Some("root"));
        // No user database names a uid this large.
        assert_eq!(login_name(3_999_999_999), None);
    }
}
