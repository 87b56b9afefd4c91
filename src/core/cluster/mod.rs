//! The agent among the cluster's other agents: the node inventory (`LocalStorageNode`), heartbeats
//! and leases, succession of a re-created Node, and node-cleanup's plan for deleted Nodes.

pub(crate) mod heartbeat;
pub mod inventory;
pub(crate) mod lease;
pub(crate) mod node_cleanup;
pub mod succession;
