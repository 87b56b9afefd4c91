//! Problems reported once per occurrence: a problem is reported when a pass first sees it and
//! forgotten when a pass no longer does, so one that comes back is reported again and memory
//! holds only the problems of now.

use std::collections::BTreeSet;

/// The problems of the last pass and of the pass under way, by key.
#[derive(Debug, Default)]
pub(crate) struct Occurrences {
    previous: BTreeSet<String>,
    current: BTreeSet<String>,
}

impl Occurrences {
    /// Starts a pass: what the last pass saw becomes what is already reported.
    pub(crate) fn begin_pass(&mut self) {
        self.previous = std::mem::take(&mut self.current);
    }

    /// Notes a problem seen in this pass; true when it is new (not seen in the last pass nor
    /// earlier in this one), i.e. when it should be reported.
    pub(crate) fn first_seen(&mut self, key: String) -> bool {
        let new = !self.previous.contains(&key) && !self.current.contains(&key);
        self.current.insert(key);
        new
    }

    /// Problems seen in the pass under way.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.current.len()
    }

    /// Whether the pass under way saw no problem.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.current.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reported_once_per_occurrence_and_again_when_it_comes_back() {
        let mut o = Occurrences::default();
        o.begin_pass();
        assert!(o.first_seen("a".into()));
        assert!(!o.first_seen("a".into()), "twice in one pass is one occurrence");
        o.begin_pass();
        assert!(!o.first_seen("a".into()), "still there: already reported");
        assert!(o.first_seen("b".into()));
        assert_eq!(o.len(), 2);
        o.begin_pass();
        assert!(!o.first_seen("a".into()));
        assert_eq!(o.len(), 1, "b is resolved");
        o.begin_pass();
        assert!(!o.first_seen("a".into()));
        assert!(o.first_seen("b".into()), "a problem that comes back is reported again");
        o.begin_pass();
        assert!(o.is_empty());
        o.begin_pass();
        assert!(o.first_seen("a".into()), "resolved problems are forgotten");
    }
}
