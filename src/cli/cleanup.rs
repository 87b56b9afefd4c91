//! `cleanup PV...`: an administrator asks for wipes. It only sets our annotation (the agent on
//! the PV's node does the work) and, with `--wait`, follows each request to its outcome.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::api::AnnotationPatch;
use crate::api::{ClientOptions, Cluster};
use crate::core::volumes::naming::{ANN_CLEANUP, ANN_CLEANUP_REQUESTED_AT, ANN_CLEANUP_RESULT, CLEANUP_REQUESTED};

/// Sets the cleanup request on each PV; with `wait`, reports each outcome. Exit code 0 only
/// when every request was accepted (and, with `wait`, completed).
pub async fn run(pvs: Vec<String>, client: ClientOptions, wait: bool, timeout: Duration) -> ExitCode {
    let cluster = match Cluster::connect_as(&client, "cleanup", "cleanup-cli").await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut requested = Vec::new();
    let mut ok = true;
    for name in pvs {
        match request(&cluster, &name).await {
            Ok(uid) => {
                println!("{name}: cleanup requested");
                requested.push((name, uid));
            }
            Err(e) => {
                eprintln!("{name}: {e}");
                ok = false;
            }
        }
    }
    if wait {
        for (name, uid) in requested {
            match follow(&cluster, &name, &uid, timeout).await {
                Ok(msg) => println!("{name}: {msg}"),
                Err(msg) => {
                    eprintln!("{name}: {msg}");
                    ok = false;
                }
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

async fn request(cluster: &Cluster, name: &str) -> Result<String, String> {
    let pv = cluster.get_pv(name).await.map_err(|e| e.to_string())?.ok_or("no such PV")?;
    let uid = pv.metadata.uid.clone().unwrap_or_default();
    if pv
        .metadata
        .finalizers
        .as_ref()
        .is_none_or(|f| !f.iter().any(|f| f == crate::core::volumes::naming::FINALIZER_WIPE))
    {
        eprintln!("{name}: note: the PV does not carry our finalizer yet; the agent adopts it first");
    }
    // A new request clears the answer to the previous one.
    // A new timestamp each time: a request after a failed or refused wipe retries it at once.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = AnnotationPatch::new()
        .set(ANN_CLEANUP, CLEANUP_REQUESTED)
        .set(ANN_CLEANUP_REQUESTED_AT, now)
        .remove(ANN_CLEANUP_RESULT);
    cluster.patch_annotations(name, None, &patch).await.map_err(|e| e.to_string())?;
    Ok(uid)
}

/// Follows one request: done when a new PV of that name is Available, refused when the agent
/// recorded a refusal. Wipe failures are reported and followed further (the agent retries).
async fn follow(cluster: &Cluster, name: &str, uid: &str, timeout: Duration) -> Result<String, String> {
    let started = Instant::now();
    let mut last_note = String::new();
    loop {
        let pv = cluster.get_pv(name).await.map_err(|e| e.to_string())?;
        let state = match &pv {
            None => "wiped; waiting for the volume to be published again".to_string(),
            Some(pv) if pv.metadata.uid.as_deref() != Some(uid) => {
                let phase = pv.phase().to_string();
                if phase == "Available" {
                    return Ok("done: wiped and published again as Available".into());
                }
                format!("published again, phase {phase}")
            }
            Some(pv) => {
                let result = pv.annotation(ANN_CLEANUP_RESULT).cloned();
                match result {
                    Some(r) if r.starts_with("refused") => return Err(r),
                    Some(r) => r,
                    None if pv.metadata.deletion_timestamp.is_some() => "wiping".into(),
                    None => "waiting for the agent".into(),
                }
            }
        };
        if state != last_note {
            eprintln!("{name}: {state}");
            last_note = state;
        }
        if started.elapsed() >= timeout {
            return Err(format!("not done after {timeout:?}; last state: {last_note}"));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
