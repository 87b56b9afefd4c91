//! The pure core: every decision of the agent, node-cleanup and the wiper, as functions over
//! facts. Nothing here touches the host or the API, so all of it is tested with plain unit
//! tests. One folder per capability (docs/architecture.md maps them).

pub mod cluster;
pub(crate) mod config;
pub mod devices;
pub mod fence;
pub mod health;
pub mod identity;
pub(crate) mod mounts;
pub(crate) mod reconcile;
pub mod volumes;
pub mod wipe;
