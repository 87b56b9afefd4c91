//! The source layout stays readable: every import between the top-level modules and folders of
//! src/ points down the ranks below (no circles), and core/ imports nothing but core/, with no
//! circle between its files either. Read from the sources themselves: every `crate::` path in
//! src/**/*.rs outside comments, in `use` lines and inline. `LSP_LAYOUT_SRC` points the check
//! at another tree (how it was seen failing on the tree before issue 29).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::support;

/// The ranks, lowest first: a module may import only modules of a lower rank. The README's
/// layout section says the same.
const RANKS: &[&[&str]] = &[
    // Pure logic and build facts: no I/O, no imports of the rest.
    &["core", "build_info", "memory"],
    // Reading and checking the ConfigMap (its types are core::settings).
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

/// The top-level module a file of src/ belongs to (`host` for src/host/claims.rs, `metrics`
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
/// `crate::host::ops::Operations`, `api` and `core` for `use crate::{api::Cluster, core::pv}`.
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

/// Imports between the files of core/ (`super::x` and `crate::core::x`), by file stem. Test
/// code is left out (`*_tests.rs`, and a file from its `#[cfg(test)]` on): tests sit above
/// what they test.
fn core_file_edges(core: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(core, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let stem = file.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        if stem == "mod" || stem.ends_with("_tests") {
            continue;
        }
        let unit = stem;
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let code: String =
            text.lines().take_while(|l| l.trim() != "#[cfg(test)]").map(code_of).collect::<Vec<_>>().join("\n");
        for prefix in ["super::", "crate::core::"] {
            let mut rest = code.as_str();
            while let Some(at) = rest.find(prefix) {
                let before = rest[..at].chars().next_back();
                rest = &rest[at + prefix.len()..];
                let target = ident_at(rest);
                // `super::super::x` is not a file of core; `super::*` in a test module is the
                // file itself.
                let word = before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
                if !word && !target.is_empty() && target != unit && target != "super" {
                    edges.entry(unit.clone()).or_default().insert(target);
                }
            }
        }
    }
    edges
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
        problems
            .push(format!("{module} has no rank: add it to RANKS in tests/static_checks/layout.rs and to the README"));
    }
    for circle in circles(&graph) {
        problems.push(format!("import circle between top-level modules: {circle}"));
    }
    for circle in circles(&core_file_edges(&src.join("core"))) {
        problems.push(format!("import circle between files of core/: {circle}"));
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
        ("/x/src/host/claims.rs", Some("host")),
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
