//! `kubectl local-storage prepare [--node NODE] [DISK]`: how to clear a disk that holds old data
//! so a class can claim it. It changes nothing: the wipe is node-side (`local-static-provisioner
//! wipe-disk`, src/cli/wipe_disk.rs and docs/devices.md), because only the agent on the host can
//! prove that nothing uses the disk (not mounted, held or open by any process, no discovery
//! entry leads to it, no PV has it), which nothing the API holds can show. So this prints the
//! exact commands, with the node's agent pod and the disk's stable ID filled in from the
//! inventory when they are known. Pure: the text is a function of the inventories listed.

use std::fmt::Write as _;

use crate::api::inventory::LocalStorageNode;
use crate::core::cluster::inventory::DeviceInventory;
use crate::core::volumes::capacity::iec;

/// The binary's path in the agent's image (docs/troubleshooting.md, the tools).
const BINARY: &str = "/usr/local/bin/local-static-provisioner";
/// The agent's container in its pod.
const CONTAINER: &str = "provisioner";
/// The label of the agent's pods (deploy/base/daemonset.yaml, the Helm chart).
const POD_LABEL: &str = "app.kubernetes.io/name=local-static-provisioner";

/// What `prepare` was asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// The node (`--node`), if given.
    pub node: Option<String>,
    /// The disk: its kernel name (`sdb`, `/dev/sdb`), stable ID or by-id name, if given.
    pub disk: Option<String>,
    /// The agent's namespace.
    pub namespace: String,
}

/// Whether `d` is the disk the operator named.
fn names(d: &DeviceInventory, disk: &str) -> bool {
    let bare = disk.strip_prefix("/dev/disk/by-id/").or_else(|| disk.strip_prefix("/dev/")).unwrap_or(disk);
    d.name == bare || d.stable_id.as_deref() == Some(disk) || d.by_id.iter().any(|b| b == bare)
}

/// The text `prepare` prints for `request`, given the inventories listed (`None` when they
/// could not be read: the steps are then printed with placeholders).
pub fn text(inventories: Option<&[LocalStorageNode]>, request: &Request) -> String {
    let mut out = String::new();
    let mut node = request.node.clone();
    let mut id: Option<String> = None;
    if let Some(disk) = &request.disk {
        let mut found: Vec<(&str, &DeviceInventory)> = inventories
            .unwrap_or_default()
            .iter()
            .filter(|n| request.node.as_deref().is_none_or(|want| n.metadata.name.as_deref() == Some(want)))
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n.status.as_ref()?)))
            .flat_map(|(name, s)| s.devices.iter().filter(|d| names(d, disk)).map(move |d| (name, d)))
            .collect();
        found.sort_by_key(|(name, _)| *name);
        match found.as_slice() {
            [] if inventories.is_none() => {}
            [] => {
                let listed = |n: &str| {
                    inventories
                        .unwrap_or_default()
                        .iter()
                        .any(|i| i.metadata.name.as_deref() == Some(n) && i.status.is_some())
                };
                match request.node.as_deref() {
                    Some(n) if !listed(n) => {
                        let _ = writeln!(
                            out,
                            "Node {n} has no inventory yet (agent not running, or older than this version): its disks are not known here."
                        );
                    }
                    place => {
                        let place = place.map_or("any node".to_string(), |n| format!("node {n}"));
                        let _ = writeln!(
                            out,
                            "No disk {disk} in the inventory of {place}: `kubectl local-storage disks` lists them."
                        );
                    }
                }
                out.push('\n');
            }
            [(name, d)] => {
                node = Some(name.to_string());
                id = d.stable_id.clone();
                describe(&mut out, name, d);
            }
            several => {
                let _ = writeln!(out, "{disk} names a disk on several nodes; give --node:");
                for (name, d) in several {
                    let _ = writeln!(
                        out,
                        "  node {name}: {} ({})",
                        d.name,
                        d.stable_id.as_deref().unwrap_or("no stable ID")
                    );
                }
                out.push('\n');
            }
        }
    }
    steps(&mut out, request, node.as_deref(), id.as_deref());
    out
}

/// The disk as the inventory shows it, and what its verdicts mean for a wipe.
fn describe(out: &mut String, node: &str, d: &DeviceInventory) {
    let _ = writeln!(
        out,
        "Disk {} on node {node}: {}, {}, {}",
        d.name,
        iec(d.size),
        d.model.as_deref().unwrap_or("model unknown"),
        d.stable_id.as_deref().map_or("no stable ID".to_string(), |i| format!("id {i}")),
    );
    let _ = writeln!(out, "  content: {}", d.content);
    for v in &d.classes {
        let code = v.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
        let _ = writeln!(out, "  class {}: {}{code}: {}", v.class, v.verdict, v.message);
    }
    if d.classes.iter().any(|v| v.verdict == "Claimed" || v.verdict == "Claiming") {
        let _ = writeln!(
            out,
            "  It is claimed: it is a volume, and wipe-disk refuses a disk a PV has. A released volume is wiped by the \
             agent itself (`kubectl local-storage cleanup PV` asks for it)."
        );
    } else if d.classes.iter().any(|v| v.reason.as_deref() == Some("not-blank")) {
        let _ = writeln!(out, "  It holds old data: this is what wipe-disk is for.");
    }
    if d.stable_id.is_none() {
        let _ = writeln!(
            out,
            "  It has no stable ID: wipe-disk names disks by stable ID only, and no class can claim it either."
        );
    }
    out.push('\n');
}

/// The node-side steps, with what is known filled in.
fn steps(out: &mut String, request: &Request, node: Option<&str>, id: Option<&str>) {
    let ns = &request.namespace;
    let node = node.unwrap_or("<node>");
    let id_known = id.is_some();
    let id = id.unwrap_or("<stable id>");
    let find_id = if id_known {
        String::new()
    } else {
        format!(
            "\n   and the disk's <stable id>: the ID column of `kubectl local-storage disks --node {node}`, exactly\n   as \
             shown (`wwid:...`, `serial:...`, `dm:mpath-...`, `loop:...`, a partition's `.../part<N>@<start>`).\n"
        )
    };
    let _ = write!(
        out,
        "\
The agent never clears data on its own, and neither does this plugin: a disk is wiped on its node,
by the agent's binary, which first proves on the host that nothing uses the disk's data (it, or a
device sharing its data, is not mounted, held or open by any process; no entry of a discovery
directory leads to it; no PV has it). The API cannot show any of that, so the wipe cannot be
asked for from here.

1. Find the agent's pod on node {node}:

   POD=$(kubectl -n {ns} get pod -l {POD_LABEL} \\
         --field-selector spec.nodeName={node} -o name)
{find_id}
2. Dry run: what it would zero, and whether that is allowed or why not (nothing is written;
   exit code 2 when refused):

   kubectl -n {ns} exec \"$POD\" -c {CONTAINER} -- {BINARY} wipe-disk --id '{id}'

3. When the dry run says allowed and the data is not needed, zero it:

   kubectl -n {ns} exec \"$POD\" -c {CONTAINER} -- {BINARY} wipe-disk --id '{id}' --yes

The agent then reads the disk blank and claims it on its next pass: `kubectl local-storage disks
--node {node}` shows it Claimed. More in docs/devices.md (Reusing a disk that holds old data).
"
    );
}

#[cfg(test)]
mod tests {
    use super::super::render::tests::{check_all, fixture};
    use super::*;

    fn request(node: Option<&str>, disk: Option<&str>) -> Request {
        Request {
            node: node.map(String::from),
            disk: disk.map(String::from),
            namespace: "local-static-provisioner".into(),
        }
    }

    #[test]
    fn prepare_matches_the_golden_files() {
        let nodes = fixture();
        let t = |node, disk| text(Some(&nodes), &request(node, disk));
        check_all(vec![
            ("prepare-not-blank.txt", t(Some("worker-1"), Some("sdc"))),
            ("prepare-claimed.txt", t(None, Some("wwid:naa.5000c500a0b1c2d3"))),
            ("prepare-several.txt", t(None, Some("sda"))),
            ("prepare-unknown.txt", t(Some("worker-2"), Some("sdz"))),
            ("prepare-no-inventory.txt", t(Some("worker-3"), Some("sdb"))),
            ("prepare-generic.txt", t(None, None)),
        ]);
    }

    #[test]
    fn a_disk_is_found_by_any_of_its_names() {
        let nodes = fixture();
        for name in [
            "sdc",
            "/dev/sdc",
            "wwid:naa.5000c500a0b1d4e5",
            "wwn-0x5000c500a0b1d4e5",
            "/dev/disk/by-id/wwn-0x5000c500a0b1d4e5",
        ] {
            let out = text(Some(&nodes), &request(None, Some(name)));
            assert!(out.contains("wipe-disk --id 'wwid:naa.5000c500a0b1d4e5' --yes"), "{name}: {out}");
            assert!(out.contains("spec.nodeName=worker-1 "), "{name}: {out}");
        }
    }

    #[test]
    fn without_the_inventory_the_steps_have_placeholders() {
        let out = text(None, &request(Some("worker-7"), Some("sdb")));
        assert!(out.contains("spec.nodeName=worker-7 "), "{out}");
        assert!(out.contains("--id '<stable id"), "{out}");
        assert!(!out.contains("No disk"), "nothing is said about an inventory not read: {out}");
    }
}
