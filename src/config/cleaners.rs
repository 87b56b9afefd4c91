//! Warnings about how released block volumes will be wiped, found when the config is read
//! rather than at the first wipe: a blockCleanerCommand that this image cannot run, and
//! upstream's Job-based cleaning, which this provisioner does not do.

use super::ProvisionerConfig;

/// Maps a blockCleanerCommand to the description of its built-in equivalent (upstream's own
/// scripts), an error saying why its arguments cannot be honoured, or None for any other
/// command.
pub(super) type BuiltinFor<'a> = &'a dyn Fn(&[String]) -> Option<Result<String, String>>;

/// Warnings about the block cleaners of `cfg`. `exists` says whether a program is present
/// in this container; `builtin` maps upstream's own scripts to the built-in method that does
/// the same (its description), or says why their arguments cannot be honoured, and returns
/// None for any other command. Both are passed in so that this stays free of host access.
pub fn cleaner_warnings(
    cfg: &ProvisionerConfig,
    exists: &dyn Fn(&str) -> bool,
    builtin: BuiltinFor<'_>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (class, c) in &cfg.storage_class_map {
        if c.block_clean_method.is_some() {
            continue;
        }
        let Some(program) = c.block_cleaner_command.first() else { continue };
        if exists(program) {
            continue;
        }
        let cmd = &c.block_cleaner_command;
        match builtin(cmd) {
            Some(Ok(_)) => {}
            Some(Err(why)) => out.push(format!(
                "storageClassMap.{class}.blockCleanerCommand: {cmd:?} is upstream's script, which this image does not have, and {why}; released block volumes of class {class:?} will not be wiped (each wipe is refused) until it is fixed, or blockCleanMethod is set"
            )),
            None => out.push(format!(
                "storageClassMap.{class}.blockCleanerCommand: {program:?} does not exist in this container and has no built-in equivalent; released block volumes of class {class:?} will not be wiped (each wipe is refused) until the program is there (mount it) or blockCleanMethod is set"
            )),
        }
    }
    if cfg.use_job_for_cleaning {
        out.push(
            "useJobForCleaning is set, but this provisioner runs no cleaning Jobs: block volumes are wiped by the agent itself, in its own pod on the node (jobTolerations is not used); a wipe cut short by a restart of the agent starts again from the beginning".to_string(),
        );
    }
    out
}
