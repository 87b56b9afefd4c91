//! Wipes: which released volumes must be wiped (the cleanup planner), what a wipe job is, what it
//! leaves on a volume's root, an operator's explicit wipe, and a volume's wipe history.

pub mod cleanup;
pub(crate) mod operator_wipe;
pub mod volume_root;
pub mod wipe_history;
pub(crate) mod wipe_job;
