//! What this binary was built from, for `version`, `--version` and the build-info metric: a
//! bug report or a dashboard then says which commit runs, not just the crate version (which
//! does not change between releases). Filled in by build.rs, which always sets every one of
//! them: "unknown" where it could not tell (sources without git and without `LSP_GIT_COMMIT`).

/// The crate version.
pub(crate) const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Short git commit, with "-dirty" when the work tree had uncommitted changes.
pub(crate) const GIT_COMMIT: &str = env!("LSP_GIT_COMMIT");

/// Build date, RFC 3339 UTC (`SOURCE_DATE_EPOCH` when it was set).
pub(crate) const BUILD_DATE: &str = env!("LSP_BUILD_DATE");

/// `rustc --version` of the compiler that built this binary.
pub(crate) const RUSTC_VERSION: &str = env!("LSP_RUSTC_VERSION");

/// The target triple this binary was built for.
pub(crate) const TARGET: &str = env!("LSP_TARGET");

/// The `version` subcommand's and `--version`'s text after the program name: one fact a line.
pub(crate) fn long_version() -> String {
    format!(
        "{VERSION}\ncommit:     {GIT_COMMIT}\nbuild date: {BUILD_DATE}\nrustc:      {RUSTC_VERSION}\ntarget:     {TARGET}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_version_lists_every_fact() {
        let text = long_version();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], env!("CARGO_PKG_VERSION"));
        assert_eq!(lines[1], format!("commit:     {GIT_COMMIT}"));
        assert!(lines[2].starts_with("build date: "), "{text}");
        assert!(lines[3].starts_with("rustc:      rustc "), "build.rs asks the compiler: {text}");
        assert_eq!(lines[4], format!("target:     {TARGET}"));
        assert_ne!(TARGET, "unknown", "build.rs always knows the target");
    }
}
