//! `local-static-provisioner disks`: every block device of this node with the facts the claim
//! rules read, and what each class with a `devices` section makes of it (claimed, would
//! claim, not selected or refused, with the reason). Runs the same planner as the agent,
//! probing candidates the same non-destructive way, and changes nothing.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::config::{LoadedConfig, ProvisionerConfig};
use crate::core::devices::device_claim::{ClaimPlan, ClaimRecord, DeviceFacts, DeviceKind, Verdict};
use crate::core::volumes::capacity::iec;
use crate::host::devices::claims::{plan_claims, read_records};
use crate::host::mounts::mountinfo::MountTable;

/// Why the listing could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DisksError {
    /// The host could not be read.
    #[error(transparent)]
    Host(#[from] crate::host::HostError),
    /// The agent's claim records could not be read.
    #[error(transparent)]
    Claims(#[from] crate::host::devices::claims::ClaimError),
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
    let verifier = state_dir.map(crate::host::devices::verify::Verifier::view);
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

/// The device's flags in one column: `ro`, `removable`, `hidden`, `rotational` or `ssd`.
fn flags(d: &DeviceFacts) -> String {
    let mut f = Vec::new();
    for (on, word) in [(d.read_only, "ro"), (d.removable, "removable"), (d.hidden, "hidden")] {
        if on {
            f.push(word);
        }
    }
    match d.rotational {
        Some(true) => f.push("rotational"),
        Some(false) => f.push("ssd"),
        None => {}
    }
    if f.is_empty() { "-".into() } else { f.join(",") }
}

/// Writes `rows` under `header`, each column as wide as its widest cell; the last column is
/// not padded.
fn write_table(out: &mut impl std::io::Write, header: &[&str], rows: &[Vec<String>]) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        cells
            .iter()
            .enumerate()
            .map(|(i, c)| if i == last { c.to_string() } else { format!("{c:<w$}", w = widths[i]) })
            .collect::<Vec<_>>()
            .join("  ")
    };
    writeln!(out, "{}", line(header.to_vec()))?;
    for row in rows {
        writeln!(out, "{}", line(row.iter().map(String::as_str).collect()))?;
    }
    Ok(())
}

/// Prints the listing; JSON when `json` (every device, sizes in bytes); `all`: the table shows
/// unattached loop devices too.
pub fn print(devices: &[DeviceFacts], plan: &ClaimPlan, json: bool, all: bool) -> std::io::Result<()> {
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
                    "content": d.content_text(), "classes": classes,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&items).map_err(std::io::Error::other)?;
        return writeln!(out, "{text}");
    }
    let shown: Vec<&DeviceFacts> = devices.iter().filter(|d| all || !d.is_unattached_loop()).collect();
    let rows: Vec<Vec<String>> = shown
        .iter()
        .map(|d| {
            let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            vec![
                d.name.clone(),
                d.dev.clone(),
                d.kind.as_ref().map(DeviceKind::to_string).unwrap_or_else(|| "?".into()),
                iec(d.size),
                flags(d),
                opt(&d.model),
                opt(&d.stable_id),
                d.content_text(),
            ]
        })
        .collect();
    write_table(&mut out, &["NAME", "DEV", "TYPE", "SIZE", "FLAGS", "MODEL", "ID", "CONTENT"], &rows)?;
    let hidden = devices.len() - shown.len();
    if hidden > 0 {
        writeln!(out, "({hidden} unattached loop devices not shown; --all shows them)")?;
    }
    let related: Vec<Vec<String>> = shown
        .iter()
        .flat_map(|d| {
            let links = (!d.by_id.is_empty()).then(|| vec![d.name.clone(), "by-id".into(), d.by_id.join(" ")]);
            let lists = [("partitions", &d.partitions), ("holders", &d.holders), ("shares data with", &d.sharing)]
                .into_iter()
                .filter(|(_, l)| !l.is_empty())
                .map(|(what, l)| vec![d.name.clone(), what.to_string(), l.join(" ")]);
            let classes = verdicts
                .get(d.name.as_str())
                .into_iter()
                .flatten()
                .map(|(class, text)| vec![d.name.clone(), format!("class {class}"), text.clone()]);
            links.into_iter().chain(lists).chain(classes).collect::<Vec<_>>()
        })
        .collect();
    if !related.is_empty() {
        writeln!(out)?;
        write_table(&mut out, &["DEVICE", "WHAT", "DETAIL"], &related)?;
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
    if let Err(e) = print(&devices, &plan, matches!(args.output, super::DisksOutput::Json), args.all) {
        eprintln!("error: writing the listing: {e}");
        return ExitCode::FAILURE;
    }
    if failed_classes > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_aligns_every_column_but_the_last() {
        let mut out = Vec::new();
        let rows = vec![
            vec!["loop0".to_string(), "7:0".into(), "blank".into()],
            vec!["nvme0n1".into(), "259:0".into(), "in use: mounted at /".into()],
        ];
        write_table(&mut out, &["NAME", "DEV", "CONTENT"], &rows).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "NAME     DEV    CONTENT\nloop0    7:0    blank\nnvme0n1  259:0  in use: mounted at /\n");
    }
}
