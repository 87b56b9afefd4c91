//! `run`: the per-node agent, with its options taken from the command line.

use std::process::ExitCode;

use super::{RunArgs, init_logging, kubeconfig_file, runtime};
use crate::agent::{AgentOptions, run};
use crate::api::ClientOptions;
use crate::host::volumes::kubelet::KubeletView;
use crate::wiper::CleanerOptions;

pub(super) fn agent(args: RunArgs) -> ExitCode {
    init_logging(args.log_json);
    let opts = AgentOptions {
        config_dir: args.config.config_dir,
        node_name: args.node_name,
        client: ClientOptions {
            kubeconfig: kubeconfig_file(args.kubeconfig, std::env::var_os("KUBECONFIG")),
            qps: args.kube_api_qps,
            burst: args.kube_api_burst,
            ..Default::default()
        },
        discovery_period: args.discovery_period,
        settle: args.settle,
        succession_settle: args.succession_settle,
        host_op_timeout: args.host_op_timeout,
        install_boot_fence: args.install_boot_fence,
        heartbeat_namespace: args.heartbeat_namespace.filter(|ns| !ns.is_empty()),
        state_dir: args.state_dir,
        // kubelet sets KUBERNETES_SERVICE_HOST in every container: in a pod, a missing kubelet
        // directory is a missing hostPath, not a host without kubelet.
        kubelet: KubeletView { dir: args.kubelet_dir, required: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() },
        create_concurrency: args.create_concurrency,
        cleaner: CleanerOptions {
            concurrency: args.wipe_concurrency,
            timeout_base: args.wipe_timeout_base,
            min_rate: args.wipe_min_rate_mib.max(1) * 1024 * 1024,
        },
        listen_address: args.listen_address,
        metrics_path: args.metrics_path,
    };
    let runtime = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(run(opts)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent stopped");
            ExitCode::FAILURE
        }
    }
}
