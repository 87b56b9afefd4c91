//! Volumes on the host: discovery of each class's entries, what an entry is and its size,
//! what kubelet mounted for pods, and per-volume encryption (fscrypt and the key store).

pub(crate) mod discovery;
pub mod encryption;
#[allow(unsafe_code)]
pub mod fscrypt;
pub mod key_store;
pub mod kubelet;
pub(crate) mod volume;
