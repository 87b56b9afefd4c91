//! The pure core: naming, rounding, pattern matching, PV construction and the planner. Nothing
//! here touches the host or the API, so all of it is tested with plain unit tests.

pub mod activity;
pub mod backoff;
pub mod capacity;
pub mod cleanup;
pub mod desired;
pub mod device_claim;
pub mod device_selector;
pub mod disk_health;
pub mod disk_identity;
pub mod effect_key;
pub mod expectations;
pub mod fence;
pub mod fence_label;
pub mod go_duration;
pub mod lease;
pub mod naming;
pub mod node_cleanup;
pub mod occurrence;
pub mod operator_wipe;
pub mod pattern;
pub mod planner;
pub mod presence;
pub mod pv;
pub mod pv_facts;
pub mod pv_inputs;
pub mod settings;
pub mod settle;
pub mod signatures;
pub mod succession;
pub mod surface;
pub mod used_mark;
pub mod volume_safety;
pub mod wipe_job;
