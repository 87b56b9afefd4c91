//! The desired state: the volumes discovery found that should be published, each with what its
//! PV is made of (`PvContext::pv_for` builds the object). Pure, so the `discover` dry run and
//! the agent produce the very same objects.

use std::collections::BTreeMap;

use crate::core::volumes::naming::pv_name;
use crate::core::volumes::pv::{FoundVolume, PvContext};
use crate::core::volumes::pv_inputs::{ClassPolicy, DesiredPv};

/// A class whose volumes cannot be published in this pass, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassProblem {
    /// StorageClass name.
    pub class: String,
    /// What is wrong (e.g. the StorageClass object does not exist).
    pub message: String,
}

/// Builds the desired PVs. `policies` holds, per class, the StorageClass settings or the reason
/// they could not be had; volumes of a class without a policy are held back and reported once.
pub(crate) fn desired_pvs(
    ctx: &PvContext<'_>,
    volumes: &[FoundVolume],
    policies: &BTreeMap<String, Result<ClassPolicy, String>>,
) -> (Vec<DesiredPv>, Vec<ClassProblem>) {
    desired_from(ctx, volumes.to_vec(), policies)
}

/// [`desired_pvs`] from volumes the caller no longer needs: their strings and used marks move
/// into the desired PVs instead of being copied (the agent's pass over a thousand published
/// volumes held both, about 0.7 MiB more at its peak).
pub(crate) fn desired_from(
    ctx: &PvContext<'_>,
    volumes: Vec<FoundVolume>,
    policies: &BTreeMap<String, Result<ClassPolicy, String>>,
) -> (Vec<DesiredPv>, Vec<ClassProblem>) {
    let mut desired = Vec::with_capacity(volumes.len());
    let mut problems: BTreeMap<String, String> = BTreeMap::new();
    for v in volumes {
        if !ctx.config.storage_class_map.contains_key(&v.class) {
            continue; // Volume from a class that is no longer configured.
        }
        let policy = match policies.get(&v.class) {
            Some(Ok(p)) => p,
            Some(Err(e)) => {
                problems.entry(v.class.clone()).or_insert_with(|| e.clone());
                continue;
            }
            None => {
                problems.entry(v.class.clone()).or_insert_with(|| format!("StorageClass {:?} is not known", v.class));
                continue;
            }
        };
        let name = pv_name(&v.entry, &ctx.node.name, &v.class);
        let policy = policy.clone();
        desired.push(DesiredPv {
            name,
            host_path: v.host_path,
            class: v.class,
            policy,
            capacity_bytes: v.capacity_bytes,
            identity: v.identity,
            disk: v.disk,
            in_use: v.in_use,
            used: v.used,
            mark_holder: None,
        });
    }
    let problems = problems.into_iter().map(|(class, message)| ClassProblem { class, message }).collect();
    (desired, problems)
}

/// Turns a StorageClass's reclaim policy and mount options into a policy, refusing what
/// upstream refuses (only Delete and Retain make sense for local volumes).
pub(crate) fn class_policy(
    class: &str,
    reclaim_policy: Option<&str>,
    mount_options: Option<&[String]>,
) -> Result<ClassPolicy, String> {
    let reclaim_policy = reclaim_policy.unwrap_or("Delete");
    if reclaim_policy != "Delete" && reclaim_policy != "Retain" {
        return Err(format!(
            "unsupported reclaimPolicy {reclaim_policy:?} in StorageClass {class:?}; local volumes support Delete and Retain"
        ));
    }
    Ok(ClassPolicy {
        reclaim_policy: reclaim_policy.to_string(),
        mount_options: mount_options.unwrap_or_default().to_vec(),
    })
}
