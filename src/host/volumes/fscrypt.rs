//! fscrypt v2 (Linux 5.4 and later): the filesystem-level encryption of one directory tree with
//! its own key, which is how each local volume's data directory gets a key of its own (and is
//! crypto-erased by forgetting it). The kernel keeps the keys per mounted filesystem: they are
//! gone after an unmount or a reboot, so the caller adds each volume's key again before the
//! volume is used.
//!
//! Neither rustix (1.1) nor nix wraps these ioctls, so each is declared here once, behind a safe
//! wrapper (as host::devices::blockdev does for the block ioctls). The constants are linux-raw-sys's; the
//! argument structures are written out (the kernel's have unions, which would need `unsafe` to
//! read) and checked against the kernel's sizes and linux-raw-sys's at compile time.
//!
//! Every call is on a descriptor the caller opened (never a path), so a symlink swapped in
//! between cannot redirect it. `path` only names that descriptor in error messages.
//!
//! What the support probe gets on Linux 6.18, as the tests below check: ext4 made with
//! `-O encrypt` answers ENODATA for its (unencrypted) root ([`Support::Usable`]), ext4 without
//! it EOPNOTSUPP ([`Support::FeatureOff`]), tmpfs ENOTTY ([`Support::NotSupported`]: tmpfs has
//! no fscrypt there). As root, FS_IOC_SET_ENCRYPTION_POLICY does not check that the key is
//! present (see [`set_policy`]), and a file open in the tree makes a removal
//! [`Removal::FilesBusy`] until it is closed and the removal repeated.

use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::{Path, PathBuf};

use linux_raw_sys::general::{
    FSCRYPT_KEY_IDENTIFIER_SIZE, FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY, FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER,
    FSCRYPT_KEY_STATUS_ABSENT, FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED, FSCRYPT_KEY_STATUS_PRESENT,
    FSCRYPT_MAX_KEY_SIZE, FSCRYPT_MODE_AES_256_CTS, FSCRYPT_MODE_AES_256_XTS, FSCRYPT_POLICY_FLAGS_PAD_32,
    FSCRYPT_POLICY_V1, FSCRYPT_POLICY_V2,
};
use nix::errno::Errno;
use nix::sys::stat::SFlag;
use zeroize::Zeroize;

/// Bytes in a master key: the largest the kernel takes, as google/fscrypt and ceph-csi use.
const KEY_SIZE: usize = FSCRYPT_MAX_KEY_SIZE as usize;
const ID_SIZE: usize = FSCRYPT_KEY_IDENTIFIER_SIZE as usize;

/// A 64-byte fscrypt master key; zeroed when dropped; Debug never prints the bytes. Kept on the
/// heap, so that moving a `MasterKey` never leaves a copy of the bytes behind; not `Clone`, so
/// that every copy is deliberate (`from_bytes`).
pub struct MasterKey(Box<[u8; KEY_SIZE]>);

impl MasterKey {
    /// 64 bytes from the kernel's random number generator (getrandom(2), which waits until it
    /// is seeded).
    pub fn generate() -> Result<MasterKey, FscryptError> {
        let mut key = MasterKey(Box::new([0; KEY_SIZE]));
        let mut filled = 0;
        while filled < KEY_SIZE {
            match rustix::rand::getrandom(&mut key.0[filled..], rustix::rand::GetRandomFlags::empty()) {
                Ok(0) => return Err(FscryptError::Random { errno: Errno::EIO }),
                Ok(n) => filled += n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(FscryptError::Random { errno: Errno::from_raw(e.raw_os_error()) }),
            }
        }
        Ok(key)
    }

    /// A key from its stored bytes: exactly 64 of them.
    pub fn from_bytes(bytes: &[u8]) -> Result<MasterKey, FscryptError> {
        if bytes.len() != KEY_SIZE {
            return Err(FscryptError::KeyLength { len: bytes.len() });
        }
        let mut key = MasterKey(Box::new([0; KEY_SIZE]));
        key.0.copy_from_slice(bytes);
        Ok(key)
    }

    /// The key's bytes, to store them.
    pub fn bytes(&self) -> &[u8] {
        &self.0[..]
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey({KEY_SIZE} bytes, not shown)")
    }
}

/// The kernel's 16-byte identifier of a v2 master key (what FS_IOC_ADD_ENCRYPTION_KEY returns):
/// a hash of the key, so it names the key without revealing it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(pub [u8; ID_SIZE]);

impl KeyId {
    /// 32 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.to_string()
    }

    /// The identifier written by [`KeyId::to_hex`]: exactly 32 lower-case hex digits (one text
    /// per identifier, so stored texts can be compared as they are).
    pub fn from_hex(s: &str) -> Option<KeyId> {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        let s = s.as_bytes();
        if s.len() != 2 * ID_SIZE {
            return None;
        }
        let mut id = [0; ID_SIZE];
        for (byte, pair) in id.iter_mut().zip(s.chunks_exact(2)) {
            *byte = digit(pair[0])? << 4 | digit(pair[1])?;
        }
        Some(KeyId(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Whether the filesystem of a directory can take a v2 policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// fscrypt works here (the probed directory may or may not be encrypted).
    Usable,
    /// The filesystem could, but its `encrypt` feature is off (ext4 made without `-O encrypt`:
    /// `tune2fs -O encrypt`), or the kernel was built without CONFIG_FS_ENCRYPTION.
    FeatureOff,
    /// The filesystem type has no fscrypt (tmpfs, xfs, btrfs), or the kernel is older than 5.4.
    NotSupported,
}

/// Whether a key is on the filesystem (FS_IOC_GET_ENCRYPTION_KEY_STATUS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyStatus {
    Absent,
    Present,
    /// Removed while some of its files were in use: the secret is wiped (nothing more can be
    /// unlocked), but the files that were open stay readable; [`remove_key`] again finishes.
    IncompletelyRemoved,
}

/// What [`remove_key`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removal {
    /// The key and every file it had unlocked are gone from the kernel.
    Removed,
    /// The key was not on the filesystem (never added, or already removed).
    WasAbsent,
    /// The key's secret is wiped, but some of its inodes are still in use (open files, a
    /// working directory or a mount inside the tree), so they stay readable; calling
    /// [`remove_key`] again once they are released completes the removal.
    FilesBusy,
}

/// The operation that failed, for messages and for callers that match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Probe,
    AddKey,
    SetPolicy,
    SyncPolicy,
    GetPolicy,
    KeyStatus,
    RemoveKey,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::Probe => "probing fscrypt support (FS_IOC_GET_ENCRYPTION_POLICY_EX) on",
            Operation::AddKey => "adding an fscrypt key (FS_IOC_ADD_ENCRYPTION_KEY) to the filesystem of",
            Operation::SetPolicy => "setting the fscrypt policy (FS_IOC_SET_ENCRYPTION_POLICY) of",
            Operation::SyncPolicy => "syncing (fsync) the new fscrypt policy of",
            Operation::GetPolicy => "reading the fscrypt policy (FS_IOC_GET_ENCRYPTION_POLICY_EX) of",
            Operation::KeyStatus => "reading an fscrypt key's status (FS_IOC_GET_ENCRYPTION_KEY_STATUS) on",
            Operation::RemoveKey => {
                "removing an fscrypt key (FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS) from the filesystem of"
            }
        })
    }
}

/// An fscrypt operation that failed, with the descriptor's path as the caller named it.
#[derive(Debug, thiserror::Error)]
pub enum FscryptError {
    /// The kernel refused the call.
    #[error("{op} {path}: {errno}{}", hint(*.op, *.errno))]
    Ioctl { op: Operation, path: PathBuf, errno: Errno },
    /// The directory is encrypted, but not with a v2 policy (only v2 policies are set or read).
    #[error("reading the fscrypt policy of {path}: it has a {} policy (version code {version}), not v2",
        if *.version == FSCRYPT_POLICY_V1 as u8 { "v1" } else { "unknown" })]
    PolicyVersion { path: PathBuf, version: u8 },
    /// The kernel answered a key status this code does not know.
    #[error("reading the status of fscrypt key {id} on {path}: unknown status {status}")]
    UnknownKeyStatus { path: PathBuf, id: KeyId, status: u32 },
    /// getrandom(2) failed.
    #[error("generating an fscrypt master key (getrandom): {errno}")]
    Random { errno: Errno },
    /// Stored key bytes of the wrong length.
    #[error("an fscrypt master key is {KEY_SIZE} bytes, not {len}")]
    KeyLength { len: usize },
}

impl FscryptError {
    /// The kernel's errno, when the failure was a system call's.
    pub fn errno(&self) -> Option<Errno> {
        match self {
            FscryptError::Ioctl { errno, .. } | FscryptError::Random { errno } => Some(*errno),
            _ => None,
        }
    }

    fn ioctl(op: Operation, path: &Path, errno: Errno) -> FscryptError {
        FscryptError::Ioctl { op, path: path.to_path_buf(), errno }
    }
}

/// What an errno means for the operation (fscrypt.rst "User API"), after the errno's own text.
fn hint(op: Operation, errno: Errno) -> &'static str {
    use Operation::*;
    match (op, errno) {
        (_, Errno::EOPNOTSUPP) => {
            "; the filesystem has no encrypt feature (tune2fs -O encrypt), or the kernel lacks CONFIG_FS_ENCRYPTION"
        }
        (_, Errno::ENOTTY) => "; this filesystem type has no fscrypt (or the kernel is older than 5.4)",
        (SetPolicy, Errno::ENOTEMPTY) => "; a policy can only be set on an empty directory",
        (SetPolicy, Errno::EEXIST) => {
            "; the directory already has a different policy, which can never change (make a new directory)"
        }
        (SetPolicy, Errno::ENOKEY) => {
            "; the key is not on this filesystem, or was added by another user (add it first)"
        }
        (SetPolicy, Errno::EPERM) => {
            "; this directory may not be encrypted (ext4 never encrypts its root directory: use a subdirectory)"
        }
        (SetPolicy, Errno::EACCES) => "; only the directory's owner or a holder of CAP_FOWNER may set its policy",
        (SetPolicy, Errno::ENOTDIR) => "; only a directory is given a policy",
        (RemoveKey, Errno::EACCES) => "; removing a key for all users needs CAP_SYS_ADMIN",
        (AddKey, Errno::EDQUOT) => {
            "; the user's key quota is used up (/proc/sys/kernel/keys/root_maxkeys, root_maxbytes)"
        }
        (GetPolicy | Probe, Errno::EOVERFLOW) => "; the policy is of a version newer than v2",
        (_, Errno::EINVAL) => "; the kernel rejected the request (encryption mode, key size or a field)",
        (_, Errno::EBADF) => "; the descriptor cannot take an ioctl (opened with O_PATH?)",
        (_, Errno::EROFS) => "; the filesystem is read-only",
        _ => "",
    }
}

// The kernel's structures (include/uapi/linux/fscrypt.h), with their sizes asserted below. The
// reserved fields are always zero, as the kernel requires.

/// `struct fscrypt_policy_v2`.
#[repr(C)]
#[derive(Clone, Copy)]
struct PolicyV2 {
    version: u8,
    contents_encryption_mode: u8,
    filenames_encryption_mode: u8,
    flags: u8,
    /// 0: the filesystem's block size (named since 6.7; reserved before, also 0).
    log2_data_unit_size: u8,
    reserved: [u8; 3],
    master_key_identifier: [u8; ID_SIZE],
}

/// `struct fscrypt_get_policy_ex_arg`: the size, then the policy (a union of v1 and v2, of
/// which the first byte is the version), 8-byte aligned.
#[repr(C)]
struct GetPolicyExArg {
    policy_size: u64,
    policy: [u8; POLICY_V2_SIZE],
}

/// `struct fscrypt_key_specifier` with `type` IDENTIFIER: the identifier is the first 16 bytes
/// of the 32-byte union.
#[repr(C)]
#[derive(Clone, Copy)]
struct KeySpec {
    kind: u32,
    reserved: u32,
    u: [u8; 32],
}

/// `struct fscrypt_add_key_arg` without its flexible `raw[]` (the ioctl's size is this part's).
#[repr(C)]
struct AddKeyArg {
    key_spec: KeySpec,
    raw_size: u32,
    /// 0: the key is in `raw`, not in a keyring.
    key_id: u32,
    flags: u32,
    reserved: [u32; 7],
}

/// An `fscrypt_add_key_arg` followed by its `raw[]`: the key.
#[repr(C)]
struct AddKeyBuf {
    arg: AddKeyArg,
    raw: [u8; KEY_SIZE],
}

/// `struct fscrypt_remove_key_arg`.
#[repr(C)]
struct RemoveKeyArg {
    key_spec: KeySpec,
    removal_status_flags: u32,
    reserved: [u32; 5],
}

/// `struct fscrypt_get_key_status_arg`.
#[repr(C)]
struct KeyStatusArg {
    key_spec: KeySpec,
    reserved: [u32; 6],
    status: u32,
    status_flags: u32,
    user_count: u32,
    out_reserved: [u32; 13],
}

const POLICY_V1_SIZE: usize = 12;
const POLICY_V2_SIZE: usize = 24;

const _: () = {
    use linux_raw_sys::general as k;
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<k::fscrypt_policy_v1>() == POLICY_V1_SIZE);
    assert!(size_of::<PolicyV2>() == POLICY_V2_SIZE && size_of::<k::fscrypt_policy_v2>() == POLICY_V2_SIZE);
    assert!(size_of::<GetPolicyExArg>() == 32 && size_of::<k::fscrypt_get_policy_ex_arg>() == 32);
    assert!(align_of::<GetPolicyExArg>() == align_of::<k::fscrypt_get_policy_ex_arg>());
    assert!(size_of::<KeySpec>() == 40 && size_of::<k::fscrypt_key_specifier>() == 40);
    assert!(size_of::<AddKeyArg>() == 80 && size_of::<k::fscrypt_add_key_arg>() == 80);
    assert!(offset_of!(AddKeyBuf, raw) == 80 && offset_of!(k::fscrypt_add_key_arg, raw) == 80);
    assert!(size_of::<RemoveKeyArg>() == 64 && size_of::<k::fscrypt_remove_key_arg>() == 64);
    assert!(size_of::<KeyStatusArg>() == 128 && size_of::<k::fscrypt_get_key_status_arg>() == 128);
    assert!(offset_of!(KeyStatusArg, status) == offset_of!(k::fscrypt_get_key_status_arg, status));
};

/// The raw requests, generated by nix as `unsafe fn`s; private so that only the safe wrappers
/// below can call them. The request numbers are nix's per-architecture encoding of the
/// kernel's `_IOR`/`_IOWR` lines, with the sizes the kernel encodes (not always the size of
/// what is passed).
mod raw {
    use super::{AddKeyArg, AddKeyBuf, GetPolicyExArg, KeyStatusArg, POLICY_V1_SIZE, PolicyV2, RemoveKeyArg};
    use nix::sys::ioctl::ioctl_num_type;
    use std::mem::size_of;

    /// `_IOR('f', 19, struct fscrypt_policy_v1)`: "read" although it passes data in, and sized
    /// for a v1 policy although it takes a v2 one (the kernel reads the version byte first).
    pub(super) const SET_POLICY: ioctl_num_type = nix::request_code_read!(b'f', 19, POLICY_V1_SIZE);
    /// `_IOWR('f', 22, __u8[9])`: the size field and the version byte.
    pub(super) const GET_POLICY_EX: ioctl_num_type = nix::request_code_readwrite!(b'f', 22, 9);
    /// `_IOWR('f', 23, struct fscrypt_add_key_arg)`: without `raw[]`, which follows it.
    pub(super) const ADD_KEY: ioctl_num_type = nix::request_code_readwrite!(b'f', 23, size_of::<AddKeyArg>());
    /// `_IOWR('f', 25, struct fscrypt_remove_key_arg)`.
    pub(super) const REMOVE_KEY_ALL_USERS: ioctl_num_type =
        nix::request_code_readwrite!(b'f', 25, size_of::<RemoveKeyArg>());
    /// `_IOWR('f', 26, struct fscrypt_get_key_status_arg)`.
    pub(super) const KEY_STATUS: ioctl_num_type = nix::request_code_readwrite!(b'f', 26, size_of::<KeyStatusArg>());

    nix::ioctl_write_ptr_bad!(set_encryption_policy, SET_POLICY, PolicyV2);
    nix::ioctl_readwrite_bad!(get_encryption_policy_ex, GET_POLICY_EX, GetPolicyExArg);
    nix::ioctl_readwrite_bad!(add_encryption_key, ADD_KEY, AddKeyBuf);
    nix::ioctl_readwrite_bad!(remove_encryption_key_all_users, REMOVE_KEY_ALL_USERS, RemoveKeyArg);
    nix::ioctl_readwrite_bad!(get_encryption_key_status, KEY_STATUS, KeyStatusArg);
}

/// The raw descriptor of `fd` if it is a directory or a regular file, so that the request goes
/// to its filesystem, for which the `FS_IOC_*` numbers are the VFS-wide fscrypt API (fs/crypto)
/// and take the structures declared here. A device node's ioctls go to its driver instead,
/// which may read the number differently: ENOTTY without the ioctl.
fn fs_object_fd(fd: BorrowedFd<'_>) -> Result<RawFd, Errno> {
    let st = nix::sys::stat::fstat(fd)?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFDIR || kind == SFlag::S_IFREG { Ok(fd.as_raw_fd()) } else { Err(Errno::ENOTTY) }
}

/// A key specifier naming `id`.
fn identifier_spec(id: &KeyId) -> KeySpec {
    let mut u = [0; 32];
    u[..ID_SIZE].copy_from_slice(&id.0);
    KeySpec { kind: FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER, reserved: 0, u }
}

/// The policy of `dir` as GET_POLICY_EX reports it: its version byte and, for v2, the key.
fn read_policy(dir: BorrowedFd<'_>) -> Result<(u8, Option<KeyId>), Errno> {
    let fd = fs_object_fd(dir)?;
    let mut arg = GetPolicyExArg { policy_size: POLICY_V2_SIZE as u64, policy: [0; POLICY_V2_SIZE] };
    // SAFETY: on a directory or regular file (checked; the descriptor is borrowed, so it stays
    // that file) GET_POLICY_EX reads `policy_size` and writes at most that many policy bytes
    // and the size back, all within the `GetPolicyExArg` the pointer points to (same layout as
    // fscrypt_get_policy_ex_arg), valid for the call.
    unsafe { raw::get_encryption_policy_ex(fd, &mut arg) }?;
    let version = arg.policy[0];
    if version == FSCRYPT_POLICY_V2 as u8 && arg.policy_size == POLICY_V2_SIZE as u64 {
        let mut id = [0; ID_SIZE];
        id.copy_from_slice(&arg.policy[8..8 + ID_SIZE]);
        return Ok((version, Some(KeyId(id))));
    }
    Ok((version, None))
}

/// Whether the filesystem of `dir` (say its root) can take a v2 policy: GET_POLICY_EX answers
/// ENODATA (not encrypted) or a policy where fscrypt works, EOPNOTSUPP where the filesystem
/// could but its feature is off, ENOTTY where it has no fscrypt.
pub fn support(dir: BorrowedFd<'_>, path: &Path) -> Result<Support, FscryptError> {
    match read_policy(dir) {
        Ok(_) | Err(Errno::ENODATA | Errno::EOVERFLOW) => Ok(Support::Usable),
        Err(Errno::EOPNOTSUPP) => Ok(Support::FeatureOff),
        Err(Errno::ENOTTY) => Ok(Support::NotSupported),
        Err(errno) => Err(FscryptError::ioctl(Operation::Probe, path, errno)),
    }
}

/// Adds `key` to the filesystem of `fs` (any descriptor on it; its root, as the kernel doc
/// suggests) and returns the identifier the kernel derived from it. Adding a key that is
/// already there succeeds with the same identifier (the kernel counts a claim for the user).
/// The copy of the key made for the call is zeroed before returning.
pub fn add_key(fs: BorrowedFd<'_>, key: &MasterKey, path: &Path) -> Result<KeyId, FscryptError> {
    let fd = fs_object_fd(fs).map_err(|e| FscryptError::ioctl(Operation::AddKey, path, e))?;
    let mut buf = AddKeyBuf {
        arg: AddKeyArg {
            key_spec: KeySpec { kind: FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER, reserved: 0, u: [0; 32] },
            raw_size: KEY_SIZE as u32,
            key_id: 0,
            flags: 0,
            reserved: [0; 7],
        },
        raw: [0; KEY_SIZE],
    };
    buf.raw.copy_from_slice(key.bytes());
    // SAFETY: on a directory or regular file (checked) ADD_KEY reads the fscrypt_add_key_arg
    // and the `raw_size` (64) key bytes after it, and writes the identifier into `key_spec`:
    // all within the `AddKeyBuf` the pointer points to (the same layout with `raw` at offset
    // 80, asserted), valid for the call.
    let result = unsafe { raw::add_encryption_key(fd, &mut buf) };
    buf.raw.zeroize();
    result.map_err(|e| FscryptError::ioctl(Operation::AddKey, path, e))?;
    let mut id = [0; ID_SIZE];
    id.copy_from_slice(&buf.arg.key_spec.u[..ID_SIZE]);
    Ok(KeyId(id))
}

/// Gives the empty directory `dir` the v2 policy of key `id`: contents AES-256-XTS, names
/// AES-256-CBC-CTS, names padded to 32 bytes, the kernel doc's recommended setting, which every
/// fscrypt kernel supports. What is created in it from then on is encrypted. The same policy
/// again succeeds; another is EEXIST, a non-empty directory ENOTEMPTY. The directory is then
/// synced, so the policy is on disk before the directory is handed out (google/fscrypt did
/// not, ceph-csi does it after it).
///
/// The kernel wants the key added by the caller (else ENOKEY) only from callers without
/// CAP_FOWNER: for root it sets a policy whose key is not there at all (nothing can then be
/// created in the directory: ENOKEY). So add the key first and, to be sure, see it Present
/// with [`key_status`].
pub fn set_policy(dir: BorrowedFd<'_>, id: &KeyId, path: &Path) -> Result<(), FscryptError> {
    let fd = fs_object_fd(dir).map_err(|e| FscryptError::ioctl(Operation::SetPolicy, path, e))?;
    let policy = PolicyV2 {
        version: FSCRYPT_POLICY_V2 as u8,
        contents_encryption_mode: FSCRYPT_MODE_AES_256_XTS as u8,
        filenames_encryption_mode: FSCRYPT_MODE_AES_256_CTS as u8,
        flags: FSCRYPT_POLICY_FLAGS_PAD_32 as u8,
        log2_data_unit_size: 0,
        reserved: [0; 3],
        master_key_identifier: id.0,
    };
    // SAFETY: on a directory or regular file (checked) SET_POLICY reads the version byte and,
    // as it is 2, one fscrypt_policy_v2 through the pointer, which points to one `PolicyV2`
    // (same layout, asserted) valid for the call; it writes nothing back.
    unsafe { raw::set_encryption_policy(fd, &policy) }
        .map_err(|e| FscryptError::ioctl(Operation::SetPolicy, path, e))?;
    nix::unistd::fsync(dir).map_err(|e| FscryptError::ioctl(Operation::SyncPolicy, path, e))
}

/// The key of `dir`'s v2 policy, `None` when it is not encrypted (ENODATA); a v1 (or unknown)
/// policy is an error. The modes are not compared: [`set_policy`] with the same key fails
/// (EEXIST) if they differ from its own.
pub fn policy_of(dir: BorrowedFd<'_>, path: &Path) -> Result<Option<KeyId>, FscryptError> {
    match read_policy(dir) {
        Ok((_, Some(id))) => Ok(Some(id)),
        Ok((version, None)) => Err(FscryptError::PolicyVersion { path: path.to_path_buf(), version }),
        Err(Errno::ENODATA) => Ok(None),
        Err(errno) => Err(FscryptError::ioctl(Operation::GetPolicy, path, errno)),
    }
}

/// Whether key `id` is on the filesystem of `fs`.
pub fn key_status(fs: BorrowedFd<'_>, id: &KeyId, path: &Path) -> Result<KeyStatus, FscryptError> {
    let fd = fs_object_fd(fs).map_err(|e| FscryptError::ioctl(Operation::KeyStatus, path, e))?;
    let mut arg = KeyStatusArg {
        key_spec: identifier_spec(id),
        reserved: [0; 6],
        status: 0,
        status_flags: 0,
        user_count: 0,
        out_reserved: [0; 13],
    };
    // SAFETY: on a directory or regular file (checked) GET_KEY_STATUS reads and writes one
    // fscrypt_get_key_status_arg through the pointer, which points to one `KeyStatusArg` (same
    // layout, asserted) valid for the call.
    unsafe { raw::get_encryption_key_status(fd, &mut arg) }
        .map_err(|e| FscryptError::ioctl(Operation::KeyStatus, path, e))?;
    match arg.status {
        FSCRYPT_KEY_STATUS_ABSENT => Ok(KeyStatus::Absent),
        FSCRYPT_KEY_STATUS_PRESENT => Ok(KeyStatus::Present),
        FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED => Ok(KeyStatus::IncompletelyRemoved),
        status => Err(FscryptError::UnknownKeyStatus { path: path.to_path_buf(), id: *id, status }),
    }
}

/// Removes key `id` from the filesystem of `fs` for every user who added it (so no other claim
/// keeps it; needs CAP_SYS_ADMIN): the kernel wipes its secret and evicts the files it
/// unlocked. Those still in use keep it [`Removal::FilesBusy`] until a later call.
pub fn remove_key(fs: BorrowedFd<'_>, id: &KeyId, path: &Path) -> Result<Removal, FscryptError> {
    let fd = fs_object_fd(fs).map_err(|e| FscryptError::ioctl(Operation::RemoveKey, path, e))?;
    let mut arg = RemoveKeyArg { key_spec: identifier_spec(id), removal_status_flags: 0, reserved: [0; 5] };
    // SAFETY: on a directory or regular file (checked) REMOVE_KEY_ALL_USERS reads and writes
    // one fscrypt_remove_key_arg through the pointer, which points to one `RemoveKeyArg` (same
    // layout, asserted) valid for the call.
    match unsafe { raw::remove_encryption_key_all_users(fd, &mut arg) } {
        Ok(_) if arg.removal_status_flags & FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY != 0 => Ok(Removal::FilesBusy),
        Ok(_) => Ok(Removal::Removed),
        Err(Errno::ENOKEY) => Ok(Removal::WasAbsent),
        Err(e) => Err(FscryptError::ioctl(Operation::RemoveKey, path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::test_env::{cannot_run, require_root};
    use std::fs::{self, File, OpenOptions};
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    use std::process::Command;

    #[test]
    fn key_ids_are_32_lower_case_hex_digits() {
        let id = KeyId([0x00, 0x01, 0x7f, 0x80, 0xab, 0xcd, 0xef, 0xff, 9, 10, 11, 12, 13, 14, 15, 16]);
        let hex = id.to_hex();
        assert_eq!(hex, "00017f80abcdefff090a0b0c0d0e0f10");
        assert_eq!(id.to_string(), hex);
        assert_eq!(format!("{id:?}"), format!("KeyId({hex})"));
        assert_eq!(KeyId::from_hex(&hex), Some(id));
        for bad in ["", &hex[1..], &format!("{hex}0"), &hex.to_uppercase(), "g0017f80abcdefff090a0b0c0d0e0f10"] {
            assert_eq!(KeyId::from_hex(bad), None, "{bad:?}");
        }
        for _ in 0..100 {
            let id = KeyId(fastrand::u128(..).to_be_bytes());
            assert_eq!(KeyId::from_hex(&id.to_hex()), Some(id));
        }
    }

    #[test]
    fn master_keys_are_64_bytes_and_never_printed() {
        let key = MasterKey::generate().unwrap();
        assert_eq!(key.bytes().len(), 64);
        assert_ne!(key.bytes(), &[0; 64][..], "random bytes");
        assert_ne!(MasterKey::generate().unwrap().bytes(), key.bytes());
        let copy = MasterKey::from_bytes(key.bytes()).unwrap();
        assert_eq!(copy.bytes(), key.bytes());
        assert_eq!(format!("{key:?}"), "MasterKey(64 bytes, not shown)");
        assert_eq!(format!("{copy:#?}"), "MasterKey(64 bytes, not shown)");
        for len in [0, 16, 32, 63, 65] {
            let err = MasterKey::from_bytes(&vec![7; len]).unwrap_err();
            assert!(matches!(err, FscryptError::KeyLength { len: l } if l == len), "{err:?}");
            assert_eq!(err.to_string(), format!("an fscrypt master key is 64 bytes, not {len}"));
        }
    }

    /// The request numbers against the kernel's (the values on x86_64 and arm64, from
    /// linux-raw-sys's generated ioctl.rs); the structure sizes are asserted at compile time.
    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn request_numbers_are_the_kernels() {
        assert_eq!(raw::SET_POLICY, 0x800C_6613);
        assert_eq!(raw::GET_POLICY_EX, 0xC009_6616);
        assert_eq!(raw::ADD_KEY, 0xC050_6617);
        assert_eq!(raw::REMOVE_KEY_ALL_USERS, 0xC040_6619);
        assert_eq!(raw::KEY_STATUS, 0xC080_661A);
    }

    #[test]
    fn errors_name_the_operation_the_path_and_the_cause() {
        let path = Path::new("/mnt/disk1");
        let err = FscryptError::ioctl(Operation::AddKey, path, Errno::EOPNOTSUPP);
        assert_eq!(err.errno(), Some(Errno::EOPNOTSUPP));
        let text = err.to_string();
        assert!(
            text.starts_with("adding an fscrypt key (FS_IOC_ADD_ENCRYPTION_KEY) to the filesystem of /mnt/disk1: ")
        );
        assert!(text.contains("EOPNOTSUPP") && text.contains("(tune2fs -O encrypt)"), "{text}");
        let text = FscryptError::ioctl(Operation::SetPolicy, path, Errno::ENOTEMPTY).to_string();
        assert!(text.ends_with("; a policy can only be set on an empty directory"), "{text}");
        let text = FscryptError::PolicyVersion { path: path.into(), version: 0 }.to_string();
        assert_eq!(text, "reading the fscrypt policy of /mnt/disk1: it has a v1 policy (version code 0), not v2");
    }

    /// A character device is refused before any ioctl: its driver, not a filesystem, would
    /// read the request.
    #[test]
    fn device_nodes_are_refused_without_an_ioctl() {
        let null = File::open("/dev/null").unwrap();
        let err = add_key(null.as_fd(), &MasterKey::from_bytes(&[1; 64]).unwrap(), Path::new("/dev/null"));
        assert!(matches!(err, Err(FscryptError::Ioctl { errno: Errno::ENOTTY, op: Operation::AddKey, .. })), "{err:?}");
        assert!(matches!(support(null.as_fd(), Path::new("/dev/null")), Ok(Support::NotSupported)));
    }

    // Real filesystems: ext4 images on loop devices, made and mounted in a temporary directory.

    /// Mounts and loop devices made by one test, undone when it ends, passed or not.
    struct Scratch {
        tmp: tempfile::TempDir,
        mounts: Vec<PathBuf>,
        loops: Vec<String>,
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            for m in self.mounts.iter().rev() {
                if !Command::new("umount").arg(m).status().is_ok_and(|s| s.success()) {
                    let _ = Command::new("umount").arg("-l").arg(m).status();
                }
            }
            for l in &self.loops {
                let _ = Command::new("losetup").arg("-d").arg(l).status();
            }
        }
    }

    /// A mounted filesystem: where, and its image (None for tmpfs).
    struct Mounted {
        dir: PathBuf,
        image: Option<PathBuf>,
    }

    impl Scratch {
        /// `None` (with the reason printed) when the test cannot run here.
        fn new(test: &str) -> Option<Scratch> {
            if !require_root(test) {
                return None;
            }
            if Command::new("mkfs.ext4").arg("-V").output().is_err() {
                cannot_run(test, "no mkfs.ext4 (e2fsprogs)");
                return None;
            }
            Some(Scratch { tmp: tempfile::tempdir().unwrap(), mounts: Vec::new(), loops: Vec::new() })
        }

        /// A 64 MiB ext4 (with or without the encrypt feature) on a loop device, mounted.
        fn ext4(&mut self, test: &str, name: &str, encrypt: bool) -> Option<Mounted> {
            let image = self.tmp.path().join(format!("{name}.img"));
            File::create(&image).unwrap().set_len(64 << 20).unwrap();
            let feature = if encrypt { "encrypt" } else { "^encrypt" };
            let out =
                Command::new("mkfs.ext4").args(["-q", "-F", "-b", "4096", "-O", feature]).arg(&image).output().unwrap();
            assert!(out.status.success(), "mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr));
            let out = match Command::new("losetup").args(["--find", "--show"]).arg(&image).output() {
                Ok(out) if out.status.success() => out,
                Ok(out) => {
                    cannot_run(test, &format!("no loop device: {}", String::from_utf8_lossy(&out.stderr).trim()));
                    return None;
                }
                Err(e) => {
                    cannot_run(test, &format!("no losetup (util-linux): {e}"));
                    return None;
                }
            };
            let device = String::from_utf8_lossy(&out.stdout).trim().to_string();
            self.loops.push(device.clone());
            let dir = self.tmp.path().join(name);
            fs::create_dir(&dir).unwrap();
            let out = Command::new("mount").args(["-t", "ext4"]).arg(&device).arg(&dir).output().unwrap();
            assert!(out.status.success(), "mount {device}: {}", String::from_utf8_lossy(&out.stderr));
            self.mounts.push(dir.clone());
            Some(Mounted { dir, image: Some(image) })
        }

        fn tmpfs(&mut self, name: &str) -> Mounted {
            let dir = self.tmp.path().join(name);
            fs::create_dir(&dir).unwrap();
            let out = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&dir).output().unwrap();
            assert!(out.status.success(), "mount tmpfs: {}", String::from_utf8_lossy(&out.stderr));
            self.mounts.push(dir.clone());
            Mounted { dir, image: None }
        }
    }

    fn open_dir(path: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
            .open(path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }

    fn contains(haystack: &[u8], needle: &[u8]) -> bool {
        haystack.windows(needle.len()).any(|w| w == needle)
    }

    /// The names in `dir`.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    /// ext4 with the encrypt feature on a loop device; `None` when the test cannot run.
    fn encrypted_ext4(test: &str) -> Option<(Scratch, Mounted)> {
        let mut scratch = Scratch::new(test)?;
        let fs = scratch.ext4(test, "fs", true)?;
        let root = open_dir(&fs.dir);
        match support(root.as_fd(), &fs.dir).unwrap() {
            Support::Usable => Some((scratch, fs)),
            other => {
                cannot_run(test, &format!("ext4 -O encrypt is {other:?} on this kernel (CONFIG_FS_ENCRYPTION?)"));
                None
            }
        }
    }

    /// The whole life of an encrypted volume directory: key added, policy set, data written
    /// (and not in the raw image, where an unencrypted control file is), key removed (the data
    /// unreadable), key added again from its stored bytes (as after a reboot: readable again).
    #[test]
    fn a_directory_is_encrypted_locked_and_unlocked_again() {
        let test = "a_directory_is_encrypted_locked_and_unlocked_again";
        let Some((_scratch, fs)) = encrypted_ext4(test) else { return };
        let mnt = &fs.dir;
        let root = open_dir(mnt);
        assert_eq!(policy_of(root.as_fd(), mnt).unwrap(), None, "the root is not encrypted");

        let key = MasterKey::generate().unwrap();
        let id = add_key(root.as_fd(), &key, mnt).unwrap();
        assert_eq!(add_key(root.as_fd(), &key, mnt).unwrap(), id, "adding it again is the same key");
        assert_eq!(key_status(root.as_fd(), &id, mnt).unwrap(), KeyStatus::Present);

        let vol = mnt.join("vol");
        fs::create_dir(&vol).unwrap();
        {
            let dir = open_dir(&vol);
            set_policy(dir.as_fd(), &id, &vol).unwrap();
            set_policy(dir.as_fd(), &id, &vol).unwrap(); // the same policy again: no change
            assert_eq!(policy_of(dir.as_fd(), &vol).unwrap(), Some(id));
        }
        let secret = format!("secret-{:032x}", fastrand::u128(..));
        let control = format!("control-{:032x}", fastrand::u128(..));
        let name = format!("{secret}.txt");
        let contents = secret.repeat(256).into_bytes();
        fs::write(vol.join(&name), &contents).unwrap();
        fs::create_dir(vol.join("sub")).unwrap();
        assert_eq!(policy_of(open_dir(&vol.join("sub")).as_fd(), &vol).unwrap(), Some(id), "inherited");
        fs::write(mnt.join(format!("{control}.txt")), control.repeat(256)).unwrap();
        nix::unistd::syncfs(root.as_fd()).unwrap();

        let image = fs::read(fs.image.as_ref().unwrap()).unwrap();
        assert!(contains(&image, control.as_bytes()), "the control file's plaintext is in the image");
        assert!(!contains(&image, secret.as_bytes()), "the encrypted file's name or contents are in the image");
        drop(image);

        // Every file is closed: the key goes completely.
        assert_eq!(remove_key(root.as_fd(), &id, mnt).unwrap(), Removal::Removed);
        assert_eq!(key_status(root.as_fd(), &id, mnt).unwrap(), KeyStatus::Absent);
        assert_eq!(remove_key(root.as_fd(), &id, mnt).unwrap(), Removal::WasAbsent);
        assert_eq!(policy_of(open_dir(&vol).as_fd(), &vol).unwrap(), Some(id), "the policy stays");
        let locked = names(&vol);
        assert_eq!(locked.len(), 2, "{locked:?}");
        assert!(!locked.iter().any(|n| n.contains("secret") || n == "sub"), "names are shown encrypted: {locked:?}");
        for n in &locked {
            if fs::symlink_metadata(vol.join(n)).unwrap().is_dir() {
                assert_eq!(names(&vol.join(n)), Vec::<String>::new(), "a locked directory can be listed");
                continue;
            }
            let err = File::open(vol.join(n)).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(nix::libc::ENOKEY), "{n}: {err}");
        }
        assert!(File::open(vol.join(&name)).is_err(), "the plaintext name is gone");
        let err = File::create(vol.join("new")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENOKEY), "{err}");

        // After a reboot: the stored bytes bring the files back.
        let stored = MasterKey::from_bytes(key.bytes()).unwrap();
        drop(key);
        assert_eq!(add_key(root.as_fd(), &stored, mnt).unwrap(), id);
        assert_eq!(key_status(root.as_fd(), &id, mnt).unwrap(), KeyStatus::Present);
        assert_eq!(names(&vol), vec![name.clone(), "sub".to_string()]);
        assert_eq!(fs::read(vol.join(&name)).unwrap(), contents);
        assert_eq!(policy_of(root.as_fd(), mnt).unwrap(), None);
    }

    /// A file open in the tree when the key is removed: the secret goes, the open file stays
    /// readable, the key is "incompletely removed" until a second removal after it is closed.
    #[test]
    fn a_key_with_open_files_is_removed_in_two_steps() {
        let test = "a_key_with_open_files_is_removed_in_two_steps";
        let Some((_scratch, fs)) = encrypted_ext4(test) else { return };
        let mnt = &fs.dir;
        let root = open_dir(mnt);
        let key = MasterKey::generate().unwrap();
        let id = add_key(root.as_fd(), &key, mnt).unwrap();
        let vol = mnt.join("vol");
        fs::create_dir(&vol).unwrap();
        set_policy(open_dir(&vol).as_fd(), &id, &vol).unwrap();
        fs::write(vol.join("data"), b"still here").unwrap();

        let mut open = File::open(vol.join("data")).unwrap();
        assert_eq!(remove_key(root.as_fd(), &id, mnt).unwrap(), Removal::FilesBusy);
        assert_eq!(key_status(root.as_fd(), &id, mnt).unwrap(), KeyStatus::IncompletelyRemoved);
        let mut text = String::new();
        open.read_to_string(&mut text).unwrap();
        assert_eq!(text, "still here", "an open file stays readable");
        let err = File::create(vol.join("new")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENOKEY), "nothing new is unlocked: {err}");

        drop(open);
        assert_eq!(remove_key(root.as_fd(), &id, mnt).unwrap(), Removal::Removed);
        assert_eq!(key_status(root.as_fd(), &id, mnt).unwrap(), KeyStatus::Absent);
        let locked = names(&vol);
        assert_eq!(locked.len(), 1);
        let err = File::open(vol.join(&locked[0])).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENOKEY), "{err}");
    }

    /// What the kernel refuses, with the errno and the hint the caller shows.
    #[test]
    fn refused_policies_say_why() {
        let test = "refused_policies_say_why";
        let Some((_scratch, fs)) = encrypted_ext4(test) else { return };
        let mnt = &fs.dir;
        let root = open_dir(mnt);
        let key = MasterKey::generate().unwrap();
        let id = add_key(root.as_fd(), &key, mnt).unwrap();
        let refused = |dir: &Path, id: &KeyId| match set_policy(open_dir(dir).as_fd(), id, dir) {
            Err(FscryptError::Ioctl { op: Operation::SetPolicy, errno, path }) => {
                assert_eq!(path, dir);
                errno
            }
            other => panic!("set_policy {}: {other:?}", dir.display()),
        };

        // ext4 never encrypts its root (and this one has lost+found in it).
        let errno = refused(mnt, &id);
        assert!(matches!(errno, Errno::EPERM | Errno::ENOTEMPTY), "{errno}");
        let full = mnt.join("full");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("plain"), "x").unwrap();
        assert_eq!(refused(&full, &id), Errno::ENOTEMPTY);
        let err = set_policy(open_dir(&full).as_fd(), &id, &full).unwrap_err().to_string();
        assert!(err.contains(&full.display().to_string()) && err.ends_with("empty directory"), "{err}");
        let vol = mnt.join("vol");
        fs::create_dir(&vol).unwrap();
        let unknown = KeyId(fastrand::u128(..).to_be_bytes());
        set_policy(open_dir(&vol).as_fd(), &id, &vol).unwrap();
        assert_eq!(refused(&vol, &unknown), Errno::EEXIST, "another key");
        assert_eq!(policy_of(open_dir(&vol).as_fd(), &vol).unwrap(), Some(id));
        // With CAP_FOWNER (root) the kernel does not check that the key is there at all.
        let nokey = mnt.join("nokey");
        fs::create_dir(&nokey).unwrap();
        set_policy(open_dir(&nokey).as_fd(), &unknown, &nokey).unwrap();
        assert_eq!(key_status(root.as_fd(), &unknown, mnt).unwrap(), KeyStatus::Absent);
        assert_eq!(policy_of(open_dir(&nokey).as_fd(), &nokey).unwrap(), Some(unknown));
        let err = File::create(nokey.join("f")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(nix::libc::ENOKEY), "{err}");
        assert_eq!(policy_of(open_dir(&full).as_fd(), &full).unwrap(), None);
        assert_eq!(remove_key(root.as_fd(), &id, mnt).unwrap(), Removal::Removed);
    }

    /// ext4 without the feature, and tmpfs: what this kernel answers (see the module doc).
    #[test]
    fn filesystems_without_fscrypt_are_told_apart() {
        let test = "filesystems_without_fscrypt_are_told_apart";
        let Some(mut scratch) = Scratch::new(test) else { return };
        let Some(plain) = scratch.ext4(test, "plain", false) else { return };
        let root = open_dir(&plain.dir);
        assert_eq!(support(root.as_fd(), &plain.dir).unwrap(), Support::FeatureOff);
        let err = add_key(root.as_fd(), &MasterKey::generate().unwrap(), &plain.dir).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::EOPNOTSUPP));
        assert!(err.to_string().contains("the filesystem has no encrypt feature (tune2fs -O encrypt)"), "{err}");

        let tmpfs = scratch.tmpfs("tmpfs");
        let root = open_dir(&tmpfs.dir);
        assert_eq!(
            support(root.as_fd(), &tmpfs.dir).unwrap(),
            Support::NotSupported,
            "tmpfs answered GET_ENCRYPTION_POLICY_EX other than ENOTTY: this kernel may have fscrypt on \
             tmpfs; update the module doc"
        );
        let err = policy_of(root.as_fd(), &tmpfs.dir).unwrap_err();
        assert_eq!(err.errno(), Some(Errno::ENOTTY), "{err}");
        assert!(tmpfs.image.is_none());
    }
}
