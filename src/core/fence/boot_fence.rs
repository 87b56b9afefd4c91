//! What the boot hook (`fence-node`, kubelet's `ExecStartPre`) sets before kubelet starts any
//! pod: the node-wide volume fence, every time kubelet starts. Pure; cli::fence_node feeds it
//! what it found on the host.
//!
//! Why every time, not once per boot: kubelet starting is a window in which pods are started
//! (re-created after a kubelet restart, or new) while nothing says the agent has checked the
//! node's disks since they last could change. A kubelet restart within a boot is no proof that
//! the disks are as they were: an agent killed without SIGTERM (OOM, SIGKILL, a crash) set no
//! fence, and an operator may have remounted the disks meanwhile. A live agent is no proof
//! either: its mount watch starts a pass at a swap, but kubelet starting pods races that pass.
//! What it costs: with a live agent, the agent sees the label on its own Node (it watches it),
//! checks every disk in a pass started after the label was set, and lifts it; pods that mount
//! the node's local volumes wait that one pass. Without a live agent the fence stays until one
//! runs and has checked the disks, which is exactly what the fence is for.
//!
//! The label's value says which window it covers, so an operator reading the Node knows who
//! lifts it: the first start of kubelet in a boot, a kubelet restart while no agent holds the
//! node (its state directory's lock is free: it crashed, was killed, or is not running), or a
//! kubelet restart while an agent runs.

/// Whether an agent holds this node now: it holds an exclusive lock on its state directory for
/// its whole life (host::identity::used_mark::Ledger), which the kernel releases when the process ends,
/// however it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentPresence {
    /// A process holds the lock: an agent runs (it may still be starting).
    Running,
    /// The lock exists and nobody holds it: the agent ran here and is gone (crashed, killed,
    /// stopped, its pod not started yet).
    Gone,
    /// No lock file: no agent has run with this state directory (or it was wiped).
    NeverRan,
    /// The lock could not be tested (its file unreadable, /proc/locks unreadable).
    Unknown,
}

/// The node-wide fence's value, per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootFence {
    /// kubelet's first start in this boot: the disks may have come back in another order.
    NodeBooted,
    /// kubelet restarted while no agent holds the node: nobody has checked the disks since the
    /// agent went (it may have been killed without setting the fence).
    AgentGone,
    /// kubelet restarted while an agent runs: it lifts the fence after its next pass.
    KubeletRestarted,
}

impl BootFence {
    /// The label value (core::fence::volume_fence::LABEL_VOLUMES_UNVERIFIED).
    pub fn label_value(self) -> &'static str {
        match self {
            BootFence::NodeBooted => "node-booted",
            BootFence::AgentGone => "agent-gone",
            BootFence::KubeletRestarted => "kubelet-restarted",
        }
    }

    /// Who lifts it, for the hook's output.
    pub fn lifted_by(self) -> &'static str {
        match self {
            BootFence::NodeBooted | BootFence::AgentGone => {
                "the next agent lifts it once its first pass has checked every volume's disk"
            }
            BootFence::KubeletRestarted => {
                "the running agent sees it on its Node and lifts it once a pass has checked every volume's disk"
            }
        }
    }
}

/// The node-wide fence kubelet's start sets: always one (see the module), its value from whether
/// this is the first start in this boot (`booted_before`: the boot marker under /run exists)
/// and whether an agent holds the node. A lock that cannot be tested counts as no agent.
pub fn boot_fence(booted_before: bool, agent: AgentPresence) -> BootFence {
    match (booted_before, agent) {
        (false, _) => BootFence::NodeBooted,
        (true, AgentPresence::Running) => BootFence::KubeletRestarted,
        (true, AgentPresence::Gone | AgentPresence::NeverRan | AgentPresence::Unknown) => BootFence::AgentGone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENCE: [AgentPresence; 4] =
        [AgentPresence::Running, AgentPresence::Gone, AgentPresence::NeverRan, AgentPresence::Unknown];

    #[test]
    fn every_start_of_kubelet_fences_and_the_value_names_the_window() {
        for booted_before in [false, true] {
            for agent in PRESENCE {
                let fence = boot_fence(booted_before, agent);
                let want = match (booted_before, agent) {
                    (false, _) => "node-booted",
                    (true, AgentPresence::Running) => "kubelet-restarted",
                    (true, _) => "agent-gone",
                };
                assert_eq!(fence.label_value(), want, "booted_before={booted_before} agent={agent:?}");
                // Every value is a valid label value and says who lifts it.
                assert!(
                    fence.label_value().len() <= 63
                        && fence.label_value().bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
                );
                assert!(fence.lifted_by().contains("lifts it"));
            }
        }
    }
}
