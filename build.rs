//! Build facts for `version` and the build-info metric: git commit, build date, rustc version
//! and target, passed to the crate as `LSP_*` environment variables.
//!
//! Works without git and without a `.git` directory (a source tarball, `cargo install`, a
//! container build that copies only the sources): the commit then comes from `LSP_GIT_COMMIT`
//! or is "unknown". The date is `SOURCE_DATE_EPOCH` when set (reproducible builds), else the
//! time this script ran. The script reruns only when HEAD, the branch it points at, the index,
//! the sources or one of those variables change, so a plain `cargo build` does not rebuild.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in ["LSP_GIT_COMMIT", "LSP_BUILD_DATE", "SOURCE_DATE_EPOCH"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = match non_empty_env("LSP_GIT_COMMIT") {
        Some(commit) => commit,
        None => git_commit(&manifest_dir).unwrap_or_else(|| "unknown".into()),
    };
    let date = non_empty_env("LSP_BUILD_DATE").unwrap_or_else(build_date);
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let rustc_version = Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=LSP_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=LSP_BUILD_DATE={date}");
    println!("cargo:rustc-env=LSP_RUSTC_VERSION={rustc_version}");
    println!("cargo:rustc-env=LSP_TARGET={target}");
}

fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git").arg("-C").arg(dir).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The short commit of the work tree holding this crate, "-dirty" when tracked files differ
/// from it. `None` when the crate is not the top of a git work tree (a tarball unpacked inside
/// some other repository must not report that repository's commit).
fn git_commit(manifest_dir: &Path) -> Option<String> {
    let top = git(manifest_dir, &["rev-parse", "--show-toplevel"])?;
    let same = |a: &Path, b: &Path| a.canonicalize().ok().zip(b.canonicalize().ok()).is_some_and(|(a, b)| a == b);
    if !same(Path::new(&top), manifest_dir) {
        return None;
    }
    // A worktree keeps HEAD and its index in its own git dir, the branches in the common one.
    let git_dir = PathBuf::from(git(manifest_dir, &["rev-parse", "--path-format=absolute", "--git-dir"])?);
    let common_dir = git(manifest_dir, &["rev-parse", "--path-format=absolute", "--git-common-dir"])
        .map(PathBuf::from)
        .unwrap_or_else(|| git_dir.clone());
    watch(&git_dir.join("HEAD"));
    watch(&git_dir.join("index"));
    watch(&common_dir.join("packed-refs"));
    if let Some(branch) = git(manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        // A packed branch has no file of its own (packed-refs holds it) until its next commit
        // writes one into its directory: then the directory is watched.
        let file = common_dir.join(&branch);
        match file.parent() {
            Some(parent) if !file.exists() => watch(parent),
            _ => watch(&file),
        }
    }
    // Edits that are not staged change no git file; the sources are watched for them.
    for path in ["src", "Cargo.toml", "Cargo.lock"] {
        watch(&manifest_dir.join(path));
    }
    let short = git(manifest_dir, &["rev-parse", "--short=12", "HEAD"])?;
    let status = git(manifest_dir, &["--no-optional-locks", "status", "--porcelain", "--untracked-files=no"])?;
    Some(if status.is_empty() { short } else { format!("{short}-dirty") })
}

/// Asks cargo to rerun this script when `path` changes; only paths that exist, since a missing
/// one counts as changed on every build.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// `SOURCE_DATE_EPOCH` (seconds since the epoch) or now, as RFC 3339 UTC.
fn build_date() -> String {
    let secs = match non_empty_env("SOURCE_DATE_EPOCH") {
        Some(v) => match v.parse::<i64>() {
            Ok(secs) => secs,
            Err(_) => {
                println!("cargo:warning=SOURCE_DATE_EPOCH={v:?} is not a number of seconds; build date unknown");
                return "unknown".into();
            }
        },
        None => SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0),
    };
    rfc3339_utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (Howard Hinnant's days-to-civil
/// algorithm: no date crate for one line of output).
fn rfc3339_utc(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
