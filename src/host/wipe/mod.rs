//! Wipes on the host: the blocking run of a wipe job, the filesystem and block wipes, an
//! operator's wipe, and the durable records of completed wipes.

pub(crate) mod operator_wipe;
pub mod run;
pub mod wipe_block;
pub mod wipe_fs;
pub mod wipe_history;
pub mod wipe_record;
