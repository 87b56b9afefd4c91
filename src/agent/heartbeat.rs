//! The agent's heartbeat (core::heartbeat): its own task renews the Lease named after its node
//! every HEARTBEAT_RENEW, apart from the pass loop, so a renewal never costs a pass and a long
//! pass never delays a renewal. A failed renewal is retried with the project's backoff (from
//! 1 s, doubling, capped at the renewal period) and said once per run of failures; node-cleanup
//! fences the node if none succeeds for the Lease's duration, and this agent lifts that fence
//! after its next pass.

use std::time::Duration;

use tracing::{debug, info, warn};

use crate::api::lease::Written;
use crate::api::{ApiError, Cluster};
use crate::core::backoff::Backoff;
use crate::core::heartbeat::{HEARTBEAT_DURATION, HEARTBEAT_RENEW, heartbeat_lease_name};

/// Renews the heartbeat Lease of `node` in `namespace` until the task is dropped (the agent's
/// process ends with it). Nothing is done when the node's name makes no valid Lease name.
pub(crate) fn spawn(cluster: Cluster, namespace: String, node: String) -> Option<tokio::task::JoinHandle<()>> {
    let Some(name) = heartbeat_lease_name(&node) else {
        warn!(node = %node, "the node's name is too long for a heartbeat Lease name; no heartbeat (node-cleanup cannot fence this node when the agent dies)");
        return None;
    };
    info!(lease = %format!("{namespace}/{name}"), "heartbeat: renewing the agent's Lease every {}s", HEARTBEAT_RENEW.as_secs());
    Some(tokio::spawn(async move {
        let mut backoff = Backoff::new(Duration::from_secs(1), HEARTBEAT_RENEW);
        let mut failing = false;
        loop {
            let outcome = match renew(&cluster, &namespace, &name, &node).await {
                Ok(Written::Done) => Ok(()),
                Ok(Written::Lost) => Err("a concurrent write won twice in a row".to_string()),
                Err(e) => Err(e.to_string()),
            };
            let delay = match outcome {
                Ok(()) => {
                    if std::mem::take(&mut failing) {
                        info!(lease = %name, "heartbeat renewed again");
                    }
                    backoff = Backoff::new(Duration::from_secs(1), HEARTBEAT_RENEW);
                    HEARTBEAT_RENEW
                }
                Err(e) => {
                    if std::mem::replace(&mut failing, true) {
                        debug!(lease = %name, error = %e, "heartbeat renewal failed again; retrying with backoff");
                    } else {
                        warn!(lease = %name, error = %e, "heartbeat renewal failed; retrying with backoff (node-cleanup fences this node if none succeeds for {}s)", HEARTBEAT_DURATION.as_secs());
                    }
                    backoff.next_delay(crate::runtime::random_fraction())
                }
            };
            tokio::time::sleep(delay).await;
        }
    }))
}

/// One renewal: read the Lease, then create it or write it back with its resourceVersion and
/// a new renewTime. Lost to a concurrent write (409): read again at once, once.
async fn renew(cluster: &Cluster, namespace: &str, name: &str, node: &str) -> Result<Written, ApiError> {
    let mut written = Written::Lost;
    for _ in 0..2 {
        let current = cluster.read_lease(namespace, name).await?;
        let acquire = current.as_ref().is_none_or(|c| c.record.holder.as_deref() != Some(node));
        written = cluster.write_lease(namespace, name, current.as_ref(), node, HEARTBEAT_DURATION, acquire).await?;
        if written == Written::Done {
            break;
        }
    }
    Ok(written)
}
