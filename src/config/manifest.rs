//! The config read from a ConfigMap manifest, the form operators keep in git, so that
//! `validate-config -f` checks exactly what will be applied. A file may hold several documents
//! (a whole rendered chart) or a v1 List: other kinds are ignored, and the ConfigMap used must
//! be the only one, or the only one whose data has provisioner keys.

use serde_json::Value;

use super::load::{TOP_KEYS, kind};
use super::{ConfigError, LoadedConfig, parse_entries};

/// Why no config could be taken from a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file is not YAML.
    #[error("{source_name}: not valid YAML: {message}")]
    NotYaml { source_name: String, message: String },
    /// A document is not a Kubernetes object (no `kind`), e.g. a Helm values file.
    #[error(
        "{source_name}: document {document} is not a Kubernetes object (it has no kind); give a ConfigMap manifest, or use --config-dir for a directory of key files"
    )]
    NotAnObject { source_name: String, document: usize },
    /// No ConfigMap among the objects.
    #[error("{source_name}: no ConfigMap in it (found: {})", if found.is_empty() { "nothing".to_string() } else { found.join(", ") })]
    NoConfigMap { source_name: String, found: Vec<String> },
    /// Several ConfigMaps could be the provisioner's.
    #[error(
        "{source_name}: several ConfigMaps could hold the provisioner config ({}); keep only the provisioner's in the file",
        names.join(", ")
    )]
    SeveralConfigMaps { source_name: String, names: Vec<String> },
    /// The ConfigMap has binaryData, which the provisioner's config cannot be.
    #[error(
        "{source_name}: ConfigMap {name} has binaryData ({}); the provisioner reads its config as text, put it under data",
        keys.join(", ")
    )]
    BinaryData { source_name: String, name: String, keys: Vec<String> },
    /// A data value is not a string (the API server would refuse the ConfigMap).
    #[error("{source_name}: ConfigMap {name}: data.{key} must be a string (a block scalar `|` for YAML), got {got}")]
    NotAString { source_name: String, name: String, key: String, got: &'static str },
    /// The ConfigMap's `data` is not a map.
    #[error("{source_name}: ConfigMap {name}: data must be a map of keys to strings")]
    DataNotAMap { source_name: String, name: String },
    /// The config in the ConfigMap was read and refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Reads the provisioner config from the ConfigMap in `text` (a manifest file's content;
/// `source_name` names it in messages).
pub fn load_manifest(source_name: &str, text: &str) -> Result<LoadedConfig, ManifestError> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| ManifestError::NotYaml {
        source_name: source_name.to_string(),
        message: super::yaml_error::describe(&e),
    })?;
    let mut objects = Vec::new();
    for (i, doc) in documents.into_iter().enumerate() {
        if doc.is_null() {
            continue;
        }
        let not_object = || ManifestError::NotAnObject { source_name: source_name.to_string(), document: i + 1 };
        let kind = doc.get("kind").and_then(Value::as_str).ok_or_else(not_object)?;
        if kind == "List" {
            for item in doc.get("items").and_then(Value::as_array).into_iter().flatten() {
                item.get("kind").and_then(Value::as_str).ok_or_else(not_object)?;
                objects.push(item.clone());
            }
        } else {
            objects.push(doc);
        }
    }
    let config_maps: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "ConfigMap").collect();
    let chosen = match config_maps.as_slice() {
        [] => {
            let found = objects.iter().map(|o| format!("{} {}", kind_of(o), name_of(o))).collect();
            return Err(ManifestError::NoConfigMap { source_name: source_name.to_string(), found });
        }
        [only] => *only,
        several => {
            let with_keys: Vec<&Value> = several.iter().copied().filter(|cm| has_provisioner_keys(cm)).collect();
            match with_keys.as_slice() {
                [only] => *only,
                [] => {
                    let names = several.iter().map(|cm| name_of(cm)).collect();
                    return Err(ManifestError::SeveralConfigMaps { source_name: source_name.to_string(), names });
                }
                many => {
                    let names = many.iter().map(|cm| name_of(cm)).collect();
                    return Err(ManifestError::SeveralConfigMaps { source_name: source_name.to_string(), names });
                }
            }
        }
    };
    let name = name_of(chosen);
    if let Some(binary) = chosen.get("binaryData").and_then(Value::as_object)
        && !binary.is_empty()
    {
        let keys = binary.keys().cloned().collect();
        return Err(ManifestError::BinaryData { source_name: source_name.to_string(), name, keys });
    }
    let mut entries = Vec::new();
    match chosen.get("data") {
        None | Some(Value::Null) => {}
        Some(Value::Object(data)) => {
            for (key, value) in data {
                let Some(text) = value.as_str() else {
                    return Err(ManifestError::NotAString {
                        source_name: source_name.to_string(),
                        name,
                        key: key.clone(),
                        got: kind(value),
                    });
                };
                entries.push((key.clone(), text.to_string()));
            }
        }
        Some(_) => return Err(ManifestError::DataNotAMap { source_name: source_name.to_string(), name }),
    }
    entries.sort();
    Ok(parse_entries(&format!("{source_name} (ConfigMap {name})"), &entries)?)
}

/// Whether a ConfigMap's data has any key the provisioner reads (in any case, as matched).
fn has_provisioner_keys(cm: &Value) -> bool {
    cm.get("data")
        .and_then(Value::as_object)
        .is_some_and(|data| data.keys().any(|k| TOP_KEYS.iter().any(|t| t.eq_ignore_ascii_case(k.trim()))))
}

/// `namespace/name`, or `name`, or `(unnamed)`.
fn name_of(o: &Value) -> String {
    let meta = &o["metadata"];
    match (meta["namespace"].as_str(), meta["name"].as_str()) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name.to_string(),
        _ => "(unnamed)".to_string(),
    }
}

fn kind_of(o: &Value) -> &str {
    o["kind"].as_str().unwrap_or("?")
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
