//! A volume's identity on the host and its durable used mark.

pub mod fingerprint;
pub mod used_mark;
