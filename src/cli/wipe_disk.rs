//! `local-static-provisioner wipe-disk --id <stable id> [--yes]`: an operator's explicit wipe of
//! one disk of this node, named by its stable id exactly as `disks` prints it. A disk holding
//! old data is refused by the claim rules forever, and the agent never clears data on its own
//! word; this command does, on the operator's, once core::wipe::operator_wipe's rules prove that
//! nothing uses the disk's data (not mounted, held, open, an entry of a discovery directory or
//! a PV's disk). Without `--yes` it only says what it would zero and why that is allowed or
//! refused. Run on the node (in the agent's pod, which has the host's /dev, /sys and, for the
//! scan of open descriptors, its PID namespace).

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

use crate::api::{ClientOptions, Cluster, node_reference};
use crate::config::ProvisionerConfig;
use crate::core::devices::device_claim::PvDisk;
use crate::core::identity::disk_identity::DiskIdentity;
use crate::core::volumes::naming::{ANN_VOLUME_IDENTITY, LABEL_HOSTNAME, LABEL_NODE, node_label_value};
use crate::core::volumes::pv_facts::PvFacts;
use crate::core::wipe::operator_wipe::{KnownPv, Target, WipeRefusal, WipeWorld, decide, default_timeout, find_target};
use crate::host::devices::claims::pv_disks;
use crate::host::wipe::operator_wipe::{gather, volumes_at, wipe};

/// How long the API gets to answer the reads the decision needs (and the event after).
const API_TIMEOUT: Duration = Duration::from_secs(30);
/// Exit code of a refusal (nothing written); 1 is a failure, 0 a wipe or an allowed dry run.
const REFUSED: u8 = 2;
/// The Event reason on the Node after a wipe.
pub const EVENT_REASON: &str = "DeviceWipedByOperator";

/// What the command was given.
#[derive(Debug)]
pub struct WipeDiskOptions {
    /// The stable id named.
    pub id: String,
    /// Write (without it, a dry run).
    pub yes: bool,
    /// The wipe's deadline; the default grows with the size.
    pub timeout: Option<Duration>,
    /// This node's name.
    pub node_name: String,
    /// How to reach the API.
    pub client: ClientOptions,
    /// The agent's state directory (its claims.json).
    pub state_dir: PathBuf,
    /// The config and the classes left out of it for errors, or why it could not be read.
    pub config: Result<(ProvisionerConfig, Vec<String>), String>,
}

/// Runs the command; see the module documentation.
pub fn run(opts: WipeDiskOptions) -> ExitCode {
    let (config, failed) = match &opts.config {
        Ok(c) => c,
        Err(e) => {
            println!(
                "refused (unscanned): the config cannot be read ({e}), so the discovery directories, whose entries may lead to the disk, are unknown"
            );
            eprintln!("error: refused; nothing was written");
            return ExitCode::from(REFUSED);
        }
    };
    let (mut world, notes) = match gather(config, failed, &opts.state_dir, &opts.id) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for n in notes {
        eprintln!("note: {n}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The API is asked only about a disk that exists.
    let mut cluster = None;
    if find_target(&world.id, &world.devices).is_ok() {
        match runtime.block_on(async { tokio::time::timeout(API_TIMEOUT, api_facts(&opts)).await }) {
            Ok(Ok((pvs, c, node))) => {
                world.pvs = Ok(pvs);
                cluster = node.map(|n| (c, n));
            }
            Ok(Err(e)) => world.pvs = Err(e),
            Err(_) => world.pvs = Err(format!("no answer within {API_TIMEOUT:?}")),
        }
    }
    let decision = decide(&world);
    if let Err(e) = print_plan(&world, &decision) {
        eprintln!("error: writing the plan: {e}");
        return ExitCode::FAILURE;
    }
    let target = match decision {
        Ok(t) => t,
        Err(_) => {
            eprintln!("error: refused; nothing was written");
            return ExitCode::from(REFUSED);
        }
    };
    if !opts.yes {
        println!("dry run: nothing was written; run again with --yes to zero it");
        return ExitCode::SUCCESS;
    }
    let timeout = opts.timeout.unwrap_or_else(|| default_timeout(target.size));
    eprintln!("zeroing /dev/{} ({} bytes, deadline {timeout:?})", target.name, target.size);
    let wiped = match wipe(&target, timeout, &mut progress_printer()) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: the wipe of /dev/{} failed: {e}", target.name);
            return ExitCode::FAILURE;
        }
    };
    let secs = wiped.elapsed.as_secs_f64();
    let rate = wiped.bytes as f64 / (1024.0 * 1024.0) / secs.max(1e-6);
    let summary = format!(
        "wiped /dev/{} (id {}): {} bytes in {secs:.2} s, {rate:.1} MiB/s; {} bytes read back, all zero",
        target.name, target.stable_id, wiped.bytes, wiped.read_back
    );
    println!("{summary}");
    match &wiped.reread {
        Some(Ok(())) => println!("the kernel re-read the partition table: its partitions are gone"),
        Some(Err(e)) => eprintln!(
            "warning: the kernel could not re-read the partition table ({e}); the old partitions stay listed until it does (partx -d, or a reboot)"
        ),
        None => {}
    }
    for (class, name) in &target.own_links {
        println!(
            "the agent's claim link {name} of class {class} leads to it: it is published once the agent sees it blank"
        );
    }
    match cluster {
        Some((c, node)) => {
            let note = format!("{summary}, on an operator's request (wipe-disk)");
            let regarding = node_reference(&node);
            let post = c.try_event(&regarding, false, EVENT_REASON, "WipeDisk", note);
            match runtime.block_on(async { tokio::time::timeout(API_TIMEOUT, post).await }) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("warning: the {EVENT_REASON} event could not be posted: {e}"),
                Err(_) => eprintln!("warning: the {EVENT_REASON} event could not be posted within {API_TIMEOUT:?}"),
            }
        }
        None => eprintln!("note: Node {} could not be read: no {EVENT_REASON} event posted", opts.node_name),
    }
    ExitCode::SUCCESS
}

/// This node's Node (when it can be read) and the cluster's local PVs as the rules see them.
async fn api_facts(opts: &WipeDiskOptions) -> Result<(Vec<KnownPv>, Cluster, Option<Node>), String> {
    let cluster = Cluster::connect_as(&opts.client, "wipe-disk", &opts.node_name).await.map_err(|e| e.to_string())?;
    let node = match cluster.node(&opts.node_name).await {
        Ok(n) => Some(n),
        Err(e) => {
            eprintln!("note: reading Node {}: {e}", opts.node_name);
            None
        }
    };
    let hostname = node
        .as_ref()
        .and_then(|n| n.metadata.labels.as_ref()?.get(LABEL_HOSTNAME).cloned())
        .unwrap_or_else(|| opts.node_name.clone());
    let pvs = cluster.list_pvs_where(|pv| pv.local_path().is_some()).await.map_err(|e| e.to_string())?;
    let label = node_label_value(&opts.node_name);
    let ours: Vec<bool> = pvs.iter().map(|pv| on_node(pv, &opts.node_name, &label, &hostname)).collect();
    // What each of this node's PVs' volumes occupies here (one read of the mount table).
    let paths: Vec<String> = pvs
        .iter()
        .zip(&ours)
        .map(|(pv, ours)| if *ours { pv.local_path().unwrap_or_default().to_string() } else { String::new() })
        .collect();
    let mut volumes = volumes_at(&paths).into_iter();
    let known = pvs
        .iter()
        .zip(ours)
        .map(|(pv, this_node)| {
            let volume = volumes.next().flatten();
            let path = pv.local_path().unwrap_or_default().to_string();
            let identity = pv.annotation(ANN_VOLUME_IDENTITY).cloned();
            let disk = if this_node {
                let mut d = pv_disks(&[(path.clone(), identity)], &Default::default()).remove(0);
                // Any path of this node's PVs that is a device here (not only under /dev).
                if d.device.is_none() {
                    d.device = std::fs::metadata(&path).ok().and_then(|m| device_name(&m));
                }
                d
            } else {
                // Another node's path means nothing here; the disk it recorded may (a LUN
                // shared by several nodes).
                let disk = identity.as_deref().and_then(DiskIdentity::parse).and_then(|id| id.disk);
                PvDisk { host_path: path, disk, device: None, unbound: false }
            };
            KnownPv { name: pv.metadata.name.clone().unwrap_or_default(), this_node, disk, volume }
        })
        .collect();
    Ok((known, cluster, node))
}

/// Kernel name of the block device `meta` describes.
fn device_name(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !meta.file_type().is_block_device() {
        return None;
    }
    let sys = format!("/sys/dev/block/{}:{}", nix::sys::stat::major(meta.rdev()), nix::sys::stat::minor(meta.rdev()));
    Some(std::fs::canonicalize(sys).ok()?.file_name()?.to_string_lossy().into_owned())
}

/// Whether a PV is this node's: our node label, its hostname label, or a node affinity term
/// naming the node's hostname (or name).
fn on_node(pv: &PvFacts, node: &str, label: &str, hostname: &str) -> bool {
    let names = |v: &str| v == node || v == hostname;
    pv.label(LABEL_NODE).is_some_and(|l| l == label)
        || pv.label(LABEL_HOSTNAME).is_some_and(|h| names(h))
        || pv.spec.node_affinity.as_ref().and_then(|a| a.required.as_ref()).is_some_and(|r| {
            r.node_selector_terms.iter().any(|t| {
                t.match_expressions
                    .iter()
                    .flatten()
                    .any(|e| e.key == LABEL_HOSTNAME && e.values.iter().flatten().any(|v| names(v)))
            })
        })
}

/// Prints the device named, and whether its wipe is allowed or every rule refusing it.
fn print_plan(world: &WipeWorld, decision: &Result<Target, Vec<WipeRefusal>>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    if let Ok(d) = find_target(&world.id, &world.devices) {
        let kind = d.kind.as_ref().map(ToString::to_string).unwrap_or_else(|| "?".into());
        writeln!(out, "disk /dev/{} ({}) {kind} {} bytes, id {}", d.name, d.dev, d.size, world.id)?;
        if !d.partitions.is_empty() {
            writeln!(out, "  partitions {} (their table is zeroed too)", d.partitions.join(" "))?;
        }
        if !d.sharing.is_empty() {
            writeln!(out, "  shares data with {}", d.sharing.join(" "))?;
        }
    }
    match decision {
        Ok(t) => {
            writeln!(
                out,
                "allowed: not mounted, held or open (it or anything sharing its data), no entry of a discovery directory leads to it, no PV has it"
            )?;
            for (class, name) in &t.own_links {
                writeln!(out, "  the agent's own claim link {name} of class {class} leads to it (no PV): allowed")?;
            }
            writeln!(out, "would zero every byte of /dev/{} ({} bytes)", t.name, t.size)?;
        }
        Err(refusals) => {
            for r in refusals {
                writeln!(out, "refused ({}): {r}", r.code())?;
            }
        }
    }
    Ok(())
}

/// Progress on stderr: percent and rate, at most once a second and at the end.
fn progress_printer() -> impl FnMut(u64, u64) {
    let started = Instant::now();
    let mut last: Option<(Instant, u64)> = None;
    move |done, total| {
        let now = Instant::now();
        let recent = last.is_some_and(|(at, _)| now.duration_since(at) < Duration::from_secs(1));
        if last.is_some_and(|(_, d)| d == done) || (done < total && recent) {
            return;
        }
        last = Some((now, done));
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let rate = mib(done) / now.duration_since(started).as_secs_f64().max(1e-6);
        let pct = if total == 0 { 100.0 } else { done as f64 * 100.0 / total as f64 };
        eprintln!("wipe-disk: {pct:.0}% ({:.1} of {:.1} MiB), {rate:.1} MiB/s", mib(done), mib(total));
    }
}
