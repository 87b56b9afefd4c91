//! The command line: `run`, `discover`, `validate-config`, `cleanup`, `node-cleanup` and
//! `version`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::agent::{AgentOptions, run};
use crate::api::ClientOptions;
use crate::config::{ConfigError, DEFAULT_CONFIG_DIR, LoadedConfig, load_dir};
use crate::core::desired::{class_policy, desired_pvs};
use crate::core::naming::provisioner_name;
use crate::core::pv::{NodeInfo, PvContext};
use crate::discovery;
use crate::host::kubelet::KubeletView;
use crate::node_cleanup::NodeCleanupOptions;
use crate::node_cleanup::leader::LeaseOptions;
use crate::wiper::CleanerOptions;

/// Placeholder for the node UID in dry runs; obviously not a real UID, so it is not applied
/// by accident without being noticed.
pub const PLACEHOLDER_NODE_UID: &str = "REPLACE-WITH-NODE-UID";

/// Publishes a node's local disks as Kubernetes PersistentVolumes (drop-in for the upstream
/// local-static-provisioner).
#[derive(Debug, Parser)]
#[command(name = "local-static-provisioner", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent: discover volumes and keep their PVs in the cluster.
    Run(RunArgs),
    /// Dry run without a cluster: print the PVs this machine's volumes would become.
    Discover(DiscoverArgs),
    /// Parse and check a config (a ConfigMap manifest with -f, or a directory of key files),
    /// print the effective config with defaults.
    ValidateConfig(ValidateArgs),
    /// Ask the agent to wipe and recycle PVs (sets our cleanup annotation).
    ///
    /// A Released PV is wiped whatever its reclaim policy; an Available PV is withdrawn first
    /// so it cannot be bound during the wipe; a Bound PV is refused.
    Cleanup(CleanupArgs),
    /// Release local PVs and claims of deleted Nodes (and stale PVs of re-created ones) for
    /// opted-in StorageClasses; run as a Deployment, one replica acting at a time (Lease).
    NodeCleanup(NodeCleanupArgs),
    /// Print the version.
    Version,
}

#[derive(Debug, Args)]
struct NodeCleanupArgs {
    /// StorageClasses opted in (comma-separated or repeated); PVs of other classes are never
    /// touched. Upstream's --storageclass-names is accepted.
    #[arg(
        long = "storage-classes",
        alias = "storageclass-names",
        env = "STORAGE_CLASSES",
        value_delimiter = ',',
        required = true
    )]
    storage_classes: Vec<String>,
    /// How long a Node must be gone (or a PV marked stale) before its claims and PVs are
    /// released (Go duration). A Node that comes back within it loses nothing. Upstream's
    /// --pvc-deletion-delay is accepted.
    #[arg(long, alias = "pvc-deletion-delay", env = "GRACE_PERIOD", default_value = "10m", value_parser = parse_duration)]
    grace_period: Duration,
    /// Safety-net pass period (Go duration); passes also follow PV changes and grace deadlines.
    /// Upstream's --stale-pv-discovery-interval is accepted.
    #[arg(long, alias = "stale-pv-discovery-interval", default_value = "10s", value_parser = parse_duration)]
    resync_period: Duration,
    /// Kubeconfig file; without it the in-cluster service account is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Sustained API requests per second.
    #[arg(long, env = "KUBE_API_QPS", default_value_t = 50)]
    kube_api_qps: u32,
    /// Requests allowed in a burst above the sustained rate.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 100)]
    kube_api_burst: u32,
    /// Name of the leader Lease.
    #[arg(long, default_value = "local-static-provisioner-node-cleanup")]
    lease_name: String,
    /// Namespace of the leader Lease (the pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "local-static-provisioner")]
    lease_namespace: String,
    /// This replica's identity in the Lease (the pod name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long the Lease holds without renewal before another replica may take it.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// How long the leader keeps acting after its last successful renewal: at least 1s less
    /// than the lease duration; half that gap (at most 10s) is the deadline of every write.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    /// How often candidates try to take the Lease and the leader renews it.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// Address of the admin server (metrics, /healthz, /readyz).
    #[arg(long, env = "LISTEN_ADDRESS", default_value = ":8080")]
    listen_address: String,
    /// Path of the Prometheus metrics endpoint.
    #[arg(long, default_value = "/metrics")]
    metrics_path: String,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "LOG_JSON")]
    log_json: bool,
}

#[derive(Debug, Args)]
struct ConfigArgs {
    /// Directory holding the ConfigMap keys, one file per key (as kubelet mounts it).
    #[arg(long, env = "CONFIG_DIR", default_value = DEFAULT_CONFIG_DIR)]
    config_dir: PathBuf,
}

#[derive(Debug, Args)]
struct ValidateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// A ConfigMap manifest to check instead of a directory (`-` reads standard input). The
    /// file may hold several documents or a v1 List: the ConfigMap used is the only one, or the
    /// only one whose data has provisioner keys. Wins over --config-dir.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Name of the Node this agent runs on (from the downward API).
    #[arg(long, env = "MY_NODE_NAME")]
    node_name: String,
    /// Kubeconfig file; without it the in-cluster service account is used.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Sustained API requests per second for the agent's own calls.
    #[arg(long, env = "KUBE_API_QPS", default_value_t = 100)]
    kube_api_qps: u32,
    /// Requests allowed in a burst above the sustained rate.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 200)]
    kube_api_burst: u32,
    /// PV creations in flight at once.
    #[arg(long, env = "CREATE_CONCURRENCY", default_value_t = 16)]
    create_concurrency: usize,
    /// Safety-net full resync period (Go duration). Discovery is event-driven (mount-table and
    /// inotify events); by default the resync runs every minResyncPeriod to 2x that, like upstream.
    #[arg(long, env = "DISCOVERY_PERIOD", value_parser = parse_duration)]
    discovery_period: Option<Duration>,
    /// How long a new mount (or a vanished one) must stay so before the agent acts (Go duration).
    #[arg(long, env = "SETTLE", default_value = "200ms", value_parser = parse_settle)]
    settle: Duration,
    /// How long the disk of a PV left by an earlier incarnation of this Node (same name, other
    /// UID) must stay missing or different before that PV is withdrawn or marked stale.
    #[arg(long, env = "SUCCESSION_SETTLE", default_value = "1m", value_parser = parse_settle)]
    succession_settle: Duration,
    /// Node-local directory (a hostPath that outlives the pod) for the ledger of used disks
    /// that cannot carry their own mark: block volumes (see docs/data-safety.md).
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/local-static-provisioner")]
    state_dir: std::path::PathBuf,
    /// kubelet's root directory (its --root-dir), mounted at the same path in the agent's
    /// container with mountPropagation HostToContainer: no wipe starts while kubelet still has
    /// the volume mounted for a pod. In a pod, wipes are refused when it is not visible.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: std::path::PathBuf,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "LOG_JSON")]
    log_json: bool,
    /// Address of the admin server (metrics, /healthz, /readyz); upstream's `:8080` form works.
    #[arg(long, env = "LISTEN_ADDRESS", default_value = ":8080")]
    listen_address: String,
    /// Path of the Prometheus metrics endpoint.
    #[arg(long, default_value = "/metrics")]
    metrics_path: String,
    /// Wipes running at once.
    #[arg(long, env = "WIPE_CONCURRENCY", default_value_t = 2)]
    wipe_concurrency: usize,
    /// Time every wipe gets regardless of size (Go duration).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    wipe_timeout_base: Duration,
    /// Slowest acceptable wipe rate in MiB/s; a wipe's timeout is the base plus size / rate.
    #[arg(long, default_value_t = 10)]
    wipe_min_rate_mib: u64,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    /// Names of the PVs to wipe and recycle.
    #[arg(required = true)]
    pvs: Vec<String>,
    /// Kubeconfig of an administrator; in-cluster or ~/.kube/config when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Follow each request until the PV is Available again, refused, or the timeout passes.
    #[arg(long)]
    wait: bool,
    /// How long --wait follows a request (Go duration).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    Yaml,
    Json,
}

#[derive(Debug, Args)]
struct DiscoverArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Node name used in PV names, the provisioned-by annotation and node affinity.
    #[arg(long, env = "MY_NODE_NAME")]
    node_name: String,
    /// Node UID for the provisioned-by annotation (a marked placeholder when absent).
    #[arg(long)]
    node_uid: Option<String>,
    /// Node labels (key=value, repeatable): the kubernetes.io/hostname value and nodeLabelsForPV.
    #[arg(long = "node-label", value_parser = parse_key_value)]
    node_labels: Vec<(String, String)>,
    /// Reclaim policy the StorageClasses would give (Delete or Retain).
    #[arg(long, default_value = "Delete")]
    reclaim_policy: String,
    /// Mount options the StorageClasses would give (repeatable).
    #[arg(long = "mount-option")]
    mount_options: Vec<String>,
    /// Output format: YAML documents or a JSON v1 List.
    #[arg(long, value_enum, default_value = "yaml")]
    output: Output,
    /// The agent's state directory: its ledger of used disks is read (never written, never
    /// locked), so used block volumes are reported as the agent would. Without it only the
    /// marks on filesystem volumes are read.
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = crate::config::duration::parse_go_duration(s)?;
    if d.is_zero() { Err("must be greater than zero".into()) } else { Ok(d) }
}

fn parse_settle(s: &str) -> Result<Duration, String> {
    crate::config::duration::parse_go_duration(s)
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not key=value"))
}

/// Runs the parsed command and maps its outcome to an exit code.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Version => {
            println!("local-static-provisioner {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::ValidateConfig(args) => validate_config(&args),
        Command::Discover(args) => discover(&args),
        Command::Run(args) => run_agent(args),
        Command::NodeCleanup(args) => run_node_cleanup(args),
        Command::Cleanup(args) => match runtime() {
            Ok(rt) => rt.block_on(crate::cleanup_cli::run(
                args.pvs,
                ClientOptions { kubeconfig: args.kubeconfig, qps: 20, burst: 40 },
                args.wait,
                args.timeout,
            )),
            Err(code) => code,
        },
    }
}

fn load_or_report(args: &ConfigArgs) -> Option<(LoadedConfig, usize)> {
    match load_dir(&args.config_dir) {
        Ok(loaded) => {
            for w in &loaded.warnings {
                eprintln!("warning: {w}");
            }
            let failures = crate::config::effective(&loaded, None).describe_failures();
            for line in &failures {
                eprintln!("error: {line}");
            }
            Some((loaded, failures.len()))
        }
        Err(e) => {
            if let ConfigError::Invalid { warnings, .. } = &e {
                for w in warnings {
                    eprintln!("warning: {w}");
                }
            }
            eprintln!("error: {e}");
            None
        }
    }
}

/// Reads the config `validate-config` checks: the manifest given with -f, else the directory.
fn load_for_validation(args: &ValidateArgs) -> Result<LoadedConfig, String> {
    let Some(file) = &args.file else { return load_dir(&args.config.config_dir).map_err(|e| report_refused(&e)) };
    let (name, text) = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| format!("error: reading standard input: {e}"))?;
        ("(standard input)".to_string(), text)
    } else {
        let text = std::fs::read_to_string(file).map_err(|e| format!("error: reading {}: {e}", file.display()))?;
        (file.display().to_string(), text)
    };
    crate::config::load_manifest(&name, &text).map_err(|e| match e {
        crate::config::ManifestError::Config(e) => report_refused(&e),
        other => format!("error: {other}"),
    })
}

/// The warnings of a refused config, then the error, as the lines to print.
fn report_refused(e: &ConfigError) -> String {
    let mut out = String::new();
    if let ConfigError::Invalid { warnings, .. } = e {
        for w in warnings {
            out.push_str(&format!("warning: {w}\n"));
        }
    }
    out.push_str(&format!("error: {e}"));
    out
}

fn validate_config(args: &ValidateArgs) -> ExitCode {
    let loaded = match load_for_validation(args) {
        Ok(loaded) => loaded,
        Err(lines) => {
            eprintln!("{lines}");
            return ExitCode::FAILURE;
        }
    };
    let eff = crate::config::effective(&loaded, None);
    let mut failed = false;
    for w in loaded.warnings.iter().chain(&crate::host::wipe_block::cleaner_warnings_here(&eff.config)) {
        eprintln!("warning: {w}");
    }
    for (class, problems) in &eff.left_out {
        failed = true;
        eprintln!("error: class {class:?} is invalid and will not be used (the other classes are):");
        for p in problems {
            eprintln!("  - {p}");
        }
    }
    if eff.config.storage_class_map.is_empty() {
        if eff.left_out.is_empty() {
            eprintln!(
                "warning: no storage classes are configured (storageClassMap is empty or missing): nothing will be published"
            );
        } else {
            eprintln!("error: every storage class is invalid: nothing will be published");
        }
    }
    // The discovery directories that exist on this machine are also checked as they resolve
    // here (symlinks, bind mounts), as the agent checks them on every pass.
    let mounts = match crate::host::mountinfo::MountTable::read() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (_, problems) = discovery::check_roots(&eff.config, &mounts.facts());
    let unsafe_roots: Vec<_> = problems.iter().filter(|(_, r)| r.is_safety_refusal()).collect();
    for (class, reason) in &unsafe_roots {
        eprintln!("storageClassMap.{class}.mountDir: {reason}");
    }
    if !unsafe_roots.is_empty() {
        eprintln!("error: {} class(es) would not be scanned; fix their discovery directories", unsafe_roots.len());
        failed = true;
    }
    match serde_saphyr::to_string(&eff.config) {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("error: printing the effective config: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

fn discover(args: &DiscoverArgs) -> ExitCode {
    let Some((LoadedConfig { config, .. }, failed_classes)) = load_or_report(&args.config) else {
        return ExitCode::FAILURE;
    };
    // The dry run reads the volumes' own used marks, and the agent's ledger when given.
    let ledger = match &args.state_dir {
        Some(dir) => match crate::host::used_mark::Ledger::read_only(dir) {
            Ok(ledger) => Some(ledger),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let scan = match crate::host::mountinfo::MountTable::read() {
        Ok(mounts) => {
            let mut scan = discovery::scan_with(&config, &mounts, &Default::default());
            discovery::read_used_marks(&mut scan.volumes, &config, &mounts, ledger.as_ref());
            scan
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let uid = args.node_uid.clone().unwrap_or_else(|| PLACEHOLDER_NODE_UID.to_string());
    let node =
        NodeInfo { name: args.node_name.clone(), uid: uid.clone(), labels: args.node_labels.iter().cloned().collect() };
    let provisioner = provisioner_name(&node.name, &uid, config.use_node_name_only);
    let ctx = PvContext { config: &config, node: &node, provisioner_name: &provisioner };
    let mut policies = BTreeMap::new();
    for class in config.storage_class_map.keys() {
        policies.insert(class.clone(), class_policy(class, Some(&args.reclaim_policy), Some(&args.mount_options)));
    }
    let (desired, problems) = desired_pvs(&ctx, &scan.volumes, &policies);
    let mut stderr = std::io::stderr().lock();
    for s in &scan.skipped {
        let _ = writeln!(
            stderr,
            "skipped {} (class {}, reason {}): {}",
            s.path.display(),
            s.class,
            s.reason.code(),
            s.reason
        );
    }
    for p in &problems {
        let _ = writeln!(stderr, "class {}: {}", p.class, p.message);
    }
    // Two entries with the same host path or PV name are reported, as the agent would refuse them.
    let identity = crate::core::planner::Identity {
        node: node.name.clone(),
        provisioner: provisioner.clone(),
        node_label: crate::core::naming::node_label_value(&node.name),
        use_node_name_only: config.use_node_name_only,
    };
    let mut pvs = Vec::new();
    for action in crate::core::planner::plan(&identity, &desired, &[], &BTreeMap::new()) {
        match action {
            crate::core::planner::Action::Create { name, host_path } => {
                pvs.extend(
                    crate::core::planner::desired_named(&desired, &name, &host_path).and_then(|d| ctx.pv_for(d)),
                );
            }
            crate::core::planner::Action::Refuse { name, host_path, reason } => {
                let _ = writeln!(stderr, "skipped {host_path} ({name}, reason {}): {reason}", reason.code());
            }
            crate::core::planner::Action::WipeFirst { name, host_path, mark, .. } => {
                let _ = writeln!(
                    stderr,
                    "skipped {host_path} ({name}, reason used): it held the data of PV {} and is wiped before it is published",
                    mark.pv
                );
            }
        }
    }
    if args.node_uid.is_none() {
        let _ = writeln!(
            stderr,
            "note: node UID unknown, provisioned-by uses the placeholder {PLACEHOLDER_NODE_UID} (pass --node-uid)"
        );
    }
    let text = match args.output {
        Output::Json => {
            serde_json::to_string_pretty(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": pvs}))
                .map(|s| s + "\n")
                .map_err(|e| e.to_string())
        }
        Output::Yaml => pvs.iter().try_fold(String::new(), |mut acc, pv| {
            acc.push_str("---\n");
            acc.push_str(&serde_saphyr::to_string(pv).map_err(|e| e.to_string())?);
            if !acc.ends_with('\n') {
                acc.push('\n');
            }
            Ok(acc)
        }),
    };
    match text {
        // The valid classes' PVs are printed; an invalid class (reported above) still fails the
        // command, so that a script applying the output notices the class left out.
        Ok(text) => {
            print!("{text}");
            if failed_classes > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("error: printing PVs: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_agent(args: RunArgs) -> ExitCode {
    init_logging(args.log_json);
    let opts = AgentOptions {
        config_dir: args.config.config_dir,
        node_name: args.node_name,
        client: ClientOptions { kubeconfig: args.kubeconfig, qps: args.kube_api_qps, burst: args.kube_api_burst },
        discovery_period: args.discovery_period,
        settle: args.settle,
        succession_settle: args.succession_settle,
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

fn run_node_cleanup(args: NodeCleanupArgs) -> ExitCode {
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
        client: ClientOptions { kubeconfig: args.kubeconfig, qps: args.kube_api_qps, burst: args.kube_api_burst },
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

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| {
        eprintln!("error: starting the async runtime: {e}");
        ExitCode::FAILURE
    })
}

fn init_logging(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
