//! Checks of the tree that need neither root nor a control plane: the source layout, the
//! toolchain scripts, and the test crates themselves. One module per area; tests of two areas
//! never run at the same time (tests/support/area.rs).

#[path = "../support/mod.rs"]
mod support;

mod crd;
mod layout;
mod test_areas;
mod toolchain;
