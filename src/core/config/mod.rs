//! The provisioner configuration as the rest of the program reads it, with upstream's duration
//! and name-pattern rules.

pub(crate) mod go_duration;
pub(crate) mod pattern;
pub(crate) mod settings;
