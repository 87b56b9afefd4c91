//! Docs that cannot drift (issue 30): the docs' factual tables checked against the code, both
//! ways.
//!
//! - Metrics: the tables of docs/operations.md (the agent) and docs/node-cleanup.md
//!   (node-cleanup, which also exposes operations.md's process and build-info rows), every
//!   name, type and label set, against what the binaries expose: a live `/metrics` of the real
//!   agent and of node-cleanup (root and the control plane), and the library's registries
//!   (always). docs/devices.md's table and every metric named anywhere in docs/ and README.md
//!   must exist, with the labels they name.
//! - Label sets: prometheus-client leaves a labelled family out of the exposition (`# TYPE`
//!   included) until it has a sample. The live agent is made to produce what a test can cheaply
//!   cause (a tmpfs volume published and wiped, a symlink refused); every other family's labels
//!   come from the library's registry after each recording method was called once. The live
//!   exposition must have every unlabelled family of the library and no family it lacks, with
//!   the same types, and the same labels where both have samples: so the stand-in is the
//!   binary's own registry. A family with samples in neither fails the test: a new family
//!   needs a sample here.
//! - Object names: the table "Object names" of docs/helm.md against `helm template` (three
//!   releases: a plain name, one containing the chart's name, a fullnameOverride; defaults and
//!   every optional object on) and `kubectl kustomize deploy/base` and `deploy/node-cleanup`;
//!   every `<release>…` or `<fullname>…` name and every `kubectl … kind/name` in the docs must
//!   be one of them.
//! - Flags: README.md's `run` table and docs/node-cleanup.md's table against clap's commands:
//!   every flag with its environment variable, both ways, and the defaults clap has; README.md's
//!   paragraph on the other commands' variables against every other command.
//! - Closed lists of label values (devices_refused's reasons, volume_failing's, fenced_volumes',
//!   succession_total's outcomes) and of which refusals make DeviceRefused a Warning, against
//!   the code that sets them.
//! - Paths: every file or folder of the repository a doc names (`src/…`, `tests/…`, `deploy/…`,
//!   `docs/…`, `scripts/…`, `bench/…`) must exist, and every function named as
//!   `src/….rs::name` must be a `fn name` of that file (docs/architecture.md names the code and
//!   the tests behind each promise that way).
//! - Each comparison is fed a mutated copy of its table and must report the mismatch.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use clap::CommandFactory;
use local_static_provisioner::cli::Cli;
use serde_json::Value;
use support::{AgentProcess, ControlPlane, library_expositions, repo_root, require_root, run, wait_until};

// ---------------------------------------------------------------------------------------------
// Markdown

fn read_doc(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// Every markdown file whose facts are checked: README.md and docs/*.md.
fn all_docs() -> Vec<(String, String)> {
    let mut paths = vec!["README.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(repo_root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| format!("docs/{}", e.file_name().to_string_lossy()))
        .filter(|p| p.ends_with(".md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths.into_iter().map(|p| (read_doc(&p), p)).map(|(text, path)| (path, text)).collect()
}

/// The cells of a table row, split on `|` outside code spans.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let inner = line.strip_prefix('|').unwrap_or(line);
    let inner = inner.strip_suffix('|').unwrap_or(inner);
    let (mut out, mut cell, mut in_code) = (Vec::new(), String::new(), false);
    for c in inner.chars() {
        match c {
            '`' => {
                in_code = !in_code;
                cell.push(c);
            }
            '|' if !in_code => out.push(std::mem::take(&mut cell).trim().to_string()),
            _ => cell.push(c),
        }
    }
    out.push(cell.trim().to_string());
    out
}

/// The rows (1-based line number, cells) of every table of `text` whose header row is `header`
/// (compared without spaces).
fn table_rows(text: &str, header: &str) -> Vec<(usize, Vec<String>)> {
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    let header = squash(header);
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if squash(lines[i]) == header {
            i += 2; // the header and the |---| line
            while i < lines.len() && lines[i].trim_start().starts_with('|') {
                rows.push((i + 1, cells(lines[i])));
                i += 1;
            }
        }
        i += 1;
    }
    rows
}

/// The code spans of `text` (single backticks).
fn code_spans(text: &str) -> Vec<String> {
    text.split('`').skip(1).step_by(2).map(str::to_string).collect()
}

/// The code of `text`, line by line (1-based): its code spans and the lines of its fenced blocks.
fn code_by_line(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            out.push((i + 1, line.to_string()));
        } else {
            out.extend(code_spans(line).into_iter().map(|s| (i + 1, s)));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// A metric as a doc names it: counters with `_total`, histograms by their base name.
#[derive(Debug, Clone, PartialEq)]
struct DocMetric {
    name: String,
    kind: String,
    labels: BTreeSet<String>,
    at: String,
}

/// A family as an exposition shows it, keyed by the name docs use (a counter's with `_total`).
#[derive(Debug, Clone, PartialEq)]
struct Family {
    kind: String,
    /// The label names of its samples (`le` left out), None without samples.
    labels: Option<BTreeSet<String>>,
}

/// `name{a,b}` into the name and its label names.
fn split_labels(item: &str) -> (String, BTreeSet<String>) {
    match item.split_once('{') {
        Some((name, rest)) => {
            let inner = rest.trim_end_matches('}');
            let labels = inner.split(',').map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect();
            (name.to_string(), labels)
        }
        None => (item.to_string(), BTreeSet::new()),
    }
}

/// The metrics of the tables headed `| metric | type | meaning |` in `text` (of file `file`). A
/// cell may name several (`a_total{m}`, `..._failed_total{m}`: `...` is the first name without
/// `_total`); the type cell gives one type each, its last one (`gauges`) for the rest.
fn metric_table(text: &str, file: &str) -> Vec<DocMetric> {
    let mut out = Vec::new();
    for (line, row) in table_rows(text, "| metric | type | meaning |") {
        let at = format!("{file}:{line}");
        let items = code_spans(&row[0]);
        assert!(!items.is_empty(), "{at}: a metric row without a metric name: {row:?}");
        let kinds: Vec<String> =
            row[1].split(',').map(|k| k.trim().trim_end_matches('s').to_string()).filter(|k| !k.is_empty()).collect();
        let stem = split_labels(&items[0]).0;
        let stem = stem.strip_suffix("_total").unwrap_or(&stem).to_string();
        for (i, item) in items.iter().enumerate() {
            let (name, labels) = split_labels(item);
            let name = match name.strip_prefix("...").or_else(|| name.strip_prefix('…')) {
                Some(rest) => format!("{stem}{rest}"),
                None => name,
            };
            let kind = kinds.get(i).or(kinds.last()).cloned().unwrap_or_default();
            out.push(DocMetric { name, kind, labels, at: at.clone() });
        }
    }
    out
}

/// Label names of one sample line's `{…}` (values may hold any escaped character).
fn sample_labels(rest: &str) -> BTreeSet<String> {
    let mut labels = BTreeSet::new();
    let mut chars = rest.chars().peekable();
    if chars.peek() != Some(&'{') {
        return labels;
    }
    chars.next();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let key = key.trim_start_matches(',').trim().to_string();
        if key.is_empty() || key.starts_with('}') {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "label {key} without a quoted value in {rest}");
        while let Some(c) = chars.next() {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => break,
                _ => {}
            }
        }
        labels.insert(key);
        match chars.next() {
            Some(',') => {}
            _ => break,
        }
    }
    labels.remove("le");
    labels
}

/// The families of a Prometheus / OpenMetrics text exposition, by the name docs use.
fn exposition(text: &str) -> BTreeMap<String, Family> {
    let mut families = BTreeMap::new();
    // Sample name -> family name.
    let mut series = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = rest.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
        let doc_name =
            if kind == "counter" && !name.ends_with("_total") { format!("{name}_total") } else { name.to_string() };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        for suffix in suffixes {
            let sample = if kind == "counter" { doc_name.clone() } else { format!("{name}{suffix}") };
            series.insert(sample, doc_name.clone());
        }
        families.insert(doc_name, Family { kind: kind.to_string(), labels: None });
    }
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        let (sample, rest) = line.split_at(end);
        let family = series.get(sample).unwrap_or_else(|| panic!("sample {sample} of no # TYPE family"));
        let labels = sample_labels(rest);
        let entry = families.get_mut(family).unwrap();
        match &entry.labels {
            None => entry.labels = Some(labels),
            Some(seen) => assert_eq!(seen, &labels, "samples of {family} with different label sets: {line}"),
        }
    }
    families
}

/// What a role exposes: the families (names, types) of the library's registry, each with the
/// labels of the live exposition where it has samples, the library's elsewhere. prometheus-client
/// leaves a labelled family without samples out of the exposition (no `# TYPE` either), so the
/// live one may lack labelled families; it must have every other one, and nothing else, with the
/// same types, and the labels of both must agree where both have samples.
fn merge_sources(
    live_name: &str,
    live: &BTreeMap<String, Family>,
    library: &BTreeMap<String, Family>,
) -> (BTreeMap<String, Family>, Vec<String>) {
    let mut problems = Vec::new();
    let mut merged = library.clone();
    for (family, f) in live {
        let Some(m) = merged.get_mut(family) else {
            problems.push(format!("{live_name} exposes {family}, which the library's registry does not"));
            continue;
        };
        if m.kind != f.kind {
            problems.push(format!("{family}: a {} in {live_name}, a {} in the library's registry", f.kind, m.kind));
        }
        match (&m.labels, &f.labels) {
            (Some(x), Some(y)) if x != y => {
                problems.push(format!("{family}: labels {y:?} in {live_name}, {x:?} in the library's registry"))
            }
            (_, Some(y)) => m.labels = Some(y.clone()),
            _ => {}
        }
    }
    for (family, f) in library.iter().filter(|(n, _)| !live.contains_key(*n)) {
        if f.labels.as_ref().is_none_or(BTreeSet::is_empty) {
            problems.push(format!("{live_name} lacks {family}, which has no labels: it must always be exposed"));
        }
    }
    (merged, problems)
}

/// Every difference between the metrics `documented` (for `role`) and those `exposed`: a
/// documented metric that is not exposed, or with another type or other labels; an exposed
/// family that is not documented; a family whose labels no source shows.
fn compare_metrics(role: &str, documented: &[DocMetric], exposed: &BTreeMap<String, Family>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for doc in documented {
        if !seen.insert(doc.name.clone()) {
            problems.push(format!("{}: {} is documented twice for {role}", doc.at, doc.name));
        }
        let Some(family) = exposed.get(&doc.name) else {
            problems.push(format!("{}: {} is documented but {role} does not expose it", doc.at, doc.name));
            continue;
        };
        if family.kind != doc.kind {
            problems.push(format!(
                "{}: {} is documented as {} but {role} exposes a {}",
                doc.at, doc.name, doc.kind, family.kind
            ));
        }
        match &family.labels {
            Some(labels) if *labels != doc.labels => problems.push(format!(
                "{}: {} is documented with labels {:?} but {role} exposes {:?}",
                doc.at, doc.name, doc.labels, labels
            )),
            Some(_) => {}
            None => problems.push(format!(
                "{}: no sample of {} to check its labels against (tests/cluster/docs_drift.rs must make one)",
                doc.at, doc.name
            )),
        }
    }
    for name in exposed.keys().filter(|n| !seen.contains(*n)) {
        problems.push(format!("{role} exposes {name}, which its metrics table does not document"));
    }
    problems
}

/// A table's metrics compared one way only: each must be exposed as documented (docs/devices.md
/// lists a few of the agent's).
fn compare_metrics_subset(role: &str, documented: &[DocMetric], exposed: &BTreeMap<String, Family>) -> Vec<String> {
    let names: BTreeSet<String> = documented.iter().map(|d| d.name.clone()).collect();
    let only: BTreeMap<String, Family> =
        exposed.iter().filter(|(n, _)| names.contains(*n)).map(|(n, f)| (n.clone(), f.clone())).collect();
    compare_metrics(role, documented, &only)
}

const METRIC_PREFIXES: [&str; 3] =
    ["local_static_provisioner_", "local_volume_provisioner_", "local_volume_node_cleanup_"];

/// Every metric named in `text` (file `file`) outside the tables: each must be a series of an
/// exposed family, with exactly the labels it lists (`name{a,b}`) or at least the ones it
/// matches (`name{a="x"}`). Globs (`…_node_cleanup_*`) are left out.
fn check_mentions(file: &str, text: &str, exposed: &BTreeMap<String, Family>) -> Vec<String> {
    let mut series: BTreeMap<String, (&String, &Family)> = BTreeMap::new();
    for (name, family) in exposed {
        series.insert(name.clone(), (name, family));
        if family.kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                series.insert(format!("{name}{suffix}"), (name, family));
            }
        }
    }
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let bytes = line.as_bytes();
        let is_name = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_';
        let mut pos = 0;
        while pos < line.len() {
            let start = METRIC_PREFIXES.iter().filter_map(|p| line[pos..].find(p).map(|s| s + pos)).min();
            let Some(start) = start else { break };
            let mut end = start;
            while end < bytes.len() && is_name(bytes[end]) {
                end += 1;
            }
            pos = end;
            if start > 0 && (is_name(bytes[start - 1]) || bytes[start - 1] == b'.') {
                continue;
            }
            let name = &line[start..end];
            if name.ends_with('_') {
                continue; // a glob: `local_static_provisioner_node_cleanup_*`
            }
            let at = format!("{file}:{}", i + 1);
            let Some((family_name, family)) = series.get(name) else {
                problems.push(format!("{at}: {name} is not a metric the agent or node-cleanup exposes"));
                continue;
            };
            if line[end..].starts_with('{') {
                let close = line[end..].find('}').map_or(line.len(), |c| end + c);
                let inner = &line[end + 1..close];
                let Some(labels) = &family.labels else { continue };
                if inner.contains('=') {
                    for key in inner.split(',').filter_map(|m| m.split(['=', '!']).next()).map(str::trim) {
                        if !labels.contains(key) && key != "le" {
                            problems.push(format!("{at}: {name} has no label {key} (it has {labels:?})"));
                        }
                    }
                } else {
                    let named: BTreeSet<String> = split_labels(&format!("x{{{inner}}}")).1;
                    if named != *labels {
                        problems
                            .push(format!("{at}: {name} is named with labels {named:?}, {family_name} has {labels:?}"));
                    }
                }
            }
        }
    }
    problems
}

/// What the docs say each role exposes: the agent, operations.md's table; node-cleanup,
/// node-cleanup.md's table and operations.md's process and build-info rows.
fn documented_metrics(operations: &str, node_cleanup: &str) -> (Vec<DocMetric>, Vec<DocMetric>) {
    let agent = metric_table(operations, "docs/operations.md");
    let mut cleanup = metric_table(node_cleanup, "docs/node-cleanup.md");
    cleanup.extend(
        agent
            .iter()
            .filter(|m| m.name.starts_with("process_") || m.name == "local_static_provisioner_build_info")
            .cloned(),
    );
    (agent, cleanup)
}

/// All the metric checks of the docs against the agent's and node-cleanup's families.
fn check_metric_docs(agent: &BTreeMap<String, Family>, cleanup: &BTreeMap<String, Family>) -> Vec<String> {
    let (doc_agent, doc_cleanup) =
        documented_metrics(&read_doc("docs/operations.md"), &read_doc("docs/node-cleanup.md"));
    assert!(doc_agent.len() > 20 && doc_cleanup.len() > 10, "the metrics tables were not found");
    let mut problems = compare_metrics("the agent", &doc_agent, agent);
    problems.extend(compare_metrics("node-cleanup", &doc_cleanup, cleanup));
    let devices = metric_table(&read_doc("docs/devices.md"), "docs/devices.md");
    assert!(!devices.is_empty(), "docs/devices.md's metrics table was not found");
    problems.extend(compare_metrics_subset("the agent", &devices, agent));
    let mut both = cleanup.clone();
    both.extend(agent.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (file, text) in all_docs() {
        problems.extend(check_mentions(&file, &text, &both));
    }
    problems
}

#[test]
fn metric_docs_match_the_registries() {
    let _area = support::area(module_path!());
    let (agent, cleanup) = library_expositions();
    let problems = check_metric_docs(&exposition(&agent), &exposition(&cleanup));
    assert!(problems.is_empty(), "the docs disagree with the metrics:\n{}", problems.join("\n"));
}

/// The labels of the live exposition where it has samples, the library's elsewhere; the two
/// must expose the same families.
fn live_and_library(role: &str, live: &str, library: &str) -> BTreeMap<String, Family> {
    let (merged, problems) = merge_sources(role, &exposition(live), &exposition(library));
    assert!(problems.is_empty(), "the live {role} and the library disagree:\n{}\n{live}", problems.join("\n"));
    merged
}

fn metrics_body(process: &AgentProcess) -> String {
    let response = process.admin_get("/metrics");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("bad response: {response}"));
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

#[test]
fn metric_docs_match_a_live_agent_and_node_cleanup() {
    let _area = support::area(module_path!());
    if !require_root("metric_docs_match_a_live_agent_and_node_cleanup") {
        return;
    }
    let cp = ControlPlane::get();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let run_id: String =
        root.file_name().unwrap().to_string_lossy().chars().filter(char::is_ascii_alphanumeric).collect();
    let node = format!("docs-drift-{}", run_id.to_ascii_lowercase());
    cp.create_node(&node);
    // A class of this run only: the claim must bind to this run's PV, not to an earlier run's
    // (whose agent is gone).
    let class = &format!("docs-drift-{run_id}").to_ascii_lowercase();
    cp.create_storage_class(class, "Delete");
    let dir = root.join("disks");
    let _volume = support::mount_tmpfs(&dir.join(format!("v-{run_id}")), 4);
    // Refused (a symlink): a sample of unpublished_entries.
    std::os::unix::fs::symlink("/tmp", dir.join(format!("link-{run_id}"))).unwrap();
    let config = root.join("config");
    let map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display());
    support::write_config(&config, &[("storageClassMap", &map)]);
    let kubeconfig = cp.agent_kubeconfig(root);
    let prefix = root.display().to_string();
    let agent = AgentProcess::start(&config, &node, &kubeconfig, &root.join("agent.log"));
    let pv = wait_until("the PV published", Duration::from_secs(60), || {
        cp.pvs_under(&prefix).into_iter().find(|pv| pv["status"]["phase"] == "Available")
    });
    let pv_name = pv["metadata"]["name"].as_str().unwrap().to_string();
    let old_uid = pv["metadata"]["uid"].as_str().unwrap().to_string();
    // A wipe: upstream's delete counters and histogram, the bytes wiped.
    let claim = format!("docs-drift-{run_id}").to_ascii_lowercase();
    cp.bind_claim(&claim, class, false);
    cp.release_claim(&claim);
    support::wait_recycled(&cp, &pv_name, &old_uid, None, Duration::from_secs(60));
    let live_agent = wait_until("the wipe in the metrics", Duration::from_secs(30), || {
        let body = metrics_body(&agent);
        body.contains("local_volume_provisioner_persistentvolume_delete_total{").then_some(body)
    });

    let cleanup_kubeconfig = cp.node_cleanup_kubeconfig(root);
    let cleanup = AgentProcess::start_node_cleanup(
        &cleanup_kubeconfig,
        &root.join("node-cleanup.log"),
        &["--storage-classes", class, "--lease-name", &format!("docs-drift-{run_id}").to_ascii_lowercase()],
    );
    let live_cleanup = metrics_body(&cleanup);

    let (library_agent, library_cleanup) = library_expositions();
    let agent_families = live_and_library("agent", &live_agent, &library_agent);
    let cleanup_families = live_and_library("node-cleanup", &live_cleanup, &library_cleanup);
    // The live agent's own samples carry the labels of the families a test can cause.
    let live = exposition(&live_agent);
    for family in [
        "local_volume_provisioner_persistentvolume_discovery_total",
        "local_volume_provisioner_persistentvolume_delete_total",
        "local_volume_provisioner_persistentvolume_delete_duration_seconds",
        "local_static_provisioner_wipe_bytes_total",
        "local_static_provisioner_unpublished_entries",
        "local_volume_provisioner_apiserver_requests_total",
        "local_static_provisioner_volumes",
    ] {
        assert!(live[family].labels.is_some(), "the live agent has no sample of {family}:\n{live_agent}");
    }
    let problems = check_metric_docs(&agent_families, &cleanup_families);
    drop(cleanup);
    drop(agent);
    assert!(problems.is_empty(), "the docs disagree with the live metrics:\n{}", problems.join("\n"));
}

#[test]
fn a_metric_table_that_disagrees_with_the_code_is_reported() {
    let _area = support::area(module_path!());
    let (agent, _) = library_expositions();
    let exposed = exposition(&agent);
    let operations = read_doc("docs/operations.md");
    let (documented, _) = documented_metrics(&operations, &read_doc("docs/node-cleanup.md"));
    assert!(compare_metrics("the agent", &documented, &exposed).is_empty());
    for (from, to, expect) in [
        // A renamed metric: reported both ways.
        (
            "`local_static_provisioner_wipe_bytes_total{mode}`",
            "`local_static_provisioner_wiped_bytes_total{mode}`",
            "local_static_provisioner_wiped_bytes_total is documented but",
        ),
        (
            "`local_static_provisioner_wipe_bytes_total{mode}`",
            "`local_static_provisioner_wiped_bytes_total{mode}`",
            "exposes local_static_provisioner_wipe_bytes_total, which",
        ),
        // A wrong label, a missing one, a wrong type.
        (
            "`local_static_provisioner_volumes{state}`",
            "`local_static_provisioner_volumes{phase}`",
            "local_static_provisioner_volumes is documented with labels {\"phase\"}",
        ),
        (
            "{mode,type,capacity,cleanup_command}",
            "{mode,type,capacity}",
            "persistentvolume_delete_duration_seconds is documented with labels",
        ),
        (
            "| `local_static_provisioner_config_valid` | gauge |",
            "| `local_static_provisioner_config_valid` | counter |",
            "config_valid is documented as counter",
        ),
        // An abbreviated name of a multi-name row.
        (
            "`..._failed_total{method}`",
            "`..._failures_total{method}`",
            "local_volume_provisioner_apiserver_requests_failures_total is documented but",
        ),
    ] {
        assert!(operations.contains(from), "the mutation's source is gone: {from}");
        let mutated = operations.replacen(from, to, 1);
        let (documented, _) = documented_metrics(&mutated, "");
        let problems = compare_metrics("the agent", &documented, &exposed);
        assert!(problems.iter().any(|p| p.contains(expect)), "{from} -> {to}: expected {expect:?} in {problems:?}");
    }
    // A removed row.
    let removed: String = operations
        .lines()
        .filter(|l| !l.contains("`local_static_provisioner_host_operations_stuck`"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (documented, _) = documented_metrics(&removed, "");
    let problems = compare_metrics("the agent", &documented, &exposed);
    assert!(
        problems.iter().any(|p| p.contains("exposes local_static_provisioner_host_operations_stuck, which")),
        "{problems:?}"
    );
    // A family without samples cannot have its labels taken for granted.
    let no_samples = exposition("# TYPE local_static_provisioner_volumes gauge\n");
    let doc = [DocMetric {
        name: "local_static_provisioner_volumes".into(),
        kind: "gauge".into(),
        labels: BTreeSet::new(),
        at: "x".into(),
    }];
    assert!(compare_metrics("r", &doc, &no_samples).iter().any(|p| p.contains("no sample of")));
    // Mentions in prose: an unknown name, wrong labels, a matcher on a label it lacks.
    let mentions = "`local_static_provisioner_wipe_byte_total`\n`local_static_provisioner_volumes{state,node}`\n\
                    `local_static_provisioner_unpublished_entries{class=\"x\"}`\n`local_static_provisioner_node_cleanup_*`\n";
    let problems = check_mentions("m.md", mentions, &exposed);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(problems[0].contains("m.md:1: local_static_provisioner_wipe_byte_total is not a metric"), "{problems:?}");
    assert!(problems[1].contains("m.md:2:") && problems[1].contains("\"node\""), "{problems:?}");
    assert!(problems[2].contains("m.md:3:") && problems[2].contains("no label class"), "{problems:?}");
    // The live exposition must have every unlabelled family, no family the library lacks, and the
    // library's labels.
    let fewer = agent.replace("# TYPE local_static_provisioner_config_valid gauge", "");
    let fewer = fewer
        .lines()
        .filter(|l| !l.starts_with("local_static_provisioner_config_valid "))
        .collect::<Vec<_>>()
        .join("\n");
    let (_, problems) = merge_sources("live", &exposition(&fewer), &exposed);
    assert!(problems.iter().any(|p| p.contains("lacks local_static_provisioner_config_valid")), "{problems:?}");
    let other = "# TYPE local_static_provisioner_volumes gauge\nlocal_static_provisioner_volumes{phase=\"Bound\"} 1\n\
                 # TYPE local_static_provisioner_extra gauge\nlocal_static_provisioner_extra 1\n";
    let (_, problems) = merge_sources("live", &exposition(other), &exposed);
    assert!(
        problems.iter().any(|p| p.contains("local_static_provisioner_volumes: labels {\"phase\"} in live")),
        "{problems:?}"
    );
    assert!(problems.iter().any(|p| p.contains("live exposes local_static_provisioner_extra, which")), "{problems:?}");
}

#[test]
fn exposition_parsing_reads_types_names_and_labels() {
    let _area = support::area(module_path!());
    let text = "# HELP a_total x\n# TYPE a counter\na_total{x=\"1,2\",y=\"q\\\"}\"} 1\n\
                # TYPE h histogram\nh_bucket{le=\"1\",m=\"a\"} 1\nh_sum{m=\"a\"} 1\nh_count{m=\"a\"} 1\n\
                # TYPE g gauge\ng 3\n# TYPE e counter\n# EOF\n";
    let f = exposition(text);
    let labels = |l: &[&str]| Some(l.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>());
    assert_eq!(f["a_total"], Family { kind: "counter".into(), labels: labels(&["x", "y"]) });
    assert_eq!(f["h"], Family { kind: "histogram".into(), labels: labels(&["m"]) });
    assert_eq!(f["g"], Family { kind: "gauge".into(), labels: labels(&[]) });
    assert_eq!(f["e_total"], Family { kind: "counter".into(), labels: None });
    let rows = metric_table(
        "| metric | type | meaning |\n|---|---|---|\n| `p_total{m}`, `..._failed_total{m}`, `..._seconds{m}` | counter, counter, histogram | x |\n| `a`, `b_total` | gauge, counters | y |\n",
        "t.md",
    );
    let names: Vec<(&str, &str, usize)> =
        rows.iter().map(|r| (r.name.as_str(), r.kind.as_str(), r.labels.len())).collect();
    assert_eq!(
        names,
        [
            ("p_total", "counter", 1),
            ("p_failed_total", "counter", 1),
            ("p_seconds", "histogram", 1),
            ("a", "gauge", 0),
            ("b_total", "counter", 0)
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Flags

/// A row of a `| flag (env) | default | … |` table: its flags with their variables, the default
/// of each, and the upstream names (docs/node-cleanup.md's third column).
#[derive(Debug)]
struct FlagRow {
    at: String,
    flags: Vec<(String, String)>,
    defaults: Vec<String>,
    upstream: Vec<String>,
}

/// The rows of the flag tables headed `header` in `text`. The first cell holds `--flag` spans and
/// as many `ENV` spans, in the same order; the default cell one value per flag, ` / `-separated.
fn flag_table(text: &str, file: &str, header: &str) -> Vec<FlagRow> {
    let columns = cells(header).len();
    table_rows(text, header)
        .into_iter()
        .map(|(line, row)| {
            let at = format!("{file}:{line}");
            assert_eq!(row.len(), columns, "{at}: {row:?}");
            let spans = code_spans(&row[0]);
            let flags: Vec<String> = spans.iter().filter(|s| s.starts_with("--")).cloned().collect();
            let envs: Vec<String> = spans.iter().filter(|s| !s.starts_with("--")).cloned().collect();
            let defaults: Vec<String> = row[1].split(" / ").map(str::to_string).collect();
            let defaults = if defaults.len() == flags.len() { defaults } else { vec![row[1].clone(); flags.len()] };
            let upstream = if columns == 4 { code_spans(&row[2]) } else { Vec::new() };
            let upstream = upstream.into_iter().filter(|s| s.starts_with("--")).collect();
            let flags = if flags.len() == envs.len() {
                flags.into_iter().zip(envs).collect()
            } else {
                // Reported by the comparison: a flag without its variable.
                flags.into_iter().map(|f| (f, String::new())).collect()
            };
            FlagRow { at, flags, defaults, upstream }
        })
        .collect()
}

/// A default as a table gives it: without code marks and the remark in parentheses.
fn plain_default(cell: &str) -> String {
    let cell = cell.split(" (").next().unwrap_or(cell);
    cell.replace('`', "").trim().to_string()
}

/// Every difference between a flag table and the command `cmd`: a row's flag that `cmd` lacks,
/// or reads another variable; a flag of `cmd` the table lacks; a default other than clap's
/// (`off` for a switch, `required` for a required flag); an upstream name that is not an alias.
fn compare_flags(command: &str, rows: &[FlagRow], cmd: &clap::Command) -> Vec<String> {
    let mut problems = Vec::new();
    let args: BTreeMap<String, &clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_positional() && !matches!(a.get_id().as_str(), "help" | "version"))
        .filter_map(|a| Some((format!("--{}", a.get_long()?), a)))
        .collect();
    let mut documented = BTreeSet::new();
    for row in rows {
        if row.flags.is_empty() {
            problems.push(format!("{}: a row without a flag", row.at));
        }
        for ((flag, env), default) in row.flags.iter().zip(&row.defaults) {
            if !documented.insert(flag.clone()) {
                problems.push(format!("{}: {flag} is in the table twice", row.at));
            }
            let Some(arg) = args.get(flag) else {
                problems.push(format!("{}: {command} has no flag {flag}", row.at));
                continue;
            };
            let real_env = arg.get_env().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
            if *env != real_env {
                problems.push(format!(
                    "{}: {flag} is documented with the variable {env:?}, {command} reads {real_env:?}",
                    row.at
                ));
            }
            let default = plain_default(default);
            let clap_default: Vec<String> =
                arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let expected = if arg.is_required_set() {
                Some("required".to_string())
            } else if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
                Some("off".to_string())
            } else if !clap_default.is_empty() {
                Some(clap_default.join(","))
            } else {
                None
            };
            match expected {
                Some(expected) if expected != default => problems.push(format!(
                    "{}: {flag} is documented with the default {default:?}, {command}'s is {expected:?}",
                    row.at
                )),
                None if ["required", "off"].contains(&default.as_str())
                    || default.chars().all(|c| c.is_ascii_digit()) =>
                {
                    problems.push(format!(
                        "{}: {flag} is documented with the default {default:?}, {command} has none",
                        row.at
                    ))
                }
                _ => {}
            }
        }
        for name in &row.upstream {
            let name = name.trim_start_matches("--");
            let known =
                row.flags.iter().filter_map(|(f, _)| args.get(f)).any(|arg| {
                    arg.get_long() == Some(name) || arg.get_all_aliases().unwrap_or_default().contains(&name)
                });
            if !known {
                problems
                    .push(format!("{}: upstream's --{name} is not accepted by {command} for {:?}", row.at, row.flags));
            }
        }
    }
    for flag in args.keys().filter(|f| !documented.contains(*f)) {
        problems.push(format!("{command} has {flag}, which its flag table does not document"));
    }
    problems
}

const README_FLAGS: &str = "| flag (env) | default | meaning |";
const NODE_CLEANUP_FLAGS: &str = "| flag (env) | default | upstream's name | meaning |";

fn subcommand(name: &str) -> clap::Command {
    Cli::command().find_subcommand(name).unwrap_or_else(|| panic!("no subcommand {name}")).clone()
}

#[test]
fn flag_tables_match_the_commands() {
    let _area = support::area(module_path!());
    let readme = flag_table(&read_doc("README.md"), "README.md", README_FLAGS);
    assert!(readme.len() > 15, "README.md's flag table was not found: {readme:?}");
    let mut problems = compare_flags("run", &readme, &subcommand("run"));
    let cleanup = flag_table(&read_doc("docs/node-cleanup.md"), "docs/node-cleanup.md", NODE_CLEANUP_FLAGS);
    assert!(cleanup.len() > 10, "docs/node-cleanup.md's flag table was not found: {cleanup:?}");
    problems.extend(compare_flags("node-cleanup", &cleanup, &subcommand("node-cleanup")));
    assert!(problems.is_empty(), "the flag tables disagree with the commands:\n{}", problems.join("\n"));
}

#[test]
fn a_flag_table_that_disagrees_with_the_command_is_reported() {
    let _area = support::area(module_path!());
    let readme = read_doc("README.md");
    let run = subcommand("run");
    let check = |text: &str| compare_flags("run", &flag_table(text, "README.md", README_FLAGS), &run);
    assert!(check(&readme).is_empty());
    for (from, to, expect) in [
        ("`--settle` (`SETTLE`)", "`--settle-time` (`SETTLE`)", "run has no flag --settle-time"),
        ("`--settle` (`SETTLE`)", "`--settle-time` (`SETTLE`)", "run has --settle, which"),
        (
            "`--settle` (`SETTLE`)",
            "`--settle` (`SETTLE_TIME`)",
            "--settle is documented with the variable \"SETTLE_TIME\"",
        ),
        (
            "| `--wipe-concurrency` (`WIPE_CONCURRENCY`) | 2 |",
            "| `--wipe-concurrency` (`WIPE_CONCURRENCY`) | 4 |",
            "default \"4\", run's is \"2\"",
        ),
        (
            "`--kube-api-burst` (`KUBE_API_BURST`) | 100 / 200",
            "`--kube-api-burst` (`KUBE_API_BURST`) | 100 / 300",
            "--kube-api-burst is documented with the default \"300\"",
        ),
        ("`--log-json` (`LOG_JSON`) | off", "`--log-json` (`LOG_JSON`) | on", "default \"on\", run's is \"off\""),
    ] {
        assert!(readme.contains(from), "the mutation's source is gone: {from}");
        let problems = check(&readme.replacen(from, to, 1));
        assert!(problems.iter().any(|p| p.contains(expect)), "{from} -> {to}: expected {expect:?} in {problems:?}");
    }
    let removed: String =
        readme.lines().filter(|l| !l.contains("`--metrics-path`")).map(|l| format!("{l}\n")).collect();
    assert!(check(&removed).iter().any(|p| p.contains("run has --metrics-path, which")));
    let cleanup = read_doc("docs/node-cleanup.md");
    let from = "| `--pvc-deletion-delay` (default";
    assert!(cleanup.contains(from));
    let mutated = cleanup.replacen(from, "| `--pvc-deletion-grace` (default", 1);
    let problems =
        compare_flags("node-cleanup", &flag_table(&mutated, "n.md", NODE_CLEANUP_FLAGS), &subcommand("node-cleanup"));
    assert!(problems.iter().any(|p| p.contains("upstream's --pvc-deletion-grace is not accepted")), "{problems:?}");
}

/// README.md's paragraph on "The other commands' variables": per command named (its first code
/// span in a `;`-separated part), the variables it lists, each with the flag named after it
/// in parentheses, if any.
#[derive(Debug)]
struct CommandVariables {
    command: String,
    variables: Vec<(String, Option<String>)>,
}

const OTHER_COMMANDS: &str = "The other commands' variables:";

fn other_commands_variables(text: &str) -> Vec<CommandVariables> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.contains(OTHER_COMMANDS)).expect("README.md's other commands' variables");
    let end = (start..lines.len()).find(|i| lines[*i].trim().is_empty()).unwrap_or(lines.len());
    let paragraph = lines[start..end].join(" ");
    let after = &paragraph[paragraph.find(OTHER_COMMANDS).unwrap() + OTHER_COMMANDS.len()..];
    // The sentence after the list is about `version`.
    let list = after.split("`local-static-provisioner version`").next().unwrap_or(after);
    let mut out = Vec::new();
    for part in list.split(';') {
        let spans = code_spans(part);
        let Some(command) = spans.first() else { continue };
        let mut variables: Vec<(String, Option<String>)> = Vec::new();
        for span in &spans[1..] {
            if span.starts_with('-') {
                if let Some(last) = variables.last_mut() {
                    last.1 = Some(span.clone());
                }
            } else {
                variables.push((span.clone(), None));
            }
        }
        out.push(CommandVariables { command: command.clone(), variables });
    }
    out
}

/// Every difference between that paragraph and the commands: a command missing (every one but
/// `run`, which has its table, that reads a variable), a variable it does not read or one it
/// reads that is not listed, a flag named for a variable that another flag reads.
fn compare_other_commands(listed: &[CommandVariables]) -> Vec<String> {
    let cli = Cli::command();
    let mut problems = Vec::new();
    let envs_of = |cmd: &clap::Command| -> BTreeMap<String, (Option<String>, Option<char>)> {
        cmd.get_arguments()
            .filter_map(|a| {
                let env = a.get_env()?.to_string_lossy().into_owned();
                Some((env, (a.get_long().map(str::to_string), a.get_short())))
            })
            .collect()
    };
    for entry in listed {
        let Some(cmd) = cli.find_subcommand(&entry.command) else {
            problems.push(format!("README.md: there is no command {}", entry.command));
            continue;
        };
        let reads = envs_of(cmd);
        let named: BTreeSet<&String> = entry.variables.iter().map(|(v, _)| v).collect();
        for env in reads.keys().filter(|e| !named.contains(e)) {
            problems.push(format!("README.md: {} reads {env}, which the paragraph does not list", entry.command));
        }
        for (env, flag) in &entry.variables {
            let Some((long, short)) = reads.get(env) else {
                problems.push(format!("README.md: {} does not read {env}", entry.command));
                continue;
            };
            let Some(flag) = flag else { continue };
            let matches = match flag.strip_prefix("--") {
                Some(name) => long.as_deref() == Some(name),
                None => flag.strip_prefix('-').and_then(|c| c.chars().next()) == *short,
            };
            if !matches {
                problems.push(format!("README.md: {}'s {env} is not read by {flag}", entry.command));
            }
        }
    }
    for cmd in cli.get_subcommands() {
        let name = cmd.get_name();
        if name != "run" && !envs_of(cmd).is_empty() && !listed.iter().any(|e| e.command == name) {
            problems.push(format!("README.md: the paragraph on the other commands' variables lacks {name}"));
        }
    }
    problems
}

#[test]
fn readme_lists_every_other_commands_variables() {
    let _area = support::area(module_path!());
    let readme = read_doc("README.md");
    let problems = compare_other_commands(&other_commands_variables(&readme));
    assert!(problems.is_empty(), "README.md disagrees with the commands:\n{}", problems.join("\n"));

    for (from, to, expect) in [
        (" and `STRICT` (`--strict`)", "", "validate-config reads STRICT, which"),
        ("`FENCE_WAIT` (`--wait`)", "`FENCE_WAIT` (`--timeout`)", "fence-node's FENCE_WAIT is not read by --timeout"),
        ("`CONFIG_FILE` (`-f`)", "`CONFIG_FILE` (`-c`)", "validate-config's CONFIG_FILE is not read by -c"),
        ("`CLEANUP_WAIT`", "`CLEANUP_WAITING`", "cleanup does not read CLEANUP_WAITING"),
        ("`node-cleanup`\nreads", "`node-cleaner`\nreads", "there is no command node-cleaner"),
    ] {
        assert!(readme.contains(from), "the mutation's source is gone: {from}");
        let problems = compare_other_commands(&other_commands_variables(&readme.replacen(from, to, 1)));
        assert!(problems.iter().any(|p| p.contains(expect)), "{from} -> {to}: expected {expect:?} in {problems:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Object names

/// One row of docs/helm.md's "Object names": kinds, the chart's name (with `<fullname>`), when
/// the chart renders it, and deploy/'s name ("—" where one of them has none).
#[derive(Debug, Clone)]
struct ObjectRow {
    at: String,
    kinds: Vec<String>,
    chart: Option<String>,
    when: String,
    kustomize: Option<String>,
}

const OBJECTS_HEADER: &str = "| kind | chart | chart renders it | deploy/ |";

fn object_table(text: &str, file: &str) -> Vec<ObjectRow> {
    table_rows(text, OBJECTS_HEADER)
        .into_iter()
        .map(|(line, row)| {
            let at = format!("{file}:{line}");
            assert_eq!(row.len(), 4, "{at}: {row:?}");
            let name = |cell: &str| code_spans(cell).first().cloned();
            ObjectRow {
                at,
                kinds: row[0].split(',').map(|k| k.trim().to_string()).collect(),
                chart: name(&row[1]),
                when: row[2].clone(),
                kustomize: name(&row[3]),
            }
        })
        .collect()
}

type Objects = BTreeSet<(String, String)>;

fn objects_of(yaml: &str) -> (Objects, Vec<Value>) {
    let docs: Vec<Value> = yaml
        .split("\n---")
        .map(|d| {
            serde_saphyr::from_str::<Value>(d).unwrap_or_else(|e| panic!("rendered YAML does not parse: {e}\n{d}"))
        })
        .filter(Value::is_object)
        .collect();
    let objects = docs
        .iter()
        .map(|d| (d["kind"].as_str().unwrap().to_string(), d["metadata"]["name"].as_str().unwrap().to_string()))
        .collect();
    (objects, docs)
}

/// The Lease node-cleanup takes: its Deployment's `--lease-name`, else the flag's default.
fn lease_of(docs: &[Value]) -> Option<String> {
    let deployment = docs.iter().find(|d| d["kind"] == "Deployment")?;
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array()?;
    let given = args.iter().filter_map(Value::as_str).find_map(|a| a.strip_prefix("--lease-name=")).map(str::to_string);
    given.or_else(|| {
        let cmd = subcommand("node-cleanup");
        let arg = cmd.get_arguments().find(|a| a.get_long() == Some("lease-name"))?;
        Some(arg.get_default_values().first()?.to_string_lossy().into_owned())
    })
}

/// The objects the table says a render has: `fullname` for `<fullname>`; the chart's column
/// (`all`: every row, else only those rendered `always` or `by default`) or deploy/'s.
fn expected_objects(rows: &[ObjectRow], chart: Option<(&str, bool)>) -> Objects {
    let mut out = Objects::new();
    for row in rows {
        let name = match chart {
            Some((fullname, all)) => {
                if !(all || row.when.starts_with("always") || row.when.starts_with("by default")) {
                    continue;
                }
                row.chart.as_ref().map(|n| n.replace("<fullname>", fullname))
            }
            None => row.kustomize.clone(),
        };
        let Some(name) = name else { continue };
        out.extend(row.kinds.iter().map(|k| (k.clone(), name.clone())));
    }
    out
}

/// Renders with their fullname: a plain release, one whose name contains the chart's, and a
/// fullnameOverride; each with the defaults and with every optional object.
struct Renders {
    chart: Vec<(String, String, bool, String)>, // (what, fullname, all, yaml)
    kustomize: String,
}

const KUBE_VERSION: &str = "1.30.0";
const EVERYTHING: [&str; 6] = [
    "nodeCleanup.enabled=true",
    "nodeCleanup.storageClasses={fast-disks}",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "admissionPolicy.enabled=true",
];

fn tool_path(script: &str) -> PathBuf {
    let out = run(Command::new("bash").arg(repo_root().join(script)));
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

fn renders() -> Renders {
    let helm = tool_path("tests/tools/build-helm.sh");
    let chart_dir = repo_root().join("deploy/helm/local-static-provisioner");
    let mut chart = Vec::new();
    for (release, extra, fullname) in [
        ("lsp", None, "lsp-local-static-provisioner"),
        ("my-local-static-provisioner", None, "my-local-static-provisioner"),
        ("lsp", Some("fullnameOverride=storage"), "storage"),
    ] {
        for all in [false, true] {
            let mut cmd = Command::new(&helm);
            // --include-crds: the chart ships the LocalStorageNode CRD in crds/.
            cmd.args([
                "template",
                release,
                "--namespace",
                "lsp-docs",
                "--kube-version",
                KUBE_VERSION,
                "--include-crds",
            ])
            .arg(&chart_dir);
            let mut sets: Vec<&str> = extra.into_iter().collect();
            if all {
                sets.extend(EVERYTHING);
            }
            for set in sets {
                cmd.args(["--set", set]);
            }
            let out = run(&mut cmd);
            let what = format!("helm template {release} {extra:?}{}", if all { " with every option" } else { "" });
            chart.push((what, fullname.to_string(), all, String::from_utf8(out.stdout).unwrap()));
        }
    }
    let kubectl = tool_path("tests/control-plane/build.sh").join("kubectl");
    let mut kustomize = String::new();
    for dir in ["deploy/base", "deploy/node-cleanup"] {
        let out = run(Command::new(&kubectl).arg("kustomize").arg(repo_root().join(dir)));
        kustomize.push_str(&String::from_utf8(out.stdout).unwrap());
        kustomize.push_str("\n---\n");
    }
    Renders { chart, kustomize }
}

/// Every difference between the object table and the renders: an object rendered that the
/// table lacks, or a row the render lacks (for the chart: every row with every option, the
/// `always` ones by default).
fn compare_objects(rows: &[ObjectRow], renders: &Renders) -> Vec<String> {
    let mut problems = Vec::new();
    let mut compare = |what: &str, expected: Objects, (mut rendered, docs): (Objects, Vec<Value>)| {
        if let Some(lease) = lease_of(&docs) {
            rendered.insert(("Lease".to_string(), lease));
        }
        for (kind, name) in expected.difference(&rendered) {
            let row = rows.iter().find(|r| r.kinds.contains(kind)).map_or("", |r| r.at.as_str());
            problems.push(format!("{row}: {kind} {name} is in the table but not in {what}"));
        }
        for (kind, name) in rendered.difference(&expected) {
            problems.push(format!("{what} has {kind} {name}, which the table does not list"));
        }
    };
    for (what, fullname, all, yaml) in &renders.chart {
        compare(what, expected_objects(rows, Some((fullname, *all))), objects_of(yaml));
    }
    compare(
        "kubectl kustomize deploy/base deploy/node-cleanup",
        expected_objects(rows, None),
        objects_of(&renders.kustomize),
    );
    problems
}

/// kubectl's kind names in the docs' commands (`get configmap NAME`, `deploy/NAME`).
const KINDS: [(&str, &str); 22] = [
    ("configmap", "ConfigMap"),
    ("cm", "ConfigMap"),
    ("daemonset", "DaemonSet"),
    ("ds", "DaemonSet"),
    ("deployment", "Deployment"),
    ("deploy", "Deployment"),
    ("serviceaccount", "ServiceAccount"),
    ("sa", "ServiceAccount"),
    ("clusterrole", "ClusterRole"),
    ("clusterrolebinding", "ClusterRoleBinding"),
    ("role", "Role"),
    ("rolebinding", "RoleBinding"),
    ("lease", "Lease"),
    ("service", "Service"),
    ("svc", "Service"),
    ("servicemonitor", "ServiceMonitor"),
    ("storageclass", "StorageClass"),
    ("sc", "StorageClass"),
    ("validatingadmissionpolicy", "ValidatingAdmissionPolicy"),
    ("prometheusrule", "PrometheusRule"),
    ("crd", "CustomResourceDefinition"),
    ("customresourcedefinition", "CustomResourceDefinition"),
];

/// The object names the docs use in code: `<release>…` and `<fullname>…` names, and the
/// `kind/name` or `kind name` of kubectl commands. (line, kind if said, name, the source line)
fn named_objects(text: &str) -> Vec<(usize, Option<String>, String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let kind_of =
        |word: &str| KINDS.iter().find(|(k, _)| *k == word.to_ascii_lowercase()).map(|(_, kind)| kind.to_string());
    for (line, code) in code_by_line(text) {
        let words: Vec<&str> =
            code.split(|c: char| c.is_whitespace() || c == '(' || c == ')').filter(|w| !w.is_empty()).collect();
        for (i, word) in words.iter().enumerate() {
            let (kind, name) = match word.split_once('/') {
                Some((k, n)) if kind_of(k).is_some() => (kind_of(k), n),
                _ => (None, *word),
            };
            let name = name.trim_end_matches([',', ';', '.', ':']);
            // `helm upgrade <release> …` names the release, `-k deploy/base` a directory.
            if name == "<release>" || repo_root().join(word).exists() {
                continue;
            }
            if name.starts_with("<release>") || name.starts_with("<fullname>") {
                out.push((line, kind, name.to_string(), lines[line - 1].to_string()));
                continue;
            }
            // `kubectl … get configmap NAME`: a literal name after a kind word.
            if !code.contains("kubectl") || kind.is_none() && kind_of(word).is_none() {
                continue;
            }
            let (kind, name) = match kind {
                Some(kind) => (kind, name.to_string()),
                None => match words.get(i + 1) {
                    Some(next) => (kind_of(word).unwrap(), next.to_string()),
                    None => continue,
                },
            };
            let literal = !name.is_empty()
                && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
            if literal && !name.starts_with('-') {
                out.push((line, Some(kind), name, lines[line - 1].to_string()));
            }
        }
    }
    out
}

/// Every object name in `text` (file `file`) that no render has: `<fullname>` names must be
/// the chart's for every fullname, `<release>` names for a plain release (`lsp`: fullname
/// `lsp-local-static-provisioner`), or, on a line that says so, for a release containing
/// `local-static-provisioner`; literal names deploy/'s.
fn check_object_names(file: &str, text: &str, renders: &Renders) -> Vec<String> {
    let all_on: Vec<&(String, String, bool, String)> = renders.chart.iter().filter(|r| r.2).collect();
    let has = |yaml: &str, kind: &Option<String>, name: &str| {
        let (mut objects, docs) = objects_of(yaml);
        if let Some(lease) = lease_of(&docs) {
            objects.insert(("Lease".to_string(), lease));
        }
        objects.iter().any(|(k, n)| n == name && kind.as_ref().is_none_or(|kind| kind == k))
    };
    let mut problems = Vec::new();
    for (line, kind, name, source) in named_objects(text) {
        let at = format!("{file}:{line}");
        let ok = if let Some(rest) = name.strip_prefix("<fullname>") {
            all_on.iter().all(|(_, fullname, _, yaml)| has(yaml, &kind, &format!("{fullname}{rest}")))
        } else if let Some(rest) = name.strip_prefix("<release>") {
            let plain = all_on.iter().find(|r| r.1 == "lsp-local-static-provisioner").unwrap();
            let containing = all_on.iter().find(|r| r.1 == "my-local-static-provisioner").unwrap();
            has(&plain.3, &kind, &format!("lsp{rest}"))
                || source.contains("contains `local-static-provisioner`")
                    && has(&containing.3, &kind, &format!("my-local-static-provisioner{rest}"))
        } else {
            has(&renders.kustomize, &kind, &name)
        };
        if !ok {
            let kind = kind.unwrap_or_else(|| "object".to_string());
            problems.push(format!("{at}: {kind} {name} is not what the chart or deploy/ name it"));
        }
    }
    problems
}

#[test]
fn object_names_in_the_docs_match_the_chart_and_deploy() {
    let _area = support::area(module_path!());
    let renders = renders();
    let rows = object_table(&read_doc("docs/helm.md"), "docs/helm.md");
    assert!(rows.len() > 10, "docs/helm.md's object table was not found: {rows:?}");
    let mut problems = compare_objects(&rows, &renders);
    let mut found = 0;
    for (file, text) in all_docs() {
        found += named_objects(&text).len();
        problems.extend(check_object_names(&file, &text, &renders));
    }
    assert!(found > 5, "the docs name {found} objects: is the extraction broken?");
    assert!(problems.is_empty(), "the docs disagree with the manifests:\n{}", problems.join("\n"));

    // The same comparisons report a table or a name that disagrees.
    let helm_md = read_doc("docs/helm.md");
    for (from, to, expect) in [
        (
            "`<fullname>-config`",
            "`<fullname>-configuration`",
            "ConfigMap storage-configuration is in the table but not in",
        ),
        (
            "`<fullname>-config`",
            "`<fullname>-configuration`",
            "has ConfigMap storage-config, which the table does not list",
        ),
        (
            "`local-provisioner-config`",
            "`local-static-provisioner-config`",
            "has ConfigMap local-provisioner-config, which",
        ),
    ] {
        assert!(helm_md.contains(from), "the mutation's source is gone: {from}");
        let problems = compare_objects(&object_table(&helm_md.replacen(from, to, 1), "h.md"), &renders);
        assert!(problems.iter().any(|p| p.contains(expect)), "{from} -> {to}: expected {expect:?} in {problems:?}");
    }
    let removed: String =
        helm_md.lines().filter(|l| !l.contains("`<fullname>-dashboard`")).map(|l| format!("{l}\n")).collect();
    let problems = compare_objects(&object_table(&removed, "h.md"), &renders);
    assert!(
        problems.iter().any(|p| p.contains("has ConfigMap lsp-local-static-provisioner-dashboard, which")),
        "{problems:?}"
    );
    let prose = "The chart names its objects `<release>-node-cleanup`.\n\
                 Its ConfigMap is `<release>-config` when the release name contains `local-static-provisioner`.\n\
                 `kubectl -n $NS logs deploy/<fullname>-node-cleanup`\n\
                 `kubectl -n $NS get configmap local-provisioner-cfg -o yaml`\n";
    let problems = check_object_names("p.md", prose, &renders);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].starts_with("p.md:1: object <release>-node-cleanup"), "{problems:?}");
    assert!(problems[1].starts_with("p.md:4: ConfigMap local-provisioner-cfg"), "{problems:?}");
}

// ---------------------------------------------------------------------------------------------
// Label values of the closed lists

/// Whether a code span looks like a label value (`no-stable-id`, `flagged_stale`).
fn code_like(span: &str) -> bool {
    span.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && span.chars().all(|c| c.is_ascii_lowercase() || c == '-' || c == '_')
}

/// The code spans of the meaning cell of `metric`'s row in the metric tables of `text`, less
/// the metric's own label names.
fn row_values(file: &str, text: &str, metric: &str) -> (String, Vec<String>) {
    for (line, row) in table_rows(text, "| metric | type | meaning |") {
        let Some(first) = code_spans(&row[0]).into_iter().next() else { continue };
        let (name, labels) = split_labels(&first);
        if name == metric {
            let spans = code_spans(&row[2]).into_iter().filter(|s| !labels.contains(s)).collect();
            return (format!("{file}:{line}"), spans);
        }
    }
    panic!("{file} has no metrics table row for {metric}");
}

/// The code spans of the paragraph of `text` that holds `anchor`, after it.
fn paragraph_values(file: &str, text: &str, anchor: &str) -> (String, Vec<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| l.contains(anchor)).unwrap_or_else(|| panic!("{file} lacks {anchor:?}"));
    let end = (start..lines.len()).find(|i| lines[*i].trim().is_empty()).unwrap_or(lines.len());
    let paragraph = lines[start..end].join("\n");
    let after = &paragraph[paragraph.find(anchor).unwrap() + anchor.len()..];
    (format!("{file}:{}", start + 1), code_spans(after))
}

/// The text of the method that starts with `signature` in `path` (to its closing brace in an
/// `impl` block).
fn method_body(path: &str, signature: &str) -> String {
    let text = read_doc(path);
    let start = text.find(signature).unwrap_or_else(|| panic!("{path} has no {signature}"));
    let body = &text[start..];
    body[..body.find("\n    }\n").unwrap_or(body.len())].to_string()
}

/// The string arms (`=> "code"`) of the method that starts with `signature` in `path`.
fn match_arms(path: &str, signature: &str) -> BTreeSet<String> {
    variant_codes(path, signature).into_values().collect()
}

/// The string arms of a method matching on an enum's variants: variant name -> string.
fn variant_codes(path: &str, signature: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in method_body(path, signature).lines() {
        let Some((lhs, rhs)) = line.split_once("=> \"") else { continue };
        let code = rhs.split('"').next().unwrap_or_default().to_string();
        for variant in lhs.split('|') {
            let variant = variant.trim();
            let variant = variant.rsplit("::").next().unwrap_or(variant);
            let name: String = variant.chars().take_while(char::is_ascii_alphanumeric).collect();
            out.insert(name, code.clone());
        }
    }
    out
}

/// The string arguments of the calls `call("…")` in `path`.
fn call_arguments(path: &str, call: &str) -> BTreeSet<String> {
    let text = read_doc(path);
    text.split(&format!("{call}(\"")).skip(1).filter_map(|s| s.split('"').next()).map(str::to_string).collect()
}

/// Every difference between the values a doc lists (`spans`, less the words in `ignore`) and
/// those the code sets.
fn compare_values(at: &str, what: &str, spans: &[String], ignore: &[&str], code: &BTreeSet<String>) -> Vec<String> {
    let listed: BTreeSet<String> =
        spans.iter().filter(|s| code_like(s) && !ignore.contains(&s.as_str())).cloned().collect();
    let mut problems = Vec::new();
    for value in code.difference(&listed) {
        problems.push(format!("{at}: {what} takes {value:?}, which the doc does not list"));
    }
    for value in listed.difference(code) {
        problems.push(format!("{at}: {what} never takes {value:?}, which the doc lists"));
    }
    problems
}

/// A closed list of label values in a doc: where, of what, its code spans, the spans that are
/// not values, and the values the code sets.
struct ValueList {
    at: String,
    what: &'static str,
    spans: Vec<String>,
    ignore: &'static [&'static str],
    code: BTreeSet<String>,
}

/// The closed lists of label values the docs give.
fn value_lists() -> Vec<ValueList> {
    let operations = read_doc("docs/operations.md");
    let devices = read_doc("docs/devices.md");
    let node_cleanup = read_doc("docs/node-cleanup.md");
    // Every refusal but `not-probed`, which the agent does not count (src/agent/report.rs).
    let report = read_doc("src/agent/report.rs");
    assert!(
        report.contains("if matches!(reason, Refusal::NotProbed) {\n                continue;"),
        "report.rs changed"
    );
    let mut refused = match_arms("src/core/devices/device_claim.rs", "pub fn code(&self)");
    assert!(refused.remove("not-probed"), "{refused:?}");
    let failing = match_arms("src/core/health/disk_health.rs", "pub fn code(&self)");
    let fenced = match_arms("src/core/fence/fence_label.rs", "pub fn label_value(self)");
    let succession = call_arguments("src/agent/succession.rs", "metrics.succession");
    assert!(refused.len() > 10 && failing.len() > 4 && fenced.len() == 4 && succession.len() > 3);
    let mut lists = Vec::new();
    let mut add =
        |(at, spans): (String, Vec<String>), what, ignore: &'static [&'static str], code: &BTreeSet<String>| {
            lists.push(ValueList { at, what, spans, ignore, code: code.clone() });
        };
    // DeviceRefused is a Warning for the refusals Refusal::needs_operator names, else Normal.
    let codes = variant_codes("src/core/devices/device_claim.rs", "pub fn code(&self)");
    let operator = method_body("src/core/devices/device_claim.rs", "pub fn needs_operator(&self)");
    let warning: BTreeSet<String> = operator
        .split("Refusal::")
        .skip(1)
        .map(|v| v.chars().take_while(char::is_ascii_alphanumeric).collect::<String>())
        .map(|v| codes.get(&v).unwrap_or_else(|| panic!("Refusal::{v} has no code")).clone())
        .collect();
    let normal: BTreeSet<String> = refused.difference(&warning).cloned().collect();
    assert!(warning.len() > 3 && normal.len() > 3, "{warning:?} {normal:?}");
    let (line, row) = table_rows(&devices, "| reason | type | meaning |")
        .into_iter()
        .find(|(_, row)| row[0] == "`DeviceRefused`")
        .expect("docs/devices.md's DeviceRefused row");
    let (as_warning, as_normal) = row[2].split_once("Normal for").expect("DeviceRefused's Normal part");
    let at = format!("docs/devices.md:{line}");
    add((at.clone(), code_spans(as_warning)), "DeviceRefused as a Warning", &[], &warning);
    add((at, code_spans(as_normal)), "DeviceRefused as Normal", &[], &normal);
    let refused_metric = "local_static_provisioner_devices_refused";
    add(
        row_values("docs/operations.md", &operations, refused_metric),
        "devices_refused{reason}",
        &["devices"],
        &refused,
    );
    add(
        paragraph_values("docs/devices.md", &devices, "Reason codes of `devices_refused`:"),
        "devices_refused{reason}",
        &[],
        &refused,
    );
    let failing_metric = "local_static_provisioner_volume_failing";
    add(row_values("docs/operations.md", &operations, failing_metric), "volume_failing{reason}", &[], &failing);
    let fenced_metric = "local_static_provisioner_fenced_volumes";
    add(row_values("docs/operations.md", &operations, fenced_metric), "fenced_volumes{reason}", &[], &fenced);
    let succession_metric = "local_static_provisioner_succession_total";
    add(
        row_values("docs/operations.md", &operations, succession_metric),
        "succession_total{outcome}",
        &[],
        &succession,
    );
    add(
        paragraph_values(
            "docs/node-cleanup.md",
            &node_cleanup,
            "The agent adds `local_static_provisioner_succession_total{outcome}`",
        ),
        "succession_total{outcome}",
        &[],
        &succession,
    );
    lists
}

#[test]
fn closed_lists_of_label_values_match_the_code() {
    let _area = support::area(module_path!());
    let mut problems = Vec::new();
    for list in value_lists() {
        problems.extend(compare_values(&list.at, list.what, &list.spans, list.ignore, &list.code));
    }
    assert!(problems.is_empty(), "the docs' lists of label values disagree with the code:\n{}", problems.join("\n"));

    // A value missing from a list, or one the code never sets, is reported.
    let ValueList { at, what, spans, ignore, code } = value_lists().remove(0);
    let fewer: Vec<String> = spans.iter().filter(|s| *s != "name-taken").cloned().collect();
    let problems = compare_values(&at, what, &fewer, ignore, &code);
    assert!(problems.iter().any(|p| p.contains("takes \"name-taken\", which the doc does not list")), "{problems:?}");
    let more: Vec<String> = spans.iter().cloned().chain(["too-small".to_string()]).collect();
    let problems = compare_values(&at, what, &more, ignore, &code);
    assert!(problems.iter().any(|p| p.contains("never takes \"too-small\"")), "{problems:?}");
}

// ---------------------------------------------------------------------------------------------
// Paths and functions

/// The repository's folders whose paths the docs name.
const REPO_DIRS: [&str; 6] = ["src/", "tests/", "deploy/", "docs/", "scripts/", "bench/"];

/// Every repository path named in `text` (file `file`) that does not exist, and every
/// `path.rs::name` whose file has no `fn name`. A path starts with one of [`REPO_DIRS`] after
/// a character that cannot be part of a path (so `/usr/share/doc/…` and `../docs/x.md` are not
/// read as one) and ends at the first character that cannot (a glob's `*` included: `tests/*.rs`
/// is read as `tests/`).
fn check_paths(file: &str, text: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut problems = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let at = format!("{file}:{}", i + 1);
        let mut pos = 0;
        while let Some(start) = REPO_DIRS.iter().filter_map(|d| line[pos..].find(d).map(|s| s + pos)).min() {
            let end = line[start..].find(|c: char| !path_char(c)).map_or(line.len(), |e| start + e);
            pos = end.max(start + 1);
            if line[..start].chars().next_back().is_some_and(path_char) {
                continue;
            }
            let path = line[start..end].trim_end_matches(['.', ',']);
            // `kubectl logs deploy/NAME` names a Deployment (checked with the object names).
            let deployment = path.starts_with("deploy/") && line[..start].contains("kubectl");
            if !repo_root().join(path).exists() && !deployment {
                problems.push(format!("{at}: {path} does not exist"));
                continue;
            }
            let Some(rest) = line[end..].strip_prefix("::").filter(|_| path.ends_with(".rs")) else { continue };
            let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let source = read_doc(path);
            let defined = ["(", "<"].iter().any(|after| source.contains(&format!("fn {name}{after}")));
            if !name.is_empty() && !defined {
                problems.push(format!("{at}: {path} has no fn {name}"));
            }
        }
    }
    problems
}

#[test]
fn paths_and_functions_named_in_the_docs_exist() {
    let _area = support::area(module_path!());
    let architecture = read_doc("docs/architecture.md");
    let named = architecture.matches("src/").count();
    assert!(named > 50, "docs/architecture.md names only {named} paths under src/: was it rewritten?");
    let mut problems = Vec::new();
    for (file, text) in all_docs() {
        problems.extend(check_paths(&file, &text));
    }
    assert!(problems.is_empty(), "the docs name paths or functions that do not exist:\n{}", problems.join("\n"));

    // A path that does not exist, or a function its file does not define, is reported; a path
    // inside another one, a glob, and a sentence's full stop are not.
    let text = "`src/core/volumes/planer.rs` and `src/core/volumes/planner.rs::plan_everything`\n\
                `src/core/volumes/planner.rs::plan`, /usr/share/doc/x, tests/*.rs, ../docs/x, src/agent/.\n\
                `kubectl logs deploy/lsp-local-static-provisioner`";
    let problems = check_paths("x.md", text);
    assert_eq!(
        problems,
        [
            "x.md:1: src/core/volumes/planer.rs does not exist",
            "x.md:1: src/core/volumes/planner.rs has no fn plan_everything",
        ],
    );
}
