//! Configuration reloads: the ConfigMap directory is re-read only when it changed (a
//! metadata fingerprint, see config::ConfigSource), on the blocking pool. A valid new config
//! applies at once; an invalid one is refused with every problem listed and the last good one
//! stays in use.

use std::collections::BTreeSet;
use std::path::PathBuf;

use tracing::{error, info, warn};

use super::Agent;
use crate::api::node_reference;
use crate::config::{ConfigSource, LoadedConfig, ProvisionerConfig};

/// Reads the configuration at start-up. An invalid one does not stop the agent: it publishes
/// nothing, says so in readiness, and picks up the config as soon as it is fixed.
pub(super) async fn first_load(source: &mut ConfigSource) -> (Option<ProvisionerConfig>, Option<String>) {
    let dir = source.dir().to_path_buf();
    match on_blocking_pool(source, ConfigSource::load).await {
        Some(Ok(LoadedConfig { config, warnings })) => {
            for w in &warnings {
                warn!(config_dir = %dir.display(), "{w}");
            }
            info!(classes = config.storage_class_map.len(), config_dir = %dir.display(), "configuration loaded");
            (Some(config), None)
        }
        Some(Err(e)) => {
            error!(error = %e, "configuration invalid; nothing is published until it is fixed");
            (None, Some(e.to_string()))
        }
        None => (None, Some(format!("reading {} failed", dir.display()))),
    }
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
    /// Applies a changed config directory. New settings apply to new PVs; existing PVs are not
    /// changed.
    pub(super) async fn reload_config(&mut self) {
        let Some(Some(loaded)) = on_blocking_pool(&mut self.source, ConfigSource::load_if_changed).await else {
            return;
        };
        match loaded {
            Ok(LoadedConfig { config, warnings }) => {
                if !self.has_config || config != self.config {
                    for w in &warnings {
                        warn!(config_dir = %self.source.dir().display(), "{w}");
                    }
                    if self.has_config {
                        info!(classes = config.storage_class_map.len(), "configuration reloaded");
                        let note = format!("configuration reloaded: {} classes", config.storage_class_map.len());
                        self.cluster.event(&node_reference(&self.node), false, "ConfigReloaded", "Reload", note).await;
                    }
                    self.identity = super::node::identity_for(&self.node_info, config.use_node_name_only);
                    self.config = config;
                    self.has_config = true;
                }
                if self.config_problem.take().is_some() {
                    info!("configuration valid again");
                }
                self.say_readiness();
                self.readiness.set_detail(None);
                self.metrics.set_config_valid(true);
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
