//! Volumes: what discovery should publish (desired), the PVs as the API holds them, the planner
//! that compares the two, PV construction and naming exactly as upstream, and the safety rules of
//! discovery (each disk at most once, never a path out of a discovery directory).

pub(crate) mod capacity;
pub(crate) mod desired;
pub mod encryption;
pub mod naming;
pub(crate) mod planner;
pub(crate) mod presence;
pub mod pv;
pub(crate) mod pv_facts;
pub(crate) mod pv_inputs;
pub(crate) mod volume_safety;
