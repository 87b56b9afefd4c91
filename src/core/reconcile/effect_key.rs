//! The keys of the agent's and the wiper's retry records (runtime::effects): one variant per
//! kind of effect, naming the object it is about. Typed, so the places that plan, carry out and
//! check an effect cannot disagree on how its key is spelt; `Display` gives the old
//! `kind/object` text for logs.

use std::fmt;

/// What an effect (an API write, a used mark, a wipe, a condition waited out) is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EffectKey {
    /// Create the PV of this name.
    Create(String),
    /// Retry a PV name another PV held (a 409 from a foreign PV).
    Collision(String),
    /// The start-up adoption of the PVs upstream made.
    Adopt,
    /// Adopt (label) this upstream PV.
    AdoptPv(String),
    /// Read the node's PVs and disks for the cleanup planner.
    Observe,
    /// Withdraw (delete) this unbound PV.
    Withdraw(String),
    /// Release this PV to its claim's reclaim policy.
    Release(String),
    /// Answer this PV's cleanup request.
    Answer(String),
    /// Upgrade this PV's recorded identity to the current format.
    Upgrade(String),
    /// Remove our finalizer from this PV.
    Finalizer(String),
    /// Withdraw this unbound PV on a failing disk.
    WithdrawFailing(String),
    /// Flag this PV's disk as failing.
    FlagFailing(String),
    /// Remove the failing flag from this PV.
    UnflagFailing(String),
    /// Flag this PV's volume as missing.
    FlagMissing(String),
    /// Remove the missing flag from this PV.
    Unflag(String),
    /// Withdraw this PV whose disk was changed under it.
    WithdrawTampered(String),
    /// Re-adopt this PV a predecessor agent made.
    Readopt(String),
    /// Flag this PV's volume as moved.
    FlagMoved(String),
    /// Flag this PV as stale.
    FlagStale(String),
    /// Write the used mark of the PV of this UID.
    Mark(String),
    /// Change the Node's fence labels (the changes, joined).
    Fences(String),
    /// Remove the start-up taint (core::fence::startup_taint) from the Node.
    StartupTaint,
    /// Carry out the device claims.
    Claims,
    /// Change one claim link (verb, class, link name).
    ClaimLink(&'static str, String, String),
    /// Wait out a device in use (class, device).
    ClaimInUse(String, String),
    /// Wait out a held device (class, link name).
    ClaimHeld(String, String),
    /// Look again at the volume at this host path, held back by another PV that names its disk
    /// (on any node: its deletion is no event here) or by records that cannot be read.
    Held(String),
    /// Wipe the volume of the PV of this UID.
    Wipe(String),
    /// Wipe the used disk at this host path before it is published again.
    WipeFirst(String),
}

impl fmt::Display for EffectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use EffectKey::*;
        match self {
            Create(n) => write!(f, "create/{n}"),
            Collision(n) => write!(f, "collision/{n}"),
            Adopt => write!(f, "adopt"),
            AdoptPv(n) => write!(f, "adopt/{n}"),
            Observe => write!(f, "observe"),
            Withdraw(n) => write!(f, "withdraw/{n}"),
            Release(n) => write!(f, "release/{n}"),
            Answer(n) => write!(f, "answer/{n}"),
            Upgrade(n) => write!(f, "upgrade/{n}"),
            Finalizer(n) => write!(f, "finalizer/{n}"),
            WithdrawFailing(n) => write!(f, "withdraw-failing/{n}"),
            FlagFailing(n) => write!(f, "flag-failing/{n}"),
            UnflagFailing(n) => write!(f, "unflag-failing/{n}"),
            FlagMissing(n) => write!(f, "flag-missing/{n}"),
            Unflag(n) => write!(f, "unflag/{n}"),
            WithdrawTampered(n) => write!(f, "withdraw-tampered/{n}"),
            Readopt(n) => write!(f, "readopt/{n}"),
            FlagMoved(n) => write!(f, "flag-moved/{n}"),
            FlagStale(n) => write!(f, "flag-stale/{n}"),
            Mark(uid) => write!(f, "mark/{uid}"),
            Fences(c) => write!(f, "fences/{c}"),
            StartupTaint => write!(f, "startup-taint"),
            Claims => write!(f, "claims"),
            ClaimLink(verb, class, link) => write!(f, "claim/{verb}/{class}/{link}"),
            ClaimInUse(class, device) => write!(f, "claim/in-use/{class}/{device}"),
            ClaimHeld(class, link) => write!(f, "claim/held/{class}/{link}"),
            Held(path) => write!(f, "held/{path}"),
            Wipe(uid) => write!(f, "wipe/{uid}"),
            WipeFirst(path) => write!(f, "wipe-first/{path}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_different_kinds_or_objects_differ_and_read_as_kind_and_object() {
        let keys = [
            EffectKey::Create("a".into()),
            EffectKey::Create("b".into()),
            EffectKey::Withdraw("a".into()),
            EffectKey::Wipe("a".into()),
            EffectKey::WipeFirst("a".into()),
            EffectKey::ClaimHeld("c".into(), "a".into()),
            EffectKey::ClaimInUse("c".into(), "a".into()),
            EffectKey::Adopt,
        ];
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate() {
                assert_eq!(i == j, a == b, "{a} vs {b}");
                assert_eq!(i == j, a.to_string() == b.to_string(), "{a} vs {b}");
            }
        }
        assert_eq!(EffectKey::WipeFirst("/mnt/disks/x".into()).to_string(), "wipe-first//mnt/disks/x");
        assert_eq!(EffectKey::ClaimHeld("fast".into(), "nvme-x".into()).to_string(), "claim/held/fast/nvme-x");
    }
}
