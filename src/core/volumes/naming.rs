//! Names and ownership markers that must match upstream exactly: a PV name that differs by a
//! single character would make every upstream-made PV a duplicate after the image swap.

/// Annotation upstream uses to mark which provisioner instance made a PV.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Legacy annotation carrying node affinity when `useAlphaAPI` is set.
pub const ANN_ALPHA_NODE_AFFINITY: &str = "volume.alpha.kubernetes.io/node-affinity";
/// The well-known node label whose value goes into every PV's node affinity.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// Our own label naming the node a PV belongs to; the agent watches only PVs carrying its own
/// value, so its memory and watch traffic do not grow with the cluster.
pub const LABEL_NODE: &str = "local-static-provisioner.io/node";
/// Our label naming the whole disk a PV's volume is on, by a hash of its stable ID
/// (core::identity::disk_trust::disk_label): another node that finds the disk looks its PVs up with one
/// label-selected list. Only a hint: the identity annotation is compared in full after it.
pub const LABEL_DISK_ID: &str = "local-static-provisioner.io/disk-id";
/// Set by an operator (`kubectl local-storage release-hold`) on a node's LocalStorageNode: the
/// comma-separated UIDs (or PV names) of other nodes' records that no longer hold that node's
/// disks back. An agent's token cannot change an object's metadata (admission policy).
pub const ANN_RELEASED_HOLDS: &str = "local-static-provisioner.io/released-holds";
/// Our finalizer on every PV we create or adopt: the PV object cannot disappear (crash, manual
/// `kubectl delete pv`) before its volume has been wiped.
pub const FINALIZER_WIPE: &str = "local-static-provisioner.io/wipe";
/// Fingerprint of the disk recorded at publication, checked before every wipe.
pub const ANN_VOLUME_IDENTITY: &str = "local-static-provisioner.io/volume-identity";
/// Set by an operator to the identity found, allowing a wipe that identity cannot prove safe.
pub const ANN_IDENTITY_CONFIRMED: &str = "local-static-provisioner.io/identity-confirmed";
/// Set (to `requested`) by an administrator to ask for a wipe and recycle of a PV.
pub const ANN_CLEANUP: &str = "local-static-provisioner.io/cleanup";
/// Value of ANN_CLEANUP that asks for a wipe.
pub const CLEANUP_REQUESTED: &str = "requested";
/// When the cleanup was last asked for (RFC 3339), set by `cleanup`: a new request retries a
/// failed or refused wipe at once instead of waiting out its retry delay.
pub const ANN_CLEANUP_REQUESTED_AT: &str = "local-static-provisioner.io/cleanup-requested-at";
/// The outcome of a cleanup request that did not end in a recycled PV (refused and why).
pub const ANN_CLEANUP_RESULT: &str = "local-static-provisioner.io/cleanup-result";
/// Set on a Bound or Released PV whose volume has disappeared from the node (the time it was
/// noticed); removed when the volume is back.
pub const ANN_VOLUME_MISSING: &str = "local-static-provisioner.io/volume-missing";
/// Set by the agent on a PV left by an earlier incarnation of its Node (same name, other UID)
/// whose recorded disk is not at its path any more: the time it was found stale. Node-cleanup
/// (where opted in) releases such PVs once they have been stale for its grace period.
pub const ANN_VOLUME_STALE: &str = "local-static-provisioner.io/volume-stale";
/// Set by the agent, next to volume-missing or instead of volume-stale, on a PV whose recorded
/// disk is at another entry of the same node now (moved, or swapped with another): the host
/// path where it is. Node-cleanup never releases such a PV: its data is on a live node.
pub const ANN_VOLUME_MOVED_TO: &str = "local-static-provisioner.io/volume-moved-to";
/// Set on a PV while its disk shows signs of failing or does not answer (core::health::disk_health):
/// the reasons. Removed when they clear.
pub const ANN_DISK_FAILING: &str = "local-static-provisioner.io/disk-failing";
/// Prefix of upstream's provisioner name.
pub const PROVISIONER_PREFIX: &str = "local-volume-provisioner-";

/// FNV-1a, 32 bits. Written out because upstream's names depend on this exact variant and the
/// `fnv` crate only offers the 64-bit one.
pub fn fnv1a32(parts: &[&[u8]]) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for part in parts {
        for &b in *part {
            hash ^= u32::from(b);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    }
    hash
}

/// Upstream's PV name: `local-pv-` + unpadded lowercase hex of FNV-1a over entry + node +
/// class with no separator.
pub fn pv_name(entry: &str, node: &str, class: &str) -> String {
    format!("local-pv-{:x}", fnv1a32(&[entry.as_bytes(), node.as_bytes(), class.as_bytes()]))
}

/// The provisioned-by value upstream writes for this node.
pub fn provisioner_name(node: &str, node_uid: &str, use_node_name_only: bool) -> String {
    if use_node_name_only {
        format!("{PROVISIONER_PREFIX}{node}")
    } else {
        format!("{PROVISIONER_PREFIX}{node}-{node_uid}")
    }
}

/// Whether a PV's provisioned-by annotation (and hostname label) say it was made for this node,
/// by upstream or by us, with the same rules upstream's cache applies.
pub fn is_provisioned_for_node(
    annotation: Option<&str>,
    hostname_label: Option<&str>,
    node: &str,
    provisioner: &str,
    use_node_name_only: bool,
) -> bool {
    let Some(ann) = annotation else { return false };
    if ann == provisioner {
        return true;
    }
    use_node_name_only
        && hostname_label == Some(node)
        && ann.strip_prefix(provisioner).is_some_and(|rest| rest.starts_with('-'))
}

/// The node UID in a provisioned-by value written for `node` by an earlier incarnation of the
/// Node (same name). Node UIDs are UUIDs, which is what tells `n1-<uid>` apart from a node
/// named `n1-x`: the rest after `n1-` must be exactly one UUID.
pub fn provisioned_by_uid<'a>(annotation: &'a str, node: &str) -> Option<&'a str> {
    let uid = annotation.strip_prefix(PROVISIONER_PREFIX)?.strip_prefix(node)?.strip_prefix('-')?;
    is_uuid(uid).then_some(uid)
}

/// Whether `s` has the 8-4-4-4-12 hex shape of the UIDs the API server assigns.
pub fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Value of our node label. Label values are limited to 63 characters of a restricted set, while
/// node names may be 253; names that do not fit are shortened with a hash so two long names
/// never share a value.
pub fn node_label_value(node: &str) -> String {
    let valid = node.len() <= 63
        && node.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && node.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && node.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if valid {
        return node.to_string();
    }
    let keep: String = node.chars().filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.')).take(54).collect();
    let keep = keep.trim_end_matches(['-', '.']);
    format!("{keep}-{:08x}", fnv1a32(&[node.as_bytes()])).trim_start_matches(['-', '.']).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_pv_name_matches_upstream() {
        assert_eq!(pv_name("mount1", "test-node", "sc1"), "local-pv-aaaafef5");
    }

    #[test]
    fn fnv_reference_vectors() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a32(&[b""]), 0x811c9dc5);
        assert_eq!(fnv1a32(&[b"a"]), 0xe40c292c);
        assert_eq!(fnv1a32(&[b"foobar"]), 0xbf9cf968);
        assert_eq!(fnv1a32(&[b"foo", b"bar"]), 0xbf9cf968);
    }

    #[test]
    fn names_are_unpadded_hex_and_depend_on_every_part() {
        let a = pv_name("ssd1", "node-a", "fast");
        assert!(a.starts_with("local-pv-"));
        let hex = &a["local-pv-".len()..];
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert!(!hex.starts_with('0'));
        assert_ne!(a, pv_name("ssd2", "node-a", "fast"));
        assert_ne!(a, pv_name("ssd1", "node-b", "fast"));
        assert_ne!(a, pv_name("ssd1", "node-a", "slow"));
        // The hash has no separator, exactly like upstream: these two collide by design.
        assert_eq!(pv_name("ab", "c", "d"), pv_name("a", "bc", "d"));
    }

    #[test]
    fn provisioner_names() {
        assert_eq!(provisioner_name("n1", "uid-1", false), "local-volume-provisioner-n1-uid-1");
        assert_eq!(provisioner_name("n1", "uid-1", true), "local-volume-provisioner-n1");
    }

    #[test]
    fn ownership_rules() {
        let p = "local-volume-provisioner-n1-u1";
        assert!(is_provisioned_for_node(Some(p), None, "n1", p, false));
        assert!(!is_provisioned_for_node(None, None, "n1", p, false));
        assert!(!is_provisioned_for_node(Some("local-volume-provisioner-n1-u0"), None, "n1", p, false));
        let short = "local-volume-provisioner-n1";
        assert!(is_provisioned_for_node(Some(short), None, "n1", short, true));
        // Old UID-style PVs are adopted in node-name-only mode when the hostname label agrees.
        assert!(is_provisioned_for_node(Some(p), Some("n1"), "n1", short, true));
        assert!(!is_provisioned_for_node(Some(p), None, "n1", short, true));
        assert!(!is_provisioned_for_node(Some(p), Some("n2"), "n1", short, true));
        // A node whose name is a prefix of another's does not adopt its PVs.
        assert!(!is_provisioned_for_node(Some("local-volume-provisioner-n10-u1"), Some("n1"), "n1", short, true));
    }

    #[test]
    fn uids_of_earlier_incarnations() {
        let uid = "0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e0";
        let ann = format!("local-volume-provisioner-n1-{uid}");
        assert_eq!(provisioned_by_uid(&ann, "n1"), Some(uid));
        // A node whose name extends ours is not an earlier us.
        assert_eq!(provisioned_by_uid(&format!("local-volume-provisioner-n1-x-{uid}"), "n1"), None);
        assert_eq!(provisioned_by_uid(&ann, "n1-x"), None);
        assert_eq!(provisioned_by_uid(&ann, "n"), None);
        // Node-name-only values carry no UID.
        assert_eq!(provisioned_by_uid("local-volume-provisioner-n1", "n1"), None);
        assert_eq!(provisioned_by_uid(&format!("other-provisioner-n1-{uid}"), "n1"), None);
        assert!(is_uuid(uid));
        assert!(!is_uuid("0f0e1d2c-3b4a-5968-7786-95a4b3c2d1e"));
        assert!(!is_uuid("0f0e1d2c_3b4a-5968-7786-95a4b3c2d1e0"));
        assert!(!is_uuid("0f0e1d2c-3b4a-5968-7786-95a4b3c2d1eg"));
    }

    #[test]
    fn node_label_values_are_valid_and_distinct() {
        assert_eq!(node_label_value("worker-1.example.com"), "worker-1.example.com");
        let long_a = format!("{}.a", "x".repeat(70));
        let long_b = format!("{}.b", "x".repeat(70));
        for v in [node_label_value(&long_a), node_label_value(&long_b)] {
            assert!(v.len() <= 63, "{v}");
            assert!(v.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
            assert!(v.as_bytes()[0].is_ascii_alphanumeric());
        }
        assert_ne!(node_label_value(&long_a), node_label_value(&long_b));
    }
}
