//! The provisioner configuration: the upstream ConfigMap format, read from the directory
//! kubelet mounts it into, with upstream's defaults, and validated before anything acts on it.
//! A config that fails here is never applied, so a typo cannot make the agent touch the
//! wrong directory.

mod cleaners;
mod effective;
mod load;
mod manifest;
mod source;
mod suggest;
mod upstream_yaml;
mod validate;
mod yaml_error;

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

pub(crate) use crate::core::config::go_duration as duration;
pub use crate::core::config::settings::{
    ACCESS_MODES, BlockCleanMethod, ClassConfig, DEFAULT_BLOCK_CLEANER, DEFAULT_MIN_RESYNC_PERIOD, ProvisionerConfig,
    VolumeMode,
};
pub use crate::core::devices::device_selector::{DeviceSelector, DeviceType, Verify, any_glob_matches, parse_quantity};
pub use cleaners::cleaner_warnings;
pub use effective::{Effective, effective};
pub use load::{load_dir, parse_entries};
pub use manifest::{ManifestError, load_manifest};
pub use source::ConfigSource;
#[cfg(test)]
use validate::nested_dirs;
pub use validate::{Findings, validate};

/// Where the upstream DaemonSet mounts the ConfigMap; keeping it lets operators swap images
/// without editing manifests.
pub const DEFAULT_CONFIG_DIR: &str = "/etc/provisioner/config";

/// One thing wrong with a config, with where it is (`storageClassMap.fast.hostDir`), so an
/// operator can fix every problem in one edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Dotted location of the offending key.
    pub location: String,
    /// What is wrong and, where it helps, what would be right.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.location, self.message)
    }
}

/// Why a configuration could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The directory or one of its files could not be read.
    #[error("reading config {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config was read but is wrong; every problem is listed.
    #[error("invalid config in {source_name}: {}", format_problems(.problems))]
    Invalid {
        source_name: String,
        problems: Vec<Problem>,
        /// Warnings met on the way, so they are not lost when the config is refused.
        warnings: Vec<String>,
    },
}

fn format_problems(problems: &[Problem]) -> String {
    let mut out = format!("{} problem(s)", problems.len());
    for p in problems {
        out.push_str("\n  - ");
        out.push_str(&p.to_string());
    }
    out
}

/// A valid configuration together with the warnings (unknown keys) met while reading it, and
/// the classes left out because their own settings are wrong.
#[derive(Debug, Clone)]
pub struct LoadedConfig {
    /// The effective configuration: every class that is valid.
    pub config: ProvisionerConfig,
    /// Non-fatal findings an operator should still see.
    pub warnings: Vec<String>,
    /// Classes left out of `config`, with their problems: one class's typo does not stop the
    /// others (upstream fails such a class alone too).
    pub failed_classes: BTreeMap<String, Vec<Problem>>,
    /// Where each unknown key was met (`storageClassMap.fast.reclaimPolicy`): the warned ones
    /// and the likely misspellings alike; `validate-config --strict` refuses any.
    pub unknown_keys: Vec<String>,
}

#[cfg(test)]
mod tests;
