//! Event-driven discovery, hot-reloaded configuration and vanished volumes, on real mounts and
//! the real control plane. The agents here run without a short resync (minResyncPeriod is an
//! hour), so everything they do is driven by mount-table and inotify events. Needs root.

use crate::support;

use std::process::Command;
use std::time::Duration;

use local_static_provisioner::core::volumes::naming::pv_name;
use support::{
    AgentProcess, ControlPlane, bind_mount, mount_tmpfs, require_root, run, umount_when_idle, wait_until, write_config,
};

const WAIT: Duration = Duration::from_secs(60);

fn class_map(class: &str, dir: &std::path::Path) -> String {
    format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = dir.display())
}

#[test]
fn mounts_and_unmounts_are_followed_without_a_resync() {
    let _area = support::area(module_path!());
    if !require_root("mounts_and_unmounts_are_followed_without_a_resync") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "events-mount-node";
    cp.create_node(node);
    cp.create_storage_class("events-fs", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let fs_dir = tmp.path().join("fs");
    std::fs::create_dir_all(&fs_dir).unwrap();
    let config = tmp.path().join("config");
    write_config(&config, &[("storageClassMap", &class_map("events-fs", &fs_dir)), ("minResyncPeriod", "1h\n")]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start_with(&config, node, &kubeconfig, &tmp.path().join("agent.log"), &[]);
    wait_until("first pass", WAIT, || agent.log_text().contains("pass done").then_some(()));

    let name = pv_name("vol1", node, "events-fs");
    let m = mount_tmpfs(&fs_dir.join("vol1"), 16);
    wait_until("PV published after the mount", WAIT, || (cp.pv_state(&name)?.1 == "Available").then_some(()));

    // A bound volume that vanishes is kept and flagged, and unflagged when it is back.
    let src = tmp.path().join("src");
    let bind = bind_mount(&src, &fs_dir.join("vol2"));
    let bound = pv_name("vol2", node, "events-fs");
    wait_until("bind-mounted volume published", WAIT, || cp.pv_state(&bound));
    std::fs::write(src.join("data"), b"tenant").unwrap();
    cp.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: events-claim, namespace: default}}\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: events-fs\n  volumeName: {bound}\n  resources: {{requests: {{storage: 1Mi}}}}\n"
    ));
    wait_until("claim bound", WAIT, || (cp.pv_state(&bound)?.1 == "Bound").then_some(()));
    umount_when_idle(&bind.path);
    wait_until("bound PV flagged as missing", WAIT, || {
        let pv = cp.get_json(&["pv", &bound])?;
        pv["metadata"]["annotations"]["local-static-provisioner.io/volume-missing"].as_str().map(|_| ())
    });
    assert!(cp.has_event(&bound, "VolumeMissing", "missing"));
    assert!(cp.describe_shows_event(&bound, "VolumeMissing"), "kubectl describe pv shows it");
    // The state an alert watches (the event is said once).
    let flagged = |n: u32| format!("local_static_provisioner_flagged_volumes{{flag=\"missing\"}} {n}");
    wait_until("missing volume counted", WAIT, || agent.admin_get("/metrics").contains(&flagged(1)).then_some(()));
    assert_eq!(cp.pv_state(&bound).unwrap().1, "Bound", "a bound PV is never deleted");
    run(Command::new("mount").arg("--bind").arg(&src).arg(&bind.path));
    wait_until("flag removed when the volume is back", WAIT, || {
        let pv = cp.get_json(&["pv", &bound])?;
        pv["metadata"]["annotations"]["local-static-provisioner.io/volume-missing"].is_null().then_some(())
    });
    assert_eq!(std::fs::read(src.join("data")).unwrap(), b"tenant");
    wait_until("missing volume no longer counted", WAIT, || {
        agent.admin_get("/metrics").contains(&flagged(0)).then_some(())
    });

    // An unbound volume that vanishes is withdrawn.
    drop(m);
    wait_until("Available PV withdrawn after the unmount", WAIT, || cp.pv_state(&name).is_none().then_some(()));
    assert!(cp.has_event(&name, "VolumeWithdrawn", "withdrawn"));
    // The only resync is the one at start-up: everything above was driven by events.
    assert_eq!(agent.log_text().matches("periodic resync").count(), 1, "{}", agent.log_text());
    drop(bind);
    drop(agent);
}

#[test]
fn config_changes_apply_without_restart_and_bad_ones_keep_the_last_good() {
    let _area = support::area(module_path!());
    if !require_root("config_changes_apply_without_restart_and_bad_ones_keep_the_last_good") {
        return;
    }
    let cp = ControlPlane::get();
    let node = "events-config-node";
    cp.create_node(node);
    cp.create_storage_class("events-a", "Delete");
    cp.create_storage_class("events-b", "Delete");
    let tmp = tempfile::tempdir().unwrap();
    let (dir_a, dir_b) = (tmp.path().join("a"), tmp.path().join("b"));
    let _a1 = mount_tmpfs(&dir_a.join("v1"), 16);
    let _b1 = mount_tmpfs(&dir_b.join("v1"), 16);
    let config = tmp.path().join("config");
    write_config(&config, &[("storageClassMap", &class_map("events-a", &dir_a)), ("minResyncPeriod", "1h\n")]);
    let kubeconfig = cp.agent_kubeconfig(tmp.path());
    let agent = AgentProcess::start_with(&config, node, &kubeconfig, &tmp.path().join("agent.log"), &[]);
    let (a1, b1) = (pv_name("v1", node, "events-a"), pv_name("v1", node, "events-b"));
    wait_until("class A published", WAIT, || cp.pv_state(&a1));
    assert!(cp.pv_state(&b1).is_none());

    // A new class, applied like kubelet does (the ..data symlink swapped).
    let both = format!("{}{}", class_map("events-a", &dir_a), class_map("events-b", &dir_b));
    write_config(&config, &[("storageClassMap", &both), ("minResyncPeriod", "1h\n")]);
    wait_until("class B published after the config change", WAIT, || cp.pv_state(&b1));

    // A broken class: refused, reported, its last good definition keeps working.
    write_config(&config, &[("storageClassMap", "events-a:\n  hostDir: relative\n"), ("minResyncPeriod", "1h\n")]);
    wait_until("ConfigInvalid event", WAIT, || {
        let events = cp.get_json(&["events.events.k8s.io", "-A"])?;
        events["items"]
            .as_array()?
            .iter()
            .any(|e| e["reason"] == "ConfigInvalid" && e["regarding"]["name"] == node)
            .then_some(())
    });
    assert!(agent.admin_get("/metrics").contains("local_static_provisioner_config_valid 0"));
    let ready = agent.admin_get("/readyz");
    assert!(
        ready.starts_with("HTTP/1.1 200")
            && ready.contains("\"events-a\" is invalid, its last valid definition stays in use"),
        "{ready}"
    );
    let _a2 = mount_tmpfs(&dir_a.join("v2"), 16);
    let a2 = pv_name("v2", node, "events-a");
    wait_until("new volume published under the last good config", WAIT, || cp.pv_state(&a2));

    // Fixed again.
    write_config(&config, &[("storageClassMap", &both), ("minResyncPeriod", "1h\n")]);
    wait_until("config valid again", WAIT, || {
        agent.admin_get("/metrics").contains("local_static_provisioner_config_valid 1").then_some(())
    });
    wait_until("readiness without the refusal detail", WAIT, || {
        let ready = agent.admin_get("/readyz");
        (ready.starts_with("HTTP/1.1 200") && ready.ends_with("\r\n\r\nok\n")).then_some(())
    });

    // A misspelt key that would widen what a class publishes (upstream ignores it and takes
    // every entry): the class is refused, with the likely key, and its last good definition
    // stays in use: an entry its namePattern would not take is still not published.
    let typo = format!("{}  namePatern: \"v*\"\n{}", class_map("events-a", &dir_a), class_map("events-b", &dir_b));
    write_config(&config, &[("storageClassMap", &typo), ("minResyncPeriod", "1h\n")]);
    let said =
        wait_until("ConfigInvalid with the likely key", WAIT, || node_event(&cp, node, "ConfigInvalid", "namePatern"));
    assert!(said.contains("did you mean \"namePattern\""), "{said}");
    // A key unlike any known one is ignored and told once (a note, a newer upstream's key).
    let noted = format!("{both}  someNote: kept by the team\n");
    write_config(&config, &[("storageClassMap", &noted), ("minResyncPeriod", "1h\n")]);
    let said = wait_until("ConfigUnknownKeys", WAIT, || node_event(&cp, node, "ConfigUnknownKeys", "someNote"));
    assert!(said.contains("ignored (known keys:"), "{said}");
    // A misspelt ConfigMap key would publish nothing: the whole change is refused.
    write_config(&config, &[("storageClasMap", &both), ("minResyncPeriod", "1h\n")]);
    let said = wait_until("ConfigInvalid for the ConfigMap key", WAIT, || {
        node_event(&cp, node, "ConfigInvalid", "storageClasMap")
    });
    assert!(said.contains("did you mean \"storageClassMap\""), "{said}");
    let _b2 = mount_tmpfs(&dir_b.join("v2"), 16);
    let b2 = pv_name("v2", node, "events-b");
    wait_until("published under the last good config", WAIT, || cp.pv_state(&b2));
    drop(agent);
}

/// The note of an event about Node `node` with `reason` whose note contains `text`.
fn node_event(cp: &ControlPlane, node: &str, reason: &str, text: &str) -> Option<String> {
    let events = cp.get_json(&["events.events.k8s.io", "-A"])?;
    events["items"].as_array()?.iter().find_map(|e| {
        let note = e["note"].as_str()?;
        (e["reason"] == reason && e["regarding"]["name"] == node && note.contains(text)).then(|| note.to_string())
    })
}
