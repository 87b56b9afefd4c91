//! What the failing- and wedged-disk tests (failing_disks.rs, wedged_disks.rs, many_wedged.rs)
//! ask of the cluster and of the agent process: a class's config, a unique name, a PV's
//! phase, events, metrics and the agent's threads and memory.

use std::path::Path;

use serde_json::Value;

use super::ControlPlane;

/// A Filesystem class whose discovery directory is `dir` (hostDir and mountDir alike).
pub fn class_map(class: &str, dir: &Path) -> String {
    format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display())
}

/// A Block class whose discovery directory is `dir`.
pub fn block_class_map(class: &str, dir: &Path) -> String {
    format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n  volumeMode: Block\n", d = dir.display())
}

/// A name unique to this run (`base-<pid>`), for nodes, classes and claims: a rerun against the
/// same control plane never meets (or binds) the PVs and claims an earlier run left.
pub fn unique(base: &str) -> String {
    format!("{base}-{}", std::process::id())
}

/// The UID of PV `name` once it exists and is Available.
pub fn available(cp: &ControlPlane, name: &str) -> Option<String> {
    cp.pv_state(name).and_then(|(uid, phase)| (phase == "Available").then_some(uid))
}

/// The PV's capacity quantity.
pub fn capacity(cp: &ControlPlane, name: &str) -> Option<String> {
    cp.get_json(&["pv", name])?["spec"]["capacity"]["storage"].as_str().map(str::to_string)
}

/// The events.k8s.io Events about the object `kind`/`name`, with `reason` when given.
pub fn events_about(cp: &ControlPlane, kind: &str, name: &str, reason: Option<&str>) -> Vec<Value> {
    let mut selector = format!("regarding.kind={kind},regarding.name={name}");
    if let Some(reason) = reason {
        selector.push_str(&format!(",reason={reason}"));
    }
    let list = cp.get_json(&["events.events.k8s.io", "-A", "--field-selector", &selector]).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The lines of a /metrics answer of `metric` whose labels include every one of `labels`.
pub fn metric_lines<'a>(metrics: &'a str, metric: &str, labels: &[String]) -> Vec<&'a str> {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && labels.iter().all(|want| l.contains(want.as_str())))
        .collect()
}

/// The value of an unlabelled gauge in a /metrics answer.
pub fn gauge(metrics: &str, metric: &str) -> Option<i64> {
    metrics.lines().find_map(|l| l.strip_prefix(&format!("{metric} "))?.trim().parse().ok())
}

/// A field of /proc/PID/status as a number (`Threads`, `VmRSS` in kB).
pub fn proc_status(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} missing from /proc/{pid}/status"))
}

/// The threads and the resident memory (KiB) of process `pid`.
pub fn threads_and_rss(pid: u32) -> (u64, u64) {
    (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"))
}
