//! local-static-provisioner: publishes the disks mounted on a Kubernetes node as local
//! PersistentVolumes, compatible with the upstream Go provisioner.
//!
//! Layout, one module per role, each importing only the ones listed after it (tests/layout.rs
//! checks it): `cli` (the commands, one file each); `agent` (the reconcile loop) and
//! `node_cleanup` (the cluster-wide Deployment for deleted Nodes, with its `leader` election);
//! `wiper` (wipes in the background); `runtime` (loop helpers); `api` (Kubernetes access) and
//! `admin` (HTTP); `metrics`; `host` (mount table, devices, discovery, the wipes themselves);
//! `config` (reading the ConfigMap); `core` (pure: naming, config types, PV construction,
//! planners), `build_info` and `memory`.

pub mod admin;
pub mod agent;
pub mod api;
pub mod build_info;
pub mod cli;
pub mod config;
pub mod core;
pub mod host;
pub mod memory;
pub mod metrics;
pub mod node_cleanup;
pub mod runtime;
pub mod wiper;
