//! "Did you mean": the known key an unknown one is most likely a misspelling of. Upstream
//! ignores unknown keys silently, so `namePatern: "nvme*"` publishes every entry and
//! `storageClasMap` publishes nothing; a key this close to a real one is treated as that
//! mistake (an error), while a key unlike any (a note, a future upstream key) stays a warning.

/// The known key `key` is a likely misspelling of: the closest by edit distance (ignoring
/// case, a swap of two neighbouring letters counting as one edit), within the distance
/// [`tolerance`] allows for that key's length, and only when no other key is as close.
pub(crate) fn likely_key<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let key = key.trim().to_ascii_lowercase();
    if key.is_empty() {
        return None;
    }
    let mut best: Option<(usize, &'a str)> = None;
    let mut tied = false;
    for candidate in known {
        let distance = edit_distance(&key, &candidate.to_ascii_lowercase());
        if distance == 0 {
            // A known key in another case is no misspelling of any other.
            return None;
        }
        if distance > tolerance(candidate.len()) {
            continue;
        }
        match best {
            Some((d, _)) if distance > d => {}
            Some((d, _)) if distance == d => tied = true,
            _ => {
                best = Some((distance, candidate));
                tied = false;
            }
        }
    }
    best.filter(|_| !tied).map(|(_, k)| k)
}

/// Edits a misspelling of a key of `len` letters may hold: one for short keys (`types`,
/// `fsType`), two up to 12 letters (`namePattern`), three for longer ones (`storageClassMap`).
fn tolerance(len: usize) -> usize {
    match len {
        0..=6 => 1,
        7..=12 => 2,
        _ => 3,
    }
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of two
/// neighbouring characters, each one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for (i, row) in d.chunks_mut(width).enumerate() {
        row[0] = i;
    }
    for (j, cell) in d.iter_mut().take(width).enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best =
                (d[(i - 1) * width + j] + 1).min(d[i * width + j - 1] + 1).min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    // The keys the parser knows, so the suggestions are tested against the real lists.
    use crate::config::load::{CLASS_KEYS as CLASS, DEVICE_KEYS, TOP_KEYS as TOP};

    #[test]
    fn misspellings_find_their_key() {
        let cases = [
            ("namePatern", "namePattern"),
            ("namepattren", "namePattern"),
            ("name_pattern", "namePattern"),
            ("hostdr", "hostDir"),
            ("hostDirs", "hostDir"),
            ("volumMode", "volumeMode"),
            ("voluemMode", "volumeMode"),
            ("fstype_", "fsType"),
            ("fsTyp", "fsType"),
            ("selecter", "selector"),
            ("device", "devices"),
            ("blockCleanerComand", "blockCleanerCommand"),
            ("accesMode", "accessMode"),
        ];
        for (typo, key) in cases {
            assert_eq!(likely_key(typo, &CLASS), Some(key), "{typo}");
        }
        let cases = [
            ("storageClasMap", "storageClassMap"),
            ("storageclassmaps", "storageClassMap"),
            ("storageClassesMap", "storageClassMap"),
            ("nodeLabelForPV", "nodeLabelsForPV"),
            ("labelForPV", "labelsForPV"),
            ("minResyncPeriode", "minResyncPeriod"),
            ("useNodeNameOnyl", "useNodeNameOnly"),
            ("setPvOwnerRefs", "setPVOwnerRef"),
        ];
        for (typo, key) in cases {
            assert_eq!(likely_key(typo, &TOP), Some(key), "{typo}");
        }
    }

    #[test]
    fn keys_unlike_any_get_no_suggestion() {
        for key in ["reclaimPolicy", "notes", "someFutureKey", "x", "", "storageClass", "capacity", "path"] {
            assert_eq!(likely_key(key, &CLASS), None, "{key}");
        }
        for key in ["notes", "someFutureKey", "jobContainerImage", "provisioner"] {
            assert_eq!(likely_key(key, &TOP), None, "{key}");
        }
    }

    #[test]
    fn a_known_key_in_any_case_is_not_a_misspelling() {
        for known in [&CLASS[..], &TOP[..], &DEVICE_KEYS[..]] {
            for key in known {
                assert_eq!(likely_key(key, known), None, "{key}");
                assert_eq!(likely_key(&key.to_uppercase(), known), None, "{key}");
            }
        }
        // maxSize is two edits from minSize, but it is a key itself.
        assert_eq!(likely_key("maxsize", &DEVICE_KEYS), None);
    }

    #[test]
    fn device_filter_misspellings_find_their_key() {
        for (typo, key) in [("minSise", "minSize"), ("maxSiz", "maxSize"), ("exlude", "exclude"), ("verfy", "verify")] {
            assert_eq!(likely_key(typo, &DEVICE_KEYS), Some(key), "{typo}");
        }
    }

    #[test]
    fn a_key_as_close_to_two_known_ones_gets_no_suggestion() {
        assert_eq!(likely_key("ab", &["aa", "bb"]), None);
        assert_eq!(likely_key("abc", &["abd", "abe"]), None);
        assert_eq!(likely_key("abc", &["abd", "xyz"]), Some("abd"));
    }

    #[test]
    fn edit_distance_counts_each_kind_of_edit_once() {
        let cases = [
            ("", "", 0),
            ("a", "", 1),
            ("", "abc", 3),
            ("abc", "abc", 0),
            ("abc", "abd", 1),
            ("abc", "ab", 1),
            ("abc", "abcd", 1),
            ("abc", "acb", 1),
            ("ca", "abc", 3),
            ("kitten", "sitting", 3),
        ];
        for (a, b, d) in cases {
            assert_eq!(edit_distance(a, b), d, "{a} {b}");
            assert_eq!(edit_distance(b, a), d, "{b} {a}");
        }
    }
}
