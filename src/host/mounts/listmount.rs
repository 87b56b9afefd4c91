//! listmount(2) and statmount(2) (Linux 6.8 and later): the mount IDs of this mount namespace,
//! and one mount's facts, without the kernel formatting the whole table as text. On a busy node
//! (kubelet mounts and unmounts for every pod) the mount watch learns from them which mounts
//! came and went, and reads the whole table only when one of them may matter (host::mounts::watch).
//!
//! Neither rustix (1.1) nor nix wraps them yet, so the two calls are made here, behind safe
//! functions; the syscall numbers and structure layouts are linux-raw-sys's (rustix's own source
//! of kernel definitions, already linked), so none is written by hand. A kernel without them
//! (ENOSYS), or a seccomp profile that refuses them (EPERM), is an `Err`: the caller reads the
//! table as before.

use std::ffi::CStr;

use nix::libc;
use std::io;
use std::path::PathBuf;

use linux_raw_sys::general::{
    __NR_listmount, __NR_statmount, LSMT_ROOT, MNT_ID_REQ_SIZE_VER0, STATMOUNT_FS_TYPE, STATMOUNT_MNT_POINT,
    STATMOUNT_MNT_ROOT, STATMOUNT_SB_BASIC, STATMOUNT_SB_SOURCE, mnt_id_req, statmount,
};

/// How many IDs one listmount call returns at most; a namespace with more is listed in pages.
const PAGE: usize = 512;

/// The unique (64-bit) IDs of every mount in this process's mount namespace, in the kernel's
/// order (ascending), into `out`.
pub(crate) fn mount_ids(out: &mut Vec<u64>) -> io::Result<()> {
    out.clear();
    let mut last = 0u64;
    loop {
        // LSMT_ROOT: every mount of the namespace below this process's root; `param`: the last
        // ID of the previous page (0: from the start).
        let req =
            mnt_id_req { size: MNT_ID_REQ_SIZE_VER0, spare: 0, mnt_id: LSMT_ROOT as u64, param: last, mnt_ns_id: 0 };
        let start = out.len();
        out.resize(start + PAGE, 0);
        let page = out[start..].as_mut_ptr();
        // SAFETY: `req` is a valid mnt_id_req of which the kernel reads its first `size` bytes;
        // the buffer is `PAGE` writable u64s starting at `out[start]`, the count passed.
        let n = unsafe { libc::syscall(libc::c_long::from(__NR_listmount), &raw const req, page, PAGE, 0u32) };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        out.truncate(start + n.min(PAGE));
        match out.last() {
            Some(&id) if n == PAGE => last = id,
            _ => return Ok(()),
        }
    }
}

/// What the mount watch needs of one mount: as a mountinfo line gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MountFacts {
    /// `major:minor` of the filesystem.
    pub device: String,
    /// The directory of the filesystem that is mounted.
    pub root: PathBuf,
    /// Where it is mounted (relative to this process's root, as in mountinfo).
    pub mount_point: PathBuf,
    pub fs_type: String,
    /// The mount source; `None` on a kernel that does not report it (before 6.11).
    pub source: Option<String>,
}

/// The facts of the mount with unique ID `id` (from [`mount_ids`]); `Err` when it is gone.
pub(crate) fn mount_facts(id: u64) -> io::Result<MountFacts> {
    let mask = STATMOUNT_SB_BASIC | STATMOUNT_MNT_ROOT | STATMOUNT_MNT_POINT | STATMOUNT_FS_TYPE | STATMOUNT_SB_SOURCE;
    let req = mnt_id_req { size: MNT_ID_REQ_SIZE_VER0, spare: 0, mnt_id: id, param: u64::from(mask), mnt_ns_id: 0 };
    // u64s, so the buffer is aligned for struct statmount; grown when the kernel says EOVERFLOW
    // (long paths).
    let mut words = 512usize;
    loop {
        let mut buf = vec![0u64; words];
        let bytes = words * std::mem::size_of::<u64>();
        // SAFETY: `req` is a valid mnt_id_req of which the kernel reads its first `size` bytes;
        // `buf` is `bytes` writable bytes, the size passed.
        let rc =
            unsafe { libc::syscall(libc::c_long::from(__NR_statmount), &raw const req, buf.as_mut_ptr(), bytes, 0u32) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EOVERFLOW) && words < 1 << 16 {
                words *= 4;
                continue;
            }
            return Err(e);
        }
        return parse(&as_bytes(&buf), mask);
    }
}

/// The buffer's bytes.
fn as_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// The facts out of a statmount answer `buf`, which begins with a `struct statmount` whose
/// string fields are offsets into the string area that follows it.
fn parse(buf: &[u8], asked: u32) -> io::Result<MountFacts> {
    let head = std::mem::size_of::<statmount>();
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("statmount: {what}"));
    if buf.len() < head {
        return Err(bad("short answer"));
    }
    let u32_at = |offset: usize| u32::from_ne_bytes(buf[offset..offset + 4].try_into().unwrap_or_default());
    let u64_at = |offset: usize| u64::from_ne_bytes(buf[offset..offset + 8].try_into().unwrap_or_default());
    let mask = u64_at(std::mem::offset_of!(statmount, mask));
    let has = |bit: u32| mask & u64::from(bit) != 0;
    let strings = &buf[head..];
    let string = |field: usize, bit: u32| -> io::Result<Option<String>> {
        if !has(bit) {
            return Ok(None);
        }
        let at = usize::try_from(u32_at(field)).map_err(|_| bad("offset"))?;
        let s = strings.get(at..).and_then(|s| CStr::from_bytes_until_nul(s).ok()).ok_or_else(|| bad("string"))?;
        Ok(Some(String::from_utf8_lossy(s.to_bytes()).into_owned()))
    };
    // Every field asked but the source must be there (the source came with Linux 6.11).
    let required = asked & !STATMOUNT_SB_SOURCE;
    if u64::from(required) & !mask != 0 {
        return Err(bad("a field asked for is missing"));
    }
    let (major, minor) =
        (u32_at(std::mem::offset_of!(statmount, sb_dev_major)), u32_at(std::mem::offset_of!(statmount, sb_dev_minor)));
    let need = |s: Option<String>, what: &str| s.ok_or_else(|| bad(what));
    Ok(MountFacts {
        device: format!("{major}:{minor}"),
        root: PathBuf::from(need(string(std::mem::offset_of!(statmount, mnt_root), STATMOUNT_MNT_ROOT)?, "root")?),
        mount_point: PathBuf::from(need(
            string(std::mem::offset_of!(statmount, mnt_point), STATMOUNT_MNT_POINT)?,
            "mount point",
        )?),
        fs_type: need(string(std::mem::offset_of!(statmount, fs_type), STATMOUNT_FS_TYPE)?, "type")?,
        source: string(std::mem::offset_of!(statmount, sb_source), STATMOUNT_SB_SOURCE)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's answers agree with mountinfo: the same number of mounts, and each mount's
    /// facts as its line gives them (skipped on a kernel without the calls).
    #[test]
    fn the_ids_and_facts_agree_with_mountinfo() {
        let mut ids = Vec::new();
        if let Err(e) = mount_ids(&mut ids) {
            eprintln!("listmount(2) unavailable here ({e}): nothing to compare");
            return;
        }
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let lines: Vec<_> = super::super::mountinfo::line_views(&text).map(|l| l.unwrap()).collect();
        assert_eq!(ids.len(), lines.len(), "{ids:?}\n{text}");
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending: {ids:?}");
        for id in ids {
            let Ok(f) = mount_facts(id) else { continue }; // gone since
            let found = lines.iter().any(|l| {
                l.device == f.device
                    && l.root.as_ref() == f.root
                    && l.mount_point.as_ref() == f.mount_point
                    && l.fs_type == f.fs_type
                    && f.source.as_deref().is_none_or(|s| s == l.source || l.source.contains('\\'))
            });
            assert!(found, "{f:?} is no line of\n{text}");
        }
    }

    #[test]
    fn a_gone_mount_is_an_error() {
        let mut ids = Vec::new();
        if mount_ids(&mut ids).is_err() {
            return;
        }
        assert!(mount_facts(u64::MAX - 1).is_err());
    }

    #[test]
    fn a_short_or_malformed_answer_is_an_error_not_a_panic() {
        assert!(parse(&[0u8; 16], STATMOUNT_SB_BASIC).is_err());
        let mut buf = vec![0u8; std::mem::size_of::<statmount>() + 4];
        // Says it has a mount point at an offset past the end.
        let mask = u64::from(STATMOUNT_MNT_POINT);
        buf[std::mem::offset_of!(statmount, mask)..][..8].copy_from_slice(&mask.to_ne_bytes());
        buf[std::mem::offset_of!(statmount, mnt_point)..][..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&buf, STATMOUNT_MNT_POINT).is_err());
        // Asked for the type, which the answer lacks.
        assert!(parse(&buf[..std::mem::size_of::<statmount>()], STATMOUNT_FS_TYPE).is_err());
    }
}
