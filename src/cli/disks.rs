//! `local-static-provisioner disks`: every block device of this node with the facts the claim
//! rules read, and what each class with a `devices` section makes of it (claimed, would
//! claim, not selected or refused, with the reason). Runs the same planner as the agent,
//! probing candidates the same non-destructive way, and changes nothing.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::config::{LoadedConfig, ProvisionerConfig};
use crate::core::device_claim::{ClaimPlan, ClaimRecord, Content, DeviceFacts, DeviceKind, Verdict};
use crate::host::claims::{plan_claims, read_records};
use crate::host::mountinfo::MountTable;

/// Why the listing could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DisksError {
    /// The host could not be read.
    #[error(transparent)]
    Host(#[from] crate::host::HostError),
    /// The agent's claim records could not be read.
    #[error(transparent)]
    Claims(#[from] crate::host::claims::ClaimError),
}

/// The claim plan of this node now: the devices, the plan, and the records it started from.
pub fn plan_now(
    config: &ProvisionerConfig,
    state_dir: Option<&Path>,
) -> Result<(Vec<DeviceFacts>, ClaimPlan, Vec<ClaimRecord>), DisksError> {
    let records = match state_dir {
        Some(dir) => read_records(dir)?,
        None => Vec::new(),
    };
    let mounts = MountTable::read()?;
    // No cluster here: which recorded devices have a PV is unknown, so they are not probed.
    let verifier = state_dir.map(crate::host::verify::Verifier::view);
    let (devices, plan) = plan_claims(config, records.clone(), None, &mounts, None, verifier.as_ref(), None);
    Ok((devices, plan, records))
}

/// One line per verdict, as `disks` and `discover` print it.
pub fn verdict_text(v: &Verdict) -> String {
    match v {
        Verdict::Claimed { name } => format!("claimed (link {name})"),
        Verdict::Claim { name, target, relink: false } => format!("would claim as {name} -> {target}"),
        Verdict::Claim { name, target, relink: true } => format!("would link again {name} -> {target} (its PV exists)"),
        Verdict::NotSelected(why) => format!("not selected: {why}"),
        Verdict::Refused(r) => format!("refused ({}): {r}", r.code()),
    }
}

fn content_text(d: &DeviceFacts) -> String {
    if let Some(why) = &d.probe.in_use {
        return format!("in use: {why}");
    }
    match &d.probe.content {
        Content::NotProbed => "not probed (no class selects it)".into(),
        Content::Blank => "blank".into(),
        Content::Busy => "open exclusively by someone".into(),
        Content::NotBlank(what) => what.clone(),
        Content::Unreadable(e) => format!("unreadable: {e}"),
        Content::Unresponsive(e) => format!("unresponsive: {e}"),
    }
}

/// Prints the listing; JSON when `json`.
pub fn print(devices: &[DeviceFacts], plan: &ClaimPlan, json: bool) -> std::io::Result<()> {
    let mut verdicts: BTreeMap<&str, Vec<(&str, String)>> = BTreeMap::new();
    for d in &plan.decisions {
        verdicts.entry(d.device.as_str()).or_default().push((d.class.as_str(), verdict_text(&d.verdict)));
    }
    let mut out = std::io::stdout().lock();
    if json {
        let items: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| {
                let classes: serde_json::Map<String, serde_json::Value> = verdicts
                    .get(d.name.as_str())
                    .map(|v| v.iter().map(|(c, t)| (c.to_string(), t.clone().into())).collect())
                    .unwrap_or_default();
                serde_json::json!({
                    "name": d.name, "dev": d.dev,
                    "type": d.kind.as_ref().map(DeviceKind::to_string),
                    "size": d.size, "readOnly": d.read_only, "removable": d.removable, "hidden": d.hidden,
                    "rotational": d.rotational, "model": d.model, "vendor": d.vendor,
                    "stableId": d.stable_id, "byId": d.by_id, "partitions": d.partitions,
                    "holders": d.holders, "sharing": d.sharing,
                    "content": content_text(d), "classes": classes,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&items).map_err(std::io::Error::other)?;
        return writeln!(out, "{text}");
    }
    for d in devices {
        let kind = d.kind.as_ref().map(DeviceKind::to_string).unwrap_or_else(|| "?".into());
        let flag = |on: bool, word: &str| if on { format!(" {word}") } else { String::new() };
        writeln!(
            out,
            "{} ({}) {kind} {} bytes{}{}{}{}",
            d.name,
            d.dev,
            d.size,
            flag(d.read_only, "read-only"),
            flag(d.removable, "removable"),
            flag(d.hidden, "hidden"),
            match d.rotational {
                Some(true) => " rotational",
                Some(false) => " non-rotational",
                None => "",
            }
        )?;
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        writeln!(out, "  model {:?} vendor {:?} id {}", opt(&d.model), opt(&d.vendor), opt(&d.stable_id))?;
        if !d.by_id.is_empty() {
            writeln!(out, "  by-id {}", d.by_id.join(" "))?;
        }
        for (what, list) in [("partitions", &d.partitions), ("holders", &d.holders), ("shares data with", &d.sharing)] {
            if !list.is_empty() {
                writeln!(out, "  {what} {}", list.join(" "))?;
            }
        }
        writeln!(out, "  content {}", content_text(d))?;
        for (class, text) in verdicts.get(d.name.as_str()).into_iter().flatten() {
            writeln!(out, "  class {class}: {text}")?;
        }
    }
    for (class, name, what) in &plan.held {
        writeln!(out, "held: class {class} link {name}: shows {what}; not published until cleared")?;
    }
    for (class, name, why) in &plan.kept {
        writeln!(out, "kept: class {class} link {name}: {why}")?;
    }
    Ok(())
}

/// The `disks` command: lists the devices and what each class makes of them.
pub(super) fn command(args: &super::DisksArgs) -> ExitCode {
    let Some((LoadedConfig { config, .. }, failed_classes)) = super::load_or_report(&args.config) else {
        return ExitCode::FAILURE;
    };
    let (devices, plan, _) = match plan_now(&config, Some(&args.state_dir)) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = print(&devices, &plan, matches!(args.output, super::DisksOutput::Json)) {
        eprintln!("error: writing the listing: {e}");
        return ExitCode::FAILURE;
    }
    if failed_classes > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
