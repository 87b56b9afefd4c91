//! One area at a time. The tests of the merged test crates (tests/host, tests/cluster,
//! tests/static_checks) were one test binary per file, and cargo runs test binaries one after
//! another: tests of two files never ran at the same time, while the tests of one file did
//! (libtest's threads, one per core by default). Several areas share what is cluster-wide or
//! host-wide (deploy/ applied to the cluster, admission policies, fake Node names, /dev/kmsg,
//! FUSE, loop devices, the CPU idle_cost measures), so the merged crates keep that guarantee:
//! every test first enters its area (its module, the former file) with [`super::area`], and
//! waits while a test of another area runs. Tests of one area still run side by side.
//!
//! libtest starts the tests in the order of their names, so the tests of one area come one
//! after another and the wait is only the tail of an area: its last test running while the
//! next area's first test waits, as the last test of a binary once ran alone. A waiting test
//! holds nothing, so no wait can block the area it waits for. When the area in the gate has
//! no test left, the area of the longest waiting test goes in (all its waiting tests with it).
//! A test waiting here is counted by libtest as running ("has been running for over 60
//! seconds" can mean waiting).
//!
//! When another area goes in, one line about the area that left goes to the real standard
//! error (libtest does not capture it): its tests and its seconds, from its first test's entry
//! to its last test's end. The last area of a run has no line: its time is the rest of the run.

use std::io::Write;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// The gate areas pass: [`enter_test_area`] uses the one of the test process; a test of the
/// gate makes its own.
pub struct AreaGate {
    state: Mutex<State>,
    changed: Condvar,
    /// Whether an area that left is told on standard error.
    report: bool,
}

struct State {
    /// The area whose tests run now, and how many of them.
    inside: Option<String>,
    running: usize,
    /// The tests waiting (ticket, area), the oldest first.
    waiting: Vec<(u64, String)>,
    next_ticket: u64,
    /// The area that went in last: its name, its first test's entry, its last test's end and
    /// how many of its tests ended.
    last: Option<(String, Instant, Instant, usize)>,
}

static GATE: AreaGate = AreaGate::new(true);

/// The area of a test from its `module_path!()`: the module below the crate root
/// (`cluster::admission` is `admission`); the crate root is an area of its own.
pub fn area_of(module_path: &str) -> &str {
    let mut parts = module_path.split("::");
    let root = parts.next().unwrap_or(module_path);
    parts.next().unwrap_or(root)
}

/// Enters the area of `module_path` at the gate of this test process ([`super::area`]).
pub fn enter_test_area(module_path: &str) -> InArea<'static> {
    GATE.enter(area_of(module_path))
}

/// A test inside its area; leaving (dropped, also when the test panics) lets the next area in
/// once this one is empty.
#[must_use = "the area is left when this is dropped: bind it to a named variable (`let _area = ...`)"]
pub struct InArea<'a> {
    gate: &'a AreaGate,
    area: String,
}

impl AreaGate {
    pub const fn new(report: bool) -> AreaGate {
        AreaGate {
            state: Mutex::new(State { inside: None, running: 0, waiting: Vec::new(), next_ticket: 0, last: None }),
            changed: Condvar::new(),
            report,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned lock is still a consistent gate.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `area` may run and enters it.
    pub fn enter(&self, area: &str) -> InArea<'_> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        state.waiting.push((ticket, area.to_string()));
        loop {
            let may_enter = match &state.inside {
                Some(inside) => inside == area,
                // The gate is empty: the area of the oldest waiting test goes in.
                None => state.waiting.first().is_some_and(|(_, oldest)| oldest == area),
            };
            if may_enter {
                state.waiting.retain(|(t, _)| *t != ticket);
                if state.inside.is_none() {
                    state.inside = Some(area.to_string());
                    if state.last.as_ref().is_none_or(|(last, ..)| last != area) {
                        if let Some((left, first_in, last_out, done)) = &state.last
                            && self.report
                        {
                            // Straight to the process's standard error, in one write: libtest
                            // captures only print! and eprint!.
                            let secs = last_out.duration_since(*first_in).as_secs_f64();
                            let line = format!("area {left}: {done} tests in {secs:.1} s\n");
                            let _ = std::io::stderr().write_all(line.as_bytes());
                        }
                        let now = Instant::now();
                        state.last = Some((area.to_string(), now, now, 0));
                    }
                    // The other waiting tests of this area follow it in.
                    self.changed.notify_all();
                }
                state.running += 1;
                return InArea { gate: self, area: area.to_string() };
            }
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl Drop for InArea<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.lock();
        state.running = state.running.saturating_sub(1);
        if let Some((last, _, last_out, done)) = state.last.as_mut()
            && *last == self.area
        {
            *last_out = Instant::now();
            *done += 1;
        }
        if state.running == 0 {
            state.inside = None;
            self.gate.changed.notify_all();
        }
    }
}
