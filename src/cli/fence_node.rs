//! `fence-node`: the node-wide volume fence set every time kubelet starts, before it starts any
//! pod (kubelet's `ExecStartPre`, deploy/host/). An agent sets it when it stops, but a crash, a
//! SIGKILL or a power loss stops nothing: without this, kubelet may start pods on disks that
//! came back in another order, or were remounted while no agent ran, before any agent has
//! checked them. The agent lifts it once a pass has checked every volume (core::fence::volume_fence); which
//! value it gets and why every start fences: core::fence::boot_fence.
//!
//! It runs with kubelet's own credentials: a kubelet may label its own Node (NodeRestriction
//! allows keys outside kubernetes.io and k8s.io).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::api::{ClientOptions, Cluster};
use crate::core::fence::boot_fence::boot_fence;
use crate::core::fence::volume_fence::LABEL_VOLUMES_UNVERIFIED;
use crate::core::reconcile::backoff::Backoff;
use crate::host::fence::boot_fence::{agent_presence, fenced_this_boot, note_fenced};

/// The kernel's table of file locks: whether an agent holds its state directory.
const PROC_LOCKS: &str = "/proc/locks";

/// Exit code when the API refused the label (credentials, RBAC): retrying cannot help.
const REFUSED: u8 = 2;

/// Sets the node-wide fence on `node`, retrying an API server that cannot be reached (a node
/// boots before its network or the control plane is up) for up to `wait`. Its value says which
/// window it covers (core::fence::boot_fence): the first kubelet start in this boot (no `marker`
/// yet), or a restart while the agent of `state_dir` runs or does not. Exit codes: 0 set, or
/// no such Node (nothing of it to fence); 1 the API did not answer in time; 2 refused.
pub async fn run(node: String, client: ClientOptions, wait: Duration, marker: &Path, state_dir: &Path) -> ExitCode {
    let agent = agent_presence(state_dir, Path::new(PROC_LOCKS));
    let fence = boot_fence(fenced_this_boot(marker), agent);
    let value = fence.label_value();
    let deadline = Instant::now() + wait;
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let labels = BTreeMap::from([(LABEL_VOLUMES_UNVERIFIED.to_string(), Some(value.to_string()))]);
    let mut last = String::new();
    loop {
        let attempt = async {
            let cluster = Cluster::connect_as(&client, "fence-node", &node).await?;
            cluster.patch_node_labels(&node, &labels).await
        };
        match attempt.await {
            Ok(_) => {
                if let Err(e) = note_fenced(marker) {
                    eprintln!("{node}: could not note this boot's kubelet start ({e})");
                }
                println!(
                    "{node}: node-wide volume fence set ({LABEL_VOLUMES_UNVERIFIED}={value}; agent: {agent:?}); {}",
                    fence.lifted_by()
                );
                return ExitCode::SUCCESS;
            }
            Err(e) if e.is_not_found() => {
                println!("{node}: no such Node yet (first boot): none of its volumes can be mounted by a pod");
                return ExitCode::SUCCESS;
            }
            Err(e) if e.is_refusal() || e.is_unauthorized() => {
                eprintln!(
                    "error: {node}: the API server refused the node-wide volume fence ({e}); run this with the \
                     node's own credentials (kubelet's kubeconfig) or credentials that may patch this Node's labels"
                );
                return ExitCode::from(REFUSED);
            }
            Err(e) => {
                let why = e.to_string();
                if why != last {
                    eprintln!("{node}: cannot set the node-wide volume fence yet: {why}; retrying");
                    last = why;
                }
            }
        }
        let delay = backoff.next_delay(crate::runtime::random_fraction());
        if Instant::now() + delay > deadline {
            eprintln!("error: {node}: the API server did not answer within {}s; the fence is not set", wait.as_secs());
            return ExitCode::FAILURE;
        }
        tokio::time::sleep(delay).await;
    }
}

/// The name kubelet registers this node under when not told otherwise: the host name, in
/// lower case.
pub fn default_node_name() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_lowercase();
    (!name.is_empty()).then_some(name)
}
