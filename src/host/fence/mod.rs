//! The boot fence's host half: the agent's own binary kept for kubelet's `ExecStartPre`.

pub(crate) mod boot_fence;
