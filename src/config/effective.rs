//! The configuration the agent runs with when some classes of the ConfigMap are invalid. A
//! class whose own settings are wrong does not stop the others (upstream fails such a class
//! alone as well). For the failed class itself the safest choice is made:
//!
//! - it had a valid definition before (a reload): that definition stays in use, so its PVs
//!   keep being served, located and wiped exactly as before the typo;
//! - it never had one (start-up, or a new class): it is left out. A class left out publishes
//!   nothing, and nothing is taken from its existing PVs: they are not withdrawn (a PV whose
//!   class is unknown is never counted as missing), and a released one is not wiped or
//!   published again until the class is valid (its wipe is refused and reported).
//!
//! A failed class that keeps its old definition must not clash with the new definition of
//! another class (same directory, nested directories): such a newcomer is treated as failed
//! in turn, until nothing clashes.

use std::collections::BTreeMap;

use super::validate::clash;
use super::{LoadedConfig, Problem, ProvisionerConfig};

/// The configuration to run and what happened to each failed class.
#[derive(Debug, Clone, PartialEq)]
pub struct Effective {
    /// What the agent uses.
    pub config: ProvisionerConfig,
    /// Failed classes that keep running on their last valid definition, with their problems.
    pub kept: BTreeMap<String, Vec<Problem>>,
    /// Failed classes that do not run at all (no earlier valid definition), with their problems.
    pub left_out: BTreeMap<String, Vec<Problem>>,
}

impl Effective {
    /// Whether the ConfigMap is used exactly as written (no class failed).
    pub fn is_complete(&self) -> bool {
        self.kept.is_empty() && self.left_out.is_empty()
    }

    /// One line per failed class, naming the class, what happens to it, and every problem
    /// (`storageClassMap.<class>.<key>: <reason>`): for logs, events and readiness.
    pub fn describe_failures(&self) -> Vec<String> {
        let kept = self.kept.iter().map(|(class, problems)| {
            format!("class {class:?} is invalid, its last valid definition stays in use: {}", one_line(problems))
        });
        let left = self.left_out.iter().map(|(class, problems)| {
            format!("class {class:?} is invalid and not used (the other classes are): {}", one_line(problems))
        });
        kept.chain(left).collect()
    }

    /// The classes that do not run at all, each with its problems in one line: what a
    /// refused wipe of one of their PVs must say.
    pub fn left_out_problems(&self) -> BTreeMap<String, String> {
        self.left_out.iter().map(|(class, problems)| (class.clone(), one_line(problems))).collect()
    }
}

/// A class's problems in one line.
fn one_line(problems: &[Problem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}

/// Builds the configuration to run from a loaded ConfigMap and the configuration in use
/// before (`None` at start-up).
pub fn effective(loaded: &LoadedConfig, last: Option<&ProvisionerConfig>) -> Effective {
    let mut config = loaded.config.clone();
    let mut kept: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    let mut left_out: BTreeMap<String, Vec<Problem>> = BTreeMap::new();
    let last_def = |class: &str| last.and_then(|l| l.storage_class_map.get(class));
    for (class, problems) in &loaded.failed_classes {
        match last_def(class) {
            Some(def) => {
                config.storage_class_map.insert(class.clone(), def.clone());
                kept.insert(class.clone(), problems.clone());
            }
            None => {
                left_out.insert(class.clone(), problems.clone());
            }
        }
    }
    // New definitions were checked against each other, and the kept ones come from one
    // consistent configuration: only a new one can clash with a kept one. Each round turns at
    // least one new definition into a kept or left-out class, so this ends.
    loop {
        let mut demoted = Vec::new();
        for (name, class) in &config.storage_class_map {
            if kept.contains_key(name) {
                continue;
            }
            let clashes = kept.keys().filter(|k| *k != name).find_map(|k| {
                let other = config.storage_class_map.get(k)?;
                clash(name, class, k, other)
            });
            if let Some(problem) = clashes {
                demoted.push((name.clone(), problem));
            }
        }
        if demoted.is_empty() {
            break;
        }
        for (name, problem) in demoted {
            match last_def(&name) {
                Some(def) if config.storage_class_map.get(&name) != Some(def) => {
                    config.storage_class_map.insert(name.clone(), def.clone());
                    kept.entry(name).or_default().push(problem);
                }
                _ => {
                    config.storage_class_map.remove(&name);
                    left_out.entry(name).or_default().push(problem);
                }
            }
        }
    }
    Effective { config, kept, left_out }
}

#[cfg(test)]
#[path = "effective_tests.rs"]
mod tests;
