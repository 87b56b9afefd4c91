//! Everything that touches the host: the mount table, file types, filesystem and block
//! device sizes, ioctls, wipes. Kept separate so the rest of the agent is plain logic. One
//! folder per capability, named as core's: the facts core judges are gathered in the host
//! folder of the same name.

// One folder per capability.
pub mod devices;
pub(crate) mod fence;
pub mod health;
pub mod identity;
pub mod mounts;
pub mod volumes;
pub mod wipe;

// Host-wide: the agent's one door to the host, the operation executor every host call that may
// hang runs under, the process's own figures, the state directory's small JSON lists.
pub(crate) mod access;
pub mod ops;
pub(crate) mod process;
pub(crate) mod state_file;

use std::path::PathBuf;

/// A host operation that failed, with the path it was about: the one I/O error of the host,
/// which every capability's error carries as its `Io` variant (`#[error(transparent)]`).
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A system call or file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// The kernel's mount table had a line we could not parse.
    #[error("unparsable line {line} of /proc/self/mountinfo: {text:?}")]
    Mountinfo { line: usize, text: String },
}

impl HostError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: impl Into<std::io::Error>) -> Self {
        HostError::Io { path: path.into(), op, source: source.into() }
    }

    /// Whether the disk failed the call (EIO...: the failing sign `io-failure`,
    /// host::health::disk_health::is_disk_failure).
    pub fn is_disk_failure(&self) -> bool {
        matches!(self, HostError::Io { source, .. } if health::disk_health::is_disk_failure(source))
    }
}

/// The unit tests' side of the skip rule in tests/support (`require_root`, `cannot_run`): a
/// test that needs root or a tool says why it cannot run and skips, except under CI, where it
/// fails so that the real-mount tests cannot pass by not running.
#[cfg(test)]
pub(crate) mod test_env {
    /// True when the test may mount; otherwise see [`cannot_run`].
    pub(crate) fn require_root(test: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        cannot_run(test, "needs root (mounts)");
        false
    }

    /// Prints why `test` cannot run here (the caller then skips), or panics under CI.
    pub(crate) fn cannot_run(test: &str, why: &str) {
        if under_ci() {
            panic!("{test} cannot run under CI (CI={:?}): {why}", std::env::var("CI").unwrap_or_default());
        }
        eprintln!("SKIPPED {test}: {why} (under CI this fails)");
    }

    /// Whether this is a CI run: `CI` set to anything but empty, `0` or `false`.
    fn under_ci() -> bool {
        std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && !v.eq_ignore_ascii_case("false"))
    }
}
