//! The reconcile loop's bookkeeping: retry records with backoff, their keys, expectations of the
//! agent's own creates, and problems reported once per occurrence.

pub(crate) mod backoff;
pub(crate) mod effect_key;
pub(crate) mod expectations;
pub(crate) mod occurrence;
