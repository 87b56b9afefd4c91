//! The kubectl plugin (issue 31): the same binary, installed as `kubectl-local_storage` (kubectl
//! turns `kubectl local-storage` into a lookup of `kubectl-local_storage` on PATH), so that one
//! release ships the agent and the operator's view of every node. `main.rs` dispatches here on
//! the file name of argv[0]; the plugin has its own clap parser (`kubectl local-storage`), so
//! the agent's commands and the plugin's never mix.
//!
//! - `disks` and `volumes` read the cluster-wide inventory (one paged list of `LocalStorageNode`
//!   objects, core::cluster::inventory) and print it (render.rs, pure, golden-tested), filtered by node
//!   and class, as a table or the objects (`-o json|yaml`);
//! - `cleanup PV...` is the main binary's `cleanup` (the wipe-and-recycle request);
//! - `release-hold --node N UID...` releases holds another node's word put on node N's disks
//!   (an annotation on N's LocalStorageNode, which no agent token may write; core::identity::disk_trust);
//! - `prepare` explains how to clear a disk that holds old data (prepare.rs): node-side, with
//!   `wipe-disk`, because only the agent on the host can prove that nothing uses the disk.

pub mod prepare;
pub mod render;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::api::inventory::LocalStorageNode;
use crate::api::{ApiError, ClientOptions, Cluster};
use render::{Filter, Format};

/// The file name kubectl looks for on PATH for `kubectl local-storage`.
pub const PLUGIN_FILE_NAME: &str = "kubectl-local_storage";

/// The CRD the plugin reads (deploy/base/crd.yaml).
const CRD: &str = "localstoragenodes.local-static-provisioner.io";

/// Why the plugin could not answer.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The API server does not serve the inventory's kind.
    #[error(
        "the API server does not know LocalStorageNode objects: install the CustomResourceDefinition {CRD} \
         (deploy/base/crd.yaml, `kubectl apply -k deploy/base`, or the Helm chart of this version)"
    )]
    CrdMissing,
    /// Connecting or listing failed.
    #[error("{0}")]
    Api(#[from] ApiError),
    /// The answer could not be printed.
    #[error("{0}")]
    Render(#[from] render::RenderError),
}

/// Whether the process was started as the kubectl plugin: the file name of argv[0] (a symlink's
/// own name, which kubectl passes as it found it on PATH).
pub fn invoked_as_plugin(argv0: Option<&OsStr>) -> bool {
    argv0.and_then(|a| Path::new(a).file_name()).is_some_and(|name| name == PLUGIN_FILE_NAME)
}

/// The local disks and volumes of every node, as their local-static-provisioner agents report
/// them (LocalStorageNode objects), and requests to wipe volumes.
#[derive(Debug, Parser)]
#[command(name = "kubectl local-storage", bin_name = "kubectl local-storage", version, about)]
pub struct Plugin {
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Every node's block devices: size, model, stable ID, what each class with a `devices`
    /// section makes of it (Claimed, NotSelected, Refused and why, Held), and what the agent
    /// found on it.
    Disks(ListArgs),
    /// Every node's volumes: discovery entries and PVs, phase, claim, flags (missing, stale,
    /// failing...) or why an entry is not published; then the Available capacity per node
    /// and class.
    Volumes(ListArgs),
    /// Ask the agents to wipe and recycle PVs (sets the cleanup annotation, as
    /// `local-static-provisioner cleanup` does).
    ///
    /// A Released PV is wiped whatever its reclaim policy; an Available PV is withdrawn first
    /// so it cannot be bound during the wipe; a Bound PV is refused.
    Cleanup(CleanupArgs),
    /// Release the hold another node's record puts on a node's block disk: the record (a
    /// used-disk record of another node's LocalStorageNode, or an unclaimed PV of another node
    /// naming the disk) is written with that node's credentials only, so the agent holds the
    /// disk and does not wipe it on that word. Released, the disk is wiped first, then
    /// published. The UIDs are those `disks` and `volumes` show for held disks
    /// (`status.held`). A claim bound on another node is not released by word.
    ReleaseHold(ReleaseHoldArgs),
    /// How to clear a disk that holds old data so a class can claim it: the node-side
    /// `wipe-disk` steps, with the node's agent pod and the disk's stable ID filled in. Changes
    /// nothing.
    Prepare(PrepareArgs),
}

/// The agent's namespace when `--namespace` is not given.
const AGENT_NAMESPACE: &str = "local-static-provisioner";

/// kubectl's connection flags, which kubectl does not pass to plugins (they go after the
/// command: `kubectl local-storage disks --context prod`).
#[derive(Debug, Args)]
struct ConnectArgs {
    #[arg(long, env = "KUBECONFIG", long_help = super::KUBECONFIG_HELP)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context), as kubectl's --context.
    #[arg(long, env = "KUBECTL_LOCAL_STORAGE_CONTEXT")]
    context: Option<String>,
    /// Act as this user (impersonation, as kubectl's --as; you need the `impersonate` verb).
    #[arg(long = "as", env = "KUBECTL_LOCAL_STORAGE_AS", value_name = "USER")]
    impersonate: Option<String>,
    /// Act as this group too (repeatable or comma-separated), as kubectl's --as-group.
    #[arg(long = "as-group", env = "KUBECTL_LOCAL_STORAGE_AS_GROUP", value_name = "GROUP", value_delimiter = ',')]
    impersonate_groups: Vec<String>,
    /// The agent's namespace (with Helm, the release's; default local-static-provisioner): the
    /// commands `prepare` prints use it. The inventory and PVs are cluster-scoped, so the other
    /// commands accept it and read the same objects, as `kubectl get pv -n NS` does.
    #[arg(short = 'n', long, env = "KUBECTL_LOCAL_STORAGE_NAMESPACE")]
    namespace: Option<String>,
}

impl ConnectArgs {
    fn client(self) -> ClientOptions {
        ClientOptions {
            kubeconfig: super::kubeconfig_file(self.kubeconfig, std::env::var_os("KUBECONFIG")),
            qps: 20,
            burst: 40,
            context: self.context,
            impersonate: self.impersonate,
            impersonate_groups: self.impersonate_groups,
        }
    }
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Only these nodes (repeatable or comma-separated). A node named without an inventory is
    /// said so.
    #[arg(long, env = "KUBECTL_LOCAL_STORAGE_NODE", value_delimiter = ',')]
    node: Vec<String>,
    /// Only this StorageClass: disks with a verdict of it, its volumes.
    #[arg(long, env = "KUBECTL_LOCAL_STORAGE_CLASS")]
    class: Option<String>,
    /// Output format: table, wide (more columns), or the LocalStorageNode objects as json or
    /// yaml (a v1 List, narrowed by the filters).
    #[arg(short = 'o', long, env = "KUBECTL_LOCAL_STORAGE_OUTPUT", value_enum, default_value = "table")]
    output: Format,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
struct CleanupArgs {
    /// Names of the PVs to wipe and recycle.
    #[arg(required = true)]
    pvs: Vec<String>,
    /// Follow each request until the PV is Available again, refused, or the timeout passes.
    #[arg(long, env = "CLEANUP_WAIT")]
    wait: bool,
    /// How long --wait follows a request (Go duration).
    #[arg(long, env = "CLEANUP_TIMEOUT", default_value = "30m", value_parser = super::parse_duration)]
    timeout: Duration,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
struct ReleaseHoldArgs {
    /// The node whose disk is held (its LocalStorageNode gets the release).
    #[arg(long, env = "KUBECTL_LOCAL_STORAGE_NODE", required = true)]
    node: String,
    /// The UIDs (or PV names) of the records whose holds to release.
    #[arg(required = true)]
    records: Vec<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

#[derive(Debug, Args)]
struct PrepareArgs {
    /// The disk: its kernel name (sdb), stable ID or /dev/disk/by-id name, as `disks` shows it.
    /// Without it, the steps with placeholders.
    disk: Option<String>,
    /// The node the disk is on (needed when the name is not unique in the cluster).
    #[arg(long, env = "KUBECTL_LOCAL_STORAGE_NODE")]
    node: Option<String>,
    #[command(flatten)]
    connect: ConnectArgs,
}

/// Runs the plugin's command and maps its outcome to an exit code.
pub fn main(plugin: Plugin) -> ExitCode {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match plugin.command {
        PluginCommand::Disks(args) => rt.block_on(list(args, render::disks)),
        PluginCommand::Volumes(args) => rt.block_on(list(args, render::volumes)),
        PluginCommand::Cleanup(args) => {
            rt.block_on(super::cleanup::run(args.pvs, args.connect.client(), args.wait, args.timeout))
        }
        PluginCommand::Prepare(args) => rt.block_on(prepare(args)),
        PluginCommand::ReleaseHold(args) => rt.block_on(release_hold(args)),
    }
}

async fn release_hold(args: ReleaseHoldArgs) -> ExitCode {
    let result = async {
        let cluster = Cluster::connect_as(&args.connect.client(), "kubectl-plugin", PLUGIN_FILE_NAME).await?;
        let held = match cluster.get_inventory(&args.node).await? {
            crate::api::inventory::Found::Present { status, .. } => status.map(|s| s.held).unwrap_or_default(),
            crate::api::inventory::Found::Absent => {
                return Err(PluginError::Api(ApiError::Config {
                    source_name: args.node.clone(),
                    message: format!("node {} has no LocalStorageNode", args.node),
                }));
            }
        };
        for r in &args.records {
            match held.iter().find(|h| h.uid.as_deref() == Some(r.as_str()) || h.record == *r) {
                Some(h) if h.reason == "claimed-pv" => eprintln!(
                    "warning: {r} is a PV a claim is bound to; a release does not lift that hold (delete the PV if its data may go)"
                ),
                Some(_) => {}
                None => eprintln!("note: node {} shows no disk held by {r} now; the release is kept for when it does", args.node),
            }
        }
        Ok::<_, PluginError>(cluster.release_holds(&args.node, &args.records).await?)
    }
    .await;
    match result {
        Ok(released) => {
            println!(
                "holds released on node {}: {} (its agent wipes such a disk, then publishes it, at its next look)",
                args.node,
                released.join(", ")
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

type Renderer = fn(&[LocalStorageNode], &Filter, Format) -> Result<String, render::RenderError>;

async fn list(args: ListArgs, render: Renderer) -> ExitCode {
    let filter = Filter { nodes: args.node, class: args.class };
    let result = async {
        let nodes = inventories(args.connect.client(), &filter.nodes).await?;
        let text = render(&nodes, &filter, args.output)?;
        Ok::<_, PluginError>((text, render::notes(&nodes, &filter)))
    }
    .await;
    match result {
        Ok((text, notes)) => {
            print!("{text}");
            // The table ends with its notes; a script's JSON or YAML must stay parseable.
            if matches!(args.output, Format::Json | Format::Yaml) {
                for note in notes {
                    eprintln!("{note}");
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn prepare(args: PrepareArgs) -> ExitCode {
    let namespace = args.connect.namespace.clone().unwrap_or_else(|| AGENT_NAMESPACE.to_string());
    let request = prepare::Request { node: args.node.clone(), disk: args.disk, namespace };
    // The steps are worth printing even when the inventory cannot be read.
    let nodes = match inventories(args.connect.client(), args.node.as_slice()).await {
        Ok(nodes) => Some(nodes),
        Err(e) => {
            eprintln!(
                "warning: the inventory could not be read, so the node and the disk's stable ID are not filled in: {e}"
            );
            None
        }
    };
    print!("{}", prepare::text(nodes.as_deref(), &request));
    ExitCode::SUCCESS
}

/// Every node's inventory (one paged list), or only those of `nodes` when named (selected by
/// the API server).
async fn inventories(client: ClientOptions, nodes: &[String]) -> Result<Vec<LocalStorageNode>, PluginError> {
    let cluster = Cluster::connect_as(&client, "kubectl-plugin", PLUGIN_FILE_NAME).await?;
    list_inventories(&cluster, nodes).await
}

/// The list, with a 404 (the API server does not serve the kind) said as the CRD to install.
async fn list_inventories(cluster: &Cluster, nodes: &[String]) -> Result<Vec<LocalStorageNode>, PluginError> {
    let listed =
        if nodes.is_empty() { cluster.list_inventories().await } else { cluster.list_inventories_of(nodes).await };
    match listed {
        Ok(nodes) => Ok(nodes),
        Err(e) if e.is_not_found() => Err(PluginError::CrdMissing),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    /// A cluster without the CRD answers the list with a 404: the error names the CRD.
    #[tokio::test]
    async fn a_missing_crd_is_named() {
        use hyper::{Response, StatusCode};
        use kube::client::Body;

        let (service, mut handle) = tower_test::mock::pair::<hyper::Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("a list request");
            let status = serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                "message": "the server could not find the requested resource",
            });
            let mut response = Response::new(Body::from(serde_json::to_vec(&status).expect("serializes")));
            *response.status_mut() = StatusCode::NOT_FOUND;
            respond.send_response(response);
            request.uri().to_string()
        });
        let opts = ClientOptions { kubeconfig: None, qps: 100, burst: 100, ..Default::default() };
        let cluster = Cluster::from_client(kube::Client::new(service, "default"), &opts, "test");
        let err = list_inventories(&cluster, &[]).await.expect_err("no CRD");
        let uri = server.await.expect("the mock server ran");
        assert!(uri.starts_with("/apis/local-static-provisioner.io/v1alpha1/localstoragenodes?"), "{uri}");
        assert!(matches!(err, PluginError::CrdMissing), "{err:?}");
        assert!(err.to_string().contains(CRD) && err.to_string().contains("deploy/base/crd.yaml"), "{err}");
        use kube::core::CustomResourceExt as _;
        assert_eq!(CRD, LocalStorageNode::crd_name(), "the name of the CRD the types make");
    }

    #[test]
    fn clap_definition_is_consistent() {
        Plugin::command().debug_assert();
    }

    #[test]
    fn only_the_plugin_file_name_selects_the_plugin() {
        let yes = |s: &str| invoked_as_plugin(Some(OsStr::new(s)));
        assert!(yes("kubectl-local_storage"));
        assert!(yes("/home/me/.krew/bin/kubectl-local_storage"));
        assert!(!yes("local-static-provisioner"));
        assert!(!yes("/usr/local/bin/local-static-provisioner"));
        assert!(!yes("kubectl-local-storage"));
        assert!(!invoked_as_plugin(None));
    }

    /// As for the main binary's commands (cli::tests): every flag can be set from the
    /// environment.
    #[test]
    fn every_flag_has_an_environment_variable() {
        let mut missing = Vec::new();
        for sub in Plugin::command().get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if !matches!(id, "help" | "version") && !arg.is_positional() && arg.get_env().is_none() {
                    missing.push(format!("{} --{id}", sub.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "flags without an environment variable: {missing:?}");
    }

    #[test]
    fn flags_parse_as_kubectl_users_write_them() {
        let p = Plugin::try_parse_from([
            "kubectl-local_storage",
            "disks",
            "--node",
            "a,b",
            "--node=c",
            "--class",
            "fast",
            "-o",
            "yaml",
        ])
        .unwrap();
        let PluginCommand::Disks(args) = p.command else { panic!("disks") };
        assert_eq!(args.node, ["a", "b", "c"]);
        assert_eq!((args.class.as_deref(), args.output), (Some("fast"), Format::Yaml));
        let p = Plugin::try_parse_from(["kubectl-local_storage", "prepare", "--node", "w1", "sdb"]).unwrap();
        let PluginCommand::Prepare(args) = p.command else { panic!("prepare") };
        assert_eq!((args.node.as_deref(), args.disk.as_deref()), (Some("w1"), Some("sdb")));
        // kubectl's connection flags, after the command as kubectl leaves them to plugins.
        let p = Plugin::try_parse_from([
            "kubectl-local_storage",
            "volumes",
            "--context",
            "prod",
            "--as",
            "jane",
            "--as-group=ops,audit",
            "-n",
            "storage",
        ])
        .unwrap();
        let PluginCommand::Volumes(args) = p.command else { panic!("volumes") };
        assert_eq!(args.connect.namespace.as_deref(), Some("storage"));
        let client = args.connect.client();
        assert_eq!((client.context.as_deref(), client.impersonate.as_deref()), (Some("prod"), Some("jane")));
        assert_eq!(client.impersonate_groups, ["ops", "audit"]);
        assert!(Plugin::try_parse_from(["kubectl-local_storage", "cleanup"]).is_err(), "cleanup needs a PV");
        let release = ["kubectl-local_storage", "release-hold", "--node", "worker-2", "u-1", "u-2"];
        let Plugin { command: PluginCommand::ReleaseHold(args) } = Plugin::try_parse_from(release).unwrap() else {
            panic!("release-hold")
        };
        assert_eq!((args.node.as_str(), args.records), ("worker-2", vec!["u-1".to_string(), "u-2".to_string()]));
        let no_node = ["kubectl-local_storage", "release-hold", "u-1"];
        assert!(Plugin::try_parse_from(no_node).is_err(), "release-hold needs the node");
        let help = Plugin::command().render_help().to_string();
        assert!(help.contains("kubectl local-storage"), "{help}");
    }
}
