//! Typed metadata patches for our PVs: which annotations to set or remove, which labels and
//! finalizers to add, so callers never build raw JSON or repeat annotation keys by hand.

use std::collections::BTreeMap;

use super::{ApiError, Cluster};

/// Annotations to set or remove on a PV, sent as one merge patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnnotationPatch {
    changes: BTreeMap<String, Option<String>>,
}

impl AnnotationPatch {
    /// No change yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`.
    pub fn set(mut self, key: &str, value: impl Into<String>) -> Self {
        self.changes.insert(key.to_string(), Some(value.into()));
        self
    }

    /// Removes `key` (nothing happens when it is not there).
    pub fn remove(mut self, key: &str) -> Self {
        self.changes.insert(key.to_string(), None);
        self
    }

    /// Sets `key` when `value` is given, removes it otherwise.
    pub fn set_or_remove(self, key: &str, value: Option<String>) -> Self {
        match value {
            Some(v) => self.set(key, v),
            None => self.remove(key),
        }
    }

    /// Whether nothing would change.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The `metadata.annotations` value of a merge patch: null removes a key.
    pub fn to_json(&self) -> serde_json::Value {
        self.changes.iter().map(|(k, v)| (k.clone(), serde_json::json!(v))).collect::<serde_json::Map<_, _>>().into()
    }
}

/// Our label, annotations and finalizer put on a PV we take over, in one patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TakeOver {
    /// Labels to set.
    pub labels: BTreeMap<String, String>,
    /// Annotations to set or remove.
    pub annotations: AnnotationPatch,
    /// The full finalizer list to write (a merge patch replaces lists), when it changes.
    pub finalizers: Option<Vec<String>>,
}

impl Cluster {
    /// Sets and removes annotations of a PV; with `resource_version`, only if the PV is
    /// unchanged since it was read (a concurrent change is never overwritten).
    pub async fn patch_annotations(
        &self,
        name: &str,
        resource_version: Option<&str>,
        patch: &AnnotationPatch,
    ) -> Result<(), ApiError> {
        self.patch_pv_metadata(name, resource_version, serde_json::json!({}), patch.to_json(), None).await
    }

    /// Sets labels of a PV; with `resource_version`, only if the PV is unchanged since it was
    /// read.
    pub async fn set_pv_labels(
        &self,
        name: &str,
        resource_version: Option<&str>,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        self.patch_pv_metadata(name, resource_version, serde_json::json!(labels), serde_json::json!({}), None).await
    }

    /// Applies a take-over patch, guarded by `resource_version` when given.
    pub async fn take_over_pv(
        &self,
        name: &str,
        resource_version: Option<&str>,
        patch: &TakeOver,
    ) -> Result<(), ApiError> {
        let labels = serde_json::json!(patch.labels);
        let annotations = patch.annotations.to_json();
        self.patch_pv_metadata(name, resource_version, labels, annotations, patch.finalizers.as_deref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_patches_set_and_remove_in_one_object() {
        let p = AnnotationPatch::new()
            .set("a", "1")
            .remove("b")
            .set_or_remove("c", None)
            .set_or_remove("d", Some("4".into()));
        assert_eq!(p.to_json(), serde_json::json!({ "a": "1", "b": null, "c": null, "d": "4" }));
        assert!(AnnotationPatch::new().is_empty());
        assert_eq!(
            AnnotationPatch::new().set("a", "1").remove("a").to_json(),
            serde_json::json!({ "a": null }),
            "the last word wins"
        );
    }
}
