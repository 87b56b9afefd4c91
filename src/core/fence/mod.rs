//! Fences: no pod gets a volume whose path provably does not hold its own disk (the volume fence
//! and its labels), the boot fence set before kubelet starts, and upstream's start-up taint.

pub mod boot_fence;
pub(crate) mod fence_label;
pub mod startup_taint;
pub mod volume_fence;
