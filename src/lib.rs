//! local-static-provisioner: publishes the disks mounted on a Kubernetes node as local
//! PersistentVolumes, compatible with the upstream Go provisioner.
//!
//! Layout, one module per role, each importing only the ones listed after it
//! (tests/static_checks/layout.rs checks it): `cli` (the commands, one file each); `agent` (the
//! reconcile loop) and `node_cleanup` (the cluster-wide Deployment for deleted Nodes, with its
//! `leader` election); `wiper` (wipes in the background); `runtime` (loop helpers); `api`
//! (Kubernetes access) and `admin` (HTTP); `metrics`; `host` (mount table, devices, discovery, the
//! wipes themselves); `config` (reading the ConfigMap); `core` (pure: naming, config types, PV
//! construction, planners), `build_info` and `memory`.

// The crate's surface is what the binary and the integration tests use; everything else is
// `pub(crate)`, so the compiler shows what is dead. `unsafe` only in the four modules that wrap
// system calls no crate offers (memory: the allocator's tunables; host::devices::blockdev: block and
// loop ioctls; host::mounts::listmount: listmount and statmount; host::volumes::fscrypt: the fscrypt ioctls),
// each allowing it where it is declared.
#![warn(unreachable_pub)]
#![deny(unsafe_code)]

pub(crate) mod admin;
pub(crate) mod agent;
pub mod api;
pub(crate) mod build_info;
pub mod cli;
pub mod config;
pub mod core;
pub mod host;
#[allow(unsafe_code)]
pub mod memory;
pub mod metrics;
pub(crate) mod node_cleanup;
pub(crate) mod runtime;
pub mod wiper;
