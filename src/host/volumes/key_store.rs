//! The node-local store of the encrypted volumes' keys (core::volumes::encryption): one file per key in
//! `<state dir>/keys/`, readable by root only, written durably before the key is used (a crash
//! after the policy is set must not leave data no key can read), and destroyed durably when
//! the volume's claim is released (docs/encryption.md says what that does and does not prove
//! on the node's own disk).

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use zeroize::Zeroize as _;

use crate::host::volumes::fscrypt::{KeyId, MasterKey};

/// Why the store could not be used, naming the file.
#[derive(Debug, thiserror::Error)]
pub enum KeyStoreError {
    /// A file operation failed (the host's one I/O error: which operation, which file).
    #[error(transparent)]
    Io(#[from] crate::host::HostError),
    /// A key file is not one this agent writes, or holds another key than its name says.
    #[error("{path}: {message}")]
    Unreadable { path: PathBuf, message: String },
    /// No key with this identifier is stored.
    #[error("no key {id} in {dir} (the node's key store): the volume's data cannot be read on this node")]
    Missing { id: String, dir: PathBuf },
}

fn io(op: &'static str, path: &Path, e: std::io::Error) -> KeyStoreError {
    KeyStoreError::Io(crate::host::HostError::io(op, path, e))
}

/// One stored key's file.
#[derive(Serialize, Deserialize)]
struct KeyFile {
    /// The kernel's identifier of the key (hex).
    id: String,
    /// The 64 key bytes, base64.
    key: String,
    /// The volume root it was made for (host path), for the operator and orphan handling.
    host_path: String,
    /// The disk's identity when the key was made (core::identity::disk_identity).
    identity: String,
    /// When it was stored (RFC 3339).
    created: String,
}

/// What the store knows of one key besides its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub id: String,
    pub host_path: String,
    pub identity: String,
    pub created: String,
    /// How long ago its file was last written (its modification time: a key's file is written
    /// whole, when the key is made or used again for a new publish); zero when the clock says
    /// it is in the future, `None` when the time cannot be read.
    pub age: Option<std::time::Duration>,
}

/// The store in a state directory.
#[derive(Debug, Clone)]
pub struct KeyStore {
    dir: PathBuf,
}

impl KeyStore {
    /// The store under `state_dir` (created, mode 0700, at the first key).
    pub fn new(state_dir: &Path) -> KeyStore {
        KeyStore { dir: state_dir.join("keys") }
    }

    /// Where the store is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &KeyId) -> PathBuf {
        self.dir.join(format!("{}.key", id.to_hex()))
    }

    /// Keeps `key` (whose identifier the kernel gave as `id`) durably: written to a new file
    /// created 0600, synced, renamed into place, and the directory synced.
    pub fn keep(&self, id: &KeyId, key: &MasterKey, host_path: &str, identity: &str) -> Result<(), KeyStoreError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| io("creating", &self.dir, e))?;
        std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("chmod", &self.dir, e))?;
        let created = k8s_openapi::jiff::Timestamp::now().round(k8s_openapi::jiff::Unit::Second);
        let file = KeyFile {
            id: id.to_hex(),
            key: base64::engine::general_purpose::STANDARD.encode(key.bytes()),
            host_path: host_path.to_string(),
            identity: identity.to_string(),
            created: created.map(|t| t.to_string()).unwrap_or_default(),
        };
        let path = self.path(id);
        let mut file = file;
        let encoded = serde_json::to_vec(&file).map_err(|e| io("encoding", &path, std::io::Error::other(e)));
        file.key.zeroize();
        let mut bytes = encoded?;
        let tmp = self.dir.join(format!("{}.key.tmp", id.to_hex()));
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("creating", &tmp, e))?;
        let written = f.write_all(&bytes).map_err(|e| io("writing", &tmp, e));
        bytes.zeroize();
        written?;
        f.sync_all().map_err(|e| io("syncing", &tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| io("renaming into place", &path, e))?;
        self.sync_dir()
    }

    /// Marks key `id` as used now (its file's modification time): a key kept for a new
    /// publish is not an old orphan.
    pub fn touch(&self, id: &KeyId) -> Result<(), KeyStoreError> {
        let path = self.path(id);
        let f = OpenOptions::new().write(true).open(&path).map_err(|e| io("opening", &path, e))?;
        f.set_modified(std::time::SystemTime::now()).map_err(|e| io("touching", &path, e))?;
        f.sync_all().map_err(|e| io("syncing", &path, e))
    }

    fn sync_dir(&self) -> Result<(), KeyStoreError> {
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(|e| io("syncing", &self.dir, e))
    }

    /// The key with identifier `id`, checked to be the key its name says (the caller proves it
    /// again: the kernel derives the identifier from the bytes).
    pub fn read(&self, id: &KeyId) -> Result<MasterKey, KeyStoreError> {
        let path = self.path(id);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyStoreError::Missing { id: id.to_hex(), dir: self.dir.clone() });
            }
            Err(e) => return Err(io("reading", &path, e)),
        };
        let mut bytes = bytes;
        let unreadable = |message: String| KeyStoreError::Unreadable { path: path.clone(), message };
        let parsed = serde_json::from_slice::<KeyFile>(&bytes).map_err(|e| unreadable(e.to_string()));
        bytes.zeroize();
        let mut file = parsed?;
        let decoded = base64::engine::general_purpose::STANDARD.decode(&file.key);
        file.key.zeroize();
        if file.id != id.to_hex() {
            return Err(unreadable(format!("names key {}, not {}", file.id, id.to_hex())));
        }
        let mut raw = decoded.map_err(|e| unreadable(e.to_string()))?;
        let key = MasterKey::from_bytes(&raw).map_err(|e| unreadable(e.to_string()));
        raw.zeroize();
        key
    }

    /// What the store knows of key `id` (not its bytes); `None` when it holds no such key.
    pub fn info(&self, id: &KeyId) -> Result<Option<KeyInfo>, KeyStoreError> {
        let path = self.path(id);
        match Self::read_info(&path)? {
            Some(info) if info.id == id.to_hex() => Ok(Some(info)),
            Some(info) => {
                Err(KeyStoreError::Unreadable { path, message: format!("names key {}, not {}", info.id, id.to_hex()) })
            }
            None => Ok(None),
        }
    }

    /// The key file at `path` without its bytes (they are zeroed once read); `None` when there
    /// is no such file.
    fn read_info(path: &Path) -> Result<Option<KeyInfo>, KeyStoreError> {
        let mut bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("reading", path, e)),
        };
        let parsed = serde_json::from_slice::<KeyFile>(&bytes);
        bytes.zeroize();
        let mut file =
            parsed.map_err(|e| KeyStoreError::Unreadable { path: path.to_path_buf(), message: e.to_string() })?;
        file.key.zeroize();
        let written = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let age = written.map(|at| std::time::SystemTime::now().duration_since(at).unwrap_or_default());
        Ok(Some(KeyInfo {
            id: file.id,
            host_path: file.host_path,
            identity: file.identity,
            created: file.created,
            age,
        }))
    }

    /// Every stored key (not their bytes); files that are not key files are left out.
    pub fn list(&self) -> Result<Vec<KeyInfo>, KeyStoreError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io("listing", &self.dir, e)),
        };
        let mut keys = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io("listing", &self.dir, e))?;
            let path = entry.path();
            if path.extension().is_none_or(|x| x != "key") {
                continue;
            }
            // A file that is not a key file (a stray, or a key zeroed by a destruction a crash
            // cut short) is not a key; destroying its key finishes it.
            match Self::read_info(&path) {
                Ok(Some(info)) => keys.push(info),
                Ok(None) | Err(KeyStoreError::Unreadable { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        keys.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(keys)
    }

    /// Destroys the stored copy of key `id`: its bytes overwritten with zeroes and synced, the
    /// file removed, the directory synced. Returns whether there was one. On a journaling or
    /// flash-backed state directory the overwrite is best effort (docs/encryption.md); the
    /// removal is what makes the key unreadable to this and every later agent.
    pub fn destroy(&self, id: &KeyId) -> Result<bool, KeyStoreError> {
        // A copy a crash left half-written beside it goes too.
        let tmp = self.dir.join(format!("{}.key.tmp", id.to_hex()));
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("removing", &tmp, e)),
        }
        let path = self.path(id);
        let mut f = match OpenOptions::new().write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io("opening", &path, e)),
        };
        let len = f.metadata().map_err(|e| io("stat", &path, e))?.len();
        let zeroes = vec![0u8; usize::try_from(len).unwrap_or(0)];
        f.write_all(&zeroes).map_err(|e| io("overwriting", &path, e))?;
        f.sync_all().map_err(|e| io("syncing", &path, e))?;
        drop(f);
        std::fs::remove_file(&path).map_err(|e| io("removing", &path, e))?;
        self.sync_dir()?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_kept_private_read_back_listed_and_destroyed() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let store = KeyStore::new(dir.path());
        assert!(store.list().unwrap().is_empty());
        let key = MasterKey::from_bytes(&[7u8; 64]).unwrap();
        let id = KeyId([0xab; 16]);
        let e = store.read(&id).unwrap_err();
        assert!(matches!(e, KeyStoreError::Missing { .. }), "{e}");
        store.keep(&id, &key, "/mnt/disks/a", "v2;fs;uuid=u").unwrap();
        let path = store.dir().join(format!("{}.key", id.to_hex()));
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(store.dir()).unwrap().mode() & 0o777, 0o700);
        assert_eq!(store.read(&id).unwrap().bytes(), key.bytes());
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].id.as_str(), listed[0].host_path.as_str()), (id.to_hex().as_str(), "/mnt/disks/a"));
        assert!(!listed[0].created.is_empty());
        assert!(listed[0].age.is_some_and(|a| a < std::time::Duration::from_secs(60)), "{:?}", listed[0].age);
        // A file under another key's name is refused, not used.
        let other = KeyId([0xcd; 16]);
        std::fs::copy(&path, store.dir().join(format!("{}.key", other.to_hex()))).unwrap();
        let e = store.read(&other).unwrap_err();
        assert!(matches!(e, KeyStoreError::Unreadable { .. }) && e.to_string().contains("names key"), "{e}");
        assert!(store.destroy(&id).unwrap());
        assert!(!path.exists());
        assert!(!store.destroy(&id).unwrap());
        assert!(matches!(store.read(&id).unwrap_err(), KeyStoreError::Missing { .. }));
        // Stray files are not keys.
        std::fs::write(store.dir().join("notes.txt"), b"x").unwrap();
        std::fs::write(store.dir().join("bad.key"), b"{").unwrap();
        assert_eq!(store.list().unwrap().len(), 1);
    }
}
