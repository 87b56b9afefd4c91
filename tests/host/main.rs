//! Tests that need only this host, as root: real mounts, loop devices, zram, wipes and the
//! shipped cleaner scripts; no control plane. Without root each says why it is skipped (a
//! failure under CI). One module per area (a former test file); tests of two areas never run
//! at the same time (tests/support/area.rs).

#[path = "../support/mod.rs"]
mod support;

mod device_content;
mod discover_host;
mod discover_safety;
mod disk_health;
mod identity;
mod scripts;
mod wipe_block;
mod wipe_fs;
