//! Failing disks: the signs the kernel shows (I/O errors, the kernel log) judged per volume.

pub mod disk_health;
pub mod kernel_log;
