//! Everything that touches the host: the mount table, file types, filesystem and block
//! device sizes. Kept small and separate so the rest of the agent is plain logic.

pub mod access;
pub mod blockdev;
pub mod identity;
pub mod mountinfo;
pub mod used_mark;
pub mod volume;
pub mod watch;
pub mod wipe_block;
pub mod wipe_fs;

use std::path::PathBuf;

/// A host operation that failed, with the path it was about.
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
}
