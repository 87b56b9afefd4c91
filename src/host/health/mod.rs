//! A volume's failing-disk signs as the kernel shows them (sysfs counters, `/dev/kmsg`).

pub mod disk_health;
pub mod kernel_log;
