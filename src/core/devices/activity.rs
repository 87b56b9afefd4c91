//! Who writes to a block device: the rules that turn the kernel's I/O counters and the open
//! descriptors of the processes the agent can see into "in use". An exclusive open (`O_EXCL`)
//! only shows users that claimed the device; a program that opened it plainly (a raw database
//! device, `dd`, a VM image writer) does not claim it, but its writes move the counters and its
//! descriptor is in `/proc`. Pure: `host::devices::writers` reads the counters and the descriptors.

use std::fmt;

/// A device's I/O counters, from `/sys/class/block/<name>/stat` (Documentation/block/stat.rst):
/// the fields that show someone writing. Reads are left out: the probe itself reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoStat {
    /// Write requests completed (field 5).
    pub writes: u64,
    /// Sectors written (field 7).
    pub write_sectors: u64,
    /// Requests in flight now (field 9): reads and writes, ours excluded once our reads ended.
    pub in_flight: u64,
    /// Discard requests completed (field 12; absent before Linux 4.18).
    pub discards: u64,
    /// Flush requests completed (field 16; absent before Linux 5.5).
    pub flushes: u64,
}

impl IoStat {
    /// Parses the `stat` file's one line of whitespace-separated counters. `None` when it has
    /// fewer than the 11 fields every kernel since 2.6 writes, or a field is not a number.
    pub fn parse(text: &str) -> Option<IoStat> {
        let fields: Vec<u64> = text.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
        if fields.len() < 11 {
            return None;
        }
        let at = |i: usize| fields.get(i).copied().unwrap_or(0);
        Some(IoStat { writes: at(4), write_sectors: at(6), in_flight: at(8), discards: at(11), flushes: at(15) })
    }
}

/// What the counters say happened between two readings: `None` when nobody wrote, discarded
/// or flushed and nothing is in flight at the second reading; else a sentence for the
/// operator. `before` is taken before the window (the probe, or the previous pass), `after`
/// once the agent's own reads have completed, so any request in flight then is someone else's.
/// The agent never writes, discards or flushes a device it probes, so every such request in
/// the window is another writer's. A counter that went down (the device was removed and a new
/// one took its name) counts as activity too: the device is not the one read before.
pub(crate) fn written_between(before: &IoStat, after: &IoStat) -> Option<String> {
    let moved = |a: u64, b: u64| b != a;
    let mut what = Vec::new();
    if moved(before.writes, after.writes) || moved(before.write_sectors, after.write_sectors) {
        let n = after.writes.wrapping_sub(before.writes);
        let sectors = after.write_sectors.wrapping_sub(before.write_sectors);
        what.push(format!("{n} writes ({} KiB)", sectors / 2));
    }
    if moved(before.discards, after.discards) {
        what.push(format!("{} discards", after.discards.wrapping_sub(before.discards)));
    }
    if moved(before.flushes, after.flushes) {
        what.push(format!("{} flushes", after.flushes.wrapping_sub(before.flushes)));
    }
    if after.in_flight > 0 {
        what.push(format!("{} requests in flight", after.in_flight));
    }
    (!what.is_empty()).then(|| format!("someone is using it: {}", what.join(", ")))
}

/// A process holding a descriptor of a device (or of a loop device's backing file).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Opener {
    /// Its PID, as the agent's `/proc` shows it.
    pub pid: u32,
    /// Its command name (`/proc/<pid>/comm`).
    pub comm: String,
    /// The descriptor number.
    pub fd: u32,
    /// Opened for writing (`O_WRONLY` or `O_RDWR` in `/proc/<pid>/fdinfo/<fd>`).
    pub writable: bool,
    /// Kernel name of the device it has open, or whose backing file it has open.
    pub what: String,
    /// It has the loop device `what`'s backing file open, not the device itself.
    pub backing_file: bool,
}

impl fmt::Display for Opener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = if self.writable { "for writing" } else { "for reading" };
        let what = if self.backing_file { format!("the backing file of {}", self.what) } else { self.what.clone() };
        write!(f, "{} (pid {}) has {what} open {mode} (fd {})", self.comm, self.pid, self.fd)
    }
}

/// The verdict on the descriptors found: `None` when no other process has the device open.
/// Readers count as well as writers: a process reading the device would read the next
/// tenant's data. Writers are named first, and at most three openers are listed.
pub(crate) fn opened_by_others(openers: &[Opener]) -> Option<String> {
    if openers.is_empty() {
        return None;
    }
    let mut sorted: Vec<&Opener> = openers.iter().collect();
    sorted.sort_by_key(|o| (!o.writable, o.pid, o.fd));
    let listed: Vec<String> = sorted.iter().take(3).map(|o| o.to_string()).collect();
    let more = sorted.len().saturating_sub(3);
    let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
    Some(format!("a process has it open: {}{tail}", listed.join("; ")))
}

/// The inode of the kernel's initial PID namespace (`PROC_PID_INIT_INO`): a process whose
/// `/proc/self/ns/pid` has it shares the host's.
pub(crate) const INITIAL_PID_NAMESPACE: u64 = 0xEFFF_FFFC;

/// Whether the processes in this agent's `/proc` are the host's, so that a scan of their
/// descriptors can prove a device unused; `Err` says why not (the refusal of every claim,
/// core::devices::device_claim::Refusal::HostProcessesUnseen, says what to do). From the inode of its PID
/// namespace, its own PID and the name (`comm`) of PID 1 there. The host's: the initial PID
/// namespace, or (a node that is itself a container, kind) one whose PID 1 is an init system
/// other than this process. In a pod without `hostPID`, PID 1 is the container's own first
/// process (this agent, a shell, or `pause` with a shared process namespace).
pub(crate) fn host_processes_seen(
    pid_namespace: Option<u64>,
    own_pid: u32,
    pid1_comm: Option<&str>,
) -> Result<(), String> {
    if pid_namespace == Some(INITIAL_PID_NAMESPACE) {
        return Ok(());
    }
    let comm = pid1_comm.map(str::trim);
    if own_pid != 1 && matches!(comm, Some("systemd" | "init")) {
        return Ok(());
    }
    Err(format!(
        "its PID namespace is its own and PID 1 is {}",
        if own_pid == 1 { "the agent itself".to_string() } else { comm.unwrap_or("unknown").to_string() }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str =
        "     120        3     9000      50      7     1     56     9   0    40   59    2   0   16   1    4   2\n";

    #[test]
    fn the_stat_line_is_read_by_field_position() {
        let s = IoStat::parse(LINE).unwrap();
        assert_eq!(s, IoStat { writes: 7, write_sectors: 56, in_flight: 0, discards: 2, flushes: 4 });
    }

    #[test]
    fn old_kernels_without_discard_and_flush_fields_parse_with_zeroes() {
        let s = IoStat::parse("1 2 3 4 5 6 7 8 9 10 11").unwrap();
        assert_eq!(s, IoStat { writes: 5, write_sectors: 7, in_flight: 9, discards: 0, flushes: 0 });
    }

    #[test]
    fn short_or_garbled_lines_are_refused() {
        for bad in ["", "1 2 3", "1 2 3 4 5 6 7 8 9 10", "a b c d e f g h i j k", "1 2 3 4 5 6 7 8 9 10 -1"] {
            assert_eq!(IoStat::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn no_change_and_nothing_in_flight_is_quiet() {
        let s = IoStat::parse(LINE).unwrap();
        assert_eq!(written_between(&s, &s), None);
        assert_eq!(written_between(&IoStat::default(), &IoStat::default()), None);
    }

    #[test]
    fn every_kind_of_write_activity_is_seen_and_named() {
        let base = IoStat { writes: 10, write_sectors: 80, in_flight: 0, discards: 1, flushes: 2 };
        let cases: Vec<(IoStat, &str)> = vec![
            (IoStat { writes: 11, write_sectors: 88, ..base }, "1 writes (4 KiB)"),
            (IoStat { write_sectors: 96, ..base }, "0 writes (8 KiB)"),
            (IoStat { discards: 3, ..base }, "2 discards"),
            (IoStat { flushes: 3, ..base }, "1 flushes"),
            (IoStat { in_flight: 2, ..base }, "2 requests in flight"),
            // The counters of another device that took the name: not the device read before.
            (IoStat { writes: 0, write_sectors: 0, ..base }, "writes"),
        ];
        for (after, want) in cases {
            let got = written_between(&base, &after).unwrap_or_else(|| panic!("{after:?} not seen"));
            assert!(got.contains(want), "{got} lacks {want}");
        }
    }

    #[test]
    fn reads_alone_are_not_activity() {
        let a = IoStat::parse("1 0 8 1 5 0 40 1 0 1 1").unwrap();
        let b = IoStat::parse("900 0 72000 30 5 0 40 1 0 30 31").unwrap();
        assert_eq!(written_between(&a, &b), None);
    }

    fn opener(pid: u32, writable: bool) -> Opener {
        Opener { pid, comm: format!("p{pid}"), fd: 3, writable, what: "loop7".into(), backing_file: false }
    }

    #[test]
    fn openers_are_named_writers_first_and_capped() {
        assert_eq!(opened_by_others(&[]), None);
        let one = opened_by_others(&[opener(7, false)]).unwrap();
        assert_eq!(one, "a process has it open: p7 (pid 7) has loop7 open for reading (fd 3)");
        let many = opened_by_others(&[opener(1, false), opener(2, true), opener(3, false), opener(4, false)]).unwrap();
        assert!(many.starts_with("a process has it open: p2 (pid 2) has loop7 open for writing"), "{many}");
        assert!(many.ends_with(" and 1 more"), "{many}");
        let file = Opener { backing_file: true, ..opener(9, true) };
        assert_eq!(
            opened_by_others(&[file]).unwrap(),
            "a process has it open: p9 (pid 9) has the backing file of loop7 open for writing (fd 3)"
        );
    }

    #[test]
    fn only_the_hosts_processes_prove_a_device_unused() {
        // The host's PID namespace, whatever PID 1 is called.
        assert!(host_processes_seen(Some(INITIAL_PID_NAMESPACE), 4242, Some("process_api")).is_ok());
        assert!(host_processes_seen(Some(INITIAL_PID_NAMESPACE), 4242, None).is_ok());
        // A node that is a container (kind): its init is PID 1, the agent is not.
        assert!(host_processes_seen(Some(4026532300), 4242, Some("systemd\n")).is_ok());
        assert!(host_processes_seen(Some(4026532300), 4242, Some("init")).is_ok());
        // A pod without hostPID: the agent, a wrapper shell or the pause container is PID 1.
        let own = host_processes_seen(Some(4026532300), 1, Some("local-static-pr")).unwrap_err();
        assert_eq!(own, "its PID namespace is its own and PID 1 is the agent itself");
        let own_init = host_processes_seen(Some(4026532300), 1, Some("init")).unwrap_err();
        assert!(own_init.contains("the agent itself"), "{own_init}");
        for comm in ["sh", "pause", "tini"] {
            let why = host_processes_seen(Some(4026532300), 7, Some(comm)).unwrap_err();
            assert!(why.contains(&format!("PID 1 is {comm}")), "{why}");
        }
        // Nothing readable: not proven.
        assert!(host_processes_seen(None, 7, None).is_err());
    }
}
