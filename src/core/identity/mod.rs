//! What a disk is and what it held: the fingerprint recorded on each PV, the disk's history across
//! nodes from evidence no single node can forge, and the durable used mark.

pub mod disk_identity;
pub mod disk_trust;
pub mod used_mark;
