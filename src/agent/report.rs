//! Problems reported once per occurrence (core::reconcile::occurrence): logged and evented when a pass
//! first sees them, forgotten when a pass no longer does, so one that comes back is reported
//! again and memory holds only the problems of now.

use std::collections::BTreeMap;

use tracing::{debug, info, warn};

use super::Agent;
use crate::api::{class_reference, node_reference, pv_reference};
use crate::core::devices::device_claim::{LinkAction, Refusal, Verdict, link_name};
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::naming::pv_name;
use crate::host::devices::claims::ClaimReport;
use crate::host::volumes::discovery::{Scan, SkipReason};

impl Agent {
    /// Logs each skipped entry once per occurrence; refusals (skips that protect data, and
    /// set-ups an operator must fix: an unreadable directory, a bad namePattern, an entry of the
    /// wrong kind) are also Warning events. A held device is only logged at debug level here:
    /// the claim report tells it (`DeviceHeld`), once.
    pub(super) async fn report_skips(&mut self, scan: &Scan) {
        for s in &scan.skipped {
            if let SkipReason::DeviceHeld(_) = s.reason {
                debug!(class = %s.class, path = %s.path.display(), "entry held back: {}", s.reason);
                continue;
            }
            let key = format!("skip/{}/{}/{}", s.class, s.path.display(), s.reason);
            if !self.problems.first_seen(key) {
                continue;
            }
            if s.reason.is_evented() {
                warn!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry refused: {}", s.reason);
                let note = format!("{} (class {}) not published: {}", s.path.display(), s.class, s.reason);
                // The PV the entry would have become (or the class, for a refused directory)
                // keeps each refusal its own Event.
                let related = match s.path.file_name().and_then(|n| n.to_str()) {
                    Some(entry) if !s.reason.is_class_wide() => {
                        self.pv_ref(&pv_name(entry, &self.identity.node, &s.class))
                    }
                    _ => class_reference(&s.class),
                };
                self.node_event(Some(related), "VolumeNotPublished", "Discover", note).await;
            } else {
                info!(class = %s.class, path = %s.path.display(), reason = s.reason.code(), "entry skipped: {}", s.reason);
            }
        }
    }

    /// A volume not published as PV `pv`, once per occurrence of `key`: a Warning event on
    /// the Node, related to the PV it would have been. Returns whether it was new (the caller
    /// logs it then, unless a failed effect's own log already said it).
    pub(super) async fn report_unpublished(&mut self, key: String, pv: &str, note: String) -> bool {
        let new = self.problems.first_seen(key);
        if new {
            self.node_event(Some(self.pv_ref(pv)), "VolumeNotPublished", "Publish", note).await;
        }
        new
    }

    /// What the device claim pass did: a Normal event for each device linked, a Warning once
    /// per occurrence for each device a class selects but refuses and for each held link, and
    /// the claim metrics. A failed link change is an effect with its own retry deadline.
    pub(super) async fn report_claims(&mut self, report: Option<&ClaimReport>) {
        let Some(report) = report else {
            self.metrics.set_device_claims(&BTreeMap::new(), &BTreeMap::new());
            return;
        };
        if let Some(e) = &report.failed {
            self.metrics.set_device_claims(&BTreeMap::new(), &BTreeMap::new());
            self.effects.due(&EffectKey::Claims);
            self.effects.record(&EffectKey::Claims, &Err::<(), _>(e.clone()));
            self.report_node_problem("DeviceClaimFailed", format!("device claims not settled: {e}")).await;
            return;
        }
        let running = report.full_reads.running.as_ref().map(|r| (r.name.as_str(), r.disk.as_str(), r.done, r.total));
        self.metrics.set_full_reads(running, &report.full_reads.results);
        let node = node_reference(&self.node);
        for (action, result) in &report.applied {
            let (verb, r) = match action {
                LinkAction::Create(r) => ("link", r),
                LinkAction::Relink(r) => ("link again", r),
                LinkAction::Retarget(r) => ("re-point", r),
                LinkAction::Remove(r) => ("remove", r),
                LinkAction::Forget(r) => ("forget", r),
                LinkAction::Release(r) => ("release the hold of", r),
            };
            let key = EffectKey::ClaimLink(verb, r.class.clone(), r.name.clone());
            self.effects.due(&key);
            self.effects.record(&key, result);
            match result {
                Ok(()) => {
                    info!(class = %r.class, link = %r.name, target = %r.target, disk = %r.disk, "device claim: {verb}");
                    if let LinkAction::Create(_) = action {
                        self.metrics.device_claimed(&r.class);
                        let note =
                            format!("linked {} (disk {}) into class {} as {}", r.target, r.disk, r.class, r.host_path);
                        // Each device its own series: related to the PV its link becomes.
                        let related = self.pv_ref(&pv_name(&r.name, &self.identity.node, &r.class));
                        self.cluster.event_related(&node, Some(related), false, "DeviceClaimed", "Claim", note).await;
                    }
                }
                Err(e) => {
                    let note = format!("could not {verb} the link {} of class {}: {e}", r.host_path, r.class);
                    self.report_node_problem("DeviceClaimFailed", note).await;
                }
            }
        }
        let mut refused: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
        for d in &report.plan.decisions {
            let Verdict::Refused(reason) = &d.verdict else { continue };
            if matches!(reason, Refusal::NotProbed) {
                continue;
            }
            *refused.entry((d.class.clone(), reason.code())).or_default() += 1;
            // A writer may stop at any time, and nothing announces it (an unmount is a mount
            // table event): looked at again on a retry deadline, so the device is claimed
            // without waiting for the resync.
            if let Refusal::Writer(why) = reason {
                self.effects.wait_out(&EffectKey::ClaimInUse(d.class.clone(), d.device.clone()), why);
            }
            let note = format!("/dev/{} not claimed for class {}: {reason}", d.device, d.class);
            if self.problems.first_seen(format!("claim/refused/{}/{}/{reason}", d.class, d.device)) {
                let warning = reason.needs_operator();
                if warning {
                    warn!(class = %d.class, device = %d.device, reason = reason.code(), "device refused: {reason}");
                } else {
                    info!(class = %d.class, device = %d.device, reason = reason.code(), "device refused: {reason}");
                }
                // Each device its own series: related to the PV it would have become.
                let stable_id = report.devices.iter().find(|f| f.name == d.device).and_then(|f| f.stable_id.as_deref());
                let related = match stable_id {
                    Some(id) => self.pv_ref(&pv_name(&link_name(id), &self.identity.node, &d.class)),
                    None => class_reference(&d.class),
                };
                self.cluster.event_related(&node, Some(related), warning, "DeviceRefused", "Claim", note).await;
            }
        }
        for (class, name, what) in &report.plan.held {
            // Held until an operator clears the device: re-checked on a retry deadline, so the
            // clean device is published without waiting for the resync.
            self.effects.wait_out(&EffectKey::ClaimHeld(class.clone(), name.clone()), what);
            let note = format!(
                "the device linked as {name} in class {class} has no PV and is not offered again: {what} (not put there by this agent, or a doubt it cannot settle); clear it (blkdiscard -z) or remove the link"
            );
            // One occurrence while the link stays held, whatever each look finds on the device
            // (probed or not, what is on it now): one WARN and one event, then debug lines.
            if self.problems.first_seen(format!("claim/held/{class}/{name}")) {
                warn!(class = %class, link = %name, "device held: {what}");
                let related = self.pv_ref(&pv_name(name, &self.identity.node, class));
                self.node_event(Some(related), "DeviceHeld", "Claim", note).await;
            } else {
                debug!(class = %class, link = %name, "device still held: {what}");
            }
        }
        for (class, name, why) in &report.plan.kept {
            if self.problems.first_seen(format!("claim/kept/{class}/{name}")) {
                info!(class = %class, link = %name, "device link kept: {why}");
            }
        }
        let mut kept: BTreeMap<String, i64> = self
            .config
            .storage_class_map
            .iter()
            .filter(|(_, c)| c.devices.is_some())
            .map(|(class, _)| (class.clone(), 0))
            .collect();
        for r in &report.records {
            *kept.entry(r.class.clone()).or_default() += 1;
        }
        self.metrics.set_device_claims(&kept, &refused);
    }

    /// A problem of PV `name`, once per occurrence: Warning event on the PV.
    pub(super) async fn report_pv_problem(&mut self, name: &str, reason: &str, note: String) {
        if self.problems.first_seen(format!("pv/{name}/{reason}/{note}")) {
            warn!(pv = name, "{note}");
            self.cluster.event(&self.pv_ref(name), true, reason, "Clean", note).await;
        }
    }

    /// A problem of this node's agent, once per occurrence: Warning event on the Node.
    pub(super) async fn report_node_problem(&mut self, reason: &str, note: String) {
        if self.problems.first_seen(format!("node/{reason}/{note}")) {
            warn!("{note}");
            self.cluster.event(&node_reference(&self.node), true, reason, "Discover", note).await;
        }
    }

    /// The reference of PV `name` for an Event, with the UID of the PV the store holds under
    /// that name (none when it does not exist: an entry not published).
    pub(super) fn pv_ref(&self, name: &str) -> k8s_openapi::api::core::v1::ObjectReference {
        let pv = self.pv_store.get(&kube::runtime::reflector::ObjectRef::new(name));
        pv_reference(name, pv.as_ref().and_then(|pv| pv.metadata.uid.as_deref()))
    }

    /// A Warning event on this Node, related to `related`.
    pub(super) async fn node_event(
        &self,
        related: Option<k8s_openapi::api::core::v1::ObjectReference>,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.cluster.event_related(&node_reference(&self.node), related, true, reason, action, note).await;
    }
}
