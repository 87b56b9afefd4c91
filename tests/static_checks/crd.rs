//! The LocalStorageNode CRD is generated from its Rust types (`core::cluster::inventory::crd`: kube's
//! `CustomResource` derive, the schema by schemars from the types and their doc comments), and
//! deploy/base/crd.yaml and the chart's crds/ must be what they generate: compared as parsed
//! YAML, so the files' layout and header comments are free.
//!
//! `LSP_UPDATE_CRD=1 cargo test --test static_checks crd::` writes both files from the types, each keeping its
//! header comment (the `#` lines it starts with). Change the types, not the files.

use std::path::{Path, PathBuf};

use local_static_provisioner::core::cluster::inventory::crd;
use serde_json::Value;

use crate::support;

/// The files that ship the CRD: the kustomize base and the chart's copy (tests/cluster/chart.rs also
/// keeps them identical).
const FILES: [&str; 2] = ["deploy/base/crd.yaml", "deploy/helm/local-static-provisioner/crds/localstoragenodes.yaml"];

/// How to bring the files back in line.
const REGENERATE: &str = "LSP_UPDATE_CRD=1 cargo test --test static_checks crd::";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Integral floats as integers (`minimum: 0`, not `0.0`: JSONSchemaProps holds them as f64),
/// so that a file says what a person would write and both sides compare alike.
fn integers(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => Value::Array(items.into_iter().map(integers).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, integers(v))).collect()),
        other => other,
    }
}

/// The CRD the types generate, as YAML.
fn generated() -> String {
    let value = integers(serde_json::to_value(crd()).expect("the CRD serialises"));
    serde_saphyr::to_string(&value).expect("the CRD as YAML")
}

/// The header comment a file starts with: its leading `#` lines.
fn header(text: &str) -> String {
    text.lines().take_while(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect()
}

fn parse(path: &Path, text: &str) -> Value {
    let value: Value = serde_saphyr::from_str(text)
        .unwrap_or_else(|e| panic!("{} is not YAML: {e}; {REGENERATE} writes it", path.display()));
    integers(value)
}

/// Where `have` and `want` differ, as JSON paths (the first few).
fn differences(have: &Value, want: &Value, path: &str, out: &mut Vec<String>) {
    if out.len() >= 20 || have == want {
        return;
    }
    match (have, want) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let at = format!("{path}.{key}");
                match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => differences(x, y, &at, out),
                    (Some(_), None) => out.push(format!("{at}: in the file, not generated")),
                    (None, Some(_)) => out.push(format!("{at}: generated, not in the file")),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{path}[{i}]"), out);
            }
        }
        _ => out.push(format!("{path}: the file has {have}, the types generate {want}")),
    }
}

#[test]
fn deploy_crds_are_what_the_types_generate() {
    let _area = support::area(module_path!());
    let body = generated();
    let update = std::env::var("LSP_UPDATE_CRD").is_ok_and(|v| v == "1");
    let want = parse(Path::new("the generated CRD"), &body);
    let mut stale = Vec::new();
    for file in FILES {
        let path = repo_root().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if update {
            std::fs::write(&path, header(&text) + &body).unwrap_or_else(|e| panic!("writing {file}: {e}"));
            continue;
        }
        let mut found = Vec::new();
        differences(&parse(&path, &text), &want, "", &mut found);
        if !found.is_empty() {
            stale.push(format!("{file}:\n  {}", found.join("\n  ")));
        }
    }
    assert!(
        stale.is_empty(),
        "the CRD files are not what the types in src/core/cluster/inventory.rs generate (edit the types, not \
         the files; `{REGENERATE}` rewrites them, keeping their header comments; review `git diff deploy/`):\n{}",
        stale.join("\n")
    );
}

/// What a file holds is valid YAML the API server reads as one CustomResourceDefinition, and a
/// header comment survives a rewrite.
#[test]
fn a_rewrite_keeps_the_header() {
    let _area = support::area(module_path!());
    let text = "# one\n# two\napiVersion: v1\n# not a header\nkind: X\n";
    assert_eq!(header(text), "# one\n# two\n");
    assert_eq!(header("apiVersion: v1\n"), "");
    let docs = generated();
    assert!(!docs.contains("\n---"), "one document");
    let value = parse(Path::new("generated"), &docs);
    assert_eq!(value["kind"], "CustomResourceDefinition");
    assert_eq!(value["metadata"]["name"], "localstoragenodes.local-static-provisioner.io");
}

/// The comparison names where a file and the types differ.
#[test]
fn a_difference_is_named_by_its_path() {
    let _area = support::area(module_path!());
    let want = serde_json::json!({"a": {"b": [1, 2], "c": "x"}});
    let have = serde_json::json!({"a": {"b": [1, 3], "d": "y"}});
    let mut out = Vec::new();
    differences(&have, &want, "", &mut out);
    assert_eq!(
        out,
        [
            ".a.b[1]: the file has 3, the types generate 2",
            ".a.d: in the file, not generated",
            ".a.c: generated, not in the file"
        ]
    );
    assert_eq!(integers(serde_json::json!({"m": 0.0, "n": 0.5})), serde_json::json!({"m": 0, "n": 0.5}));
}
