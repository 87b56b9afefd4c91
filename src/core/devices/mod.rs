//! Raw block devices a class claims (its `devices` section): which ones match, and whether one is
//! proven blank across its whole surface and unused by any writer.

pub(crate) mod activity;
pub mod device_claim;
pub(crate) mod device_selector;
pub mod signatures;
pub(crate) mod surface;
