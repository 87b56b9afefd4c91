//! The small JSON lists the agent keeps in its state directory (`claims.json`,
//! `verified.json`): read whole, and replaced durably (a new file written and synced beside
//! the old one, renamed over it, and the directory synced), so a crash leaves either list whole.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A state file that could not be read or written, naming it.
#[derive(Debug, thiserror::Error)]
pub enum StateFileError {
    /// A file operation failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// The file is not a list this agent writes.
    #[error("{path}: {message}")]
    Unreadable { path: PathBuf, message: String },
}

fn io(op: &'static str, path: &Path, e: impl Into<std::io::Error>) -> StateFileError {
    StateFileError::Io(crate::host::HostError::io(op, path, e))
}

/// The list in `path`; empty when there is no such file.
pub(crate) fn read_list<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, StateFileError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| StateFileError::Unreadable { path: path.to_path_buf(), message: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io("reading", path, e)),
    }
}

/// Replaces the list in `path` (inside the directory `dir`) durably, sorted.
pub(crate) fn write_list<T: Serialize + Ord + Clone>(
    dir: &Path,
    path: &Path,
    items: &[T],
) -> Result<(), StateFileError> {
    let mut sorted = items.to_vec();
    sorted.sort();
    let text = serde_json::to_vec_pretty(&sorted).map_err(|e| io("encoding", path, std::io::Error::other(e)))?;
    replace_durably(dir, path, &text, None)
}

/// Held while a list is read, changed and replaced ([`update_list`]): a wipe task records its
/// wipe while the agent prunes the same file, and neither may lose the other's change.
static UPDATING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Reads the list in `path`, lets `change` edit it, and replaces it durably when `change`
/// says it changed something; returns the list as it stands. One update at a time in this
/// process.
pub(crate) fn update_list<T: Serialize + DeserializeOwned + Ord + Clone>(
    dir: &Path,
    path: &Path,
    change: impl FnOnce(&mut Vec<T>) -> bool,
) -> Result<Vec<T>, StateFileError> {
    let _updating = UPDATING.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut all = read_list(path)?;
    if change(&mut all) {
        write_list(dir, path, &all)?;
    }
    Ok(all)
}

/// Replaces the file `path` (inside the directory `dir`) with `bytes` durably: a new file
/// written and synced beside it (with permission bits `mode` when given), renamed over it, and
/// the directory synced, so a crash, or a reader meanwhile, sees the old file or the new one.
pub(crate) fn replace_durably(dir: &Path, path: &Path, bytes: &[u8], mode: Option<u32>) -> Result<(), StateFileError> {
    use std::os::unix::fs::PermissionsExt as _;
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    let tmp = dir.join(name);
    let mut f = File::create(&tmp).map_err(|e| io("creating", &tmp, e))?;
    f.write_all(bytes).map_err(|e| io("writing", &tmp, e))?;
    if let Some(mode) = mode {
        f.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|e| io("chmod", &tmp, e))?;
    }
    f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into place", path, e))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing", dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_is_written_sorted_and_read_back_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("list.json");
        assert_eq!(read_list::<u32>(&path).unwrap(), Vec::<u32>::new());
        write_list(dir.path(), &path, &[3u32, 1, 2]).unwrap();
        assert_eq!(read_list::<u32>(&path).unwrap(), vec![1, 2, 3]);
        assert!(!dir.path().join("list.json.tmp").exists());
        std::fs::write(&path, b"{not json").unwrap();
        let e = read_list::<u32>(&path).unwrap_err();
        assert!(matches!(e, StateFileError::Unreadable { .. }), "{e}");
        assert!(e.to_string().starts_with(&path.display().to_string()), "{e}");
    }
}
