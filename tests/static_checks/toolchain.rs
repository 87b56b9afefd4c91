//! scripts/toolchain.sh: the scripts find Go and cargo under sudo, whose secure_path drops
//! /usr/local/go/bin and ~/.cargo/bin, in the invoking user's home and the usual places, or say
//! exactly what to do. Each case runs the script in a clean environment (`env -i`) with
//! secure_path's PATH and a made-up user home.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support;

const SECURE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// An executable shell script at `path`.
fn script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fake `go` that reports `version` (as `go env GOVERSION` does).
fn fake_go(path: &Path, version: &str) {
    script(path, &format!("[ \"$1 $2\" = \"env GOVERSION\" ] && echo {version}"));
}

/// Runs `snippet` after sourcing the script, with secure_path's PATH, `home` as HOME and
/// `user_home` as the invoking user's; returns (exit code, stdout, stderr).
fn run(snippet: &str, home: &Path, user_home: &Path, extra: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new("/usr/bin/env");
    cmd.arg("-i")
        .arg(format!("PATH={SECURE_PATH}"))
        .arg(format!("HOME={}", home.display()))
        .arg(format!("LSP_TOOLCHAIN_HOME={}", user_home.display()));
    for (k, v) in extra {
        cmd.arg(format!("{k}={v}"));
    }
    let lib = repo().join("scripts/toolchain.sh");
    let out = cmd.args(["bash", "-c", &format!("source {}; {snippet}", lib.display())]).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_invoking_users_go_and_cargo_are_found_under_secure_path() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fake_go(&user.path().join("sdk/go1.26.2/bin/go"), "go1.26.2");
    script(&user.path().join(".cargo/bin/cargo"), "echo user-cargo");
    std::fs::create_dir_all(user.path().join(".rustup")).unwrap();
    let (code, out, err) = run(
        "lsp_find_toolchains && command -v go && command -v cargo && echo \"rustup=$RUSTUP_HOME\"",
        home.path(),
        user.path(),
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], user.path().join("sdk/go1.26.2/bin/go").to_str().unwrap());
    assert_eq!(lines[1], user.path().join(".cargo/bin/cargo").to_str().unwrap());
    // Their rustup proxy needs their toolchains; caches stay this user's own (CARGO_HOME unset).
    assert_eq!(lines[2], format!("rustup={}", user.path().join(".rustup").display()));
}

#[test]
fn a_go_older_than_1_26_is_passed_over() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    fake_go(&user.path().join(".local/go/bin/go"), "go1.25.7");
    fake_go(&user.path().join("sdk/go1.27rc1/bin/go"), "go1.27rc1");
    script(&user.path().join(".cargo/bin/cargo"), "true");
    let (code, out, err) = run("lsp_find_toolchains && command -v go", home.path(), user.path(), &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, user.path().join("sdk/go1.27rc1/bin/go").to_str().unwrap());
    for (version, ok) in [
        ("go1.26.0", true),
        ("go1.26", true),
        ("go2.0.1", true),
        ("go1.25.9", false),
        ("go1.9", false),
        ("devel", false),
    ] {
        let go = user.path().join(format!("v/{version}/go"));
        fake_go(&go, version);
        let (code, _, _) = run(&format!("lsp_go_ok {}", go.display()), home.path(), user.path(), &[]);
        assert_eq!(code == 0, ok, "{version}");
    }
}

#[test]
fn a_missing_cargo_says_exactly_what_to_do() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (code, _, err) = run("lsp_find_toolchains cargo", home.path(), user.path(), &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("Rust (cargo) is required and was not found"), "{err}");
    assert!(err.contains(&format!("{}/.cargo/bin", user.path().display())), "{err}");
    assert!(err.contains("https://rustup.rs"), "{err}");
    assert!(err.contains("sudo env \"PATH=$PATH\" bash"), "{err}");
}

#[test]
fn the_release_binary_follows_cargo_target_dir() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let cases = [
        (None, "/r/target/release/local-static-provisioner"),
        (Some("build"), "/r/build/release/local-static-provisioner"),
        (Some("/var/tmp/t"), "/var/tmp/t/release/local-static-provisioner"),
    ];
    for (dir, expected) in cases {
        let extra: Vec<(&str, &str)> = dir.map(|d| ("CARGO_TARGET_DIR", d)).into_iter().collect();
        let (code, out, err) = run("lsp_release_binary /r", home.path(), user.path(), &extra);
        assert_eq!((code, out.as_str()), (0, expected), "{dir:?}: {err}");
    }
}

/// What `sudo bash scripts/install-deps.sh` meets on this machine: secure_path, root's HOME.
#[test]
fn install_deps_passes_under_secure_path() {
    let _area = support::area(module_path!());
    if !nix::unistd::geteuid().is_root() {
        return support::cannot_run("install_deps_passes_under_secure_path", "needs root (it installs packages)");
    }
    let out = Command::new("/usr/bin/env")
        .args(["-i", &format!("PATH={SECURE_PATH}"), "HOME=/root", "bash"])
        .arg(repo().join("scripts/install-deps.sh"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A long build says every LSP_TICK seconds that it still runs, and how long it took; the line
/// printer ends with it (a caller's `$(...)` returns at once).
#[test]
fn a_long_stage_says_it_still_runs_and_how_long_it_took() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let started = std::time::Instant::now();
    let (code, out, err) = run(
        "x=$(lsp_stage demo 'the agent' sleep 2.5; echo done); echo \"$x\"",
        home.path(),
        user.path(),
        &[("LSP_TICK", "1")],
    );
    assert_eq!((code, out.as_str()), (0, "done"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "the ticker outlived the stage: {err}");
    assert!(err.contains("demo: building the agent ..."), "{err}");
    assert!(err.contains("demo: still building the agent (1 s so far)"), "{err}");
    assert!(err.contains("demo: the agent built in 2 s") || err.contains("demo: the agent built in 3 s"), "{err}");
}

/// A build that waits for another build's lock says what it waits for (the lock file and the
/// holder's PID), that it still waits, and how long it waited (tests/lib.sh's reuse_or_lock).
#[test]
fn a_build_waiting_on_a_lock_says_what_for_and_how_long() {
    let _area = support::area(module_path!());
    let (home, user) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let lock = home.path().join("build.lock");
    let mut holder = Command::new("flock").arg(&lock).args(["sleep", "2.5"]).spawn().unwrap();
    // The holder has the lock once flock -n fails.
    while Command::new("flock").args(["-n"]).arg(&lock).arg("true").status().unwrap().success() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let snippet = format!("exec 9> {0}; lsp_lock cp 9 {0} 'the control plane'; echo locked", lock.display());
    let (code, out, err) = run(&snippet, home.path(), user.path(), &[("LSP_TICK", "1")]);
    holder.wait().unwrap();
    assert_eq!((code, out.as_str()), (0, "locked"), "{err}");
    let waiting =
        format!("cp: waiting for another build of the control plane to finish (lock {}, held by pid ", lock.display());
    assert!(err.contains(&waiting), "{err}");
    assert!(err.contains(&holder.id().to_string()), "the holder's PID is not named: {err}");
    // The seconds depend on how soon this script reached the lock on a loaded machine; what must
    // hold is that a tick came while it waited, counted in whole seconds from the start of the
    // wait, and that the wait it reports is no shorter than the last tick.
    let ticks = seconds_in(&err, "cp: still waiting for the other build of the control plane (", " s so far)");
    let waited = seconds_in(&err, "cp: waited ", " s for the other build of the control plane");
    assert!(!ticks.is_empty() && ticks.iter().all(|s| (1..=3).contains(s)), "ticks {ticks:?}: {err}");
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "ticks out of order {ticks:?}: {err}");
    assert!(waited.len() == 1 && waited[0] >= *ticks.last().unwrap() && waited[0] <= 3, "waited {waited:?}: {err}");
}

/// The whole seconds in every line of `text` of the form `{before}N{after}`.
fn seconds_in(text: &str, before: &str, after: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix(before)?.strip_suffix(after)?.parse().ok()).collect()
}
