//! "Blank" across the whole surface of a device, not only where signatures live: a disk
//! "cleaned" with `dd if=/dev/zero bs=1M count=100` keeps its filesystem further in, and raw
//! data (a database device, plain dm-crypt, an image written raw) has no signature at all.
//! Reading the signature areas alone would hand such a disk to a tenant.
//!
//! Two ways to look, both pure here (the host reads):
//! - [`sample_windows`]: a bounded set of 64 KiB windows read on every probe, besides the
//!   signature areas: one every MiB over the first and last 256 MiB (the "dense edges", where
//!   partial wipes and most data start or end), and a grid over the whole device aligned at 0
//!   with a stride `S = max(1 MiB, the power of two >= size / budget)`, where the budget is 4096
//!   windows (non-rotational or unknown) or 1024 (rotational: about 1024 seeks of ~10 ms, so
//!   ~10-15 s on a spinning disk, plus ~2 × 256 MiB read at the edges). Added to the design:
//!   a window at each allocation group start mkfs.xfs would choose (at most 52), because an
//!   empty XFS whose first 100 MiB were zeroed holds nothing else and its groups seldom start
//!   on a grid point (seen on a 331 MiB loop device: missed without them).
//! - a full read (`verify: full`): every byte, once per disk identity, in the background.
//!
//! What the samples prove, for an extent of `E` bytes of non-zero data at a uniformly random
//! position, with windows of `W` = 64 KiB:
//! - inside the edges, it is always seen when `E >= 1 MiB` (a window starts every MiB);
//! - in the interior, it is seen with probability `min(1, (E + W - 1) / S)`, always when
//!   `E >= S` (a window starts every `S` bytes).
//!
//! | device | S (non-rot.) | E = 64 KiB | E = 1 MiB | E = 64 MiB | S (rot.) | 64 KiB | 1 MiB | 64 MiB |
//! |---|---|---|---|---|---|---|---|---|
//! | 100 GiB | 32 MiB | 0.39 % | 3.3 % | 100 % | 128 MiB | 0.098 % | 0.83 % | 50 % |
//! | 1 TiB | 256 MiB | 0.049 % | 0.41 % | 25 % | 1 GiB | 0.012 % | 0.10 % | 6.3 % |
//! | 8 TiB | 2 GiB | 0.0061 % | 0.052 % | 3.1 % | 8 GiB | 0.0015 % | 0.013 % | 0.78 % |
//!
//! Sampling catches whole filesystems, partial wipes and raw images (extents of many MiB); only
//! a full read proves a small extent absent. [`FullRead`] is the state of that read as the claim
//! rules see it, and the rest of this module the pure rules around it.

use serde::{Deserialize, Serialize};

use crate::core::devices::activity::IoStat;
use crate::core::devices::signatures::signature_areas;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// Length of each sample window.
pub(crate) const WINDOW: u64 = 64 * KIB;
/// Distance between windows over the edges.
pub(crate) const EDGE_STRIDE: u64 = MIB;
/// How far the dense edges reach from each end.
pub(crate) const EDGE: u64 = 256 * MIB;
/// Grid windows over a non-rotational (or unknown) device.
pub(crate) const BUDGET: u64 = 4096;
/// Grid windows over a rotational device: each is a seek.
pub(crate) const BUDGET_ROTATIONAL: u64 = 1024;

/// The grid stride for a device of `size` bytes: `max(1 MiB, the power of two >= size /
/// budget)`, so the grid has at most `budget` windows.
pub(crate) fn grid_stride(size: u64, rotational: Option<bool>) -> u64 {
    let budget = if rotational == Some(true) { BUDGET_ROTATIONAL } else { BUDGET };
    size.div_ceil(budget).checked_next_power_of_two().unwrap_or(1 << 63).max(MIB)
}

/// The windows `(offset, len)` to read besides [`signature_areas`]`(size)`: the dense edges,
/// the XFS group starts and the grid (see the module documentation), clipped to the device, with what the signature
/// areas already cover cut out; sorted, not overlapping, adjacent ones merged.
pub(crate) fn sample_windows(size: u64, rotational: Option<bool>) -> Vec<(u64, u64)> {
    let stride = grid_stride(size, rotational);
    let mut starts: Vec<u64> = Vec::new();
    // First edge, the grid, then the last edge aligned at 0 too (so it meets the grid's points).
    starts.extend((0..size.min(EDGE)).step_by(EDGE_STRIDE as usize));
    starts.extend((0..size).step_by(usize::try_from(stride).unwrap_or(usize::MAX)));
    let last_edge = size.saturating_sub(EDGE) / EDGE_STRIDE * EDGE_STRIDE;
    starts.extend((last_edge..size).step_by(EDGE_STRIDE as usize));
    starts.extend(xfs_group_starts(size));
    starts.sort_unstable();
    starts.dedup();
    let windows = starts.into_iter().map(|at| (at, WINDOW.min(size - at)));
    subtract(merge(windows.collect()), &signature_areas(size))
}

/// Where mkfs.xfs puts its allocation groups on a device of `size` bytes: the headers of each
/// (a secondary superblock, the free space and inode btree roots: a few KiB) are all an empty
/// XFS holds outside its first MiB, at offsets the grid misses unless the device's size is a
/// round number. xfsprogs (calc_default_ag_geometry) splits the device's 4 KiB blocks into
/// 2^2 groups (one disk), 2^4 or 2^5 (a striped device), each `ceil(blocks / 2^n)` long; devices
/// of 4 TiB and more get 1 TiB groups, which the grid's points already meet.
fn xfs_group_starts(size: u64) -> Vec<u64> {
    const BLOCK: u64 = 4096;
    let blocks = size / BLOCK;
    let mut starts = Vec::new();
    for shift in [2u32, 4, 5] {
        let group = blocks.div_ceil(1 << shift).max(1) * BLOCK;
        starts.extend((1..(1u64 << shift)).map(|i| i * group).filter(|at| *at < size));
    }
    starts
}

/// Sorted, overlapping or touching ranges joined.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (at, len) in ranges.into_iter().filter(|r| r.1 > 0) {
        match out.last_mut() {
            Some((last, last_len)) if at <= *last + *last_len => *last_len = (*last_len).max(at + len - *last),
            _ => out.push((at, len)),
        }
    }
    out
}

/// `ranges` without the bytes `cut` covers (both sorted and merged).
fn subtract(ranges: Vec<(u64, u64)>, cut: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(ranges.len());
    for (at, len) in ranges {
        let mut pieces = vec![(at, at + len)];
        for &(c_at, c_len) in cut.iter().filter(|(c, l)| *c < at + len && c + l > at) {
            let c_end = c_at + c_len;
            pieces = pieces
                .into_iter()
                .flat_map(|(s, e)| [(s, e.min(c_at)), (s.max(c_end), e)])
                .filter(|(s, e)| s < e)
                .collect();
        }
        out.extend(pieces.into_iter().map(|(s, e)| (s, e - s)));
    }
    out
}

/// Index of the first non-zero byte of `bytes`. Whole 4 KiB blocks are compared with a block
/// of zeros (a `memcmp`, fast in any build), and only a block that differs is searched.
pub(crate) fn first_non_zero(bytes: &[u8]) -> Option<usize> {
    const ZEROS: [u8; 4096] = [0; 4096];
    let mut start = 0;
    for block in bytes.chunks(ZEROS.len()) {
        if block != &ZEROS[..block.len()] {
            return block.iter().position(|&b| b != 0).map(|i| start + i);
        }
        start += block.len();
    }
    None
}

/// A byte offset as people read it: `157286400 (150 MiB)`, `1234 (1.2 KiB)`.
pub(crate) fn offset_text(offset: u64) -> String {
    const UNITS: [(&str, u64); 5] =
        [("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    let Some((unit, scale)) = UNITS.iter().find(|(_, s)| offset >= *s) else { return format!("{offset}") };
    let value = offset as f64 / *scale as f64;
    if offset.is_multiple_of(*scale) {
        format!("{offset} ({} {unit})", offset / scale)
    } else {
        format!("{offset} ({value:.1} {unit})")
    }
}

/// Where the full read of one disk stands, as the claim rules see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum FullRead {
    /// The class asks for none, or nothing is known (the rules then ask for one).
    #[default]
    Unknown,
    /// Waiting for another device's full read to finish (one at a time per node).
    Queued,
    /// Under way.
    Reading { done: u64, total: u64 },
    /// Every byte read zero, with no write to the device during the read.
    Blank,
    /// Non-zero data at this byte offset.
    Data { offset: u64 },
    /// The last read failed or was voided by a write; it is tried again later.
    Failed(String),
    /// A blank proof is kept but no longer holds (the reason: written since, another boot, a
    /// record of an earlier version): the disk needs a new full read.
    Void(String),
}

impl FullRead {
    /// Why a device whose class asks for a full read is not claimed yet; `None` once it read
    /// blank. `Data` is the caller's to turn into a "not blank" refusal.
    pub fn pending(&self) -> Option<String> {
        match self {
            FullRead::Blank | FullRead::Data { .. } => None,
            FullRead::Unknown => Some("full read not started yet".into()),
            FullRead::Queued => Some("full read queued behind another device's (one at a time per node)".into()),
            FullRead::Reading { done, total } => Some(format!("full read {}% done", percent_step(*done, *total))),
            FullRead::Failed(why) => Some(format!("the last full read did not finish ({why}); it is tried again")),
            FullRead::Void(why) => Some(format!("the full read's proof no longer holds ({why}); it is read again")),
        }
    }
}

/// `done` of `total` in whole tens of percent (0, 10, ... 100): the steps progress is logged
/// and reported at, so a refusal's text changes at most ten times per read.
pub(crate) fn percent_step(done: u64, total: u64) -> u64 {
    if total == 0 {
        return 100;
    }
    let percent = u128::from(done.min(total)) * 100 / u128::from(total);
    (percent as u64) / 10 * 10
}

/// One finished full read, kept in the state directory (`verified.json`) so a disk is read
/// whole once: matched by stable id and size (a disk of another size is another disk).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct VerifiedRecord {
    /// The device's stable id (`wwid:...`, `loop:...`).
    pub disk: String,
    /// Its size in bytes when read.
    pub size: u64,
    /// `None`: every byte read zero; `Some(offset)`: the first non-zero byte.
    pub data_at: Option<u64>,
    /// When the read finished, in seconds since the Unix epoch.
    pub at: u64,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`) when the read finished: the
    /// write counters below count from that boot. `None` in records of earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
    /// The device's write counters at the end of the read. `None` in records of earlier
    /// versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<WriteCounters>,
}

/// The counters of a device's `stat` that move when anything is written to it (see
/// core::devices::activity::IoStat): writes completed, sectors written, discards completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WriteCounters {
    /// Write requests completed.
    pub writes: u64,
    /// Sectors written.
    pub write_sectors: u64,
    /// Discard requests completed.
    pub discards: u64,
}

impl From<&IoStat> for WriteCounters {
    fn from(s: &IoStat) -> Self {
        WriteCounters { writes: s.writes, write_sectors: s.write_sectors, discards: s.discards }
    }
}

/// The device as it is now, to judge a kept blank proof by: this boot's ID and the device's
/// write counters, each `None` when it cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Now<'a> {
    /// The boot ID now.
    pub boot: Option<&'a str>,
    /// The device's write counters now.
    pub counters: Option<WriteCounters>,
}

/// Whether a kept blank proof still holds: only while the node runs the boot it was taken in
/// and the device's write counters have not moved since (nothing was written or discarded:
/// the bytes are those read). Anything unknown voids it: a record of an earlier version (no
/// boot, no counters), a boot ID or counters that cannot be read now. Another boot voids it
/// because counters restart at zero and the disk may have been written while the node was
/// down or from another machine. `Err` says why, for the operator.
pub(crate) fn proof_holds(record: &VerifiedRecord, now: Now<'_>) -> Result<(), String> {
    let (Some(boot), Some(counters)) = (record.boot.as_deref(), record.counters) else {
        return Err("recorded by an earlier version, without the boot and the write counters".into());
    };
    let Some(now_boot) = now.boot else { return Err("this boot's ID cannot be read".into()) };
    if boot != now_boot {
        return Err("the node booted again since the read".into());
    }
    let Some(c) = now.counters else { return Err("the device's write counters cannot be read".into()) };
    if c == counters {
        return Ok(());
    }
    let mut what = Vec::new();
    if c.writes != counters.writes || c.write_sectors != counters.write_sectors {
        let sectors = c.write_sectors.wrapping_sub(counters.write_sectors);
        what.push(format!("{} writes ({} KiB)", c.writes.wrapping_sub(counters.writes), sectors / 2));
    }
    if c.discards != counters.discards {
        what.push(format!("{} discards", c.discards.wrapping_sub(counters.discards)));
    }
    Err(format!("written since the read: {}", what.join(", ")))
}

/// What a kept record says of the device now. A record of data whose offset the probe just
/// read as zero (`probe_blank` covers that window too) is stale: the operator cleared the
/// disk, so it is read again. A blank record is `Blank` only while [`proof_holds`], else
/// `Void` (read again).
pub(crate) fn recorded(
    records: &[VerifiedRecord],
    disk: &str,
    size: u64,
    probe_blank: bool,
    now: Now<'_>,
) -> Option<FullRead> {
    let r = records.iter().find(|r| r.disk == disk && r.size == size)?;
    match r.data_at {
        None => Some(proof_holds(r, now).map_or_else(FullRead::Void, |()| FullRead::Blank)),
        Some(_) if probe_blank => None,
        Some(offset) => Some(FullRead::Data { offset }),
    }
}

#[cfg(test)]
#[path = "surface_tests.rs"]
mod tests;
