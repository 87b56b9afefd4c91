//! inotify per agent (issue 42): a real agent process with a Filesystem class, a Block class
//! and a class that claims devices holds exactly one inotify instance (the directory watcher
//! and the block-device watch share it, read by one thread); and an agent that cannot make its
//! instance, or add its watches, keeps working, says so with a Warning event on its Node and a
//! metric, and heals when the limit is raised, without a restart. The limits are lowered in a
//! user namespace of the agent's own (`unshare --user`: /proc/sys/user/max_inotify_* are per
//! user namespace), so nothing host-wide is touched. Against the real control plane; needs
//! root.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use support::used_lab::*;
use support::{AgentProcess, wait_until};

/// The inotify instances process `pid` holds (its descriptors that are one).
fn inotify_instances(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == "anon_inode:inotify"))
        .count()
}

/// The names of process `pid`'s threads, sorted.
fn threads(pid: u32) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect();
    names.sort();
    names
}

/// A Filesystem class with one tmpfs volume, a Block class, and a class claiming loop devices
/// of a size no test makes: (the volume, the config directory).
fn three_classes(h: &Harness) -> (std::path::PathBuf, std::path::PathBuf) {
    let disks = h.lab.dir("disks");
    let volume = disks.join("vol1");
    h.lab.tmpfs(&volume, 4);
    let blocks = h.lab.dir("blocks");
    let claims = h.lab.dir("claims");
    let config = h.config(
        "config",
        &[
            ("ws-fs", &disks, ""),
            ("ws-block", &blocks, "  volumeMode: Block\n"),
            (
                "ws-claims",
                &claims,
                "  volumeMode: Block\n  devices:\n    types: [loop]\n    minSize: 3Mi\n    maxSize: 3Mi\n",
            ),
        ],
    );
    (volume, config)
}

#[test]
fn an_agent_with_filesystem_block_and_device_classes_holds_one_inotify_instance() {
    let _area = support::area(module_path!());
    let Some(h) = Harness::new("one_inotify_instance") else { return };
    let (volume, config) = three_classes(&h);
    let agent = h.agent(&config, &[]);
    h.wait_published(&volume);
    // Every watcher is set up by the first pass (the block-device watch at start).
    let log = agent.log_text();
    assert!(!log.contains("inotify unavailable") && !log.contains("directory not watched"), "{log}");
    assert_eq!(inotify_instances(agent.pid()), 1, "inotify instances of the agent");
    // As many watch threads as with two instances: the instance's reader took the directory
    // watcher's place.
    let watch_threads: Vec<String> = threads(agent.pid())
        .into_iter()
        .filter(|t| ["inotify", "dir-watch", "mount-watch", "block-device-wa"].contains(&t.as_str()))
        .collect();
    assert_eq!(watch_threads, ["block-device-wa", "inotify", "mount-watch"]);
    // The shared instance still tells the directory watcher: a new volume is published
    // without waiting for the resync (the config's default resync is minutes).
    let second = h.lab.path("disks/vol2");
    h.lab.tmpfs(&second, 4);
    h.wait_published(&second);
    assert_eq!(inotify_instances(agent.pid()), 1);
    let metrics = agent.admin_get("/metrics");
    for kind in ["instances", "watches"] {
        let line = format!("local_static_provisioner_watch_degraded{{kind=\"{kind}\"}} 0");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
}

/// An agent in a user namespace of its own whose `limit` (max_inotify_instances or
/// max_inotify_watches, in /proc/sys/user/) is 0 there.
fn agent_without(h: &Harness, config: &Path, limit: &str) -> AgentProcess {
    let set = format!("echo 0 > /proc/sys/user/{limit} && exec \"$@\"");
    let wrapper = ["unshare", "--user", "--map-root-user", "sh", "-c", &set, "sh"];
    let log = h.lab.path(&format!("agent-{limit}.log"));
    AgentProcess::start_wrapped(&wrapper, config, &h.node, &h.kubeconfig, &log, &[])
}

/// Sets `limit` in the user namespace of process `pid` (as its root: nsenter gives the
/// namespace's owner every capability there).
fn raise(pid: u32, limit: &str) {
    let set = format!("echo 1024 > /proc/sys/user/{limit}");
    let ok = Command::new("nsenter").args(["-t", &pid.to_string(), "-U", "--", "sh", "-c", &set]).status();
    assert!(ok.is_ok_and(|s| s.success()), "raising {limit} in the agent's user namespace");
}

/// Whether an Event about the Node with UID `uid` (this run's: the Node is made anew, so an
/// earlier run's events do not count) with `reason` exists whose note contains `text`.
fn node_event(h: &Harness, uid: &str, reason: &str, text: &str) -> bool {
    let Some(events) = h.cp.get_json(&["events.events.k8s.io", "-A"]) else { return false };
    events["items"].as_array().is_some_and(|items| {
        items.iter().any(|e| {
            e["regarding"]["kind"] == "Node"
                && e["regarding"]["name"] == h.node.as_str()
                && e["regarding"]["uid"] == uid
                && e["reason"] == reason
                && e["note"].as_str().is_some_and(|n| n.contains(text))
        })
    })
}

fn degraded(agent: &AgentProcess, kind: &str, value: u8) -> bool {
    let line = format!("local_static_provisioner_watch_degraded{{kind=\"{kind}\"}} {value}");
    agent.admin_get("/metrics").contains(&line)
}

/// An agent short of `limit` says so (event, metric), and heals once it is raised.
fn exhausted_then_healed(name: &str, limit: &str, kind: &str, sysctl: &str) {
    let Some(h) = Harness::new(name) else { return };
    let (_, config) = three_classes(&h);
    let uid = h.recreate_node();
    let agent = agent_without(&h, &config, limit);
    let wait = Duration::from_secs(60);
    wait_until(&format!("{kind} degraded in the metric"), wait, || degraded(&agent, kind, 1).then_some(()));
    wait_until("the WatchesExhausted event on the Node", wait, || {
        node_event(&h, &uid, "WatchesExhausted", sysctl).then_some(())
    });
    assert!(node_event(&h, &uid, "WatchesExhausted", "periodic resync"), "the note says what is degraded");
    if kind == "instances" {
        assert_eq!(inotify_instances(agent.pid()), 0);
    }
    // Raised: the agent's own retries (at most 36 s apart) take it up, no restart.
    raise(agent.pid(), limit);
    let heal = Duration::from_secs(90);
    wait_until(&format!("{kind} healed in the metric"), heal, || degraded(&agent, kind, 0).then_some(()));
    wait_until("the WatchesRestored event on the Node", wait, || {
        node_event(&h, &uid, "WatchesRestored", "available again").then_some(())
    });
    assert_eq!(inotify_instances(agent.pid()), 1, "one instance once healed");
    let log = agent.log_text();
    assert!(log.contains("inotify exhausted") && log.contains("inotify restored"), "{log}");
}

#[test]
fn instances_exhausted_is_a_warning_and_a_metric_and_heals_when_the_limit_is_raised() {
    let _area = support::area(module_path!());
    exhausted_then_healed(
        "inotify_instances_exhausted",
        "max_inotify_instances",
        "instances",
        "fs.inotify.max_user_instances",
    );
}

#[test]
fn watches_exhausted_is_a_warning_and_a_metric_and_heals_when_the_limit_is_raised() {
    let _area = support::area(module_path!());
    exhausted_then_healed("inotify_watches_exhausted", "max_inotify_watches", "watches", "fs.inotify.max_user_watches");
}
