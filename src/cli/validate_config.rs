//! `validate-config`: parses and checks a config (a ConfigMap manifest with -f, or a directory
//! of key files) and prints the effective config with its defaults.

use std::process::ExitCode;

use super::{ValidateArgs, report_refused};
use crate::config::{LoadedConfig, load_dir};
use crate::host::volumes::discovery;

/// Reads the config `validate-config` checks: the manifest given with -f, else the directory.
fn load_for_validation(args: &ValidateArgs) -> Result<LoadedConfig, String> {
    let Some(file) = &args.file else { return load_dir(&args.config.config_dir).map_err(|e| report_refused(&e)) };
    let (name, text) = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .map_err(|e| format!("error: reading standard input: {e}"))?;
        ("(standard input)".to_string(), text)
    } else {
        let text = std::fs::read_to_string(file).map_err(|e| format!("error: reading {}: {e}", file.display()))?;
        (file.display().to_string(), text)
    };
    crate::config::load_manifest(&name, &text).map_err(|e| match e {
        crate::config::ManifestError::Config(e) => report_refused(&e),
        other => format!("error: {other}"),
    })
}

pub(super) fn run(args: &ValidateArgs) -> ExitCode {
    let loaded = match load_for_validation(args) {
        Ok(loaded) => loaded,
        Err(lines) => {
            eprintln!("{lines}");
            return ExitCode::FAILURE;
        }
    };
    let eff = crate::config::effective(&loaded, None);
    let mut failed = false;
    for w in loaded.warnings.iter().chain(&crate::host::wipe::wipe_block::cleaner_warnings_here(&eff.config)) {
        eprintln!("warning: {w}");
    }
    if args.strict && !loaded.unknown_keys.is_empty() {
        failed = true;
        for key in &loaded.unknown_keys {
            eprintln!("error: {key}: unknown key (--strict refuses every unknown key)");
        }
    }
    for (class, problems) in &eff.left_out {
        failed = true;
        eprintln!("error: class {class:?} is invalid and will not be used (the other classes are):");
        for p in problems {
            eprintln!("  - {p}");
        }
    }
    if eff.config.storage_class_map.is_empty() {
        if eff.left_out.is_empty() {
            eprintln!(
                "warning: no storage classes are configured (storageClassMap is empty or missing): nothing will be published"
            );
        } else {
            eprintln!("error: every storage class is invalid: nothing will be published");
        }
    }
    // The discovery directories that exist on this machine are also checked as they resolve
    // here (symlinks, bind mounts), as the agent checks them on every pass.
    let mounts = match crate::host::mounts::mountinfo::MountTable::read() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (_, problems) = discovery::check_roots(&eff.config, &mounts.facts());
    let unsafe_roots: Vec<_> = problems.iter().filter(|(_, r)| r.is_safety_refusal()).collect();
    for (class, reason) in &unsafe_roots {
        eprintln!("storageClassMap.{class}.mountDir: {reason}");
    }
    if !unsafe_roots.is_empty() {
        eprintln!("error: {} class(es) would not be scanned; fix their discovery directories", unsafe_roots.len());
        failed = true;
    }
    match serde_saphyr::to_string(&eff.config) {
        Ok(text) => print!("{text}"),
        Err(e) => {
            eprintln!("error: printing the effective config: {e}");
            return ExitCode::FAILURE;
        }
    }
    if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
