//! Where the agent reads its configuration from. This first version re-reads the directory on
//! every call, as the agent always did; change detection comes next.
use std::path::{Path, PathBuf};

use super::{ConfigError, LoadedConfig, load_dir};

/// Where the configuration comes from.
pub struct ConfigSource {
    dir: PathBuf,
}

impl ConfigSource {
    /// A source for `dir`.
    pub fn new(dir: &Path) -> Self {
        ConfigSource { dir: dir.to_path_buf() }
    }
    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The configuration now; `None` would mean "unchanged since the last call".
    pub fn load_if_changed(&mut self) -> Option<Result<LoadedConfig, ConfigError>> {
        Some(load_dir(&self.dir))
    }
}
