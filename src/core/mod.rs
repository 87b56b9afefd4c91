//! The pure core: naming, rounding, pattern matching, PV construction and the planner. Nothing
//! here touches the host or the API, so all of it is tested with plain unit tests.

pub(crate) mod activity;
pub(crate) mod backoff;
pub(crate) mod capacity;
pub mod cleanup;
pub(crate) mod desired;
pub mod device_claim;
pub(crate) mod device_selector;
pub mod disk_health;
pub mod disk_identity;
pub(crate) mod effect_key;
pub(crate) mod expectations;
pub mod fence;
pub(crate) mod fence_label;
pub(crate) mod go_duration;
pub mod inventory;
pub(crate) mod lease;
pub mod naming;
pub(crate) mod node_cleanup;
pub(crate) mod occurrence;
pub(crate) mod operator_wipe;
pub(crate) mod pattern;
pub(crate) mod planner;
pub(crate) mod presence;
pub mod pv;
pub(crate) mod pv_facts;
pub(crate) mod pv_inputs;
pub(crate) mod settings;
pub(crate) mod settle;
pub mod signatures;
pub mod succession;
pub(crate) mod surface;
pub mod used_mark;
pub(crate) mod volume_safety;
pub mod wipe_history;
pub(crate) mod wipe_job;
