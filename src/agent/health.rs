//! Failing and wedged disks (core::health::disk_health): the signs the scan read and the volumes that
//! do not answer (host::ops) are judged per volume; a new volume on a failing disk is not
//! published, an unbound PV on one is withdrawn, and every other PV on one is annotated and
//! its claim's owner told, until the signs clear.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use tracing::{info, warn};

use super::Agent;
use crate::api::{AnnotationPatch, claim_reference, pv_reference};
use crate::core::health::disk_health::Signs;
use crate::core::health::disk_health::{Failing, HealthAction, annotation_value, plan_health};
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::naming::ANN_DISK_FAILING;
use crate::core::wipe::cleanup::PvState;
use crate::host::ops::{Stall, Subject};
use crate::host::volumes::discovery::{Scan, SkipReason, Skipped};

impl Agent {
    /// The failing signs of every volume examined this pass, by host path, with the volumes
    /// that do not answer, judged against this node's PVs (`states`: their capacities), and
    /// the volumes grown past their PV's capacity, to tell. Reports the stalls (metrics,
    /// readiness) on the way.
    pub(super) fn judge_disks(&mut self, signs: &[(String, Signs)], states: &[PvState]) -> Judged {
        let stalls = self.ops.stalls();
        let now = Instant::now();
        let capacity = |path: &str| states.iter().find(|s| s.host_path == path && !s.deleting)?.capacity_bytes;
        let mut failing: BTreeMap<String, Vec<Failing>> = BTreeMap::new();
        let mut growths = Vec::new();
        let mut kernel_log = self.kernel_log.lock().unwrap_or_else(|e| e.into_inner());
        for (path, s) in signs {
            let mut found = self.health.judge_volume(path, s, capacity(path), now);
            let since = self.health.seen_since(path, &s.instance, now);
            found.extend(kernel_log.failing(&s.devices, since, now));
            if !found.is_empty() {
                failing.insert(path.clone(), found);
            }
            if let Some((was, now)) = self.health.growth(path, capacity(path), s.size.as_ref()) {
                growths.push(Growth { path: path.clone(), was, now });
            }
        }
        drop(kernel_log);
        // A PV's disk whose look is still running keeps what was learnt of it (its I/O error
        // baseline, a held failure): a pass that did not look is not a recovery.
        let seen: BTreeSet<&str> =
            signs.iter().map(|(p, _)| p.as_str()).chain(states.iter().map(|s| s.host_path.as_str())).collect();
        self.health.retain(|key| seen.contains(key));
        for stall in &stalls {
            if let Subject::Volume(path) = &stall.subject {
                let what = format!("its {} did not answer within its deadline", stall.op);
                failing.entry(path.clone()).or_default().push(Failing::Unresponsive(what));
            }
        }
        self.report_stalls(&stalls);
        let looked = signs.iter().map(|(p, _)| p.clone()).chain(failing.keys().cloned()).collect();
        Judged { failing, looked, growths }
    }

    /// Tells each grown volume's PV and claim once per size (a Normal event `VolumeGrown`): the
    /// PV's capacity is not changed (a Bound PV's is the claim's; an unbound one never offers
    /// more than it did), and a new PV of the volume would offer the new size.
    pub(super) async fn tell_growths(&self, states: &[PvState], growths: &[Growth]) {
        use crate::core::volumes::capacity::iec;
        for g in growths {
            let Some(pv) = states.iter().find(|s| s.host_path == g.path) else { continue };
            let note = format!(
                "the volume of PV {} at {} grew to {} (the PV offers {}); the PV's capacity is not changed",
                pv.name,
                g.path,
                iec(g.now),
                iec(g.was)
            );
            info!(pv = %pv.name, "{note}");
            self.tell(pv, false, "VolumeGrown", note).await;
        }
    }

    /// Names the subjects that do not answer in the metrics and in /readyz, with the threads
    /// they hold (and whether those reached their cap: new volumes are then not looked at).
    pub(super) fn report_stalls(&self, stalls: &[Stall]) {
        let named: Vec<(String, String)> = stalls.iter().map(|s| (stall_path(&s.subject), s.op.to_string())).collect();
        self.metrics.set_unresponsive(&named, self.ops.stuck());
        let held = self.ops.held();
        self.metrics.set_wedged(held.threads, held.cap_reached());
        let mut text: Vec<String> =
            stalls.iter().map(|s| format!("{} ({}, {}s)", stall_path(&s.subject), s.op, s.for_.as_secs())).collect();
        if held.cap_reached() {
            let cap = format!(
                "{} host-operation threads held by disks that do not answer, at their cap: volumes not seen answering \
                 before are not looked at until some return",
                held.threads
            );
            text.insert(0, cap);
        }
        self.readiness.set_unresponsive((!text.is_empty()).then(|| text.join(", ")));
    }

    /// Takes the volumes on a failing disk out of the volumes found: none is published (or
    /// offered again) while its disk fails. Volumes that only do not answer were skipped by the
    /// scan already.
    pub(super) fn keep_failing_back(&self, scan: &mut Scan, failing: &BTreeMap<String, Vec<Failing>>) {
        let is_failing =
            |path: &str| failing.get(path).filter(|f| f.iter().any(|f| !matches!(f, Failing::Unresponsive(_))));
        let (held, kept): (Vec<_>, Vec<_>) =
            std::mem::take(&mut scan.volumes).into_iter().partition(|v| is_failing(&v.host_path).is_some());
        scan.volumes = kept;
        for v in held {
            let why = is_failing(&v.host_path).map(|f| annotation_value(f)).unwrap_or_default();
            let dir = self.config.storage_class_map.get(&v.class).map(|c| c.mount_dir.clone()).unwrap_or_default();
            scan.skipped.push(Skipped {
                class: v.class.clone(),
                path: std::path::Path::new(&dir).join(&v.entry),
                reason: SkipReason::DiskFailing(why),
            });
        }
    }

    /// Annotates, withdraws and unflags this node's PVs as their disks' signs say
    /// (core::health::disk_health::plan_health), telling the PV and its claim.
    pub(super) async fn follow_health(&mut self, states: &[PvState], judged: &Judged) {
        let failing = &judged.failing;
        let mut labels = Vec::new();
        for (path, reasons) in failing {
            let pv = states.iter().find(|s| s.host_path == *path).map(|s| s.name.clone()).unwrap_or_default();
            labels.extend(reasons.iter().map(|r| (path.clone(), pv.clone(), r.code().to_string())));
        }
        self.metrics.set_failing(&labels);
        for action in plan_health(states, failing, &judged.looked) {
            match action {
                HealthAction::Withdraw { name, uid, resource_version, why } => {
                    let key = EffectKey::WithdrawFailing(name.clone());
                    let deleted = self.cluster.delete_pv(&name, &uid, Some(&resource_version));
                    if let Some(Ok(())) = self.effects.run(&key, deleted).await {
                        self.note_withdrawn(&uid).await;
                        let note = format!(
                            "the disk of unbound PV {name} is failing ({why}); the PV is withdrawn so no claim gets \
                             it, and its volume is published again once the disk is healthy"
                        );
                        warn!(pv = %name, "{note}");
                        let pv = pv_reference(&name, Some(&uid));
                        self.cluster.event(&pv, true, "VolumeWithdrawn", "Monitor", note).await;
                    }
                }
                HealthAction::Flag { name, value } => {
                    let Some(pv) = states.iter().find(|s| s.name == name) else { continue };
                    let patch = AnnotationPatch::new().set(ANN_DISK_FAILING, value.clone());
                    let patched = self.cluster.patch_annotations(&name, None, &patch);
                    if let Some(Ok(())) = self.effects.run(&EffectKey::FlagFailing(name.clone()), patched).await {
                        let note = format!(
                            "the disk of PV {name} at {} on node {} is failing or does not answer: {value}. Its data may \
                             be at risk: back it up or move the workload (see the agent's docs/troubleshooting.md)",
                            pv.host_path, self.identity.node
                        );
                        warn!(pv = %name, "{note}");
                        self.tell(pv, true, "DiskFailing", note).await;
                    }
                }
                HealthAction::Unflag { name } => {
                    let Some(pv) = states.iter().find(|s| s.name == name) else { continue };
                    let patch = AnnotationPatch::new().remove(ANN_DISK_FAILING);
                    let patched = self.cluster.patch_annotations(&name, None, &patch);
                    if let Some(Ok(())) = self.effects.run(&EffectKey::UnflagFailing(name.clone()), patched).await {
                        let note = format!(
                            "the disk of PV {name} at {} answers and shows no sign of failing again",
                            pv.host_path
                        );
                        info!(pv = %name, "{note}");
                        self.tell(pv, false, "DiskRecovered", note).await;
                    }
                }
            }
        }
    }

    /// An event on the PV and on its bound claim, so `kubectl describe pvc` shows it to the
    /// application's owner.
    async fn tell(&self, pv: &PvState, warning: bool, reason: &str, note: String) {
        self.tell_as(pv, warning, reason, "Monitor", note).await;
    }

    /// As `tell`, with the event's action.
    pub(super) async fn tell_as(&self, pv: &PvState, warning: bool, reason: &str, action: &str, note: String) {
        let pv_ref = pv_reference(&pv.name, Some(&pv.uid));
        self.cluster.event(&pv_ref, warning, reason, action, note.clone()).await;
        if let Some((namespace, name, uid)) = &pv.claim {
            let claim = claim_reference(namespace, name, uid);
            self.cluster.event_related(&claim, Some(pv_ref), warning, reason, action, note).await;
        }
    }
}

/// What a pass learnt of its volumes' disks (see `Agent::judge_disks`).
pub(super) struct Judged {
    /// The failing signs by host path (those that do not answer among them).
    pub(super) failing: BTreeMap<String, Vec<Failing>>,
    /// The host paths whose disks this pass looked at: signs read, or a look that did not answer.
    pub(super) looked: BTreeSet<String>,
    /// The volumes grown past their PV's capacity.
    pub(super) growths: Vec<Growth>,
}

/// A volume grown past its PV's capacity (core::health::disk_health::grown), in bytes.
pub(super) struct Growth {
    path: String,
    was: u64,
    now: u64,
}

/// How a stalled subject is named in metrics and readiness.
fn stall_path(subject: &Subject) -> String {
    match subject {
        Subject::Volume(p) | Subject::Directory(p) | Subject::Config(p) => p.clone(),
        Subject::Device(d) => format!("/dev/{d}"),
        Subject::Host(what) => what.to_string(),
    }
}
