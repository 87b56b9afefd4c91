//! Semantic checks on a parsed config: things that parse but would make the agent publish the
//! wrong directory, or fail later in a way an operator would only see in the API server logs.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path};

use super::{ACCESS_MODES, ClassConfig, Problem, ProvisionerConfig};
use crate::core::config::pattern::NamePattern;
use crate::core::volumes::pv::clean_path as normalize;
use crate::core::volumes::volume_safety::{SENSITIVE_DIRS, SYSTEM_DIRS, dedicated_dev_dir, dev_root_advice};

/// Pseudo-filesystems that hold no volumes at any depth.
const PSEUDO_FS_ROOTS: [&str; 2] = ["/proc", "/sys"];

/// What is wrong with a parsed config: problems that concern the whole config (it is refused),
/// and problems of single classes (only those classes are left out).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Findings {
    /// Problems of top-level keys: the whole config is refused for any of them.
    pub global: Vec<Problem>,
    /// Problems of one class each, by class name.
    pub classes: BTreeMap<String, Vec<Problem>>,
}

impl Findings {
    fn class(&mut self, class: &str, location: String, message: String) {
        self.classes.entry(class.to_string()).or_default().push(Problem { location, message });
    }
}

/// Lists every problem in the config, empty when it is usable. A problem of one class's
/// settings (or of its directories clashing with another class's) concerns that class only.
pub fn validate(cfg: &ProvisionerConfig) -> Findings {
    let mut findings = Findings::default();

    if cfg.min_resync_period.is_zero() {
        findings
            .global
            .push(Problem { location: "minResyncPeriod".into(), message: "must be greater than zero".into() });
    }
    for (class, c) in &cfg.storage_class_map {
        let loc = |key: &str| format!("storageClassMap.{class}.{key}");
        if let Some(msg) = class_name_problem(class) {
            findings.class(class, format!("storageClassMap.{class}"), msg);
        }
        for (key, dir) in [("hostDir", &c.host_dir), ("mountDir", &c.mount_dir)] {
            if let Some(msg) = dir_problem(dir) {
                findings.class(class, loc(key), msg);
            }
        }
        if !ACCESS_MODES.contains(&c.access_mode.as_str()) {
            findings.class(
                class,
                loc("accessMode"),
                format!("{:?} is not an access mode (use one of {})", c.access_mode, ACCESS_MODES.join(", ")),
            );
        }
        if let Err(e) = NamePattern::parse(&c.name_pattern) {
            findings.class(class, loc("namePattern"), e);
        }
        if c.block_cleaner_command.iter().any(|s| s.is_empty()) {
            findings.class(class, loc("blockCleanerCommand"), "contains an empty string".into());
        }
        for (i, term) in c.selector.iter().enumerate() {
            let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
                && term.match_fields.as_ref().is_none_or(Vec::is_empty);
            if empty {
                findings.class(
                    class,
                    format!("{}[{i}]", loc("selector")),
                    "is an empty term; it would match every node".into(),
                );
            }
        }
    }
    for (class, problems) in conflicts(cfg) {
        findings.classes.entry(class).or_default().extend(problems);
    }
    for (i, key) in cfg.node_labels_for_pv.iter().enumerate() {
        if key.is_empty() {
            findings.global.push(Problem { location: format!("nodeLabelsForPV[{i}]"), message: "is empty".into() });
        }
    }
    for (key, value) in &cfg.labels_for_pv {
        if let Some(msg) = label_key_problem(key).or_else(|| label_value_problem(value)) {
            findings.global.push(Problem { location: format!("labelsForPV.{key}"), message: msg });
        }
    }
    findings
}

/// Classes whose directories clash with another class's, by class: a hostDir or mountDir
/// that is already another class's (the class sorted later is blamed: the other one can run
/// alone safely), and hostDirs nested in one another (both are blamed: the outer class would
/// publish the inner one's whole directory as one volume, and wipe it).
pub(super) fn conflicts(cfg: &ProvisionerConfig) -> BTreeMap<String, Vec<Problem>> {
    let mut out: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    let mut push = |class: &str, location: String, message: String| {
        out.entry(class.to_string()).or_default().push(Problem { location, message });
    };
    let mut host_dirs: BTreeMap<String, &str> = BTreeMap::new();
    let mut mount_dirs: BTreeMap<String, &str> = BTreeMap::new();
    for (class, c) in &cfg.storage_class_map {
        for (key, dir, seen) in [("hostDir", &c.host_dir, &mut host_dirs), ("mountDir", &c.mount_dir, &mut mount_dirs)]
        {
            if dir_problem(dir).is_some() {
                continue;
            }
            let normal = normalize(dir);
            if let Some(other) = seen.get(&normal) {
                push(
                    class,
                    format!("storageClassMap.{class}.{key}"),
                    format!("{dir:?} is already the {key} of class {other:?}; one directory can serve one class"),
                );
            } else {
                seen.insert(normal, class.as_str());
            }
        }
    }
    let dirs: Vec<(&String, String)> = cfg
        .storage_class_map
        .iter()
        .filter(|(_, c)| dir_problem(&c.host_dir).is_none())
        .map(|(n, c)| (n, normalize(&c.host_dir)))
        .collect();
    let dir_names: Vec<&str> = dirs.iter().map(|(_, d)| d.as_str()).collect();
    let mut outer_problems = Vec::new();
    for (i, o) in nested_dirs(&dir_names) {
        let ((inner, inner_dir), (outer, outer_dir)) = (&dirs[i], &dirs[o]);
        push(
            inner,
            format!("storageClassMap.{inner}.hostDir"),
            format!(
                "{inner_dir:?} is inside the hostDir {outer_dir:?} of class {outer:?}; discovery directories must not nest"
            ),
        );
        outer_problems.push((
            outer.to_string(),
            format!("storageClassMap.{outer}.hostDir"),
            format!(
                "{outer_dir:?} contains the hostDir {inner_dir:?} of class {inner:?}; discovery directories must not nest"
            ),
        ));
    }
    for (class, location, message) in outer_problems {
        push(&class, location, message);
    }
    out
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

/// Why `dir` cannot be a class's hostDir or mountDir. A directory of its own below /dev/disk
/// is accepted (`dedicated_dev_dir`, in core/volumes/volume_safety.rs).
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
        let advice = dev_root_advice(Path::new(&normal));
        return Some(format!("{dir:?} is a system directory and cannot be a discovery root{advice}"));
    }
    if PSEUDO_FS_ROOTS.iter().any(|root| normal.starts_with(&format!("{root}/"))) {
        return Some(format!("{dir:?} is inside a kernel pseudo-filesystem and cannot hold volumes"));
    }
    if dedicated_dev_dir(Path::new(&normal)) {
        return None;
    }
    if let Some(sensitive) = SENSITIVE_DIRS.iter().find(|s| normal == **s || normal.starts_with(&format!("{s}/"))) {
        let advice = dev_root_advice(Path::new(&normal));
        return Some(format!(
            "{dir:?} is inside the host directory {sensitive}, whose contents are the host's own; it cannot hold volumes{advice}"
        ));
    }
    None
}

/// Why two classes cannot run side by side (the same hostDir or mountDir, or nested
/// hostDirs), from `class`'s point of view; None when they can. Used when a class that failed
/// keeps its last valid definition next to the others' new ones.
pub(super) fn clash(class: &str, c: &ClassConfig, other: &str, o: &ClassConfig) -> Option<Problem> {
    let at = |key: &str| format!("storageClassMap.{class}.{key}");
    for (key, mine, theirs) in [("hostDir", &c.host_dir, &o.host_dir), ("mountDir", &c.mount_dir, &o.mount_dir)] {
        if normalize(mine) == normalize(theirs) {
            return Some(Problem {
                location: at(key),
                message: format!(
                    "{mine:?} is the {key} of class {other:?}, which keeps its last valid definition; one directory can serve one class"
                ),
            });
        }
    }
    let (mine, theirs) = (normalize(&c.host_dir), normalize(&o.host_dir));
    let nested = |inner: &str, outer: &str| inner.starts_with(outer) && inner[outer.len()..].starts_with('/');
    if nested(&mine, &theirs) || nested(&theirs, &mine) {
        return Some(Problem {
            location: at("hostDir"),
            message: format!(
                "{mine:?} and the hostDir {theirs:?} of class {other:?} (which keeps its last valid definition) nest; discovery directories must not nest"
            ),
        });
    }
    None
}
