//! Semantic checks on a parsed config: things that parse but would make the agent publish the
//! wrong directory, or fail later in a way an operator would only see in the API server logs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};

use super::{ACCESS_MODES, Problem, ProvisionerConfig};
use crate::core::pattern::NamePattern;
use crate::core::pv::clean_path as normalize;
use crate::core::volume_safety::{SENSITIVE_DIRS, SYSTEM_DIRS};

/// Pseudo-filesystems that hold no volumes at any depth.
const PSEUDO_FS_ROOTS: [&str; 2] = ["/proc", "/sys"];

/// Lists every problem in the config, empty when it is usable.
pub fn validate(cfg: &ProvisionerConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut push = |location: String, message: String| problems.push(Problem { location, message });

    if cfg.min_resync_period.is_zero() {
        push("minResyncPeriod".into(), "must be greater than zero".into());
    }
    let mut host_dirs: BTreeMap<String, &str> = BTreeMap::new();
    let mut mount_dirs: BTreeMap<String, &str> = BTreeMap::new();
    for (class, c) in &cfg.storage_class_map {
        let loc = |key: &str| format!("storageClassMap.{class}.{key}");
        if let Some(msg) = class_name_problem(class) {
            push(format!("storageClassMap.{class}"), msg);
        }
        for (key, dir, seen) in [("hostDir", &c.host_dir, &mut host_dirs), ("mountDir", &c.mount_dir, &mut mount_dirs)]
        {
            match dir_problem(dir) {
                Some(msg) => push(loc(key), msg),
                None => {
                    let normal = normalize(dir);
                    if let Some(other) = seen.get(&normal) {
                        push(
                            loc(key),
                            format!(
                                "{dir:?} is already the {key} of class {other:?}; one directory can serve one class"
                            ),
                        );
                    } else {
                        seen.insert(normal, class.as_str());
                    }
                }
            }
        }
        if !ACCESS_MODES.contains(&c.access_mode.as_str()) {
            push(
                loc("accessMode"),
                format!("{:?} is not an access mode (use one of {})", c.access_mode, ACCESS_MODES.join(", ")),
            );
        }
        if let Err(e) = NamePattern::parse(&c.name_pattern) {
            push(loc("namePattern"), e);
        }
        if c.block_cleaner_command.iter().any(|s| s.is_empty()) {
            push(loc("blockCleanerCommand"), "contains an empty string".into());
        }
        for (i, term) in c.selector.iter().enumerate() {
            let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
                && term.match_fields.as_ref().is_none_or(Vec::is_empty);
            if empty {
                push(format!("{}[{i}]", loc("selector")), "is an empty term; it would match every node".into());
            }
        }
    }
    for (i, key) in cfg.node_labels_for_pv.iter().enumerate() {
        if key.is_empty() {
            push(format!("nodeLabelsForPV[{i}]"), "is empty".into());
        }
    }
    for (key, value) in &cfg.labels_for_pv {
        if let Some(msg) = label_key_problem(key).or_else(|| label_value_problem(value)) {
            push(format!("labelsForPV.{key}"), msg);
        }
    }
    // A class's hostDir inside another's would make one class's whole directory a volume of
    // the other, to be published twice and wiped with everything in it.
    let dirs: Vec<(&String, String)> = cfg
        .storage_class_map
        .iter()
        .filter(|(_, c)| dir_problem(&c.host_dir).is_none())
        .map(|(n, c)| (n, normalize(&c.host_dir)))
        .collect();
    let dir_names: Vec<&str> = dirs.iter().map(|(_, d)| d.as_str()).collect();
    for (i, o) in nested_dirs(&dir_names) {
        let ((inner, inner_dir), (outer, outer_dir)) = (&dirs[i], &dirs[o]);
        push(
            format!("storageClassMap.{inner}.hostDir"),
            format!(
                "{inner_dir:?} is inside the hostDir {outer_dir:?} of class {outer:?}; discovery directories must not nest"
            ),
        );
    }
    problems
}

/// Every pair `(inner, outer)` of indices where `dirs[inner]` lies strictly inside
/// `dirs[outer]` (`dirs[inner]` starts with `dirs[outer]` and a `/`), ordered by inner, then
/// by outer, as a scan over every pair would list them. A directory's possible outers are its
/// own prefixes ending before a `/`, so each is looked up instead of compared with every other
/// directory: a config with thousands of classes validates in near-linear time.
pub(super) fn nested_dirs(dirs: &[&str]) -> Vec<(usize, usize)> {
    let mut by_dir: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, d) in dirs.iter().enumerate() {
        by_dir.entry(d).or_default().push(i);
    }
    let mut pairs = Vec::new();
    for (inner, dir) in dirs.iter().enumerate() {
        let start = pairs.len();
        for (slash, _) in dir.match_indices('/') {
            if let Some(outers) = by_dir.get(&dir[..slash]) {
                pairs.extend(outers.iter().map(|&outer| (inner, outer)));
            }
        }
        pairs[start..].sort_unstable();
    }
    pairs
}

/// Kubernetes label key syntax: optional DNS-subdomain prefix and `/`, then a name of at most
/// 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && (prefix.is_empty() || class_name_problem(prefix).is_some())
    {
        return Some(format!("label key {key:?} has an invalid prefix (must be a lowercase DNS subdomain)"));
    }
    if name.is_empty() || !label_name_ok(name) {
        return Some(format!(
            "label key {key:?} is invalid (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        ));
    }
    None
}

fn label_value_problem(value: &str) -> Option<String> {
    (!value.is_empty() && !label_name_ok(value)).then(|| {
        format!("label value {value:?} is invalid (at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)")
    })
}

fn label_name_ok(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn class_name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    (!ok).then(|| format!("{name:?} is not a valid StorageClass name (lowercase DNS subdomain)"))
}

fn dir_problem(dir: &str) -> Option<String> {
    if dir.is_empty() {
        return Some("is required".into());
    }
    let path = Path::new(dir);
    if !path.is_absolute() {
        return Some(format!("{dir:?} must be an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Some(format!("{dir:?} must not contain '..'"));
    }
    let normal = normalize(dir);
    if SYSTEM_DIRS.contains(&normal.as_str()) {
        return Some(format!("{dir:?} is a system directory and cannot be a discovery root"));
    }
    if PSEUDO_FS_ROOTS.iter().any(|root| normal.starts_with(&format!("{root}/"))) {
        return Some(format!("{dir:?} is inside a kernel pseudo-filesystem and cannot hold volumes"));
    }
    if let Some(sensitive) = SENSITIVE_DIRS.iter().find(|s| normal == **s || normal.starts_with(&format!("{s}/"))) {
        return Some(format!(
            "{dir:?} is inside the host directory {sensitive}, whose contents are the host's own; it cannot hold volumes"
        ));
    }
    None
}
