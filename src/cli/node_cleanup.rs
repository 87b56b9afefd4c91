//! `node-cleanup`: the cluster-wide Deployment that releases the claims and PVs of deleted
//! Nodes, with its leader Lease, from the command line.

use std::process::ExitCode;

use super::{NodeCleanupArgs, init_logging, kubeconfig_file, runtime};
use crate::api::ClientOptions;
use crate::node_cleanup::NodeCleanupOptions;
use crate::node_cleanup::leader::LeaseOptions;

pub(super) fn run(args: NodeCleanupArgs) -> ExitCode {
    init_logging(args.log_json);
    let identity = args.identity.filter(|s| !s.is_empty()).unwrap_or_else(default_identity);
    let lease = LeaseOptions {
        namespace: args.lease_namespace,
        name: args.lease_name,
        identity,
        lease_duration: args.lease_duration,
        renew_deadline: args.renew_deadline,
        retry_period: args.retry_period,
    };
    // The fence on every write relies on these: see leader::LeaseOptions::request_deadline.
    if let Err(e) = lease.validate() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let opts = NodeCleanupOptions {
        classes: args.storage_classes.into_iter().map(|c| c.trim().to_string()).filter(|c| !c.is_empty()).collect(),
        grace: args.grace_period,
        resync: args.resync_period,
        lease,
        client: ClientOptions {
            kubeconfig: kubeconfig_file(args.kubeconfig, std::env::var_os("KUBECONFIG")),
            qps: args.kube_api_qps,
            burst: args.kube_api_burst,
            ..Default::default()
        },
        listen_address: args.listen_address,
        metrics_path: args.metrics_path,
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(crate::node_cleanup::run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "node-cleanup stopped");
            ExitCode::FAILURE
        }
    }
}

/// Hostname plus PID: unique per process even when two run on one machine (tests, or a pod
/// name that is not passed in).
fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}-{}", std::process::id())
}
