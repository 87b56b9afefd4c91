//! The mount table (`/proc/self/mountinfo`, listmount(2)) and change notifications (inotify,
//! mount-table polls), so discovery reacts in milliseconds.

pub(crate) mod inotify;
#[allow(unsafe_code)]
pub(crate) mod listmount;
pub mod mountinfo;
pub(crate) mod watch;
