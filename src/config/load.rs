//! Reading the ConfigMap directory and turning its YAML into a typed config. Matching is
//! lenient the way upstream's is (case-insensitive keys, YAML 1.1 booleans, booleans written
//! as strings) so every ConfigMap that upstream accepts is accepted here too.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::suggest::likely_key;
use super::upstream_yaml::{Conversion, upstream_labels};
use super::{
    BlockCleanMethod, ClassConfig, ConfigError, DEFAULT_BLOCK_CLEANER, DeviceSelector, DeviceType, LoadedConfig,
    Problem, ProvisionerConfig, Verify, VolumeMode, parse_quantity, validate,
};
use crate::core::config::go_duration::parse_go_duration;
use crate::core::config::pattern::NamePattern;
use crate::core::wipe::volume_root::ConfiguredRoot;

/// Reads every key file of a mounted ConfigMap (skipping kubelet's `..data` machinery and
/// directories), then parses and validates it.
pub fn load_dir(dir: &Path) -> Result<LoadedConfig, ConfigError> {
    let entries = read_entries(dir)?;
    parse_entries(&source_name(dir), &entries)
}

/// How errors name a config directory.
pub(super) fn source_name(dir: &Path) -> String {
    dir.display().to_string()
}

/// Whether a directory entry may be a ConfigMap key: kubelet's own entries (`..data`, the
/// timestamped directories, `..data_tmp`) start with `..`. Shared with the change detector
/// so that it watches exactly what is read here.
pub(super) fn is_key_name(name: &str) -> bool {
    !name.starts_with("..")
}

/// The (key, content) pairs of every key file, sorted by key: the whole input of
/// [`parse_entries`].
pub(super) fn read_entries(dir: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let read_err = |source| ConfigError::Read { path: dir.to_path_buf(), source };
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_err)? {
        let entry = entry.map_err(read_err)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !is_key_name(name) {
            continue;
        }
        let path = entry.path();
        // Keys are symlinks into ..data; follow them, and ignore anything that is not a file.
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => {}
            Ok(_) => continue,
            Err(source) => return Err(ConfigError::Read { path, source }),
        }
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
        entries.push((name.to_string(), text));
    }
    entries.sort();
    Ok(entries)
}

/// Parses ConfigMap entries (key, file content) into a validated config. `source_name` is
/// only used in error messages. A problem of a top-level key refuses the whole config (every
/// problem, of classes too, is listed so one edit fixes all); a problem of one class only
/// leaves that class out: it is listed in [`LoadedConfig::failed_classes`] and the other
/// classes are used.
pub fn parse_entries(source_name: &str, entries: &[(String, String)]) -> Result<LoadedConfig, ConfigError> {
    let mut p = Parser::default();
    let mut config = p.top_level(entries);
    let findings = validate(&config);
    p.problems.extend(findings.global);
    for (class, problems) in findings.classes {
        p.class_problems.entry(class).or_default().extend(problems);
    }
    if !p.problems.is_empty() {
        let mut problems = p.problems;
        problems.extend(p.class_problems.into_values().flatten());
        return Err(ConfigError::Invalid { source_name: source_name.to_string(), problems, warnings: p.warnings });
    }
    for class in p.class_problems.keys() {
        config.storage_class_map.remove(class);
    }
    Ok(LoadedConfig { config, warnings: p.warnings, failed_classes: p.class_problems, unknown_keys: p.unknown })
}

pub(super) const TOP_KEYS: [&str; 11] = [
    "storageClassMap",
    "nodeLabelsForPV",
    "labelsForPV",
    "useAlphaAPI",
    "useJobForCleaning",
    "jobTolerations",
    "minResyncPeriod",
    "useNodeNameOnly",
    "setPVOwnerRef",
    "removeNodeNotReadyTaint",
    "provisionerNotReadyNodeTaintKey",
];

/// Keys of a class's `devices` section.
pub(super) const DEVICE_KEYS: [&str; 9] =
    ["types", "minSize", "maxSize", "rotational", "models", "vendors", "exclude", "maxPerNode", "verify"];

pub(super) const CLASS_KEYS: [&str; 13] = [
    "hostDir",
    "mountDir",
    "blockCleanerCommand",
    "blockCleanMethod",
    "volumeMode",
    "accessMode",
    "fsType",
    "namePattern",
    "selector",
    "devices",
    "rootMode",
    "rootOwner",
    "encryption",
];

#[derive(Default)]
struct Parser {
    /// Problems of top-level keys.
    problems: Vec<Problem>,
    /// Problems met while reading one class, by class.
    class_problems: BTreeMap<String, Vec<Problem>>,
    warnings: Vec<String>,
    /// Where every unknown key was met (`storageClassMap.fast.namePatern`), for `--strict`.
    unknown: Vec<String>,
}

impl Parser {
    fn problem(&mut self, location: &str, message: impl Into<String>) {
        self.problems.push(Problem { location: location.to_string(), message: message.into() });
    }

    /// An unknown key at `loc` (None: the top level, a ConfigMap key). A likely misspelling
    /// of a known key is a problem: upstream would ignore it silently, which widens what is
    /// published (`namePatern`) or empties it (`storageClasMap`); it fails its class, or the
    /// whole config at the top level, so the last good one stays in use. Any other unknown
    /// key is a warning (a note, a key of a newer upstream), and an error only for
    /// `validate-config --strict`.
    fn unknown_key(&mut self, loc: Option<&str>, key: &str, known: &[&'static str]) {
        let at = loc.map_or_else(|| key.to_string(), |l| format!("{l}.{key}"));
        self.unknown.push(at.clone());
        match likely_key(key, known) {
            Some(meant) => self.problem(
                &at,
                format!(
                    "unknown key {key:?}: did you mean {meant:?}? Upstream would ignore it, which changes what is \
                     published; fix the key (or remove it)"
                ),
            ),
            None => {
                let place = loc.map_or_else(|| "unknown config key".to_string(), |l| format!("{l}: unknown key"));
                self.warnings.push(format!("{place} {key:?} ignored (known keys: {})", known.join(", ")));
            }
        }
    }

    fn top_level(&mut self, entries: &[(String, String)]) -> ProvisionerConfig {
        let mut cfg = ProvisionerConfig::default();
        for (key, text) in entries {
            let Some(canonical) = canonical_key(key, &TOP_KEYS) else {
                self.unknown_key(None, key, &TOP_KEYS);
                continue;
            };
            if canonical == "labelsForPV" {
                // Read as upstream reads it, scalar by scalar (see upstream_yaml).
                cfg.labels_for_pv = self.labels_for_pv(text);
                continue;
            }
            let value = match serde_saphyr::from_str::<Value>(text) {
                Ok(v) => v,
                Err(e) => {
                    self.problem(canonical, format!("not valid YAML: {}", super::yaml_error::describe(&e)));
                    continue;
                }
            };
            let loc = canonical;
            match canonical {
                "storageClassMap" => cfg.storage_class_map = self.class_map(&value),
                "nodeLabelsForPV" => cfg.node_labels_for_pv = self.string_list(&value, loc).unwrap_or_default(),
                "useAlphaAPI" => cfg.use_alpha_api = self.boolean(&value, loc),
                "useJobForCleaning" => cfg.use_job_for_cleaning = self.boolean(&value, loc),
                "useNodeNameOnly" => cfg.use_node_name_only = self.boolean(&value, loc),
                "setPVOwnerRef" => cfg.set_pv_owner_ref = self.boolean(&value, loc),
                "removeNodeNotReadyTaint" => cfg.remove_node_not_ready_taint = self.boolean(&value, loc),
                "provisionerNotReadyNodeTaintKey" => {
                    cfg.provisioner_not_ready_node_taint_key = self.string(&value, loc).unwrap_or_default()
                }
                "jobTolerations" => {
                    cfg.job_tolerations = self.k8s_list(&value, loc, "a list of Tolerations").unwrap_or_default()
                }
                "minResyncPeriod" => {
                    if let Some(s) = self.string(&value, loc) {
                        match parse_go_duration(&s) {
                            Ok(d) => cfg.min_resync_period = d,
                            Err(e) => self.problem(loc, format!("{e} (expected a Go duration such as 5m0s)")),
                        }
                    }
                }
                _ => unreachable_key(canonical),
            }
        }
        cfg
    }

    fn class_map(&mut self, value: &Value) -> BTreeMap<String, ClassConfig> {
        let mut out = BTreeMap::new();
        match value {
            Value::Null => {}
            Value::Object(map) => {
                for (class, spec) in map {
                    let loc = format!("storageClassMap.{class}");
                    // Whatever goes wrong while reading this class is this class's problem.
                    let before = self.problems.len();
                    let parsed = self.class(spec, &loc);
                    let own: Vec<Problem> = self.problems.drain(before..).collect();
                    if !own.is_empty() {
                        self.class_problems.entry(class.clone()).or_default().extend(own);
                    }
                    if let Some(c) = parsed {
                        out.insert(class.clone(), c);
                    }
                }
            }
            other => self
                .problem("storageClassMap", format!("expected a map of class name to settings, got {}", kind(other))),
        }
        out
    }

    fn class(&mut self, value: &Value, loc: &str) -> Option<ClassConfig> {
        let Value::Object(map) = value else {
            self.problem(loc, format!("expected a map of settings, got {}", kind(value)));
            return None;
        };
        let mut fields: BTreeMap<&'static str, &Value> = BTreeMap::new();
        for (key, v) in map {
            match canonical_key(key, &CLASS_KEYS) {
                Some(k) => {
                    fields.insert(k, v);
                }
                None => self.unknown_key(Some(loc), key, &CLASS_KEYS),
            }
        }
        let field_str = |p: &mut Self, name: &str| -> Option<String> {
            fields.get(name).and_then(|v| p.string(v, &format!("{loc}.{name}")))
        };
        let host_dir = field_str(self, "hostDir");
        let mount_dir = field_str(self, "mountDir");
        let volume_mode = match field_str(self, "volumeMode").as_deref() {
            None | Some("") | Some("Filesystem") => VolumeMode::Filesystem,
            Some("Block") => VolumeMode::Block,
            Some(other) => {
                self.problem(
                    &format!("{loc}.volumeMode"),
                    format!("{other:?} is not a volume mode (use Filesystem or Block)"),
                );
                VolumeMode::Filesystem
            }
        };
        let access_mode =
            field_str(self, "accessMode").filter(|s| !s.is_empty()).unwrap_or_else(|| "ReadWriteOnce".into());
        let fs_type = field_str(self, "fsType").filter(|s| !s.is_empty());
        let name_pattern = field_str(self, "namePattern").filter(|s| !s.is_empty()).unwrap_or_else(|| "*".into());
        let block_cleaner_command = match fields.get("blockCleanerCommand") {
            None | Some(Value::Null) => vec![DEFAULT_BLOCK_CLEANER.to_string()],
            Some(v) => {
                let l = format!("{loc}.blockCleanerCommand");
                match self.string_list(v, &l) {
                    Some(list) if list.is_empty() => {
                        self.problem(&l, "is an empty list; leave it out to use the default or name a command");
                        Vec::new()
                    }
                    Some(list) => list,
                    None => Vec::new(),
                }
            }
        };
        let block_clean_method = match field_str(self, "blockCleanMethod").as_deref() {
            None | Some("") => None,
            Some(m) => match BlockCleanMethod::parse(m) {
                Some(m) if fields.contains_key("blockCleanerCommand") => {
                    self.problem(
                        &format!("{loc}.blockCleanMethod"),
                        "is set together with blockCleanerCommand; choose one",
                    );
                    Some(m)
                }
                Some(m) => Some(m),
                None => {
                    self.problem(
                        &format!("{loc}.blockCleanMethod"),
                        format!("{m:?} is not a block clean method (use quick, discard or zero)"),
                    );
                    None
                }
            },
        };
        let selector = match fields.get("selector") {
            Some(v) => self.k8s_list(v, &format!("{loc}.selector"), "a list of NodeSelectorTerms").unwrap_or_default(),
            None => Vec::new(),
        };
        let devices = fields.get("devices").and_then(|v| self.devices(v, &format!("{loc}.devices")));
        // Quoted only: YAML reads 0775 unquoted as decimal 775 or octal 509 depending on its
        // version, and a wrong mode on every wiped root is not a guess to make.
        let quoted = |p: &mut Self, key: &str| match fields.get(key) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                p.problem(&format!("{loc}.{key}"), "must be a quoted string (e.g. \"0775\", \"1000:1000\")");
                None
            }
        };
        let root_mode = quoted(self, "rootMode")
            .and_then(|t| ConfiguredRoot::parse_mode(&t).map_err(|e| self.problem(&format!("{loc}.rootMode"), e)).ok());
        let root_owner = quoted(self, "rootOwner").and_then(|t| {
            ConfiguredRoot::parse_owner(&t).map_err(|e| self.problem(&format!("{loc}.rootOwner"), e)).ok()
        });
        if (root_mode.is_some() || root_owner.is_some()) && volume_mode == VolumeMode::Block {
            self.problem(
                &format!("{loc}.rootMode"),
                "rootMode and rootOwner are for Filesystem classes (a Block volume has no root directory)",
            );
        }
        let encryption = match field_str(self, "encryption") {
            None => None,
            Some(s) => crate::core::volumes::encryption::Encryption::parse(&s)
                .map_err(|e| self.problem(&format!("{loc}.encryption"), e))
                .ok()
                .flatten(),
        };
        if encryption.is_some() && volume_mode == VolumeMode::Block {
            self.problem(
                &format!("{loc}.encryption"),
                "is for Filesystem classes: a Block volume is handed to the pod as a device, with no directory to encrypt",
            );
        }
        if encryption.is_some() && devices.is_some() {
            self.problem(
                &format!("{loc}.encryption"),
                "cannot be set with devices: claimed devices are raw block devices, and encryption needs a mounted filesystem (docs/encryption.md)",
            );
        }
        Some(ClassConfig {
            host_dir: host_dir.unwrap_or_default(),
            mount_dir: mount_dir.unwrap_or_default(),
            block_cleaner_command,
            block_clean_method,
            volume_mode,
            access_mode,
            fs_type,
            name_pattern,
            selector,
            devices,
            root_mode,
            root_owner,
            encryption,
        })
    }

    /// Accepts YAML booleans (1.1 spellings included) and the same words written as strings,
    /// because the upstream Helm chart renders `"yes"` and `"true"`.
    fn boolean(&mut self, value: &Value, loc: &str) -> bool {
        match value {
            Value::Bool(b) => *b,
            Value::Null => false,
            Value::String(s) => match parse_yaml11_bool(s) {
                Some(b) => b,
                None => {
                    self.problem(loc, format!("{s:?} is not a boolean (use true/false, yes/no or on/off)"));
                    false
                }
            },
            other => {
                self.problem(loc, format!("expected a boolean, got {}", kind(other)));
                false
            }
        }
    }

    fn string(&mut self, value: &Value, loc: &str) -> Option<String> {
        match value {
            Value::String(s) => Some(s.trim().to_string()),
            Value::Number(n) => Some(n.to_string()),
            Value::Null => None,
            other => {
                self.problem(loc, format!("expected a string, got {} (quote the value)", kind(other)));
                None
            }
        }
    }

    fn string_list(&mut self, value: &Value, loc: &str) -> Option<Vec<String>> {
        match value {
            Value::Null => Some(Vec::new()),
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    out.push(self.string(item, &format!("{loc}[{i}]"))?);
                }
                Some(out)
            }
            other => {
                self.problem(loc, format!("expected a list of strings, got {}", kind(other)));
                None
            }
        }
    }

    /// `labelsForPV` with upstream's meaning for unquoted values (`tier : 1.10` is the label
    /// value "1.1"), and a warning for each label that was not read as the text written.
    fn labels_for_pv(&mut self, text: &str) -> BTreeMap<String, String> {
        match upstream_labels(text) {
            Ok((labels, conversions)) => {
                for c in conversions {
                    if let Some(w) = conversion_warning(&c) {
                        self.warnings.push(w);
                    }
                }
                labels
            }
            Err(e) => {
                self.problem("labelsForPV", e);
                BTreeMap::new()
            }
        }
    }

    /// Reads a class's `devices` section (see config::devices). A problem fails only its class.
    fn devices(&mut self, value: &Value, loc: &str) -> Option<DeviceSelector> {
        let map = match value {
            // `devices:` with nothing under it: every clean whole disk.
            Value::Null => return Some(DeviceSelector::default()),
            Value::Object(map) => map,
            other => {
                self.problem(loc, format!("expected a map of device filters, got {}", kind(other)));
                return None;
            }
        };
        let mut selector = DeviceSelector::default();
        let mut fields: BTreeMap<&'static str, &Value> = BTreeMap::new();
        for (key, v) in map {
            match canonical_key(key, &DEVICE_KEYS) {
                Some(k) => {
                    fields.insert(k, v);
                }
                None => {
                    let hint =
                        likely_key(key, &DEVICE_KEYS).map(|k| format!("did you mean {k:?}? ")).unwrap_or_default();
                    self.unknown.push(format!("{loc}.{key}"));
                    self.problem(
                        loc,
                        format!(
                            "unknown key {key:?}: {hint}a typo here could claim the wrong disks (known keys: {})",
                            DEVICE_KEYS.join(", ")
                        ),
                    )
                }
            }
        }
        if let Some(v) = fields.get("types") {
            let l = format!("{loc}.types");
            let list = self.string_list(v, &l).unwrap_or_default();
            if list.is_empty() {
                self.problem(&l, "is empty; leave it out for [disk] or name disk, partition, multipath or loop");
            }
            let mut types = Vec::new();
            for t in &list {
                match DeviceType::parse(t) {
                    Some(t) if !types.contains(&t) => types.push(t),
                    Some(_) => {}
                    None => {
                        self.problem(&l, format!("{t:?} is not a device type (use disk, partition, multipath or loop)"))
                    }
                }
            }
            types.sort();
            selector.types = types;
        }
        let mut sizes = [None, None];
        for (i, key) in ["minSize", "maxSize"].into_iter().enumerate() {
            let l = format!("{loc}.{key}");
            if let Some(text) = fields.get(key).and_then(|v| self.string(v, &l)) {
                match parse_quantity(&text) {
                    Ok(bytes) => sizes[i] = Some(bytes),
                    Err(e) => self.problem(&l, e),
                }
            }
        }
        [selector.min_size, selector.max_size] = sizes;
        if let (Some(min), Some(max)) = (selector.min_size, selector.max_size)
            && min > max
        {
            self.problem(
                &format!("{loc}.minSize"),
                format!("{min} bytes is more than maxSize ({max} bytes): nothing could match"),
            );
        }
        if let Some(v) = fields.get("rotational").filter(|v| !v.is_null()) {
            selector.rotational = Some(self.boolean(v, &format!("{loc}.rotational")));
        }
        let mut lists: [Vec<String>; 3] = Default::default();
        for (i, key) in ["models", "vendors", "exclude"].into_iter().enumerate() {
            let l = format!("{loc}.{key}");
            let Some(list) = fields.get(key).and_then(|v| self.string_list(v, &l)) else { continue };
            for (j, glob) in list.iter().enumerate() {
                if let Err(e) = NamePattern::parse(glob) {
                    self.problem(&format!("{l}[{j}]"), format!("bad glob: {e}"));
                }
            }
            lists[i] = list;
        }
        [selector.models, selector.vendors, selector.exclude] = lists;
        if let Some(v) = fields.get("maxPerNode").filter(|v| !v.is_null()) {
            let l = format!("{loc}.maxPerNode");
            match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(0) => self.problem(&l, "is 0: no device could be claimed (remove the devices section instead)"),
                Some(n) => selector.max_per_node = Some(n),
                None => self.problem(&l, format!("expected a positive whole number, got {}", kind(v))),
            }
        }
        if let Some(text) =
            fields.get("verify").filter(|v| !v.is_null()).and_then(|v| self.string(v, &format!("{loc}.verify")))
        {
            match Verify::parse(&text) {
                Some(v) => selector.verify = v,
                None => self.problem(
                    &format!("{loc}.verify"),
                    format!("{text:?} is not a verify mode (use sample, the default, or full: read every byte before the first claim)"),
                ),
            }
        }
        Some(selector)
    }

    fn k8s_list<T: serde::de::DeserializeOwned>(&mut self, value: &Value, loc: &str, what: &str) -> Option<Vec<T>> {
        if value.is_null() {
            return Some(Vec::new());
        }
        match serde_json::from_value(value.clone()) {
            Ok(v) => Some(v),
            Err(e) => {
                self.problem(loc, format!("expected {what}: {e}"));
                None
            }
        }
    }
}

/// Matches a key case-insensitively against the known spellings, as Go's encoding/json does
/// for upstream.
fn canonical_key(key: &str, known: &[&'static str]) -> Option<&'static str> {
    let key = key.trim();
    known.iter().copied().find(|k| k.eq_ignore_ascii_case(key))
}

/// YAML 1.1 boolean words, in any case.
pub(crate) fn parse_yaml11_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "y" | "on" => Some(true),
        "false" | "no" | "n" | "off" => Some(false),
        _ => None,
    }
}

/// What a YAML value is, in words, for error messages ("a list", "a number"...).
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

fn unreachable_key(key: &str) {
    // TOP_KEYS and the match above list the same keys; a key missing from the match is a
    // programming error that tests catch, not something to crash a node agent over.
    debug_assert!(false, "config key {key} has no handler");
}

/// The warning for a label upstream's YAML parser does not read as the text written; None for
/// an empty value, which is plainly the empty string.
fn conversion_warning(c: &Conversion) -> Option<String> {
    if c.written.is_empty() {
        return None;
    }
    let (what, location) =
        if c.is_key { ("key", "labelsForPV".to_string()) } else { ("value", format!("labelsForPV.{}", c.key)) };
    Some(if c.result == c.written {
        format!(
            "{location}: the unquoted {} {} is read as the label {what} {:?}, as upstream reads it; quote it to make that explicit",
            c.kind, c.written, c.result
        )
    } else {
        format!(
            "{location}: the unquoted {} {} is read as the label {what} {:?}, as upstream reads it, not {:?}; quote it if you meant {:?}",
            c.kind, c.written, c.result, c.written, c.written
        )
    })
}
