//! Configuration reloads: the ConfigMap directory is re-read only when it changed (a
//! metadata fingerprint, see config::ConfigSource), as an operation on the config directory
//! under the executor's deadline (host::ops): a directory that stops answering costs the pass
//! one grace, and the last good config stays in use meanwhile. A valid new config
//! applies at once; an invalid one is refused with every problem listed and the last good one
//! stays in use. A class whose own settings are wrong fails alone (config::effective): at
//! start-up it is left out, on a reload it keeps its last valid definition, and the other
//! classes apply.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tracing::{error, info, warn};

use super::Agent;
use crate::admin::Readiness;
use crate::api::node_reference;
use crate::config::{ConfigSource, Effective, LoadedConfig, ProvisionerConfig, effective};
use crate::host::ops::{Answer, Operations, Subject};
use crate::host::wipe::wipe_block::cleaner_warnings_here;

/// Reads the configuration at start-up, under the executor's deadline (its directory may sit on
/// a filesystem that stops answering). An invalid or unread one does not stop the agent: it
/// publishes nothing, says so in readiness, and picks up the config as soon as it is fixed or
/// read. Invalid classes are left out (and named in readiness), the others run.
pub(super) async fn first_load(
    source: &mut ConfigSource,
    readiness: &Readiness,
    ops: &Operations,
    timeout: std::time::Duration,
) -> FirstLoad {
    let dir = source.dir().to_path_buf();
    match read_config(source, ops, timeout, ConfigSource::load).await {
        Ok(Ok(loaded)) => {
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
        Ok(Err(e)) => {
            error!(error = %e, "configuration invalid; nothing is published until it is fixed");
            FirstLoad { problem: Some(e.to_string()), ..FirstLoad::default() }
        }
        Err(why) => {
            warn!(config_dir = %dir.display(), "{why}; nothing is published until it is read");
            FirstLoad { problem: Some(why), ..FirstLoad::default() }
        }
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

/// Runs `read` on the source as an operation on the config directory under `timeout`
/// (host::ops), off the runtime's workers: it stats and reads files, which block while their
/// filesystem does not answer. `Err` says why there is no answer this time: the read is still
/// running (its answer is kept for the next call) or the directory does not answer. The source
/// is handed to the operation and back; one that does not come back is replaced by a fresh
/// one, whose first look reads everything.
async fn read_config<T: Send + 'static>(
    source: &mut ConfigSource,
    ops: &Operations,
    timeout: std::time::Duration,
    read: fn(&mut ConfigSource) -> T,
) -> Result<T, String> {
    let dir = source.dir().to_path_buf();
    let mut owned = std::mem::replace(source, ConfigSource::new(&dir));
    let (ops, subject) = (ops.clone(), Subject::Config(dir.display().to_string()));
    let answer = tokio::task::spawn_blocking(move || {
        ops.run(subject, "config read", timeout, move |_on| {
            let result = read(&mut owned);
            (owned, result)
        })
    })
    .await
    .map_err(|e| format!("reading the config directory {} failed: {e}", dir.display()))?;
    match answer {
        Answer::Done((owned, result)) => {
            *source = owned;
            Ok(result)
        }
        Answer::Pending => {
            Err(format!("the config directory {} is still being read (its filesystem answers slowly)", dir.display()))
        }
        Answer::Unresponsive(e) => Err(e.to_string()),
    }
}

impl Agent {
    /// Tells on the Node, once per occurrence, what the operator must fix in the configuration
    /// the agent runs: the unknown keys it ignores (`ConfigUnknownKeys`), and at the first pass
    /// the problems met at start-up, before the API could be reached (`ConfigInvalid`; later
    /// ones are told as reloads meet them).
    pub(super) async fn tell_config_findings(&mut self) {
        if !std::mem::replace(&mut self.config_state.told_first_load, true)
            && let Some(problem) = &self.config_state.config_problem
        {
            let note = if self.has_config {
                format!("configuration partly refused at start-up: {problem}")
            } else {
                format!("configuration invalid at start-up; nothing is published until it is fixed: {problem}")
            };
            self.cluster.event(&node_reference(&self.node), true, "ConfigInvalid", "Load", note).await;
        }
        if self.config_state.config_warnings == self.config_state.told_warnings {
            return;
        }
        self.config_state.told_warnings = self.config_state.config_warnings.clone();
        if !self.config_state.config_warnings.is_empty() {
            let note = format!("configuration: {}", self.config_state.config_warnings.join("; "));
            self.cluster.event(&node_reference(&self.node), true, "ConfigUnknownKeys", "Load", note).await;
        }
    }

    /// Applies a changed config directory. New settings apply to new PVs; existing PVs are not
    /// changed. A class that became invalid keeps its last valid definition.
    pub(super) async fn reload_config(&mut self) {
        let loaded = match read_config(
            &mut self.config_state.source,
            &self.ops,
            self.host_timeout,
            ConfigSource::load_if_changed,
        )
        .await
        {
            Ok(read) => {
                if std::mem::take(&mut self.config_state.config_unread) {
                    info!(config_dir = %self.config_state.source.dir().display(), "the config directory answers again");
                    let detail = self
                        .config_state
                        .config_problem
                        .as_ref()
                        .filter(|_| self.has_config)
                        .map(|p| format!("config: {p}"));
                    self.readiness.set_detail(detail);
                    self.say_readiness();
                }
                match read {
                    Some(loaded) => loaded,
                    None => return,
                }
            }
            Err(why) => return self.config_unread(why),
        };
        match loaded {
            Ok(loaded) => {
                self.config_state.config_warnings.clone_from(&loaded.warnings);
                let eff = effective(&loaded, self.has_config.then_some(&self.config));
                let changed = !self.has_config || eff.config != self.config;
                if changed {
                    log_findings(self.config_state.source.dir(), &loaded, &eff);
                    if self.has_config {
                        let classes = eff.config.storage_class_map.len();
                        info!(classes, "configuration reloaded");
                        let note = format!("configuration reloaded: {classes} classes");
                        self.cluster.event(&node_reference(&self.node), false, "ConfigReloaded", "Reload", note).await;
                    }
                    self.identity = super::node::identity_for(&self.node_info, eff.config.use_node_name_only);
                    self.config = eff.config.clone();
                    self.has_config = true;
                    self.config_state.left_out_classes = eff.left_out_problems();
                }
                match failure_summary(&eff) {
                    Some(problem) => {
                        if self.config_state.config_problem.as_deref() != Some(problem.as_str()) {
                            // A change applied has had its failures logged with its findings.
                            if !changed {
                                for line in eff.describe_failures() {
                                    error!(config_dir = %self.config_state.source.dir().display(), "{line}");
                                }
                            }
                            let note = format!("configuration change partly refused: {problem}");
                            self.cluster
                                .event(&node_reference(&self.node), true, "ConfigInvalid", "Reload", note)
                                .await;
                            self.config_state.config_problem = Some(problem.clone());
                        }
                        self.readiness.set_detail(Some(format!("config: {problem}")));
                        self.metrics.set_config_valid(false);
                    }
                    None => {
                        if self.config_state.config_problem.take().is_some() {
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
                if self.config_state.config_problem.as_deref() != Some(problem.as_str()) {
                    error!(error = %problem, "configuration change refused; the last valid configuration stays in use");
                    let note = format!("configuration change refused, last valid configuration kept: {problem}");
                    self.cluster.event(&node_reference(&self.node), true, "ConfigInvalid", "Reload", note).await;
                    self.config_state.config_problem = Some(problem.clone());
                }
                self.metrics.set_config_valid(false);
                if self.has_config {
                    self.readiness.set_detail(Some(format!("config: last change refused: {problem}")));
                }
                self.say_readiness();
            }
        }
    }

    /// The config directory gave no answer this pass (a read still running, or its filesystem
    /// not answering): the configuration in use stays, and readiness says so (not ready while
    /// there is none yet). Logged once per occurrence.
    fn config_unread(&mut self, why: String) {
        self.config_state.config_unread = true;
        if self.problems.first_seen(format!("config-read/{why}")) {
            warn!("{why}; the configuration in use stays until it is read");
        }
        if self.has_config {
            self.readiness.set_detail(Some(format!("config: not read, the last good one stays in use: {why}")));
        } else {
            self.readiness.set(Some(format!("no configuration read yet: {why}")));
        }
    }

    /// inotify on the config directory and every class's discovery directory; a directory
    /// that cannot be watched (missing, or not answering: its add runs under the executor's
    /// deadline, host::mounts::watch::DirWatcher) is reported once per occurrence and tried again on
    /// the next pass. Off the runtime's workers: it waits up to the executor's grace.
    pub(super) async fn watch_dirs(&mut self) {
        let Some(mut watcher) = self.watches.dir_watcher.take() else { return };
        let config_dir = self.config_state.source.dir().to_path_buf();
        let mut dirs: BTreeMap<PathBuf, Subject> = self
            .config
            .storage_class_map
            .values()
            .map(|c| (PathBuf::from(&c.mount_dir), Subject::Directory(c.mount_dir.clone())))
            .collect();
        dirs.insert(config_dir.clone(), Subject::Config(config_dir.display().to_string()));
        let _waiting = self.readiness.host_call();
        let Ok((watcher, problems)) = tokio::task::spawn_blocking(move || {
            let problems = watcher.watch_exactly(&dirs);
            (watcher, problems)
        })
        .await
        else {
            warn!("the directory watcher's task failed; changes are found by mount events and resync");
            return;
        };
        self.watches.dir_watcher = Some(watcher);
        for e in problems {
            if self.problems.first_seen(format!("watch/{e}")) {
                warn!(error = %e, "directory not watched (yet); changes there are found by mount events and resync");
            }
        }
    }

    /// What the agent lacks of inotify (host::mounts::inotify: instances or watches exhausted): in the
    /// metric every pass, and on the Node as a Warning once per onset and a Normal event when
    /// it healed (core::mounts::inotify::shortage_notice). The shared instance wakes a pass when it
    /// changes.
    pub(super) async fn say_watch_shortage(&mut self) {
        use crate::core::mounts::inotify::{EXHAUSTED_REASON, RESTORED_REASON, ShortageNotice, shortage_notice};
        let Some(inotify) = &self.watches.inotify else { return };
        let now = inotify.shortage();
        self.metrics.set_watch_degraded(now.instances, now.watches);
        let notice = shortage_notice(self.watches.told_shortage, now);
        self.watches.told_shortage = now;
        match notice {
            Some(ShortageNotice::Exhausted { note }) => {
                warn!(%note, "inotify exhausted");
                self.cluster.event(&node_reference(&self.node), true, EXHAUSTED_REASON, "Watch", note).await;
            }
            Some(ShortageNotice::Restored { note }) => {
                info!(%note, "inotify restored");
                self.cluster.event(&node_reference(&self.node), false, RESTORED_REASON, "Watch", note).await;
            }
            None => {}
        }
    }
}
