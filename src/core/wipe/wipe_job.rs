//! What a wipe is, as the wiper hands it to the host and the host reports back: the job (the
//! PV, where its volume is, its time limits), its progress, what it removed and why it did not
//! complete. Pure data, below both: host::access and host::wipe::run do the wipe, the wiper
//! (which re-exports these) schedules it and finishes the PV.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::core::config::settings::ClassConfig;
use crate::core::volumes::naming::ANN_IDENTITY_CONFIRMED;
use crate::core::wipe::cleanup::PvState;

/// Why a wipe did not complete.
#[derive(Debug, thiserror::Error)]
pub enum WipeError {
    /// The disk at the path is provably not the one that was published: never wipe it.
    #[error(
        "volume identity mismatch at {path}: {reason}. PV recorded {recorded:?}, found {found:?}; a different disk sits at this path and is not wiped. Put the PV's own disk back at this path to have it wiped"
    )]
    IdentityMismatch { path: PathBuf, recorded: String, found: String, reason: String },
    /// Nothing proves that the disk at the path is the one that was published (no stable
    /// device ID, or an identity recorded in the old format that cannot tell): not wiped until
    /// an operator confirms exactly the identity found.
    #[error(
        "volume identity unproven at {host_path}: {reason}. If the disk there is the one PV {pv} used (check on the node with `lsblk -o NAME,SERIAL,WWN,UUID,MOUNTPOINTS` and its files), allow the wipe with: kubectl annotate pv {pv} --overwrite {ANN_IDENTITY_CONFIRMED}='{found}' (recorded: {recorded:?})"
    )]
    IdentityUnproven { host_path: String, pv: String, recorded: String, found: String, reason: String },
    /// The PV cannot be mapped to a path this agent sees.
    #[error("{0}")]
    Unmapped(String),
    /// kubelet still has the volume mounted for a pod (its claim can be gone before the pod's
    /// containers are): wiping now would let what they still write reach the next tenant.
    /// Retried with the failure backoff until kubelet has unmounted it.
    #[error("{path} is still mounted for a pod at {by}; the wipe waits until kubelet has unmounted it")]
    InUse { path: PathBuf, by: PathBuf },
    /// The wipe itself failed (I/O error, tree changed, cancelled); retried soon.
    #[error("{0}")]
    Failed(String),
    /// An encrypted volume's key could not be destroyed (files still open, the kernel still
    /// has it, the store could not be written): nothing was removed; retried soon.
    #[error("{0}")]
    KeyNotDestroyed(String),
    /// The volume is in a state only an operator can fix (nested mount, not mounted,
    /// immutable file, wrong entry type, missing cleaner): retried rarely.
    #[error("{0}")]
    Refused(String),
    /// The wipe took longer than its size allows.
    #[error("wipe of {path} timed out after {after:?}")]
    TimedOut { path: PathBuf, after: Duration },
    /// The volume does not answer: an earlier wipe or operation on it is stuck in the kernel
    /// (host::ops). Retried once it answers again.
    #[error("{0}")]
    Unresponsive(String),
    /// The wipe succeeded but the PV could not be finished; it is retried (not wiped again
    /// while the wipe's record holds, see host::wipe::wipe_record).
    /// The API client's error (the wiper converts it), boxed: this module sits below the client.
    #[error("finishing PV after the wipe: {0}")]
    Api(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl WipeError {
    /// Refusals that will not go away by retrying soon: they wait for an operator.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            WipeError::IdentityMismatch { .. }
                | WipeError::IdentityUnproven { .. }
                | WipeError::Unmapped(_)
                | WipeError::Refused(_)
        )
    }
}

/// Where a PV's volume is, as this agent sees it, and how its class wants it wiped.
#[derive(Debug, Clone)]
pub struct WipeTarget {
    /// Path under the class's mountDir.
    pub path: PathBuf,
    /// The class settings (block method or command).
    pub class: ClassConfig,
}

/// A wipe for the host to do: the PV (its recorded identity, an operator's confirmation) and
/// where its volume is.
#[derive(Debug, Clone)]
pub struct WipeJob {
    /// The PV whose disk is wiped (for a wipe-first, a stand-in named after the PV to come).
    pub pv: PvState,
    /// Where the volume is and how its class wipes.
    pub target: WipeTarget,
    /// Time every wipe gets regardless of size.
    pub timeout_base: Duration,
    /// Slowest rate (bytes per second) a wipe is allowed.
    pub min_rate: u64,
    /// Whether a PV is finished after the wipe: the completed wipe is then recorded durably
    /// (host::wipe::wipe_record), so a retry after a failed finish does not wipe again.
    pub resumable: bool,
}

impl WipeJob {
    /// How long a wipe of `size` bytes may take.
    pub fn timeout_for(&self, size: u64) -> Duration {
        self.timeout_base + Duration::from_secs(size / self.min_rate.max(1))
    }
}

/// What a completed wipe removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wiped {
    /// "fs" or "block", for the metrics.
    pub mode: &'static str,
    /// Bytes freed (filesystem) or overwritten (block device).
    pub bytes: u64,
    /// Not wiped now: an earlier wipe of this PV completed, and its record still holds.
    pub resumed: bool,
    /// The identity the wipe proved on its own descriptor.
    pub identity: String,
    /// How (core::wipe::wipe_history::LastWipe::method).
    pub method: String,
    /// When the wipe completed (RFC 3339; empty: not known, an old record resumed).
    pub at: String,
    /// An encrypted volume's key, destroyed before its files were removed (core::volumes::encryption).
    pub key_erased: Option<crate::core::wipe::wipe_history::KeyErased>,
}

/// A wipe's progress, shared with the host side: the size once known, and bytes done.
#[derive(Debug, Default)]
pub struct Progress {
    /// Bytes done so far (block wipes).
    pub done: AtomicU64,
    /// Bytes the wipe writes in all (the size once per pass of a multi-pass method), 0 until
    /// the check found the size: progress and the timeout scale with it.
    pub total: AtomicU64,
    /// The volume's size, 0 until the check found it: the metrics' `capacity`.
    pub size: AtomicU64,
    /// Grows as a filesystem wipe removes entries: a wipe whose counters stand still for
    /// [`WIPE_STALL`] is unresponsive (host::ops).
    pub beats: AtomicU64,
}

/// How long a wipe may show no progress before its volume counts as unresponsive: it then
/// gives its slot back, so other wipes go on (it keeps running until its size-scaled timeout).
pub const WIPE_STALL: Duration = Duration::from_secs(60);
