//! Tests against a real control plane: the one tests/run.sh started (LSP_CONTROL_PLANE_DIR),
//! or a private one per test without it (tests/control-plane/). Most also need root (real
//! mounts and loop devices under the agent), and say why they are skipped without it (a failure
//! under CI). One module per area (a former test file); tests of two areas never run at the same
//! time (tests/support/area.rs): several share the cluster's deploy/ objects, admission
//! policies, fake Nodes and the host's devices.

#[path = "../support/mod.rs"]
mod support;

mod admission;
mod agent;
mod agent_defects;
mod attack_agent;
mod attack_used_mark;
mod chart;
mod cleaner;
mod control_plane;
mod deploy;
mod device_claims;
mod device_surface;
mod device_writers;
mod docs_drift;
mod encryption;
mod events;
mod failing_disks;
mod fence;
mod host_defects;
mod idle_cost;
mod inventory;
mod kubectl_plugin;
mod loop_identity;
mod many_wedged;
mod node_cleanup;
mod operator_wipe;
mod retry;
mod safety;
mod startup;
mod used_mark;
mod watch_share;
mod wedged_disks;
mod wipe_recovery;
