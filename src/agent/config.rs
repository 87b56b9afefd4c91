//! Configuration reloads: the ConfigMap directory is re-read only when it changed (a
//! metadata fingerprint, see config::ConfigSource), on the blocking pool. A valid new config
//! applies at once; an invalid one is refused with every problem listed and the last good one
//! stays in use. A class whose own settings are wrong fails alone (config::effective): at
//! start-up it is left out, on a reload it keeps its last valid definition, and the other
//! classes apply.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use tracing::{error, info, warn};

use super::Agent;
use crate::admin::Readiness;
use crate::api::node_reference;
use crate::config::{ConfigSource, Effective, LoadedConfig, ProvisionerConfig, effective};
use crate::host::wipe_block::cleaner_warnings_here;

/// Reads the configuration at start-up. An invalid one does not stop the agent: it publishes
/// nothing, says so in readiness, and picks up the config as soon as it is fixed. Invalid
/// classes are left out (and named in readiness), the others run.
pub(super) async fn first_load(source: &mut ConfigSource, readiness: &Readiness) -> FirstLoad {
    let dir = source.dir().to_path_buf();
    match on_blocking_pool(source, ConfigSource::load).await {
        Some(Ok(loaded)) => {
            let eff = effective(&loaded, None);
            log_findings(&dir, &loaded, &eff);
            info!(classes = eff.config.storage_class_map.len(), config_dir = %dir.display(), "configuration loaded");
            let problem = failure_summary(&eff);
            if let Some(p) = &problem {
                readiness.set_detail(Some(format!("config: {p}")));
            }
            let left_out = eff.left_out_problems();
            FirstLoad { config: Some(eff.config), problem, left_out, warnings: loaded.warnings }
        }
        Some(Err(e)) => {
            error!(error = %e, "configuration invalid; nothing is published until it is fixed");
            FirstLoad { problem: Some(e.to_string()), ..FirstLoad::default() }
        }
        None => FirstLoad { problem: Some(format!("reading {} failed", dir.display())), ..FirstLoad::default() },
    }
}

/// What the first read of the configuration found, before the API can be reached: the
/// first pass tells it on the Node ([`Agent::tell_config_findings`]).
#[derive(Default)]
pub(super) struct FirstLoad {
    /// The configuration to use; None when none is valid.
    pub config: Option<ProvisionerConfig>,
    /// Why the configuration is not used as written (refused, or classes left out).
    pub problem: Option<String>,
    /// Classes left out as invalid, with their problems.
    pub left_out: BTreeMap<String, String>,
    /// Unknown keys unlike any known one (config::LoadedConfig::warnings).
    pub warnings: Vec<String>,
}

/// Logs what an operator must see about a config being applied: its warnings, the block
/// cleaners this image cannot run, each failed class (class, key and reason), and a config
/// that publishes nothing.
fn log_findings(dir: &std::path::Path, loaded: &LoadedConfig, eff: &Effective) {
    for w in loaded.warnings.iter().chain(&cleaner_warnings_here(&eff.config)) {
        warn!(config_dir = %dir.display(), "{w}");
    }
    for line in eff.describe_failures() {
        error!(config_dir = %dir.display(), "{line}");
    }
    if eff.config.storage_class_map.is_empty() {
        if eff.is_complete() {
            warn!(config_dir = %dir.display(), "no storage classes are configured (storageClassMap is empty or missing): nothing is published");
        } else {
            error!(config_dir = %dir.display(), "every storage class is invalid: nothing is published until the config is fixed");
        }
    }
}

/// The failed classes in one line (readiness detail, event note, comparison between
/// reloads), None when the config is used as written.
fn failure_summary(eff: &Effective) -> Option<String> {
    (!eff.is_complete()).then(|| eff.describe_failures().join("; "))
}

/// Runs `read` on the source on the blocking pool (it stats and reads files); `None` when the
/// task itself failed.
async fn on_blocking_pool<T: Send + 'static>(source: &mut ConfigSource, read: fn(&mut ConfigSource) -> T) -> Option<T> {
    let mut owned = std::mem::replace(source, ConfigSource::new(source.dir()));
    let (owned, result) = tokio::task::spawn_blocking(move || {
        let result = read(&mut owned);
        (owned, result)
    })
    .await
    .ok()?;
    *source = owned;
    Some(result)
}

impl Agent {
    /// Tells on the Node, once per occurrence, what the operator must fix in the configuration
    /// the agent runs: the unknown keys it ignores (`ConfigUnknownKeys`), and at the first pass
    /// the problems met at start-up, before the API could be reached (`ConfigInvalid`; later
    /// ones are told as reloads meet them).
    pub(super) async fn tell_config_findings(&mut self) {
        if !std::mem::replace(&mut self.told_first_load, true)
            && let Some(problem) = &self.config_problem
        {
            let note = if self.has_config {
                format!("configuration partly refused at start-up: {problem}")
            } else {
                format!("configuration invalid at start-up; nothing is published until it is fixed: {problem}")
            };
            self.cluster.event(&node_reference(&self.node), true, "ConfigInvalid", "Load", note).await;
        }
        if self.config_warnings == self.told_warnings {
            return;
        }
        self.told_warnings = self.config_warnings.clone();
        if !self.config_warnings.is_empty() {
            let note = format!("configuration: {}", self.config_warnings.join("; "));
            self.cluster.event(&node_reference(&self.node), true, "ConfigUnknownKeys", "Load", note).await;
        }
    }

    /// Applies a changed config directory. New settings apply to new PVs; existing PVs are not
    /// changed. A class that became invalid keeps its last valid definition.
    pub(super) async fn reload_config(&mut self) {
        let Some(Some(loaded)) = on_blocking_pool(&mut self.source, ConfigSource::load_if_changed).await else {
            return;
        };
        match loaded {
            Ok(loaded) => {
                self.config_warnings.clone_from(&loaded.warnings);
                let eff = effective(&loaded, self.has_config.then_some(&self.config));
                let changed = !self.has_config || eff.config != self.config;
                if changed {
                    log_findings(self.source.dir(), &loaded, &eff);
                    if self.has_config {
                        let classes = eff.config.storage_class_map.len();
                        info!(classes, "configuration reloaded");
                        let note = format!("configuration reloaded: {classes} classes");
                        self.cluster.event(&node_reference(&self.node), false, "ConfigReloaded", "Reload", note).await;
                    }
                    self.identity = super::node::identity_for(&self.node_info, eff.config.use_node_name_only);
                    self.config = eff.config.clone();
                    self.has_config = true;
                    self.left_out_classes = eff.left_out_problems();
                }
                match failure_summary(&eff) {
                    Some(problem) => {
                        if self.config_problem.as_deref() != Some(problem.as_str()) {
                            // A change applied has had its failures logged with its findings.
                            if !changed {
                                for line in eff.describe_failures() {
                                    error!(config_dir = %self.source.dir().display(), "{line}");
                                }
                            }
                            let note = format!("configuration change partly refused: {problem}");
                            self.cluster
                                .event(&node_reference(&self.node), true, "ConfigInvalid", "Reload", note)
                                .await;
                            self.config_problem = Some(problem.clone());
                        }
                        self.readiness.set_detail(Some(format!("config: {problem}")));
                        self.metrics.set_config_valid(false);
                    }
                    None => {
                        if self.config_problem.take().is_some() {
                            info!("configuration valid again");
                        }
                        self.readiness.set_detail(None);
                        self.metrics.set_config_valid(true);
                    }
                }
                self.say_readiness();
            }
            Err(e) => {
                let problem = e.to_string();
                if self.config_problem.as_deref() != Some(problem.as_str()) {
                    error!(error = %problem, "configuration change refused; the last valid configuration stays in use");
                    let note = format!("configuration change refused, last valid configuration kept: {problem}");
                    self.cluster.event(&node_reference(&self.node), true, "ConfigInvalid", "Reload", note).await;
                    self.config_problem = Some(problem.clone());
                }
                self.metrics.set_config_valid(false);
                if self.has_config {
                    self.readiness.set_detail(Some(format!("config: last change refused: {problem}")));
                }
                self.say_readiness();
            }
        }
    }

    /// inotify on the config directory and every class's discovery directory; a directory
    /// that cannot be watched is reported once per occurrence.
    pub(super) fn watch_dirs(&mut self) {
        let Some(watcher) = self.dir_watcher.as_mut() else { return };
        let mut dirs = BTreeSet::from([self.source.dir().to_path_buf()]);
        dirs.extend(self.config.storage_class_map.values().map(|c| PathBuf::from(&c.mount_dir)));
        for e in watcher.watch_exactly(&dirs) {
            if self.problems.first_seen(format!("watch/{e}")) {
                warn!(error = %e, "cannot watch directory; changes there are found by mount events and resync");
            }
        }
    }
}
