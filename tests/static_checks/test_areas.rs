//! The test crates themselves. The integration tests are a few crates, each linked once
//! (tests/static_checks, tests/host, tests/cluster: one module per area), plus the real-node
//! crates tests/run.sh runs on their own; every file of a crate's folder is one of its modules,
//! and every test enters its area first, so that tests of two areas never run at the same time
//! (tests/support/area.rs). The area gate lets the tests of one area run side by side and
//! never two areas at once.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::area::{AreaGate, area_of};

/// The test crates of one file that stay apart: tests/run.sh runs them on the real node, after
/// the others.
const SEPARATE: &[&str] = &["real_node.rs", "real_node_helm.rs"];

/// What every test of a merged crate starts with.
const ENTER: &str = "    let _area = support::area(module_path!());";

/// The folders of tests/ holding a crate (a main.rs).
fn crate_dirs() -> Vec<PathBuf> {
    let tests = support::repo_root().join("tests");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&tests)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("main.rs").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .collect();
    files.sort();
    files
}

/// The names of the tests in `text` (functions under `#[test]` or `#[tokio::test]`) whose body
/// does not start with [`ENTER`].
fn tests_not_entering(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut missing = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim();
        if !(t == "#[test]" || (t.starts_with("#[tokio::test") && t.ends_with(']'))) {
            continue;
        }
        let Some(sig) = lines[i + 1..].iter().position(|l| !l.trim_start().starts_with("#[")) else { continue };
        let sig = i + 1 + sig;
        let name = lines[sig].split("fn ").nth(1).and_then(|r| r.split('(').next()).unwrap_or(lines[sig]);
        if !(lines[sig].trim_end().ends_with('{') && lines.get(sig + 1) == Some(&ENTER)) {
            missing.push(name.to_string());
        }
    }
    missing
}

#[test]
fn every_test_file_is_a_module_of_a_merged_crate() {
    let _area = support::area(module_path!());
    let tests = support::repo_root().join("tests");
    let mut problems = Vec::new();
    for file in rust_files(&tests) {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        if !SEPARATE.contains(&name.as_str()) {
            problems.push(format!(
                "tests/{name} is a test crate of its own, linked on its own: make it a module of \
                 tests/static_checks, tests/host or tests/cluster"
            ));
        }
    }
    let dirs = crate_dirs();
    assert!(dirs.len() >= 3, "the merged crates: {dirs:?}");
    for dir in dirs {
        let main = std::fs::read_to_string(dir.join("main.rs")).unwrap();
        let declared: Vec<&str> = main
            .lines()
            .filter_map(|l| l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')))
            .filter(|m| *m != "support")
            .collect();
        let crate_name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let files: Vec<String> = rust_files(&dir)
            .iter()
            .map(|f| f.file_stem().unwrap().to_string_lossy().into_owned())
            .filter(|stem| stem != "main")
            .collect();
        for stem in &files {
            if !declared.contains(&stem.as_str()) {
                problems.push(format!(
                    "tests/{crate_name}/{stem}.rs is not a module of tests/{crate_name}/main.rs: it never runs"
                ));
            }
        }
        for module in &declared {
            if !files.iter().any(|f| f == module) {
                problems.push(format!("tests/{crate_name}/main.rs declares {module}, which is no file of its folder"));
            }
        }
        for stem in &files {
            let text = std::fs::read_to_string(dir.join(format!("{stem}.rs"))).unwrap();
            for test in tests_not_entering(&text) {
                problems.push(format!("tests/{crate_name}/{stem}.rs: {test} does not start with `{}`", ENTER.trim()));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn tests_that_do_not_enter_their_area_are_found() {
    let _area = support::area(module_path!());
    let text = "#[test]\nfn a() {\n    let _area = support::area(module_path!());\n}\n\
                #[test]\n#[ignore = \"slow\"]\nfn b() {\n    run();\n}\n\
                #[tokio::test]\nasync fn c() {\n    let _ = support::area(module_path!());\n}\n";
    assert_eq!(tests_not_entering(text), ["b", "c"]);
}

#[test]
fn the_area_is_the_module_below_the_crate() {
    let _area = support::area(module_path!());
    assert_eq!(area_of("cluster::admission"), "admission");
    assert_eq!(area_of("cluster::admission::inner"), "admission");
    assert_eq!(area_of("cluster"), "cluster");
    assert_eq!(area_of(module_path!()), "test_areas");
}

/// Tests of areas a, a, a, b, b, c, a, b, each on its own thread, started in that order: tests
/// of one area run side by side (the first two wait inside until they see each other), two
/// areas never do, and every test ends (a waiting test blocks nobody).
#[test]
fn two_areas_never_run_at_once_and_one_area_runs_side_by_side() {
    let _area = support::area(module_path!());
    let gate = AreaGate::new(false);
    let inside: Mutex<Vec<&str>> = Mutex::new(Vec::new());
    let most_of_one_area = AtomicUsize::new(0);
    let ended = AtomicUsize::new(0);
    let order = ["a", "a", "a", "b", "b", "c", "a", "b"];
    std::thread::scope(|s| {
        for (i, area) in order.iter().enumerate() {
            let (gate, inside, most, ended) = (&gate, &inside, &most_of_one_area, &ended);
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(10 * i as u64));
                let _in = gate.enter(area);
                {
                    let mut now = inside.lock().unwrap();
                    assert!(now.iter().all(|other| other == area), "{area} entered while {now:?} ran");
                    now.push(area);
                    most.fetch_max(now.len(), Ordering::SeqCst);
                }
                let start = Instant::now();
                while i < 2 && most.load(Ordering::SeqCst) < 2 && start.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                std::thread::sleep(Duration::from_millis(20));
                let mut now = inside.lock().unwrap();
                let at = now.iter().position(|a| a == area).unwrap();
                now.remove(at);
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
    });
    assert_eq!(ended.load(Ordering::SeqCst), order.len());
    assert!(most_of_one_area.load(Ordering::SeqCst) >= 2, "tests of one area never ran side by side");
}
