//! The command line: `run`, `discover`, `disks`, `wipe-disk`, `validate-config`, `cleanup`,
//! `fence-node`, `node-cleanup` and `version`: the clap definitions and the dispatch here, each
//! subcommand in its own file. The kubectl plugin (`kubectl local-storage`, the same binary
//! under another name) has its own parser in `kubectl/`.

pub mod cleanup;
mod discover;
pub mod disks;
pub mod fence_node;
pub mod kubectl;
mod node_cleanup;
mod run;
mod validate_config;
pub mod wipe_disk;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use tracing_subscriber::EnvFilter;

use crate::api::ClientOptions;
use crate::config::{ConfigError, DEFAULT_CONFIG_DIR, LoadedConfig, load_dir};

/// Placeholder for the node UID in the provisioned-by annotation of dry runs; obviously not a
/// real UID, so it is not applied by accident without being noticed. It never goes into an
/// owner reference: the garbage collector would delete a PV whose owner does not exist.
pub const PLACEHOLDER_NODE_UID: &str = "REPLACE-WITH-NODE-UID";

/// Where the API connection comes from, in the order kube's `Config::infer` tries them (a
/// kubeconfig first, the in-cluster service account only when none is found).
const KUBECONFIG_HELP: &str = "Kubeconfig file. Without it: the KUBECONFIG variable (a list of files is merged, as kubectl \
     does), else ~/.kube/config when it exists, else the in-cluster service account (KUBERNETES_SERVICE_HOST and the \
     mounted token)";

/// The kubeconfig file to load, or `None` to let kube's `Config::infer` find one. clap hands
/// KUBECONFIG over as one path; when it is a list ("a:b", as kubectl accepts) it is left to
/// `Config::infer`, which merges the list as kubectl does.
fn kubeconfig_file(arg: Option<PathBuf>, env: Option<std::ffi::OsString>) -> Option<PathBuf> {
    let from_env_list =
        |path: &PathBuf| env.as_ref().is_some_and(|e| e == path.as_os_str() && std::env::split_paths(e).count() > 1);
    arg.filter(|path| !from_env_list(path))
}

/// Publishes a node's local disks as Kubernetes PersistentVolumes (drop-in for the upstream
/// local-static-provisioner).
#[derive(Debug, Parser)]
#[command(name = "local-static-provisioner", version, long_version = crate::build_info::long_version(), about)]
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
    /// List every block device of this node with its facts and, for each class with a
    /// `devices` section, whether it is claimed, would be, or why not. Changes nothing.
    Disks(DisksArgs),
    /// Zero one disk of this node, named by its stable id exactly as `disks` prints it, on an
    /// operator's word: refused while it, or anything sharing its data, is mounted, held, open,
    /// an entry of a discovery directory or a PV's disk. Without --yes, only says what it would
    /// zero and why that is allowed or refused.
    WipeDisk(WipeDiskArgs),
    /// Parse and check a config (a ConfigMap manifest with -f, or a directory of key files),
    /// print the effective config with defaults.
    ValidateConfig(ValidateArgs),
    /// Ask the agent to wipe and recycle PVs (sets our cleanup annotation).
    ///
    /// A Released PV is wiped whatever its reclaim policy; an Available PV is withdrawn first
    /// so it cannot be bound during the wipe; a Bound PV is refused.
    Cleanup(CleanupArgs),
    /// Set the node-wide volume fence on this node (kubelet's ExecStartPre, each time kubelet
    /// starts, with kubelet's kubeconfig: deploy/host/): no pod newly mounts a volume of the
    /// node until its agent has checked every disk, so disks a reboot brought back in another
    /// order, or that were remounted while no agent ran, never reach another tenant's pod.
    FenceNode(FenceNodeArgs),
    /// Release local PVs and claims of deleted Nodes (and stale PVs of re-created ones) for
    /// opted-in StorageClasses; run as a Deployment, one replica acting at a time (Lease).
    NodeCleanup(NodeCleanupArgs),
    /// Print the version, git commit, build date, rustc version and target.
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
    #[arg(long, alias = "stale-pv-discovery-interval", env = "RESYNC_PERIOD", default_value = "10s", value_parser = parse_duration)]
    resync_period: Duration,
    #[arg(long, env = "KUBECONFIG", help = KUBECONFIG_HELP)]
    kubeconfig: Option<PathBuf>,
    /// Sustained API requests per second.
    #[arg(long, env = "KUBE_API_QPS", default_value_t = 50)]
    kube_api_qps: u32,
    /// Requests allowed in a burst above the sustained rate.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 100)]
    kube_api_burst: u32,
    /// Name of the leader Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "local-static-provisioner-node-cleanup")]
    lease_name: String,
    /// Namespace of the leader Lease (the pod's own, from the downward API).
    #[arg(long, env = "POD_NAMESPACE", default_value = "local-static-provisioner")]
    lease_namespace: String,
    /// This replica's identity in the Lease (the pod name, from the downward API).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long the Lease holds without renewal before another replica may take it.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    lease_duration: Duration,
    /// How long the leader keeps acting after its last successful renewal: at least 1s less
    /// than the lease duration; half that gap (at most 10s) is the deadline of every write.
    #[arg(long, env = "RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    renew_deadline: Duration,
    /// How often candidates try to take the Lease and the leader renews it.
    #[arg(long, env = "RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    retry_period: Duration,
    /// Address of the admin server (metrics, /healthz, /readyz).
    #[arg(long, env = "LISTEN_ADDRESS", default_value = ":8080")]
    listen_address: String,
    /// Path of the Prometheus metrics endpoint.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
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
struct DisksArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The agent's state directory: its claim records (claims.json) say which links are its
    /// own (without them, its links show as "already a volume"). Read only; a directory that
    /// does not exist holds no records.
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/local-static-provisioner")]
    state_dir: PathBuf,
    /// Output format.
    #[arg(long, env = "DISKS_OUTPUT", value_enum, default_value = "table")]
    output: DisksOutput,
    /// Also list unattached loop devices (size 0) in the table; JSON always lists every device.
    #[arg(long, env = "DISKS_ALL")]
    all: bool,
}

#[derive(Debug, Args)]
struct WipeDiskArgs {
    /// The disk's stable id, exactly as `disks` prints it (`wwid:...`, `serial:...`,
    /// `dm:mpath-...`, `loop:...`, a partition's `.../part<N>@<start>`).
    #[arg(long, env = "WIPE_DISK_ID")]
    id: String,
    /// Write. Without it nothing is written: the command prints what it would zero and why
    /// that is allowed or refused (exit code 2 when refused).
    #[arg(long, env = "WIPE_DISK_YES")]
    yes: bool,
    /// Deadline of the wipe (Go duration); by default 10m plus the size at 10 MiB/s.
    #[arg(long, env = "WIPE_DISK_TIMEOUT", value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Name of this Node (its PVs are read from the API; the event goes on it).
    #[arg(long, env = "MY_NODE_NAME", value_parser = parse_node_name)]
    node_name: String,
    #[arg(long, env = "KUBECONFIG", help = KUBECONFIG_HELP)]
    kubeconfig: Option<PathBuf>,
    #[command(flatten)]
    config: ConfigArgs,
    /// The agent's state directory: its claims.json says which links are its own.
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/local-static-provisioner")]
    state_dir: PathBuf,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum DisksOutput {
    Table,
    Json,
}

#[derive(Debug, Args)]
struct ValidateArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// A ConfigMap manifest to check instead of a directory (`-` reads standard input). The
    /// file may hold several documents or a v1 List: the ConfigMap used is the only one, or the
    /// only one whose data has provisioner keys. Wins over --config-dir.
    #[arg(short = 'f', long = "file", env = "CONFIG_FILE")]
    file: Option<PathBuf>,
    /// Fail on any unknown key, not only on likely misspellings of a known one (which always
    /// fail): for CI checks of a config before it is applied.
    #[arg(long, env = "STRICT")]
    strict: bool,
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Name of the Node this agent runs on (from the downward API: spec.nodeName).
    #[arg(long, env = "MY_NODE_NAME", value_parser = parse_node_name)]
    node_name: String,
    #[arg(long, env = "KUBECONFIG", help = KUBECONFIG_HELP)]
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
    /// How long one host operation on a volume or device (a stat, a used-mark write, a probe)
    /// may take before the volume counts as unresponsive and the agent goes on without it.
    #[arg(long, env = "HOST_OP_TIMEOUT", default_value = "10s", value_parser = parse_settle)]
    host_op_timeout: Duration,
    /// Node-local directory (a hostPath that outlives the pod) for the ledger of used disks
    /// that cannot carry their own mark: block volumes (see docs/data-safety.md).
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/local-static-provisioner")]
    state_dir: std::path::PathBuf,
    /// Keep a copy of this binary at <state-dir>/bin/local-static-provisioner, for the boot
    /// fence kubelet runs before it starts pods (`fence-node`, deploy/host/). On in deploy/.
    #[arg(long, env = "INSTALL_BOOT_FENCE")]
    install_boot_fence: bool,
    /// Namespace of the heartbeat Lease (local-static-provisioner-agent-<node>) the agent renews
    /// every 10 s, so node-cleanup can fence the node when the agent dies without SIGTERM.
    /// Unset: no heartbeat. deploy/ sets it to the pod's namespace.
    #[arg(long, env = "HEARTBEAT_NAMESPACE")]
    heartbeat_namespace: Option<String>,
    /// kubelet's root directory (its --root-dir). Its pods/, plugins/kubernetes.io~local-volume
    /// and plugins/kubernetes.io/local-volume (where kubelet mounts local volumes) are mounted
    /// at the same paths in the agent's container, read-only with mountPropagation
    /// HostToContainer: no wipe starts while kubelet still has the volume mounted for a pod. In
    /// a pod, wipes are refused while any of them is not visible.
    #[arg(long, env = "KUBELET_DIR", default_value = "/var/lib/kubelet")]
    kubelet_dir: std::path::PathBuf,
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, env = "LOG_JSON")]
    log_json: bool,
    /// Address of the admin server (metrics, /healthz, /readyz); upstream's `:8080` form works.
    #[arg(long, env = "LISTEN_ADDRESS", default_value = ":8080")]
    listen_address: String,
    /// Path of the Prometheus metrics endpoint.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
    metrics_path: String,
    /// Wipes running at once.
    #[arg(long, env = "WIPE_CONCURRENCY", default_value_t = 2)]
    wipe_concurrency: usize,
    /// Time every wipe gets regardless of size (Go duration).
    #[arg(long, env = "WIPE_TIMEOUT_BASE", default_value = "10m", value_parser = parse_duration)]
    wipe_timeout_base: Duration,
    /// Slowest acceptable wipe rate in MiB/s; a wipe's timeout is the base plus size / rate.
    #[arg(long, env = "WIPE_MIN_RATE_MIB", default_value_t = 10)]
    wipe_min_rate_mib: u64,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    /// Names of the PVs to wipe and recycle.
    #[arg(required = true)]
    pvs: Vec<String>,
    /// Kubeconfig of an administrator.
    #[arg(long, env = "KUBECONFIG", long_help = KUBECONFIG_HELP)]
    kubeconfig: Option<PathBuf>,
    /// Follow each request until the PV is Available again, refused, or the timeout passes.
    #[arg(long, env = "CLEANUP_WAIT")]
    wait: bool,
    /// How long --wait follows a request (Go duration).
    #[arg(long, env = "CLEANUP_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    timeout: Duration,
}

#[derive(Debug, Args)]
struct FenceNodeArgs {
    /// This node's name as registered (kubelet's --hostname-override); default: the host name
    /// in lower case, as kubelet does.
    #[arg(long, env = "FENCE_NODE_NAME")]
    node: Option<String>,
    /// Kubelet's kubeconfig (its credentials may label their own Node).
    #[arg(long, env = "KUBECONFIG", default_value = "/etc/kubernetes/kubelet.conf")]
    kubeconfig: PathBuf,
    /// How long to retry an API server that cannot be reached yet (Go duration).
    #[arg(long, env = "FENCE_WAIT", default_value = "5m", value_parser = parse_duration)]
    wait: Duration,
    /// Where it notes that kubelet started in this boot (a later start is a restart: the
    /// fence's value says so; it fences all the same). Under /run, which every boot empties.
    #[arg(long, env = "FENCE_BOOT_MARKER", default_value = crate::host::fence::boot_fence::BOOT_MARKER)]
    boot_marker: PathBuf,
    /// The agent's --state-dir: whether an agent runs is told by the lock it holds there.
    #[arg(long, env = "STATE_DIR", default_value = "/var/lib/local-static-provisioner")]
    state_dir: PathBuf,
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
    #[arg(long, env = "MY_NODE_NAME", value_parser = parse_node_name)]
    node_name: String,
    /// The Node's UID (`kubectl get node NAME -o jsonpath='{.metadata.uid}'`), for the
    /// provisioned-by annotation and, with setPVOwnerRef, the owner reference. Without it the
    /// annotation holds a marked placeholder and no owner reference is written.
    #[arg(long, env = "NODE_UID", value_parser = parse_node_uid)]
    node_uid: Option<String>,
    /// Node labels (key=value, repeatable or comma-separated): the kubernetes.io/hostname value
    /// and nodeLabelsForPV.
    #[arg(long = "node-label", env = "NODE_LABELS", value_delimiter = ',', value_parser = parse_key_value)]
    node_labels: Vec<(String, String)>,
    /// Reclaim policy the StorageClasses would give (Delete or Retain).
    #[arg(long, env = "RECLAIM_POLICY", default_value = "Delete")]
    reclaim_policy: String,
    /// Mount options the StorageClasses would give (repeatable or comma-separated).
    #[arg(long = "mount-option", env = "MOUNT_OPTIONS", value_delimiter = ',')]
    mount_options: Vec<String>,
    /// Output format: YAML documents or a JSON v1 List.
    #[arg(long, env = "DISCOVER_OUTPUT", value_enum, default_value = "yaml")]
    output: Output,
    /// The agent's state directory: its ledger of used disks is read (never written, never
    /// locked), so used block volumes are reported as the agent would. Without it only the
    /// marks on filesystem volumes are read.
    #[arg(long, env = "STATE_DIR")]
    state_dir: Option<std::path::PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = crate::config::duration::parse_go_duration(s)?;
    if d.is_zero() { Err("must be greater than zero".into()) } else { Ok(d) }
}

fn parse_settle(s: &str) -> Result<Duration, String> {
    crate::config::duration::parse_go_duration(s)
}

/// A Node name as Kubernetes accepts it (a lowercase RFC 1123 DNS subdomain, as the API server
/// validates Node names), checked at parse time: an empty or malformed name would otherwise
/// pass `discover` and fail obscurely once `run` talks to the API.
fn parse_node_name(s: &str) -> Result<String, String> {
    const HOW: &str = "set --node-name or MY_NODE_NAME (in a pod, from the downward API: spec.nodeName)";
    if s.is_empty() {
        return Err(format!("the Node name is empty; {HOW}"));
    }
    if let Some(problem) = dns_subdomain_problem(s) {
        return Err(format!("{s:?} is not a valid Node name: {problem}; {HOW}"));
    }
    Ok(s.to_string())
}

/// What keeps `s` from being a DNS subdomain (RFC 1123): at most 253 characters, dot-separated
/// labels of lowercase letters, digits and '-', each starting and ending with a letter or digit.
fn dns_subdomain_problem(s: &str) -> Option<String> {
    if s.len() > 253 {
        return Some(format!("{} characters, at most 253 allowed", s.len()));
    }
    if let Some(c) = s.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))) {
        return Some(format!("{c:?} is not allowed (only lowercase letters, digits, '-' and '.')"));
    }
    if s.split('.').any(|label| label.is_empty() || label.starts_with('-') || label.ends_with('-')) {
        return Some("every dot-separated part must start and end with a lowercase letter or digit".into());
    }
    None
}

/// A Node UID as the API server assigns it (a UUID): anything else, in an owner reference,
/// names an owner that does not exist, and the garbage collector deletes the PV.
fn parse_node_uid(s: &str) -> Result<String, String> {
    // The API server writes UIDs in lowercase, and owner references are compared as strings.
    if crate::core::volumes::naming::is_uuid(s) && !s.bytes().any(|b| b.is_ascii_uppercase()) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a Node UID (a UUID such as 0b9d5a4c-2f4e-4c55-9a51-1a1e3c1e6f7d); get it with \
             kubectl get node NODE -o jsonpath='{{.metadata.uid}}'"
        ))
    }
}

fn parse_key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| format!("{s:?} is not key=value"))
}

/// Runs the parsed command and maps its outcome to an exit code.
pub fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Version => {
            println!("local-static-provisioner {}", crate::build_info::long_version());
            ExitCode::SUCCESS
        }
        Command::ValidateConfig(args) => validate_config::run(&args),
        Command::Discover(args) => discover::run(&args),
        Command::Disks(args) => disks::command(&args),
        Command::WipeDisk(args) => wipe_disk::run(wipe_disk::WipeDiskOptions {
            config: load_dir(&args.config.config_dir)
                .map(|l| (l.config, l.failed_classes.into_keys().collect()))
                .map_err(|e| e.to_string()),
            id: args.id,
            yes: args.yes,
            timeout: args.timeout,
            node_name: args.node_name,
            client: ClientOptions {
                kubeconfig: kubeconfig_file(args.kubeconfig, std::env::var_os("KUBECONFIG")),
                qps: 20,
                burst: 40,
                ..Default::default()
            },
            state_dir: args.state_dir,
        }),
        Command::Run(args) => run::agent(args),
        Command::NodeCleanup(args) => node_cleanup::run(args),
        Command::FenceNode(args) => {
            let Some(node) = args.node.or_else(fence_node::default_node_name) else {
                eprintln!("error: no --node given and the host name cannot be read");
                return ExitCode::FAILURE;
            };
            match runtime() {
                Ok(rt) => {
                    let client =
                        ClientOptions { kubeconfig: Some(args.kubeconfig), qps: 5, burst: 5, ..Default::default() };
                    rt.block_on(fence_node::run(node, client, args.wait, &args.boot_marker, &args.state_dir))
                }
                Err(code) => code,
            }
        }
        Command::Cleanup(args) => match runtime() {
            Ok(rt) => rt.block_on(cleanup::run(
                args.pvs,
                ClientOptions {
                    kubeconfig: kubeconfig_file(args.kubeconfig, std::env::var_os("KUBECONFIG")),
                    qps: 20,
                    burst: 40,
                    ..Default::default()
                },
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
            eprintln!("{}", report_refused(&e));
            None
        }
    }
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

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| {
        eprintln!("error: starting the async runtime: {e}");
        ExitCode::FAILURE
    })
}

fn init_logging(json: bool) {
    // kube's request tracing logs every failed request at ERROR without its cause; our own
    // messages name the API server and the whole cause, once per distinct cause, so by default
    // its line is off (RUST_LOG brings it back).
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,kube_client::client::builder=off"));
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// Every flag of every subcommand can be set from the environment (a DaemonSet or a
    /// Deployment sets env more easily than args): a new flag without `env` fails here.
    #[test]
    fn every_flag_has_an_environment_variable() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>, names: &mut Vec<(String, String)>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") || arg.is_positional() {
                    continue;
                }
                match arg.get_env() {
                    Some(env) => names.push((format!("{path} --{id}"), env.to_string_lossy().into_owned())),
                    None => missing.push(format!("{path} --{}", arg.get_long().unwrap_or(id))),
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing, names);
            }
        }
        let (mut missing, mut names) = (Vec::new(), Vec::new());
        walk(&Cli::command(), "local-static-provisioner", &mut missing, &mut names);
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
        assert!(names.len() > 30, "the walk reached the subcommands' flags: {names:?}");
        for (flag, env) in &names {
            assert!(
                env.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{flag}: environment variable {env:?} is not UPPER_SNAKE_CASE"
            );
        }
        // The names deployments already use stay as they are.
        for (flag, env) in [
            ("run --node_name", "MY_NODE_NAME"),
            ("run --config_dir", "CONFIG_DIR"),
            ("run --kubeconfig", "KUBECONFIG"),
            ("run --kubelet_dir", "KUBELET_DIR"),
            ("discover --node_name", "MY_NODE_NAME"),
        ] {
            let full = format!("local-static-provisioner {flag}");
            assert!(names.contains(&(full.clone(), env.to_string())), "{full} should read {env}: {names:?}");
        }
    }

    #[test]
    fn a_kubeconfig_list_from_the_environment_is_left_to_kube() {
        let list = std::ffi::OsString::from("/a/config:/b/config");
        assert_eq!(kubeconfig_file(Some(PathBuf::from(&list)), Some(list.clone())), None);
        let one = std::ffi::OsString::from("/a/config");
        assert_eq!(kubeconfig_file(Some(PathBuf::from(&one)), Some(one.clone())), Some(PathBuf::from("/a/config")));
        // A flag given on the command line is always used as it is.
        assert_eq!(kubeconfig_file(Some(PathBuf::from("/c/config")), Some(list)), Some(PathBuf::from("/c/config")));
        assert_eq!(kubeconfig_file(None, None), None);
    }

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["node-1", "ip-10-0-0-1.ec2.internal", "a", &"a".repeat(253)] {
            assert_eq!(parse_node_name(good).as_deref(), Ok(good));
        }
        for (bad, says) in [
            ("", "the Node name is empty"),
            ("Node1", "'N' is not allowed"),
            ("node_1", "'_' is not allowed"),
            ("-node", "must start and end"),
            ("node-", "must start and end"),
            ("a..b", "must start and end"),
            (".a", "must start and end"),
            ("node 1", "' ' is not allowed"),
            (&"a".repeat(254), "254 characters, at most 253"),
        ] {
            let err = parse_node_name(bad).expect_err(bad);
            assert!(err.contains(says), "{bad:?}: {err}");
            assert!(err.contains("--node-name") && err.contains("MY_NODE_NAME"), "names the flag and env: {err}");
        }
    }

    #[test]
    fn empty_node_name_is_refused_at_parse_time_by_every_subcommand_taking_it() {
        for sub in ["run", "discover"] {
            let err = Cli::try_parse_from(["lsp", sub, "--node-name", ""]).expect_err(sub);
            let text = err.to_string();
            assert!(text.contains("--node-name") && text.contains("MY_NODE_NAME"), "{sub}: {text}");
            let err = Cli::try_parse_from(["lsp", sub, "--node-name", "Bad_Name"]).expect_err(sub);
            assert!(err.to_string().contains("not a valid Node name"), "{sub}: {err}");
        }
    }

    #[test]
    fn node_uid_must_be_the_api_servers_uuid() {
        let uid = "0b9d5a4c-2f4e-4c55-9a51-1a1e3c1e6f7d";
        assert_eq!(parse_node_uid(uid).as_deref(), Ok(uid));
        for bad in [
            "",
            "REPLACE-WITH-NODE-UID",
            "node-1",
            "0B9D5A4C-2F4E-4C55-9A51-1A1E3C1E6F7D",
            "0b9d5a4c2f4e4c559a511a1e3c1e6f7d",
        ] {
            let err = parse_node_uid(bad).expect_err(bad);
            assert!(err.contains("kubectl get node NODE -o jsonpath='{.metadata.uid}'"), "{err}");
        }
        assert!(parse_node_uid(PLACEHOLDER_NODE_UID).is_err(), "the placeholder can never reach an owner reference");
    }
}
