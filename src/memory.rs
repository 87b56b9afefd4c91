//! How the process uses glibc's allocator. The agent runs on every node, so its resident memory
//! is paid once per node; most of what it allocates is transient (a page of a list, the PVs of
//! one pass), and glibc keeps what was freed unless told otherwise:
//!
//! - one heap (arena) per thread that ever allocated, up to 8 per core, each keeping its own
//!   freed memory: a few threads are enough to hold megabytes nobody uses;
//! - freed memory below the top of a heap is never given back by `free`;
//! - large blocks go into the heap too once a large block was freed (the threshold adapts).
//!
//! `tune` caps the arenas, fixes the threshold for large blocks, and starts a scavenger thread
//! that hands freed memory back to the kernel (`malloc_trim`) when enough of it has piled up.
//! Other C libraries (musl) need none of it and get nothing.

/// Applies the allocator settings and starts the scavenger; call once, first thing in `main`,
/// before other threads exist (arena settings apply to arenas created afterwards).
pub fn tune() {
    imp::tune();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    use std::time::Duration;

    use nix::libc;

    /// Heaps (arenas) glibc may create: measured with bench/bulk-publish.sh 1000 and
    /// bench/node-cleanup-nodes.sh, one arena holds several MiB less than glibc's default (8 per
    /// core) and the two runtime workers and the blocking pool do not contend enough to show.
    const ARENA_MAX: i32 = 1;

    /// Allocations of this size or more get their own mapping, returned to the kernel when
    /// freed. glibc's threshold otherwise starts at 128 KiB and rises to the size of each such
    /// block freed (up to 32 MiB), so after the first large pass the large, short-lived buffers
    /// of every later one (a pass's vectors, a page of a list, a response body) land in the heap
    /// and leave it fragmented. Setting it fixes it. Measured with bench/bulk-publish.sh 1000:
    /// peak RSS 20.3 -> 19.4 MiB.
    const MMAP_THRESHOLD: i32 = 64 * 1024;

    /// How often the scavenger looks at the heap: cheap (one `mallinfo2`), and rare enough that a
    /// burst of work (a pass, a list) has finished before its memory is handed back.
    const SCAVENGE_EVERY: Duration = Duration::from_secs(5);

    /// Freed bytes kept in the heap before the scavenger hands them back: below it, trimming would
    /// only make the next allocations fault pages in again.
    const SCAVENGE_ABOVE: usize = 1 << 20;

    pub(super) fn tune() {
        // SAFETY: mallopt only sets a tunable of the allocator; any value is accepted or refused
        // (returning 0), and it is called before any other thread exists.
        unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) };
        // SAFETY: as above.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) };
        // A small stack: the loop below needs a few hundred bytes.
        let started = std::thread::Builder::new().name("scavenger".into()).stack_size(64 * 1024).spawn(move || {
            let (mut kept, mut faults, mut skipped) = (0, 0, 0);
            loop {
                std::thread::sleep(SCAVENGE_EVERY);
                // Nothing new touched since the last look (no page faulted in): the heap holds
                // no more than it did then, so the look (mallinfo2 walks every free block, about
                // 10 ms on an idle agent's fragmented heap) is skipped; once every 5 min anyway.
                let now = minor_faults();
                if now == faults && skipped < LOOK_AT_LEAST_EVERY {
                    skipped += 1;
                    continue;
                }
                (faults, skipped) = (now, 0);
                scavenge(SCAVENGE_ABOVE, &mut kept);
            }
        });
        if let Err(e) = started {
            // Logging is not set up yet this early.
            eprintln!("warning: no memory scavenger thread ({e}); freed memory stays in the heap");
        }
    }

    /// Looks skipped at most in a row while nothing new is touched: one look every 5 min.
    const LOOK_AT_LEAST_EVERY: u32 = 59;

    /// The process's minor page faults so far (getrusage): they grow whenever memory is touched
    /// for the first time, or again after a trim handed it back.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage only writes one `rusage`, which `usage` is, valid for the call.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: as above; RUSAGE_SELF is always valid.
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
            return -1;
        }
        usage.ru_minflt
    }

    /// Hands freed memory back to the kernel when more than `above` bytes of it sit in the
    /// heaps beyond `kept`, what the last trim could not hand back (free pieces smaller than a
    /// page, between blocks in use); says whether it did, and updates `kept`. Without `kept`,
    /// a heap whose free memory is such pieces was trimmed every 5 s for nothing: each trim walks
    /// the whole heap (an idle agent with 100 volumes spent 0.1 CPU-s a minute on it).
    pub(super) fn scavenge(above: usize, kept: &mut usize) -> bool {
        // SAFETY: mallinfo2 only reads the allocator's statistics (under its own locks).
        let free = unsafe { libc::mallinfo2() }.fordblks;
        if free <= kept.saturating_add(above) {
            // Less free than after the last trim: the heap was reused since; count from there.
            *kept = (*kept).min(free);
            return false;
        }
        // SAFETY: malloc_trim only releases free memory of the allocator's heaps (under their
        // locks); nothing in use is touched.
        unsafe { libc::malloc_trim(0) };
        // SAFETY: as above.
        *kept = unsafe { libc::mallinfo2() }.fordblks;
        true
    }
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Anonymous resident memory of this process, in KiB.
    fn rss_anon_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("an RssAnon line")
    }

    #[test]
    fn freed_memory_below_the_top_of_the_heap_is_handed_back() {
        // 64 MiB in small blocks, all touched, then all freed but the last, which pins the top
        // of the heap: `free` alone gives nothing back.
        let mut blocks: Vec<Vec<u8>> = (0..16 * 1024).map(|i| vec![i as u8; 4000]).collect();
        let pin = blocks.pop();
        drop(blocks);
        let before = rss_anon_kib();
        let mut kept = 0;
        assert!(super::imp::scavenge(1 << 20, &mut kept), "64 MiB freed, yet the scavenger saw nothing to do");
        let after = rss_anon_kib();
        assert!(before.saturating_sub(after) > 32 * 1024, "resident anonymous memory {before} KiB -> {after} KiB");
        drop(pin);
        // Nothing worth handing back right after: no trim, whatever the trim could not hand back.
        assert!(!super::imp::scavenge(1 << 20, &mut kept));
        assert!(!super::imp::scavenge(usize::MAX, &mut 0));
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) fn tune() {}
}
