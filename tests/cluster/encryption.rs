//! Per-volume encryption at rest (docs/encryption.md) on real ext4 loop devices made with the
//! encrypt feature, the real control plane and the agent under its own RBAC: each volume is
//! published with its own key on its data directory, what the tenant writes never reaches the
//! disk in clear, the key is back in the kernel after a remount (a reboot drops every key) and
//! destroyed on release, so the old blocks restored read nothing with any key the node has; a
//! filesystem without the feature is refused, and a PV whose key is lost is fenced.
//!
//! Needs root.

use crate::support;

use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use local_static_provisioner::host::volumes::fscrypt;
use local_static_provisioner::host::volumes::key_store::KeyStore;
use support::used_lab::*;
use support::{run, wait_until};

/// What the tenant writes: long and odd enough to be found in a raw image only where written.
const SECRET: &[u8] = b"ENCRYPTED-TENANT-SECRET-5b1e77d0-never-in-clear";
/// What the admin writes at the volume's root, outside the encrypted directory: found in the
/// raw image, so a search that finds nothing is not blind.
const CONTROL: &[u8] = b"UNENCRYPTED-CONTROL-MARKER-0c4f2a99";
const ANN_ENCRYPTION: &str = "local-static-provisioner.io/encryption";
const ANN_LAST_WIPE: &str = "local-static-provisioner.io/last-wipe";

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// An ext4 on a new loop device, made with (or without) the encrypt feature, mounted at `at`.
fn ext4(h: &Harness, name: &str, at: &Path, encrypt: bool) -> (PathBuf, PathBuf) {
    let (dev, img) = h.lab.loop_dev(name, 64);
    let mut mkfs = Command::new("mkfs.ext4");
    mkfs.args(["-q", "-F"]);
    if encrypt {
        mkfs.args(["-O", "encrypt"]);
    }
    run(mkfs.arg(&dev));
    h.lab.mount_dev(&dev, at);
    (dev, img)
}

/// The key identifier a PV's encryption annotation names.
fn key_of(h: &Harness, pv: &str) -> String {
    let ann = h.ann(pv, ANN_ENCRYPTION).unwrap_or_else(|| panic!("{pv} has no {ANN_ENCRYPTION}"));
    ann.strip_prefix("fscrypt-v2 key=").unwrap_or_else(|| panic!("{ann:?}")).to_string()
}

/// Reads `file`; the error's raw errno when it cannot be.
fn read(file: &Path) -> Result<Vec<u8>, Option<i32>> {
    std::fs::read(file).map_err(|e| e.raw_os_error())
}

const ENOKEY: i32 = 126;

/// The node's fence label of `pv`, if set.
fn fence(h: &Harness, pv: &str) -> Option<String> {
    let node = h.cp.get_json(&["node", &h.node])?;
    node["metadata"]["labels"][format!("fence.local-static-provisioner.io/{pv}")].as_str().map(str::to_string)
}

#[test]
fn each_volume_gets_its_own_key_kept_across_a_remount_and_destroyed_on_release() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("encryption") else { return };
    let class = "enc-fast";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "  encryption: fscrypt\n")]);
    let state = h.lab.path(&format!("state-{}", h.node));
    let store = KeyStore::new(&state);
    let (e, f, plain) = (disks.join("e"), disks.join("f"), disks.join("p"));
    let (dev, img) = ext4(&h, "e", &e, true);
    ext4(&h, "f", &f, true);
    ext4(&h, "p", &plain, false);
    let mut agent = h.agent(&config, &[]);

    // Each volume: its data directory published, with a key of its own, stored on the node.
    let data = e.join("lsp-encrypted");
    let pv = h.wait_published(&data);
    let other = h.wait_published(&f.join("lsp-encrypted"));
    let (key, other_key) = (key_of(&h, &pv), key_of(&h, &other));
    assert_ne!(key, other_key, "two volumes share a key");
    let id = fscrypt::KeyId::from_hex(&key).unwrap();
    let stored = store.read(&id);
    assert!(stored.is_ok(), "the key of {pv} ({key}): {:?}; stored: {:?}", stored.err(), store.list());
    assert!(h.pv_at(&e).is_none(), "the volume root itself must not be published");
    // A filesystem without the encrypt feature: refused, and the Node is told what to do.
    let refused = wait_until("the plain ext4 refused with an event", WAIT, || {
        h.node_event("VolumeNotPublished", "encrypt feature")
    });
    assert!(refused.contains("tune2fs -O encrypt"), "{refused}");
    assert!(h.pv_at(&plain).is_none() && h.pv_at(&plain.join("lsp-encrypted")).is_none());

    // The tenant writes through its claim; the disk never holds it in clear.
    h.claim("enc-claim", class, &pv, false);
    std::fs::write(data.join("secret"), SECRET).unwrap();
    std::fs::write(e.join("control"), CONTROL).unwrap();
    run(&mut Command::new("sync"));
    let raw = std::fs::read(&dev).unwrap();
    assert!(contains(&raw, CONTROL), "the control marker is on the disk (else the search is blind)");
    assert!(!contains(&raw, SECRET), "the tenant's data reached the disk in clear");
    std::fs::remove_file(e.join("control")).unwrap();
    run(&mut Command::new("sync"));
    // The disk as it is now, to be restored after the release.
    let before = h.lab.path("images/e-before.img");
    run(Command::new("cp").arg("--sparse=always").arg(&img).arg(&before));

    // A reboot drops every key: the agent stopped, the filesystem unmounted and mounted again.
    drop(agent);
    h.lab.umount(&e);
    h.lab.mount_dev(&dev, &e);
    let locked = entries(&data);
    assert_eq!(locked.len(), 1, "{locked:?}");
    assert_ne!(locked[0].file_name().unwrap(), "secret", "names are readable without the key");
    assert_eq!(read(&locked[0]).err(), Some(Some(ENOKEY)), "the tenant's file is readable without its key");
    // The agent back: the key is in the kernel again before anything else, the data readable.
    agent = h.agent(&config, &[]);
    wait_until("the key loaded again after the remount", WAIT, || {
        (read(&data.join("secret")).ok()? == SECRET).then_some(())
    });
    assert_eq!(fence(&h, &pv), None, "a volume whose key is loaded is not fenced");
    // Remounted while the agent runs: the new mount is seen, and its key put back.
    h.lab.umount(&e);
    h.lab.mount_dev(&dev, &e);
    wait_until("the key loaded again after a remount under the running agent", WAIT, || {
        (read(&data.join("secret")).ok()? == SECRET).then_some(())
    });

    // Released: the key destroyed first (kernel and store), then the files; the clean volume is
    // published again with a new key, and its PV says what was done.
    let old_uid = h.uid(&pv);
    h.delete_claim("enc-claim");
    let new_key = wait_until("the volume published again after its wipe", WAIT, || {
        let (name, phase) = h.pv_at(&data)?;
        (name == pv && phase == "Available" && h.uid(&pv) != old_uid).then(|| key_of(&h, &pv))
    });
    assert_ne!(new_key, key, "the recycled volume kept its key");
    let history = h.ann(&pv, ANN_LAST_WIPE).unwrap_or_default();
    for part in ["method=crypto-erase", &format!("key={key}"), "key-destroyed=", "key-verified=absent"] {
        assert!(history.contains(part), "{part} missing from {ANN_LAST_WIPE}: {history:?}");
    }
    assert!(store.read(&id).is_err(), "the released volume's key is still in the node's store");
    assert!(store.list().unwrap().iter().all(|k| k.id != key));
    assert!(entries(&data).is_empty(), "the recycled volume is not empty");
    // A second tenant, released too: the PV after it tells both tenants' erases.
    let second_uid = h.uid(&pv);
    h.claim("enc-claim-2", class, &pv, false);
    std::fs::write(data.join("second"), SECRET).unwrap();
    h.delete_claim("enc-claim-2");
    wait_until("the volume recycled a second time", WAIT, || {
        let (name, phase) = h.pv_at(&data)?;
        (name == pv && phase == "Available" && h.uid(&pv) != second_uid).then_some(())
    });
    let last = h.ann(&pv, ANN_LAST_WIPE).unwrap_or_default();
    assert!(last.contains(&format!("key={new_key}")) && last.contains(&second_uid), "{last:?}");
    let earlier = h.ann(&pv, "local-static-provisioner.io/earlier-wipes").unwrap_or_default();
    assert!(earlier.contains(&format!("key={key}")) && earlier.contains(&old_uid), "{earlier:?}");
    drop(agent);

    // The old blocks restored: what the tenant wrote reads with no key the node has.
    let copy = h.lab.loop_on(&before);
    let restored = h.lab.path("restored");
    h.lab.mount_dev_with(&copy, &restored, &["-o", "ro"]);
    let old = entries(&restored.join("lsp-encrypted"));
    assert_eq!(old.len(), 1, "the restored copy holds the tenant's file: {old:?}");
    let root = std::fs::File::open(&restored).unwrap();
    for kept in store.list().unwrap() {
        let bytes = store.read(&fscrypt::KeyId::from_hex(&kept.id).unwrap()).unwrap();
        let added = fscrypt::add_key(root.as_fd(), &bytes, &restored).unwrap();
        assert_ne!(added.to_hex(), key);
    }
    assert_eq!(read(&old[0]).err(), Some(Some(ENOKEY)), "the released tenant's data is readable from its old blocks");
    drop(root);
    h.lab.umount(&restored);
}

/// A bound encrypted volume whose key the node lost (its state directory restored without
/// `keys/`, say) is fenced after a remount: kubelet would mount a directory nobody can read.
#[test]
fn a_volume_whose_key_is_lost_is_fenced() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("enc-lost") else { return };
    let class = "enc-lost";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "  encryption: fscrypt\n")]);
    let store = KeyStore::new(&h.lab.path(&format!("state-{}", h.node)));
    let e = disks.join("e");
    let (dev, _) = ext4(&h, "e", &e, true);
    let agent = h.agent(&config, &[]);
    let data = e.join("lsp-encrypted");
    let pv = h.wait_published(&data);
    h.claim("enc-lost-claim", class, &pv, false);
    std::fs::write(data.join("secret"), SECRET).unwrap();
    drop(agent);
    let id = fscrypt::KeyId::from_hex(&key_of(&h, &pv)).unwrap();
    assert!(store.destroy(&id).unwrap());
    h.lab.umount(&e);
    h.lab.mount_dev(&dev, &e);
    let _agent = h.agent(&config, &[]);
    wait_until("the PV fenced for its lost key", WAIT, || (fence(&h, &pv)? == "key-unavailable").then_some(()));
    assert_eq!(h.pv_at(&data).map(|(_, phase)| phase).as_deref(), Some("Bound"), "the PV itself is kept");
}

/// A used encrypted volume whose PV an operator force-deleted (no wipe, no key destroyed) is
/// wiped before it is published again, and that wipe destroys the key its data directory is
/// encrypted with (the node's, proven on the disk): the next tenant gets a new key, and the old
/// one is gone from the node.
#[test]
fn a_force_deleted_encrypted_volume_is_crypto_erased_before_it_returns() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("enc-forced") else { return };
    let class = "enc-forced";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "  encryption: fscrypt\n")]);
    let store = KeyStore::new(&h.lab.path(&format!("state-{}", h.node)));
    let e = disks.join("e");
    ext4(&h, "e", &e, true);
    let _agent = h.agent(&config, &[]);
    let data = e.join("lsp-encrypted");
    let pv = h.wait_published(&data);
    let key = key_of(&h, &pv);
    h.claim("enc-forced-claim", class, &pv, false);
    std::fs::write(data.join("secret"), SECRET).unwrap();
    // Deleted while Bound, its finalizers forced off: no wipe, and the same name comes back
    // for the volume once it is wiped, so "gone" is the old object's UID no longer there.
    let old_uid = h.uid(&pv);
    h.cp.kubectl_ok(&["delete", "pv", &pv, "--wait=false"]);
    wait_until("the used PV gone", WAIT, || {
        if h.pv(&pv).is_none_or(|p| p["metadata"]["uid"] != old_uid.as_str()) {
            return Some(());
        }
        let _ = h.cp.kubectl(&["patch", "pv", &pv, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
        None
    });
    h.delete_claim("enc-forced-claim");
    let new_key = wait_until("the volume wiped first and published again", WAIT, || {
        let (name, phase) = h.pv_at(&data)?;
        (phase == "Available" && h.uid(&name) != old_uid).then(|| key_of(&h, &name))
    });
    assert_ne!(new_key, key);
    let old = fscrypt::KeyId::from_hex(&key).unwrap();
    assert!(store.read(&old).is_err(), "the force-deleted volume's key is still in the node's store");
    assert!(entries(&data).is_empty(), "the volume came back with the tenant's files");
}

/// A PV whose annotation names another volume's key (edited by hand, or a forged object) is
/// never wiped with it: the wipe refuses, the other volume's key stays, and the data stays.
#[test]
fn a_pv_naming_another_volumes_key_destroys_nothing() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("enc-forged") else { return };
    let class = "enc-forged";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "  encryption: fscrypt\n")]);
    let store = KeyStore::new(&h.lab.path(&format!("state-{}", h.node)));
    let (e, f) = (disks.join("e"), disks.join("f"));
    ext4(&h, "e", &e, true);
    ext4(&h, "f", &f, true);
    let _agent = h.agent(&config, &[]);
    let (data_e, data_f) = (e.join("lsp-encrypted"), f.join("lsp-encrypted"));
    let (pv_e, pv_f) = (h.wait_published(&data_e), h.wait_published(&data_f));
    let key_f = key_of(&h, &pv_f);
    h.claim("enc-forged-claim", class, &pv_e, false);
    std::fs::write(data_e.join("secret"), SECRET).unwrap();
    let forged = format!("{ANN_ENCRYPTION}=fscrypt-v2 key={key_f}");
    h.cp.kubectl_ok(&["annotate", "pv", &pv_e, "--overwrite", &forged]);
    h.delete_claim("enc-forged-claim");
    let refused = wait_until("the wipe refused", WAIT, || {
        let result = h.ann(&pv_e, "local-static-provisioner.io/cleanup-result")?;
        result.contains("not with the key its PV names").then_some(result)
    });
    assert!(refused.contains(&key_f), "{refused}");
    let id_f = fscrypt::KeyId::from_hex(&key_f).unwrap();
    assert!(store.read(&id_f).is_ok(), "another volume's key was destroyed");
    assert_eq!(read(&data_f.join("missing")).err(), Some(Some(2)));
    assert_eq!(read(&data_e.join("secret")).ok().as_deref(), Some(SECRET), "the data was removed");
    assert_eq!(h.pv_at(&data_e).map(|(_, phase)| phase).as_deref(), Some("Released"));
}

/// The host steps on a real ext4 with the encrypt feature, without a cluster: a readied empty
/// directory is reused only on the disk its key was made for; one with files is never reused,
/// nor given up with its key; a mount over `lsp-encrypted` is not this volume's; an empty one
/// is given up with its key (kernel and store).
#[test]
fn a_readied_key_is_reused_or_given_up_only_while_its_directory_is_empty_and_on_its_own_disk() {
    let _area = support::area(module_path!());
    use local_static_provisioner::host::identity::used_mark::open_volume_root;
    use local_static_provisioner::host::volumes::encryption::{EncryptionError, abandon, prepare};
    let Some(h) = Harness::new("enc-host") else { return };
    let e = h.lab.path("e");
    ext4(&h, "e", &e, true);
    let store = KeyStore::new(&h.lab.path("state"));
    let root = open_volume_root(&e).unwrap();
    let fd = root.as_fd();
    let disk = "v2;fs;disk=test:e;uuid=e;ino=2";
    let id = prepare(fd, &e, "/mnt/e", disk, &store).unwrap();
    assert!(store.read(&id).is_ok());
    // Interrupted before its PV: the same empty directory and key again.
    assert_eq!(prepare(fd, &e, "/mnt/e", disk, &store).unwrap(), id);
    // A clone elsewhere (another disk's identity): refused, the directory kept as it is.
    let other = prepare(fd, &e, "/mnt/e", "v2;fs;disk=test:clone;uuid=c;ino=2", &store).unwrap_err();
    assert!(matches!(other, EncryptionError::OtherDisksKey { .. }), "{other}");
    // Files written with the key: never reused, never given up.
    let data = e.join("lsp-encrypted");
    std::fs::write(data.join("f"), SECRET).unwrap();
    let held = prepare(fd, &e, "/mnt/e", disk, &store).unwrap_err();
    assert!(matches!(held, EncryptionError::HoldsData { .. }), "{held}");
    let kept = abandon(fd, &e, &id, &store).unwrap_err();
    assert!(matches!(kept, EncryptionError::HoldsData { .. }), "{kept}");
    assert!(store.read(&id).is_ok(), "a key with data was destroyed");
    std::fs::remove_file(data.join("f")).unwrap();
    // Something mounted over the directory is not this volume's.
    h.lab.tmpfs(&data, 1);
    let over = prepare(fd, &e, "/mnt/e", disk, &store).unwrap_err();
    assert!(matches!(over, EncryptionError::MountedOver { .. }), "{over}");
    h.lab.umount(&data);
    // Empty: given up, the directory removed, the key gone from the kernel and the store.
    abandon(fd, &e, &id, &store).unwrap();
    assert!(!data.exists());
    assert!(store.read(&id).is_err());
    assert_eq!(fscrypt::key_status(fd, &id, &e).unwrap(), fscrypt::KeyStatus::Absent);
}

/// A tenant of a class that does not encrypt may leave anything named `lsp-encrypted` at its
/// volume's root (a file, a link, a directory on a filesystem without fscrypt): the wipe removes
/// it like any entry, and the volume is recycled.
#[test]
fn a_plain_volumes_entry_named_like_the_data_directory_does_not_stop_its_wipe() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("enc-plain") else { return };
    let class = "enc-plain";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "")]);
    let (a, b) = (disks.join("a"), disks.join("b"));
    h.lab.tmpfs(&a, 8);
    ext4(&h, "b", &b, false);
    let _agent = h.agent(&config, &[]);
    let (pv_a, pv_b) = (h.wait_published(&a), h.wait_published(&b));
    let (uid_a, uid_b) = (h.uid(&pv_a), h.uid(&pv_b));
    h.claim("enc-plain-a", class, &pv_a, false);
    h.claim("enc-plain-b", class, &pv_b, false);
    std::fs::write(a.join("lsp-encrypted"), b"a file").unwrap();
    std::os::unix::fs::symlink("/", b.join("lsp-encrypted")).unwrap();
    h.delete_claim("enc-plain-a");
    h.delete_claim("enc-plain-b");
    for (pv, uid, root) in [(&pv_a, &uid_a, &a), (&pv_b, &uid_b, &b)] {
        wait_until(&format!("{pv} recycled"), WAIT, || {
            let (name, phase) = h.pv_at(root)?;
            (name == *pv && phase == "Available" && h.uid(pv) != *uid).then_some(())
        });
        assert!(!root.join("lsp-encrypted").exists() && std::fs::symlink_metadata(root.join("lsp-encrypted")).is_err());
    }
}

/// Turning encryption on for a class converts nothing in place: its PV keeps its path and its
/// data, the Node is told, and the volume is published encrypted after its wipe.
#[test]
fn a_class_turned_encrypting_converts_no_volume_silently() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("enc-later") else { return };
    let class = "enc-later";
    let disks = h.lab.dir("disks");
    let config = h.config("config", &[(class, &disks, "")]);
    let e = disks.join("e");
    ext4(&h, "e", &e, true);
    let _agent = h.agent(&config, &[]);
    let pv = h.wait_published(&e);
    h.claim("enc-later-claim", class, &pv, false);
    std::fs::write(e.join("tenant"), SECRET).unwrap();
    // The same config directory, now with encryption on (a reload, as kubelet updates it).
    h.config("config", &[(class, &disks, "  encryption: fscrypt\n")]);
    let told = wait_until("the Node told of the unencrypted PV", WAIT, || h.node_event("EncryptionPending", &pv));
    assert!(told.contains(class) && told.contains("stay unencrypted"), "{told}");
    assert_eq!(h.pv_at(&e), Some((pv.clone(), "Bound".to_string())));
    assert_eq!(std::fs::read(e.join("tenant")).unwrap(), SECRET, "the tenant's data was touched");
    assert!(!e.join("lsp-encrypted").exists(), "a data directory was made in a tenant's volume");
    // Released and wiped: published again, encrypted.
    let uid = h.uid(&pv);
    h.delete_claim("enc-later-claim");
    let data = e.join("lsp-encrypted");
    wait_until("the volume published again encrypted", WAIT, || {
        let (name, phase) = h.pv_at(&data)?;
        (name == pv && phase == "Available" && h.uid(&pv) != uid).then_some(())
    });
    assert!(h.ann(&pv, ANN_ENCRYPTION).is_some());
}

/// The entries of a directory (by their names as the kernel shows them: encrypted without
/// the key).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    all.sort();
    all
}
