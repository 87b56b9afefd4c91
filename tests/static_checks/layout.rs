//! The source layout stays readable: every import between the top-level modules and folders of
//! src/ points down the ranks below (no circles), core/ imports nothing but core/, every file of
//! core/ and host/ sits in a capability folder (host/ using core's folder names), and no two
//! files of core/ or of host/ import each other in a circle. Read from the sources themselves: every `crate::` path in
//! src/**/*.rs outside comments, in `use` lines and inline. `LSP_LAYOUT_SRC` points the check
//! at another tree (how it was seen failing on the tree before issue 29).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support;

/// The ranks, lowest first: a module may import only modules of a lower rank.
/// docs/architecture.md's table of top-level modules says the same.
const RANKS: &[&[&str]] = &[
    // Pure logic and build facts: no I/O, no imports of the rest.
    &["core", "build_info", "memory"],
    // Reading and checking the ConfigMap (its types are core::config::settings).
    &["config"],
    // Everything that touches the host, discovery included.
    &["host"],
    // Prometheus metrics (reads the process's own figures through host).
    &["metrics"],
    // The API client; the admin HTTP server (metrics, health).
    &["api", "admin"],
    // Loop helpers shared by the long-running roles.
    &["runtime"],
    // Wipes in the background.
    &["wiper"],
    // The two long-running roles.
    &["agent", "node_cleanup"],
    // The command line.
    &["cli"],
];

/// The top-level module a file of src/ belongs to (`host` for src/host/devices/claims.rs, `metrics`
/// for src/metrics.rs); `None` for the crate roots (lib.rs, main.rs).
fn unit_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned());
    let first = parts.next()?;
    match (first.strip_suffix(".rs"), parts.next()) {
        (Some("lib" | "main"), None) => None,
        (Some(stem), None) => Some(stem.to_string()),
        (_, _) => Some(first),
    }
}

/// A line without its `//` comment (doc comments included). Good enough for this code base:
/// no string literal here holds `//` before a `crate::` path.
fn code_of(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

/// The first path segments after every `crate::` in `text` (outside comments): `host` for
/// `crate::host::ops::Operations`, `api` and `core` for `use crate::{api::Cluster, core::volumes::pv}`.
fn crate_paths(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let code: String = text.lines().map(code_of).collect::<Vec<_>>().join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `local_static_provisioner::` or `my_crate::` end in "crate::" too.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            found.extend(group_heads(group));
        } else {
            found.push(ident_at(rest));
        }
    }
    found.retain(|s| !s.is_empty());
    found
}

/// The first segment of every path of a `{a::x, b::{y, z}, c}` group (`group` starts after `{`).
fn group_heads(group: &str) -> Vec<String> {
    let (mut heads, mut depth, mut at_start) = (Vec::new(), 0usize, true);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => at_start = true,
            c if at_start && (c.is_alphanumeric() || c == '_') => {
                heads.push(ident_at(&group[i..]));
                at_start = false;
            }
            _ => {}
        }
    }
    heads
}

fn ident_at(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())).path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Imports between top-level modules: (from, to) -> the files that make them.
type Edges = BTreeMap<(String, String), BTreeSet<String>>;

fn top_level_edges(src: &Path) -> Edges {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut edges = Edges::new();
    for file in files {
        let Some(unit) = unit_of(src, &file) else { continue };
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        for target in crate_paths(&text) {
            if target != unit && target != "self" && target != "super" {
                let name = file.strip_prefix(src).unwrap_or(&file).display().to_string();
                edges.entry((unit.clone(), target)).or_default().insert(name);
            }
        }
    }
    edges
}

/// The capability folders of core/ and host/, and the few host-wide files that sit beside them.
/// A file elsewhere has no room a newcomer would look in: add its folder here and to
/// docs/architecture.md. host/ uses core's folder names, so the facts a core folder judges are
/// gathered in the host folder of the same name.
const CORE_FOLDERS: &[&str] =
    &["cluster", "config", "devices", "fence", "health", "identity", "mounts", "reconcile", "volumes", "wipe"];
const HOST_FOLDERS: &[&str] = &["devices", "fence", "health", "identity", "mounts", "volumes", "wipe"];
const HOST_WIDE_FILES: &[&str] = &["access", "ops", "process", "state_file"];

/// Every path a text names after `prefix` (`crate::core::`), outside comments, with `{}` groups
/// expanded: `crate::core::{a::b, c::{d, e}}` names `a::b`, `c::d` and `c::e`.
fn paths_after(text: &str, prefix: &str) -> Vec<Vec<String>> {
    fn tree(text: &str, base: &[String], out: &mut Vec<Vec<String>>) -> usize {
        let (mut at, mut path) = (0, base.to_vec());
        let bytes = text.as_bytes();
        while at < text.len() {
            let c = bytes[at] as char;
            if c.is_alphanumeric() || c == '_' {
                let word = ident_at(&text[at..]);
                at += word.len();
                path.push(word);
            } else if text[at..].starts_with("::{") {
                at += 3 + tree(&text[at + 3..], &path, out);
                path = base.to_vec();
            } else if text[at..].starts_with("::") {
                at += 2;
            } else if c == ',' || c == '}' {
                if path.len() > base.len() {
                    out.push(std::mem::replace(&mut path, base.to_vec()));
                }
                at += 1;
                if c == '}' || base.is_empty() {
                    return at;
                }
            } else if c.is_whitespace() && !base.is_empty() {
                at += 1;
            } else {
                break;
            }
        }
        if path.len() > base.len() {
            out.push(path);
        }
        at
    }
    let code: String = text.lines().map(code_of).collect::<Vec<_>>().join("\n");
    let (mut out, mut rest) = (Vec::new(), code.as_str());
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            tree(group, &[String::new()], &mut out);
        } else {
            tree(rest, &[], &mut out);
        }
    }
    for path in &mut out {
        path.retain(|s| !s.is_empty());
    }
    out.retain(|p| !p.is_empty());
    out
}

/// A file of `root` (core/ or host/) as the layout names it: `volumes/planner` for
/// src/core/volumes/planner.rs, `ops` for src/host/ops.rs; None for a folder's mod.rs, which
/// only declares its files.
fn file_unit(root: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(root).ok()?.with_extension("");
    let name = rel.to_string_lossy().into_owned();
    (rel.file_name()? != "mod").then_some(name)
}

/// What a path after `crate::core::` (or `super::` from `from`) names among the files of `root`:
/// `volumes/planner` for `volumes::planner::X`; None for an item of the root's mod.rs.
fn target_file(root: &Path, path: &[String]) -> Option<String> {
    let first = path.first()?;
    if root.join(first).is_dir() {
        let file = path.get(1)?;
        root.join(first).join(format!("{file}.rs")).is_file().then(|| format!("{first}/{file}"))
    } else {
        root.join(format!("{first}.rs")).is_file().then(|| first.clone())
    }
}

/// Imports between the production files of `root` (src/core or src/host), as `folder/file`.
/// Test code is left out (`*_tests.rs`, and a file from its `#[cfg(test)]` on): tests sit above
/// what they test.
fn file_edges(root: &Path, name: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let Some(unit) = file_unit(root, &file) else { continue };
        if unit.ends_with("_tests") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let code: String = text.lines().take_while(|l| l.trim() != "#[cfg(test)]").collect::<Vec<_>>().join("\n");
        let folder = file.parent().and_then(|p| p.strip_prefix(root).ok()).map(Path::to_path_buf).unwrap_or_default();
        let mut targets: Vec<String> =
            paths_after(&code, &format!("crate::{name}::")).iter().filter_map(|p| target_file(root, p)).collect();
        for path in paths_after(&code, "super::") {
            let mut full: Vec<String> = folder.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            full.extend(path);
            targets.extend(target_file(root, &full));
        }
        for target in targets {
            if target != unit {
                edges.entry(unit.clone()).or_default().insert(target);
            }
        }
    }
    edges
}

/// Files of `root` outside the capability folders (and, for host/, its host-wide files), and
/// folders no rule names.
fn misplaced(root: &Path, folders: &[&str], top_files: &[&str]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("reading {}: {e}", root.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("reading {}: {e}", root.display())).path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        // A file's unit tests (`ops_tests.rs`) sit beside it.
        let file = name.strip_suffix("_tests").unwrap_or(&name);
        let known =
            if path.is_dir() { folders.contains(&name.as_str()) } else { file == "mod" || top_files.contains(&file) };
        if !known {
            problems.push(format!(
                "{} is not in a capability folder of {} (folders: {}): move it into one, or name a new folder in tests/static_checks/layout.rs and docs/architecture.md",
                path.display(),
                root.display(),
                folders.join(", ")
            ));
        }
    }
    problems
}

/// The circles of a graph, each as the path that closes it (`a -> b -> a`), one per circle
/// found by a depth-first walk.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    fn walk(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        out: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            out.push(circle.join(" -> "));
            return;
        }
        if !done.insert(node.to_string()) {
            return;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            walk(next, graph, path, done, out);
        }
        path.pop();
    }
    let (mut done, mut out) = (BTreeSet::new(), Vec::new());
    for node in graph.keys() {
        walk(node, graph, &mut Vec::new(), &mut done, &mut out);
    }
    out
}

fn rank_of(unit: &str) -> Option<usize> {
    RANKS.iter().position(|rank| rank.contains(&unit))
}

/// What is wrong with the layout of the tree at `src`, one line each.
fn layout_problems(src: &Path) -> Vec<String> {
    let edges = top_level_edges(src);
    let (mut problems, mut unranked) = (Vec::new(), BTreeSet::new());
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((from, to), files) in &edges {
        graph.entry(from.clone()).or_default().insert(to.clone());
        let files = files.iter().cloned().collect::<Vec<_>>().join(", ");
        if from == "core" {
            problems.push(format!("core imports {to} ({files}): core is pure and imports only core"));
        }
        match (rank_of(from), rank_of(to)) {
            (Some(f), Some(t)) if f <= t => {
                problems.push(format!("{from} (rank {f}) imports {to} (rank {t}), not below it ({files})"))
            }
            (f, t) => {
                for (rank, module) in [(f, from), (t, to)] {
                    if rank.is_none() {
                        unranked.insert(module.clone());
                    }
                }
            }
        }
    }
    for module in unranked {
        problems.push(format!(
            "{module} has no rank: add it to RANKS in tests/static_checks/layout.rs and to docs/architecture.md"
        ));
    }
    for circle in circles(&graph) {
        problems.push(format!("import circle between top-level modules: {circle}"));
    }
    for name in ["core", "host"] {
        for circle in circles(&file_edges(&src.join(name), name)) {
            problems.push(format!("import circle between files of {name}/: {circle}"));
        }
    }
    problems.extend(misplaced(&src.join("core"), CORE_FOLDERS, &[]));
    problems.extend(misplaced(&src.join("host"), HOST_FOLDERS, HOST_WIDE_FILES));
    for folder in HOST_FOLDERS {
        if !CORE_FOLDERS.contains(folder) {
            problems.push(format!("host/{folder} has no core/{folder}: host's folders take core's names"));
        }
    }
    problems
}

#[test]
fn imports_point_down_the_ranks_without_circles() {
    let _area = support::area(module_path!());
    let src = std::env::var_os("LSP_LAYOUT_SRC")
        .map_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), PathBuf::from);
    let edges = top_level_edges(&src);
    assert!(edges.len() > 20, "the walk found the imports of {}: {edges:?}", src.display());
    let problems = layout_problems(&src);
    assert!(problems.is_empty(), "{} layout problem(s):\n{}", problems.len(), problems.join("\n"));
}

#[test]
fn crate_paths_are_read_from_code_only() {
    let _area = support::area(module_path!());
    let text = "use crate::host::ops::{Answer, Job};\n\
                use crate::{api::Cluster, core::{pv, naming::X}, metrics};\n\
                let x = crate::wiper::ask_of(&pv); // crate::agent in a comment\n\
                /// [`crate::admin::Readiness`] in a doc comment\n\
                use local_static_provisioner::runtime;\n\
                pub(crate) fn f() {}\n";
    assert_eq!(crate_paths(text), ["host", "api", "core", "metrics", "wiper"]);
}

#[test]
fn files_belong_to_their_top_level_module() {
    let _area = support::area(module_path!());
    let src = Path::new("/x/src");
    for (file, unit) in [
        ("/x/src/metrics.rs", Some("metrics")),
        ("/x/src/host/devices/claims.rs", Some("host")),
        ("/x/src/cli/mod.rs", Some("cli")),
        ("/x/src/core/a/b.rs", Some("core")),
        ("/x/src/lib.rs", None),
        ("/x/src/main.rs", None),
    ] {
        assert_eq!(unit_of(src, Path::new(file)).as_deref(), unit, "{file}");
    }
}

#[test]
fn circles_are_found_and_named() {
    let _area = support::area(module_path!());
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
        }
        g
    };
    assert!(circles(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])).is_empty());
    assert_eq!(circles(&graph(&[("a", "b"), ("b", "a")])), ["a -> b -> a"]);
    assert_eq!(circles(&graph(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")])), ["a -> b -> c -> a"]);
    assert_eq!(circles(&graph(&[("x", "y"), ("y", "z"), ("z", "y")])), ["y -> z -> y"]);
}

#[test]
fn every_rank_names_distinct_modules() {
    let _area = support::area(module_path!());
    let all: Vec<&str> = RANKS.iter().flat_map(|r| r.iter().copied()).collect();
    let distinct: BTreeSet<&str> = all.iter().copied().collect();
    assert_eq!(all.len(), distinct.len(), "a module in two ranks: {all:?}");
    assert_eq!(rank_of("core"), Some(0));
    assert!(rank_of("cli") > rank_of("agent") && rank_of("agent") > rank_of("wiper"));
    assert!(rank_of("wiper") > rank_of("host") && rank_of("host") > rank_of("core"));
}

#[test]
fn use_groups_are_expanded_to_every_path() {
    let _area = support::area(module_path!());
    let text = "use crate::core::{volumes::planner::{self, Plan}, identity::used_mark::UsedMark};\n\
                use crate::core::wipe::cleanup::PvState; // crate::core::fence::x in a comment\n\
                let n = crate::core::volumes::naming::pv_name(x);\n\
                use super::{blockdev, mountinfo::MountTable};\n";
    let core = paths_after(text, "crate::core::");
    let heads: Vec<String> = core.iter().map(|p| p[..2].join("/")).collect();
    assert_eq!(heads, ["volumes/planner", "volumes/planner", "identity/used_mark", "wipe/cleanup", "volumes/naming"]);
    let sup: Vec<String> = paths_after(text, "super::").iter().map(|p| p[0].clone()).collect();
    assert_eq!(sup, ["blockdev", "mountinfo"]);
}

#[test]
fn file_edges_cross_folders_and_find_circles_between_files() {
    let _area = support::area(module_path!());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let core = file_edges(&src.join("core"), "core");
    assert!(core.get("volumes/planner").is_some_and(|t| t.contains("identity/used_mark")), "{core:?}");
    let host = file_edges(&src.join("host"), "host");
    assert!(host.get("wipe/run").is_some_and(|t| t.contains("identity/fingerprint")), "{host:?}");
    assert!(host.get("devices/blockdev").is_some_and(|t| t.contains("mounts/mountinfo")), "super:: of host");
    // A tree of two files in two folders that import each other, and a file outside any folder.
    let dir = std::env::temp_dir().join(format!("lsp-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (file, text) in [
        ("core/mod.rs", "pub mod a;\npub mod b;\n"),
        ("core/a/mod.rs", "pub mod x;\n"),
        ("core/a/x.rs", "use crate::core::b::y::Y;\n#[cfg(test)]\nmod tests { use crate::core::stray::Z; }\n"),
        ("core/b/mod.rs", "pub mod y;\n"),
        ("core/b/y.rs", "pub fn f() { crate::core::{a::x::g}; }\n"),
        ("core/stray.rs", ""),
    ] {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let edges = file_edges(&dir.join("core"), "core");
    assert_eq!(circles(&edges), ["a/x -> b/y -> a/x"], "test code is left out: {edges:?}");
    let problems = misplaced(&dir.join("core"), &["a", "b"], &[]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("stray.rs"), "{problems:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
