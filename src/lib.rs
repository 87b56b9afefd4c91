//! local-static-provisioner: publishes the disks mounted on a Kubernetes node as local
//! PersistentVolumes, compatible with the upstream Go provisioner.
//!
//! Layout: `config` (the ConfigMap), `core` (pure naming, PV construction, planner),
//! `host` (mount table and devices), `discovery` (host scan), `api` (Kubernetes access),
//! `agent` (the reconcile loop), `wiper` (wipes), `node_cleanup` (the cluster-wide Deployment
//! for deleted Nodes, with its `leader` election), `metrics` and `admin` (HTTP), `cli` (the commands, one file each).

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
