//! Checks of the tree that need neither root nor a control plane: the source layout and the
//! toolchain scripts. One module per area (a former test file); tests of two areas never run
//! at the same time (tests/support/area.rs).

#[path = "../support/mod.rs"]
mod support;

mod layout;
mod toolchain;
