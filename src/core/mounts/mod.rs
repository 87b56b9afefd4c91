//! Mount changes: which mount-table entries and device changes matter, the shared inotify
//! instance's registrations, and the settle window a change must hold for.

pub(crate) mod inotify;
pub(crate) mod mount_interest;
pub(crate) mod settle;
