//! `discover`: the dry run without a cluster. Prints the PVs this machine's volumes would
//! become, planned as the agent plans them.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::{DiscoverArgs, Output, PLACEHOLDER_NODE_UID, disks, load_or_report};
use crate::config::LoadedConfig;
use crate::core::volumes::desired::{class_policy, desired_pvs};
use crate::core::volumes::naming::provisioner_name;
use crate::core::volumes::pv::{NodeInfo, PvContext};
use crate::host::volumes::discovery;

pub(super) fn run(args: &DiscoverArgs) -> ExitCode {
    let Some((LoadedConfig { mut config, .. }, failed_classes)) = load_or_report(&args.config) else {
        return ExitCode::FAILURE;
    };
    // An owner reference needs the Node's real UID: with a made-up one the garbage collector
    // finds no owner and deletes the PV, and our finalizer then leaves it Terminating for good.
    // Without --node-uid the PVs are printed without one (as with setPVOwnerRef: false), so
    // applying them is safe; the agent adds nothing later, so the warning says how to get it.
    if args.node_uid.is_none() && config.set_pv_owner_ref {
        config.set_pv_owner_ref = false;
        eprintln!("{}", missing_owner_warning(&args.node_name));
    }
    // The dry run reads the volumes' own used marks, and the agent's ledger when given.
    let ledger = match &args.state_dir {
        Some(dir) => match crate::host::identity::used_mark::Ledger::read_only(dir) {
            Ok(ledger) => Some(ledger),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    // Device claims are planned as the agent would and their links scanned as if made.
    let claims = if config.storage_class_map.values().any(|c| c.devices.is_some()) || args.state_dir.is_some() {
        match disks::plan_now(&config, args.state_dir.as_deref()) {
            Ok((_, plan, _)) => Some(plan),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let mut links = Vec::new();
    for action in claims.iter().flat_map(|p| &p.actions) {
        if let crate::core::devices::device_claim::LinkAction::Create(r) = action {
            eprintln!("claim: class {} would link {} -> {} (disk {})", r.class, r.host_path, r.target, r.disk);
            links.push((r.class.clone(), r.name.clone(), PathBuf::from(&r.target)));
        }
    }
    for d in claims.iter().flat_map(|p| &p.decisions) {
        if let crate::core::devices::device_claim::Verdict::Refused(r) = &d.verdict {
            eprintln!("claim: class {} refuses /dev/{} ({}): {r}", d.class, d.device, r.code());
        }
    }
    let scan = match crate::host::mounts::mountinfo::MountTable::read() {
        Ok(mounts) => {
            let mut scan = discovery::scan_with_links(&config, &mounts, &Default::default(), &links);
            discovery::read_used_marks(&mut scan.volumes, &config, &mounts, ledger.as_ref());
            if let Some(plan) = &claims {
                discovery::hold_back(&mut scan, &config, &plan.held);
            }
            scan
        }
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let uid = args.node_uid.clone().unwrap_or_else(|| PLACEHOLDER_NODE_UID.to_string());
    let node =
        NodeInfo { name: args.node_name.clone(), uid: uid.clone(), labels: args.node_labels.iter().cloned().collect() };
    let provisioner = provisioner_name(&node.name, &uid, config.use_node_name_only);
    let ctx = PvContext { config: &config, node: &node, provisioner_name: &provisioner };
    let mut policies = BTreeMap::new();
    for class in config.storage_class_map.keys() {
        policies.insert(class.clone(), class_policy(class, Some(&args.reclaim_policy), Some(&args.mount_options)));
    }
    let (desired, problems) = desired_pvs(&ctx, &scan.volumes, &policies);
    let mut stderr = std::io::stderr().lock();
    for s in &scan.skipped {
        let _ = writeln!(
            stderr,
            "skipped {} (class {}, reason {}): {}",
            s.path.display(),
            s.class,
            s.reason.code(),
            s.reason
        );
    }
    for p in &problems {
        let _ = writeln!(stderr, "class {}: {}", p.class, p.message);
    }
    // Two entries with the same host path or PV name are reported, as the agent would refuse them.
    let identity = crate::core::volumes::planner::Identity {
        node: node.name.clone(),
        provisioner: provisioner.clone(),
        node_label: crate::core::volumes::naming::node_label_value(&node.name),
        use_node_name_only: config.use_node_name_only,
    };
    let mut pvs = Vec::new();
    for action in crate::core::volumes::planner::plan(&identity, &desired, &[], &BTreeMap::new()) {
        match action {
            crate::core::volumes::planner::Action::Create { name, host_path } => {
                // An encrypting class's volume is published by the agent only, with the key it
                // makes then (docs/encryption.md): a PV applied from here would be unencrypted.
                let d = crate::core::volumes::planner::desired_named(&desired, &name, &host_path);
                if let Some(class) =
                    d.and_then(|d| config.storage_class_map.get(&d.class)).filter(|c| c.encryption.is_some())
                {
                    let _ = writeln!(
                        stderr,
                        "skipped {host_path} ({name}, reason encrypted): its class encrypts its volumes (encryption: {}); only the agent publishes them, with the key it makes for each",
                        serde_json::to_value(class.encryption)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    );
                    continue;
                }
                pvs.extend(d.and_then(|d| ctx.pv_for(d)));
            }
            crate::core::volumes::planner::Action::Refuse { name, host_path, reason } => {
                let _ = writeln!(stderr, "skipped {host_path} ({name}, reason {}): {reason}", reason.code());
            }
            crate::core::volumes::planner::Action::WipeFirst { name, host_path, mark, .. } => {
                let _ = writeln!(
                    stderr,
                    "skipped {host_path} ({name}, reason used): it held the data of PV {} and is wiped before it is published",
                    mark.pv
                );
            }
        }
    }
    if args.node_uid.is_none() {
        let _ = writeln!(
            stderr,
            "note: node UID unknown, provisioned-by uses the placeholder {PLACEHOLDER_NODE_UID} (pass --node-uid)"
        );
    }
    let text = match args.output {
        Output::Json => {
            serde_json::to_string_pretty(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": pvs}))
                .map(|s| s + "\n")
                .map_err(|e| e.to_string())
        }
        Output::Yaml => pvs.iter().try_fold(String::new(), |mut acc, pv| {
            acc.push_str("---\n");
            acc.push_str(&serde_saphyr::to_string(pv).map_err(|e| e.to_string())?);
            if !acc.ends_with('\n') {
                acc.push('\n');
            }
            Ok(acc)
        }),
    };
    match text {
        // The valid classes' PVs are printed; an invalid class (reported above) still fails the
        // command, so that a script applying the output notices the class left out.
        Ok(text) => {
            print!("{text}");
            if failed_classes > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS }
        }
        Err(e) => {
            eprintln!("error: printing PVs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The warning `discover` prints when setPVOwnerRef is on and the Node's UID is unknown.
pub(super) fn missing_owner_warning(node: &str) -> String {
    format!(
        "warning: setPVOwnerRef is true but --node-uid is not given: the PVs are printed WITHOUT their \
         ownerReference to Node {node:?} (a made-up UID would let the garbage collector delete them). To include it, \
         pass --node-uid \"$(kubectl get node {node} -o jsonpath='{{.metadata.uid}}')\""
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_warning_says_how_to_include_it() {
        let text = missing_owner_warning("node-1");
        assert!(text.contains("WITHOUT their ownerReference"), "{text}");
        assert!(text.contains("--node-uid \"$(kubectl get node node-1 -o jsonpath='{.metadata.uid}')\""), "{text}");
    }
}
