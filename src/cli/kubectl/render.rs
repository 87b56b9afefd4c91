//! What `kubectl local-storage disks` and `volumes` print, from the inventories as listed:
//! pure functions of `&[LocalStorageNode]` and the filters, so that every output is a golden
//! file of the tests (tests/golden/kubectl-plugin/) and the command itself only lists and prints.
//!
//! Tables read like kubectl's (upper-case headers, columns three spaces apart, `-` for nothing),
//! sizes are IEC (`crate::core::volumes::capacity::iec`, as the printer columns' `availableCapacity`).
//! `-o json|yaml` prints the objects as the API holds them (a `v1` `List`, managed fields left
//! out as kubectl does), narrowed by the same filters: for scripts.

use kube::Resource as _;
use serde_json::json;

use crate::api::inventory::LocalStorageNode;
use crate::core::cluster::inventory::{DeviceInventory, InventoryStatus, VolumeInventory};
use crate::core::volumes::capacity::iec;

/// What the API answer could not be turned into.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// An object did not serialise as JSON (it came from JSON: not expected).
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The same, as YAML.
    #[error("writing YAML: {0}")]
    Yaml(String),
}

/// How to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table.
    Table,
    /// A table with more columns.
    Wide,
    /// The objects, as a JSON `List`.
    Json,
    /// The objects, as YAML.
    Yaml,
}

/// Which nodes and which class to show (empty: all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Node names; empty shows every node.
    pub nodes: Vec<String>,
    /// A StorageClass; `None` shows every class.
    pub class: Option<String>,
}

impl Filter {
    fn node(&self, name: &str) -> bool {
        self.nodes.is_empty() || self.nodes.iter().any(|n| n == name)
    }

    fn class(&self, class: &str) -> bool {
        self.class.as_deref().is_none_or(|c| c == class)
    }

    fn device(&self, d: &DeviceInventory) -> bool {
        self.class.is_none() || d.classes.iter().any(|v| self.class(&v.class))
    }
}

/// The inventories a filter selects, sorted by node name, and the nodes it names that have none.
struct Selection<'a> {
    /// Objects with a status.
    shown: Vec<(&'a str, &'a InventoryStatus)>,
    /// Every selected object, with or without status (for `-o json|yaml`).
    objects: Vec<&'a LocalStorageNode>,
    /// Notes about nodes: no inventory, an invalid configuration, unknown keys.
    notes: Vec<String>,
}

fn select<'a>(nodes: &'a [LocalStorageNode], filter: &Filter) -> Selection<'a> {
    let mut objects: Vec<&LocalStorageNode> =
        nodes.iter().filter(|n| filter.node(n.metadata.name.as_deref().unwrap_or_default())).collect();
    objects.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut shown = Vec::new();
    let mut notes = Vec::new();
    let no_inventory =
        |name: &str| format!("node {name}: no inventory yet (agent not running, or older than this version)");
    for object in &objects {
        let name = object.metadata.name.as_deref().unwrap_or_default();
        match &object.status {
            Some(status) => {
                if !status.agent.config_valid {
                    let why = status.agent.config_problem.as_deref().unwrap_or("no reason given");
                    notes.push(format!(
                        "node {name}: the configuration on disk is invalid ({why}); the agent runs its last valid one"
                    ));
                }
                if !status.agent.unknown_keys.is_empty() {
                    notes.push(format!(
                        "node {name}: configuration keys the agent does not know, ignored: {}",
                        status.agent.unknown_keys.join(", ")
                    ));
                }
                shown.push((name, status));
            }
            None => notes.push(no_inventory(name)),
        }
    }
    let mut absent: Vec<&String> = filter
        .nodes
        .iter()
        .filter(|n| !objects.iter().any(|o| o.metadata.name.as_deref() == Some(n.as_str())))
        .collect();
    absent.sort();
    absent.dedup();
    notes.extend(absent.into_iter().map(|n| no_inventory(n)));
    Selection { shown, objects, notes }
}

/// The notes a command prints about the nodes a filter selects (on stderr with `-o json|yaml`,
/// after the table otherwise).
pub fn notes(nodes: &[LocalStorageNode], filter: &Filter) -> Vec<String> {
    select(nodes, filter).notes
}

/// `disks`: one row per device of each node (with a class filter, devices with a verdict of
/// that class), or the objects.
pub fn disks(nodes: &[LocalStorageNode], filter: &Filter, format: Format) -> Result<String, RenderError> {
    let selection = select(nodes, filter);
    let wide = match format {
        Format::Json | Format::Yaml => return objects(&selection, filter, format),
        Format::Table => false,
        Format::Wide => true,
    };
    let mut header = vec!["NODE", "NAME", "SIZE", "TYPE"];
    if wide {
        header.extend(["ROTATIONAL", "MODEL", "ID", "BY-ID"]);
    } else {
        header.extend(["MODEL", "ID"]);
    }
    header.extend(["CLASSES", "CONTENT"]);
    let mut rows = Vec::new();
    for (node, status) in &selection.shown {
        for d in status.devices.iter().filter(|d| filter.device(d)) {
            let mut row = vec![node.to_string(), d.name.clone(), iec(d.size), or_dash(d.kind.as_deref())];
            if wide {
                let rotational = match d.rotational {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                };
                row.push(rotational.into());
            }
            row.push(or_dash(d.model.as_deref()));
            row.push(or_dash(d.stable_id.as_deref()));
            if wide {
                row.push(if d.by_id.is_empty() { "-".into() } else { d.by_id.join(",") });
            }
            let verdicts: Vec<String> = d
                .classes
                .iter()
                .filter(|v| filter.class(&v.class))
                .map(|v| match &v.reason {
                    Some(reason) => format!("{}: {} ({reason})", v.class, v.verdict),
                    None => format!("{}: {}", v.class, v.verdict),
                })
                .collect();
            row.push(if verdicts.is_empty() { "-".into() } else { verdicts.join(", ") });
            row.push(or_dash(Some(&d.content)));
            rows.push(row);
        }
    }
    let mut out = if rows.is_empty() { "No disks found.\n".to_string() } else { table(&header, &rows) };
    let mut notes = held_notes(&selection);
    notes.extend(selection.notes.iter().cloned());
    append_notes(&mut out, &notes);
    Ok(out)
}

/// One note per disk another node's PV or record holds back, with the command that releases a
/// hold that rests on one node's word.
fn held_notes(selection: &Selection<'_>) -> Vec<String> {
    let mut notes = Vec::new();
    for (node, status) in &selection.shown {
        for h in &status.held {
            let mut note = format!("{node}: {} is held: {}", h.path, h.message);
            if h.reason != "claimed-pv"
                && let Some(uid) = &h.uid
            {
                note.push_str(&format!(" (release: kubectl local-storage release-hold --node {node} {uid})"));
            }
            notes.push(note);
        }
    }
    notes
}

/// `volumes`: one row per discovery entry or PV of each node (with a class filter, of that
/// class), then the Available capacity per node and class.
pub fn volumes(nodes: &[LocalStorageNode], filter: &Filter, format: Format) -> Result<String, RenderError> {
    let selection = select(nodes, filter);
    let wide = match format {
        Format::Json | Format::Yaml => return objects(&selection, filter, format),
        Format::Table => false,
        Format::Wide => true,
    };
    let mut header = vec!["NODE", "CLASS", "PATH", "PV", "PHASE", "CAPACITY", "CLAIM", "FLAGS"];
    if wide {
        header.push("REASON");
    }
    header.push("MESSAGE");
    let mut rows = Vec::new();
    for (node, status) in &selection.shown {
        for v in status.volumes.iter().filter(|v| filter.class(&v.class)) {
            rows.push(volume_row(node, v, wide));
        }
    }
    let mut out = if rows.is_empty() { "No volumes found.\n".to_string() } else { table(&header, &rows) };
    let summary = capacity_summary(&selection, filter);
    if !summary.is_empty() {
        out.push('\n');
        out.push_str(&summary);
    }
    append_notes(&mut out, &selection.notes);
    Ok(out)
}

fn volume_row(node: &str, v: &VolumeInventory, wide: bool) -> Vec<String> {
    let mut row = vec![
        node.to_string(),
        v.class.clone(),
        v.path.clone(),
        or_dash(v.pv.as_deref()),
        v.phase.clone(),
        v.capacity_bytes.map_or_else(|| "-".into(), iec),
        or_dash(v.claim.as_deref()),
        if v.flags.is_empty() { "-".into() } else { v.flags.join(",") },
    ];
    if wide {
        row.push(or_dash(v.reason.as_deref()));
        row.push(or_dash(v.message.as_deref()));
    } else {
        // The words when there are some, else the code.
        row.push(or_dash(v.message.as_deref().or(v.reason.as_deref())));
    }
    row
}

/// Per node and class (the status's `classes`): PVs, Available PVs and their capacity, with
/// the total of what is shown.
fn capacity_summary(selection: &Selection<'_>, filter: &Filter) -> String {
    let header = ["NODE", "CLASS", "MODE", "VOLUMES", "AVAILABLE", "AVAILABLE CAPACITY"];
    let mut rows = Vec::new();
    let (mut volumes, mut available, mut bytes) = (0u64, 0u64, 0u64);
    for (node, status) in &selection.shown {
        for c in status.classes.iter().filter(|c| filter.class(&c.name)) {
            volumes += u64::from(c.volumes);
            available += u64::from(c.available);
            bytes = bytes.saturating_add(c.available_bytes);
            rows.push(vec![
                node.to_string(),
                c.name.clone(),
                or_dash(Some(&c.volume_mode)),
                c.volumes.to_string(),
                c.available.to_string(),
                iec(c.available_bytes),
            ]);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    rows.push(vec![
        "total".into(),
        String::new(),
        String::new(),
        volumes.to_string(),
        available.to_string(),
        iec(bytes),
    ]);
    table(&header, &rows)
}

/// The selected objects as a `v1` `List`: with a class filter, each status keeps only the
/// devices with a verdict of that class and the volumes and classes of that class.
fn objects(selection: &Selection<'_>, filter: &Filter, format: Format) -> Result<String, RenderError> {
    let mut items = Vec::new();
    for object in &selection.objects {
        let mut metadata = object.metadata.clone();
        metadata.managed_fields = None;
        let mut item = json!({
            "apiVersion": LocalStorageNode::api_version(&()),
            "kind": LocalStorageNode::kind(&()),
            "metadata": metadata,
            "spec": object.spec,
        });
        if let Some(status) = &object.status {
            let mut status = status.clone();
            if filter.class.is_some() {
                status.devices.retain(|d| filter.device(d));
                status.volumes.retain(|v| filter.class(&v.class));
                status.classes.retain(|c| filter.class(&c.name));
            }
            item["status"] = serde_json::to_value(&status)?;
        }
        items.push(item);
    }
    let list = json!({ "apiVersion": "v1", "kind": "List", "items": items });
    match format {
        Format::Yaml => serde_saphyr::to_string(&list).map_err(|e| RenderError::Yaml(e.to_string())),
        _ => Ok(serde_json::to_string_pretty(&list)? + "\n"),
    }
}

fn or_dash(s: Option<&str>) -> String {
    match s {
        Some(s) if !s.is_empty() => s.to_string(),
        _ => "-".into(),
    }
}

fn append_notes(out: &mut String, notes: &[String]) {
    if notes.is_empty() {
        return;
    }
    out.push('\n');
    for note in notes {
        out.push_str(note);
        out.push('\n');
    }
}

/// Columns padded to their widest cell and three spaces apart, as kubectl prints; the last
/// column is not padded (no trailing spaces). Widths count characters, not bytes.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(&widths).enumerate() {
            if i > 0 {
                line.push_str("   ");
            }
            line.push_str(cell);
            if i + 1 < row.len() {
                line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::PathBuf;

    use serde_json::Value;

    use super::*;

    /// The fixture inventories (tests/fixtures/kubectl-plugin/inventories.json): worker-1 with
    /// claimed, refused and held devices and plain, missing, unpublished and deleting volumes;
    /// worker-2 with one claimed disk; worker-3 without status.
    pub(crate) fn fixture() -> Vec<LocalStorageNode> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubectl-plugin/inventories.json");
        let text = std::fs::read_to_string(&path).unwrap();
        let list: Value = serde_json::from_str(&text).unwrap();
        serde_json::from_value(list["items"].clone()).unwrap()
    }

    /// A line diff (longest common subsequence) of expected and actual, `-`/`+` marked.
    fn diff(expected: &str, actual: &str) -> String {
        let (a, b): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), actual.lines().collect());
        let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in (0..a.len()).rev() {
            for j in (0..b.len()).rev() {
                lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
            }
        }
        let (mut i, mut j, mut out) = (0, 0, String::new());
        while i < a.len() || j < b.len() {
            if i < a.len() && j < b.len() && a[i] == b[j] {
                out.push_str(&format!("  {}\n", a[i]));
                (i, j) = (i + 1, j + 1);
            } else if j < b.len() && (i == a.len() || lcs[i][j + 1] > lcs[i + 1][j]) {
                out.push_str(&format!("+ {}\n", b[j]));
                j += 1;
            } else {
                out.push_str(&format!("- {}\n", a[i]));
                i += 1;
            }
        }
        out
    }

    /// Compares `actual` with tests/golden/kubectl-plugin/`name`; `UPDATE_GOLDEN=1` rewrites the
    /// file instead. The mismatch, with its diff, when they differ.
    pub(crate) fn golden(name: &str, actual: &str) -> Result<(), String> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kubectl-plugin").join(name);
        if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
            std::fs::write(&path, actual).unwrap();
            return Ok(());
        }
        let expected = std::fs::read_to_string(&path)
            .map_err(|e| format!("{name}: {e} (UPDATE_GOLDEN=1 writes it; check it by hand)"))?;
        if expected == actual {
            return Ok(());
        }
        Err(format!(
            "{name} differs from the golden file (- golden, + now; UPDATE_GOLDEN=1 rewrites it):\n{}",
            diff(&expected, actual)
        ))
    }

    /// Checks every case and reports every mismatch at once.
    pub(crate) fn check_all(cases: Vec<(&str, String)>) {
        let failures: Vec<String> = cases.iter().filter_map(|(name, text)| golden(name, text).err()).collect();
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    fn filter(nodes: &[&str], class: Option<&str>) -> Filter {
        Filter { nodes: nodes.iter().map(|n| n.to_string()).collect(), class: class.map(String::from) }
    }

    #[test]
    fn outputs_match_the_golden_files() {
        let nodes = fixture();
        let all = Filter::default();
        let one = filter(&["worker-1"], None);
        let raw = filter(&[], Some("raw"));
        let missing = filter(&["worker-2", "worker-9"], None);
        let d = |f: &Filter, o| disks(&nodes, f, o).unwrap();
        let v = |f: &Filter, o| volumes(&nodes, f, o).unwrap();
        check_all(vec![
            ("disks.txt", d(&all, Format::Table)),
            ("disks-wide.txt", d(&all, Format::Wide)),
            ("disks.json", d(&all, Format::Json)),
            ("disks.yaml", d(&all, Format::Yaml)),
            ("disks-node-worker-1.txt", d(&one, Format::Table)),
            ("disks-class-raw.txt", d(&raw, Format::Table)),
            ("disks-class-raw.json", d(&raw, Format::Json)),
            ("disks-missing-node.txt", d(&missing, Format::Table)),
            ("volumes.txt", v(&all, Format::Table)),
            ("volumes-wide.txt", v(&all, Format::Wide)),
            ("volumes.json", v(&all, Format::Json)),
            ("volumes.yaml", v(&all, Format::Yaml)),
            ("volumes-node-worker-1.txt", v(&one, Format::Table)),
            ("volumes-class-raw.txt", v(&raw, Format::Table)),
            ("volumes-missing-node.txt", v(&missing, Format::Table)),
        ]);
    }

    #[test]
    fn a_changed_output_fails_with_a_diff() {
        let nodes = fixture();
        let mut text = disks(&nodes, &Filter::default(), Format::Table).unwrap();
        text = text.replacen("Claimed", "Claimd", 1);
        // Never rewrite the golden from a deliberately wrong text.
        if std::env::var("UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
            return;
        }
        let err = golden("disks.txt", &text).unwrap_err();
        assert!(err.contains("- ") && err.contains("+ ") && err.contains("Claimd"), "{err}");
    }

    #[test]
    fn json_and_yaml_are_the_objects_as_listed() {
        let nodes = fixture();
        let json: Value = serde_json::from_str(&disks(&nodes, &Filter::default(), Format::Json).unwrap()).unwrap();
        let items = json["items"].as_array().unwrap();
        assert_eq!(items.len(), 3);
        let names: Vec<&str> = items.iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["worker-1", "worker-2", "worker-3"], "sorted by node");
        assert!(items[0]["metadata"]["managedFields"].is_null(), "managed fields left out");
        let back: LocalStorageNode = serde_json::from_value(items[0].clone()).unwrap();
        let mut original = nodes.iter().find(|n| n.metadata.name.as_deref() == Some("worker-1")).unwrap().clone();
        original.metadata.managed_fields = None;
        assert_eq!(back, original, "the object as the API holds it");
        let yaml: Value = serde_saphyr::from_str(&volumes(&nodes, &Filter::default(), Format::Yaml).unwrap()).unwrap();
        assert_eq!(yaml, json, "YAML says the same");
    }

    #[test]
    fn an_empty_answer_says_so() {
        assert_eq!(disks(&[], &Filter::default(), Format::Table).unwrap(), "No disks found.\n");
        assert_eq!(volumes(&[], &Filter::default(), Format::Table).unwrap(), "No volumes found.\n");
        let json: Value = serde_json::from_str(&disks(&[], &Filter::default(), Format::Json).unwrap()).unwrap();
        assert_eq!(json["items"], json!([]));
    }

    #[test]
    fn table_columns_are_aligned_by_characters() {
        let t = table(&["A", "B"], &[vec!["é".into(), "x".into()], vec!["abc".into(), "y".into()]]);
        assert_eq!(t, "A     B\né     x\nabc   y\n");
    }

    #[test]
    fn a_held_disk_is_a_flagged_volume_and_a_note_with_its_release() {
        use crate::core::cluster::inventory::{EntryInput, HeldDisk, Inputs, build};
        let held = |reason: &str| HeldDisk {
            path: "/mnt/raw/d".into(),
            node: "worker-1".into(),
            record: "local-pv-1".into(),
            uid: Some("u-1".into()),
            reason: reason.into(),
            message: "node worker-1's LocalStorageNode records this disk".into(),
        };
        for (reason, releasable) in [("record", true), ("unclaimed-pv", true), ("claimed-pv", false)] {
            let status = build(Inputs {
                node: "worker-2".into(),
                entries: vec![EntryInput {
                    class: "raw".into(),
                    host_path: "/mnt/raw/d".into(),
                    refused: Some(("used-unknown".into(), "held".into())),
                    needs_operator: true,
                    ..Default::default()
                }],
                held: vec![held(reason)],
                ..Default::default()
            });
            assert_eq!(status.volumes[0].flags, ["held"]);
            assert_eq!(status.volumes[0].reason.as_deref(), Some(format!("held-by-{reason}").as_str()));
            assert_eq!(status.summary.problems, 1, "counted once");
            let object = LocalStorageNode {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some("worker-2".into()),
                    ..Default::default()
                },
                status: Some(status),
                ..Default::default()
            };
            let all = Filter { nodes: Vec::new(), class: None };
            let disks = disks(std::slice::from_ref(&object), &all, Format::Table).unwrap();
            assert!(disks.contains("worker-2: /mnt/raw/d is held: node worker-1's"), "{disks}");
            assert_eq!(disks.contains("kubectl local-storage release-hold --node worker-2 u-1"), releasable, "{disks}");
            let volumes = volumes(&[object], &all, Format::Table).unwrap();
            assert!(volumes.contains("held"), "{volumes}");
        }
    }
}
