//! Noticing that the mounted ConfigMap changed without reading it. The agent looks at its
//! config on every pass; with thousands of classes, reading and validating it each time costs
//! more than the pass itself, and almost every pass finds it unchanged. A fingerprint made of
//! metadata only (the directory, the `..data` link and every key file the loader reads, as
//! `stat` sees them) tells whether anything could have changed; only then are the files read,
//! and only when their bytes differ is the config parsed and validated again.
//!
//! File timestamps are coarse: the kernel stamps them from a clock that advances once per tick
//! (milliseconds), and some filesystems keep whole seconds. An edit that keeps the size and
//! lands in the same tick as the previous look could leave every stamp as it was (and a
//! removed file's inode number can be reused at once). So a fingerprint with any stamp newer
//! than [`SETTLE`] before it was taken is not trusted: until it has settled, each look reads
//! the files and compares their bytes (no validation unless they differ).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::load::{is_key_name, parse_entries, read_entries, source_name};
use super::{ConfigError, LoadedConfig};

/// How old every stamp must be before metadata alone is trusted to show a change: above the
/// one-second granularity of the coarsest filesystems a ConfigMap may sit on, and far above
/// a kernel tick.
const SETTLE: Duration = Duration::from_secs(2);

/// A config directory watched for changes by metadata, so a pass that finds it unchanged reads
/// no file and validates nothing. The caller keeps its last good config: a refused config is
/// reported once per change, not on every pass.
#[derive(Debug)]
pub struct ConfigSource {
    dir: PathBuf,
    settle: Duration,
    last: Option<Snapshot>,
    reads: u64,
}

/// What the last look saw.
#[derive(Debug)]
struct Snapshot {
    fingerprint: Fingerprint,
    /// Every stamp was older than the settle time when it was taken.
    settled: bool,
    /// The entries read, or why they could not be read (the error's text).
    read: Result<Vec<(String, String)>, String>,
}

/// The metadata of everything the loader reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fingerprint {
    /// The directory could not be listed (the error's text).
    Unlisted(String),
    /// The directory, kubelet's `..data` link target, and each key entry with the metadata of
    /// what it leads to (the loader follows the key symlinks), or why that failed.
    Listed { dir: Stamp, data_link: Option<PathBuf>, keys: Vec<(String, Result<Stamp, String>)> },
}

/// One `stat`: identity (device, inode), type and permissions, size, and both change times
/// with nanoseconds (ctime moves on every write and cannot be set back by a user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    mode: u32,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            mode: meta.mode(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }
}

impl Fingerprint {
    /// Takes the fingerprint of `dir` with the same choices of entries the loader makes.
    fn take(dir: &Path) -> Self {
        let dir_stamp = match std::fs::metadata(dir) {
            Ok(meta) => Stamp::of(&meta),
            Err(e) => return Fingerprint::Unlisted(e.to_string()),
        };
        let listing = match std::fs::read_dir(dir) {
            Ok(listing) => listing,
            Err(e) => return Fingerprint::Unlisted(e.to_string()),
        };
        let mut keys = Vec::new();
        for entry in listing {
            let entry = match entry {
                Ok(entry) => entry,
                Err(e) => return Fingerprint::Unlisted(e.to_string()),
            };
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|n| is_key_name(n)) else { continue };
            let stamp = std::fs::metadata(entry.path()).map(|m| Stamp::of(&m)).map_err(|e| e.to_string());
            keys.push((name.to_string(), stamp));
        }
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        let data_link = std::fs::read_link(dir.join("..data")).ok();
        Fingerprint::Listed { dir: dir_stamp, data_link, keys }
    }

    /// Whether every stamp is older than `settle` before `taken`, so that a later change is
    /// bound to show in the stamps.
    fn settled(&self, taken: SystemTime, settle: Duration) -> bool {
        let Fingerprint::Listed { dir, keys, .. } = self else { return true };
        let Some(limit) = taken.checked_sub(settle).and_then(|t| t.duration_since(UNIX_EPOCH).ok()) else {
            return false;
        };
        let limit = (i64::try_from(limit.as_secs()).unwrap_or(i64::MAX), i64::from(limit.subsec_nanos()));
        std::iter::once(dir)
            .chain(keys.iter().filter_map(|(_, s)| s.as_ref().ok()))
            .all(|s| s.mtime < limit && s.ctime < limit)
    }
}

impl ConfigSource {
    /// Watches `dir`; the first [`load_if_changed`](Self::load_if_changed) always loads.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ConfigSource { dir: dir.into(), settle: SETTLE, last: None, reads: 0 }
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many times the files were read, so an idle pass can be shown to cost no reads.
    #[cfg(test)]
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The config as [`load_dir`](super::load_dir) would return it, or `None` when nothing it
    /// reads has changed since the last call: its metadata is unchanged (and settled), or the
    /// files were read again and hold the same bytes, or the same read error recurs. A
    /// refused or unreadable config is therefore returned once per change; the caller keeps
    /// using its last good one meanwhile.
    pub fn load_if_changed(&mut self) -> Option<Result<LoadedConfig, ConfigError>> {
        let taken = SystemTime::now();
        let fingerprint = Fingerprint::take(&self.dir);
        if let Some(last) = &self.last
            && last.settled
            && last.fingerprint == fingerprint
        {
            return None;
        }
        self.read(taken, fingerprint, false)
    }

    /// Loads whatever changed or not (start-up, or a caller that lost its copy), and remembers
    /// what it read so the next [`load_if_changed`](Self::load_if_changed) compares with it.
    pub fn load(&mut self) -> Result<LoadedConfig, ConfigError> {
        let taken = SystemTime::now();
        let fingerprint = Fingerprint::take(&self.dir);
        match self.read(taken, fingerprint, true) {
            Some(result) => result,
            // Not reached: a forced read always reports.
            None => super::load_dir(&self.dir),
        }
    }

    /// Reads the files and records them with `fingerprint` (taken at `taken`, before the
    /// read: a change in between makes the next fingerprint differ, and the bytes comparison
    /// then keeps it from being reported twice). Parses only when forced or when the bytes,
    /// or the read error, differ from the last read.
    fn read(
        &mut self,
        taken: SystemTime,
        fingerprint: Fingerprint,
        force: bool,
    ) -> Option<Result<LoadedConfig, ConfigError>> {
        self.reads += 1;
        let outcome = read_entries(&self.dir).map_err(|e| (e.to_string(), e));
        let same = self.last.as_ref().is_some_and(|last| match (&last.read, &outcome) {
            (Ok(before), Ok(now)) => before == now,
            (Err(before), Err((now, _))) => before == now,
            _ => false,
        });
        let report = force || !same;
        let (read, result) = match outcome {
            Ok(entries) => {
                let result = report.then(|| parse_entries(&source_name(&self.dir), &entries));
                (Ok(entries), result)
            }
            Err((text, e)) => (Err(text), report.then_some(Err(e))),
        };
        let settled = fingerprint.settled(taken, self.settle);
        self.last = Some(Snapshot { fingerprint, settled, read });
        result
    }

    /// A source with another settle time, to test both sides of it without waiting.
    #[cfg(test)]
    fn with_settle(dir: impl Into<PathBuf>, settle: Duration) -> Self {
        ConfigSource { settle, ..ConfigSource::new(dir) }
    }
}

#[cfg(test)]
#[path = "source_tests.rs"]
mod tests;
