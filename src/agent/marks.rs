//! Used marks (core::identity::used_mark): written on a disk before its PV is created, completed with the
//! PV's UID and claim, and the ledger told about PVs let go unclaimed. The host work runs in
//! one blocking call per batch; a failed mark is retried with backoff like any effect.

use tracing::{debug, warn};

use super::Agent;
use crate::core::identity::used_mark::{Replace, UsedMark, UsedRead};
use crate::core::reconcile::effect_key::EffectKey;
use crate::core::volumes::planner::DesiredPv;
use crate::core::wipe::cleanup::PvState;
use crate::host::access::MarkJob;
use crate::host::identity::used_mark::{Accept, Carrier, MarkOutcome};
use crate::host::ops::{Job, Subject};
use crate::wiper::{target_at, target_for};

impl Agent {
    /// Writes the used mark on every disk about to be published, before its PV is created (see
    /// core::identity::used_mark), proving on the descriptor written through that it is the disk found.
    /// Returns the volumes whose disks are marked now; the others are retried with backoff.
    pub(super) async fn mark_before_create<'d>(&mut self, creates: Vec<&'d DesiredPv>) -> Vec<&'d DesiredPv> {
        if creates.is_empty() {
            return creates;
        }
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut pvs = Vec::new();
        let mut jobs = Vec::new();
        for d in creates {
            let Ok(target) = target_at(&d.host_path, &d.class, self.config.storage_class_map.get(&d.class)) else {
                continue;
            };
            let mark = UsedMark {
                pv: d.name.clone(),
                node: self.identity.node.clone(),
                path: d.host_path.clone(),
                identity: d.identity.clone(),
                at: now.clone(),
                uid: None,
                root: None,
                claimed: false,
                wiped_filesystems: Vec::new(),
            };
            // The mark discovery judged (gone PV, offered only, or a create that never
            // happened) may be replaced; any other found on the disk now stops the create.
            let judged = match &d.used {
                UsedRead::Marked(m) | UsedRead::Offered(m) => Some(m.clone()),
                _ => None,
            };
            jobs.push(MarkJob {
                path: target.path,
                recorded: mark.identity.clone(),
                confirmed: None,
                accept: Accept::Proven,
                mark,
                replace: Replace::BeforeCreate { judged },
            });
            pvs.push(d);
        }
        let marks: Vec<UsedMark> = jobs.iter().map(|j| j.mark.clone()).collect();
        let outcomes = match self.write_marks(jobs).await {
            Some(Ok(outcomes)) => outcomes,
            Some(Err(e)) => {
                warn!(error = %e, "cannot read the mount table to mark new volumes; nothing is published this pass");
                for m in &marks {
                    self.effects.record::<(), _>(&EffectKey::Create(m.pv.clone()), &Err(e.to_string()));
                }
                return Vec::new();
            }
            None => return Vec::new(),
        };
        let mut ready = Vec::new();
        for ((pv, mark), outcome) in pvs.into_iter().zip(marks).zip(outcomes) {
            let key = EffectKey::Create(mark.pv.clone());
            let not_yet = match outcome {
                Ok(MarkOutcome::Written(_, carrier)) => {
                    self.report_node_local(&mark, &carrier).await;
                    ready.push(pv);
                    continue;
                }
                Ok(MarkOutcome::NotTheDisk(why)) => {
                    debug!(pv = %mark.pv, path = %mark.path, "the volume changed since discovery ({why}); not published yet");
                    format!("the volume changed since discovery ({why})")
                }
                Ok(MarkOutcome::DiskFailing(why)) => {
                    // Held as the sign io-failure: the next passes keep the volume back as
                    // disk-failing (core::health::disk_health), never "created, then withdrawn".
                    warn!(pv = %mark.pv, path = %mark.path, "not published: its disk failed the used mark's write ({why})");
                    self.health.witness(&mark.path, &why, std::time::Instant::now());
                    format!("its disk is failing: {why}")
                }
                Ok(MarkOutcome::Kept(there)) => {
                    let other = there.map(|m| m.pv).unwrap_or_default();
                    warn!(pv = %mark.pv, path = %mark.path, other = %other, "the disk carries another PV's used mark since discovery read it; not published this pass");
                    format!("the disk carries the used mark of PV {other}")
                }
                Err(e) => {
                    let note = format!(
                        "volume at {} not published as {}: its used mark cannot be written ({e})",
                        mark.path, mark.pv
                    );
                    self.report_unpublished(format!("mark-failed/{}/{e}", mark.path), &mark.pv, note).await;
                    format!("its used mark cannot be written: {e}")
                }
            };
            // Looked at again at the retry deadline, not at the next unrelated event.
            self.effects.record::<(), _>(&key, &Err(not_yet));
        }
        ready
    }

    /// Keeps the used mark on the disks of this node's PVs: completes it with the PV's UID once
    /// the PV exists (the mark written before the create could not know it), and puts it on
    /// PVs made by upstream or older versions once a claim uses them. The disk is proven to be
    /// the PV's recorded one on the descriptor written through; PVs whose mark is complete are
    /// not read again by this process.
    pub(super) async fn ensure_marks(&mut self, states: &[PvState], missing: &std::collections::BTreeSet<String>) {
        let live: std::collections::HashSet<&str> = states.iter().map(|s| s.uid.as_str()).collect();
        self.marks.marked.retain(|uid, _| live.contains(uid.as_str()));
        let busy = self.cleaner.busy(states);
        let candidates: Vec<&PvState> = states
            .iter()
            .filter(|pv| !pv.deleting && !missing.contains(&pv.uid) && !busy.pvs.contains(&pv.uid))
            .filter(|pv| match self.marks.marked.get(&pv.uid) {
                Some(claimed) => !claimed && pv.used_by_a_claim(),
                None => true,
            })
            .collect();
        // After a restart every PV's mark is checked once: in batches, like publishing.
        for batch in candidates.chunks(super::publish::PUBLISH_BATCH) {
            self.mark_pvs(batch.iter().map(|pv| (*pv).clone()).collect()).await;
        }
    }

    /// The work of [`Self::ensure_marks`] for the given PVs (also called right after creates, so
    /// the UID is on the disk at once rather than on the next pass).
    pub(super) async fn mark_pvs(&mut self, candidates: Vec<PvState>) {
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut pvs = Vec::new();
        let mut jobs = Vec::new();
        for pv in candidates {
            let Ok(target) = target_for(&pv, self.config.storage_class_map.get(&pv.class)) else { continue };
            let used = pv.used_by_a_claim();
            // A used PV's disk is marked even when its identity proves nothing (an old-format or
            // missing record): kubelet mounts whatever is at the path, so that holds the data.
            let (recorded, accept) = match (&pv.identity, used) {
                (Some(id), false) => (id.clone(), Accept::Proven),
                (Some(id), true) => (id.clone(), Accept::Plausible),
                (None, true) => (String::new(), Accept::Anything),
                (None, false) => continue,
            };
            if !self.effects.due(&EffectKey::Mark(pv.uid.clone())) {
                continue;
            }
            let mark = UsedMark {
                pv: pv.name.clone(),
                node: self.identity.node.clone(),
                path: pv.host_path.clone(),
                identity: recorded.clone(),
                at: now.clone(),
                uid: Some(pv.uid.clone()),
                root: None,
                claimed: used,
                wiped_filesystems: Vec::new(),
            };
            jobs.push(MarkJob {
                path: target.path,
                recorded,
                confirmed: pv.identity_confirmed.clone(),
                accept,
                mark,
                replace: Replace::Keep { used },
            });
            pvs.push(pv);
        }
        if jobs.is_empty() {
            return;
        }
        let outcomes = match self.write_marks(jobs).await {
            Some(Ok(outcomes)) => outcomes,
            Some(Err(e)) => {
                for pv in &pvs {
                    self.effects.record::<(), _>(&EffectKey::Mark(pv.uid.clone()), &Err(format!("mount table: {e}")));
                }
                return;
            }
            None => return,
        };
        for (pv, outcome) in pvs.into_iter().zip(outcomes) {
            let key = EffectKey::Mark(pv.uid.clone());
            match &outcome {
                Ok(MarkOutcome::Written(m, carrier)) => {
                    debug!(pv = %pv.name, claimed = m.claimed, "used mark written");
                    self.report_node_local(m, carrier).await;
                    self.marks.marked.insert(pv.uid.clone(), m.claimed);
                }
                Ok(MarkOutcome::Kept(Some(m))) if m.pv == pv.name && m.uid.as_deref() == Some(pv.uid.as_str()) => {
                    self.marks.marked.insert(pv.uid.clone(), m.claimed);
                }
                Ok(MarkOutcome::NotTheDisk(why)) => {
                    debug!(pv = %pv.name, "not marking: the disk at its path is not proven to be its own ({why})")
                }
                Ok(MarkOutcome::DiskFailing(why)) => {
                    warn!(pv = %pv.name, "the used mark cannot be kept: its disk is failing ({why})");
                    self.health.witness(&pv.host_path, why, std::time::Instant::now());
                }
                Ok(MarkOutcome::Kept(_)) | Err(_) => {}
            }
            let outcome = match outcome {
                Ok(MarkOutcome::DiskFailing(why)) => Err(format!("its disk is failing: {why}")),
                other => other,
            };
            self.effects.record(&key, &outcome.map_err(|e| format!("keeping the used mark of PV {}: {e}", pv.name)));
        }
    }

    /// A volume whose filesystem cannot carry its used mark (vfat, exFAT, NFS, a read-only
    /// mount) is protected by this node's ledger only: a Warning event on the Node, related to
    /// the PV, the first time its mark is written so (not again for its UID or claim, nor
    /// after a restart, which writes nothing new).
    async fn report_node_local(&self, mark: &UsedMark, carrier: &Carrier) {
        let Carrier::LedgerOnly { why, first: true } = carrier else { return };
        warn!(pv = %mark.pv, path = %mark.path, "the used mark is kept in this node's ledger only: {why}");
        let note = format!(
            "The used mark of the volume at {} (PV {}) is kept in this node's ledger only: {why}. It does not \
             travel with the disk: here it is wiped before it is offered again as usual, but moved to another \
             node (or with this node's state directory lost) it is not known as used there and can be published \
             with its data. Use a filesystem that holds trusted.* extended attributes (ext4, XFS, btrfs) to have \
             the mark travel.",
            mark.path, mark.pv
        );
        self.node_event(Some(self.pv_ref(&mark.pv)), "UsedMarkNodeLocal", "Publish", note).await;
    }

    /// Writes the used marks, each on the pool of per-volume operations under the host
    /// operation deadline (a frozen filesystem blocks a write: that volume is unresponsive and
    /// the others go on), then records those written in the ledger in one durable write. One
    /// outcome per job, in order; `Err` when the mount table cannot be read.
    async fn write_marks(&self, jobs: Vec<MarkJob>) -> Option<Result<Vec<Result<MarkOutcome, String>>, String>> {
        let (ops, timeout, shared) = (self.ops.clone(), self.host_timeout, self.host.clone());
        self.on_host(move |host| {
            let mounts = host.mount_table().map_err(|e| e.to_string())?;
            let jobs = jobs
                .into_iter()
                .map(|job| {
                    let (host, mounts) = (shared.clone(), mounts.clone());
                    let m = &job.mark;
                    let tag = format!("{}|{}|{:?}|{}", m.pv, m.identity, m.uid, m.claimed);
                    let subject = Subject::Volume(m.path.clone());
                    let domain = mounts.domain_of(&job.path);
                    Job::effect(subject, "used mark write", timeout, move |on| host.mark_one(&job, &mounts, on))
                        .tagged(tag)
                        .on(domain)
                })
                .collect();
            let mut outcomes: Vec<Result<MarkOutcome, String>> = ops
                .run_all(jobs)
                .into_iter()
                .map(|r| {
                    r.or_error(
                        "its used mark is still being written (a slow disk); looked at again when the write ends",
                    )
                })
                .collect();
            host.record_marks(&mut outcomes);
            Ok(outcomes)
        })
        .await
    }

    /// Records in the ledger that this PV was let go while no claim was on it (a precondition
    /// or the PV's own state proved it): its disk's mark then counts as offered, not used, and
    /// the disk is published again without a wipe. A failure only costs that wipe. Until the
    /// store shows the PV being deleted, it is taken as such (core::reconcile::expectations).
    pub(super) async fn note_withdrawn(&mut self, uid: &str) {
        self.expectations.deleted(uid, std::time::Instant::now());
        let uids = vec![uid.to_string()];
        if let Some(Err(e)) = self.on_host(move |host| host.record_withdrawn(&uids)).await {
            warn!(uid, error = %e, "cannot record an unclaimed withdrawal; its disk is wiped before it returns");
        }
    }
}
