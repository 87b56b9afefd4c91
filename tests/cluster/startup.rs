//! Start-up against an API server that is not there or refuses us, and `discover`'s output
//! applied to a real control plane with setPVOwnerRef: what a new user meets first.
//!
//! - a closed port: the agent names the API URL and the refused connection, keeps retrying
//!   (same loop, log-once and /readyz reason as a Node that is not registered yet), and stops
//!   cleanly on SIGTERM;
//! - the real control plane: a Node not registered yet, then registered; a token it refuses;
//! - `discover --output json | kubectl apply -f -` without --node-uid: no owner reference, and
//!   the garbage collector leaves the PV alone, while the same PV with an owner UID that is not
//!   the Node's is deleted by it (which shows the collector ran).

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{ControlPlane, binary, mount_tmpfs, require_root, wait_until, write_config};

/// The agent run as a user would: no RUST_LOG (the default log filter is part of what is
/// tested), its log in a file; killed by its PID when dropped.
struct Agent {
    child: Child,
    log: std::path::PathBuf,
}

impl Agent {
    fn start(dir: &Path, node: &str, kubeconfig: &Path) -> Agent {
        let config = dir.join("config");
        write_config(&config, &[("storageClassMap", "")]);
        let log = dir.join(format!("{node}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(binary())
            .args(["run", "--node-name", node, "--listen-address", "127.0.0.1:0"])
            .arg("--config-dir")
            .arg(&config)
            .arg("--state-dir")
            .arg(dir.join(format!("state-{node}")))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("RUST_LOG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap();
        Agent { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn readyz(&self) -> String {
        support::admin_get(|| self.log(), "/readyz")
    }

    /// SIGTERM, then the exit status and the whole log.
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let status = self.child.wait().unwrap();
        (status, self.log())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("----- agent log {} -----\n{}", self.log.display(), self.log());
        }
    }
}

fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("closed.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: {server}, insecure-skip-tls-verify: true}}}}]\nusers: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: c, context: {{cluster: c, user: u}}}}]\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

/// How many log lines contain `needle`.
fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn a_closed_port_is_named_with_its_cause_and_retried_like_a_missing_node() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    // A port that was just free and is closed now: connecting is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let server = format!("https://127.0.0.1:{port}");
    let agent = Agent::start(dir.path(), "closed-port-node", &kubeconfig(dir.path(), &server));
    let expected = format!("cannot reach the API server at {server}/: watch node closed-port-node: ");
    let ready = wait_until("/readyz to name the API server", Duration::from_secs(30), || {
        let ready = agent.readyz();
        ready.contains(&expected).then_some(ready)
    });
    assert!(ready.starts_with("HTTP/1.1 503"), "not ready while the API server is unreachable: {ready}");
    assert!(ready.contains("Connection refused"), "the cause, not just \"client error (Connect)\": {ready}");
    // Backoff from 0.5 s doubling: four or more tries in 8 s, still running, said once.
    std::thread::sleep(Duration::from_secs(8));
    let log = agent.log();
    assert_eq!(count(&log, &expected), 1, "said once per distinct cause, as a missing Node:\n{log}");
    assert_eq!(count(&log, "ERROR"), 0, "no ERROR line per retry (kube's request trace is off by default):\n{log}");
    assert!(log.contains(&format!("server={server}/")), "the API server is named at start-up:\n{log}");
    let (status, log) = agent.stop();
    assert!(status.success(), "a SIGTERM while waiting is a clean stop: {status}\n{log}");
    assert!(log.contains("stopped before the Node could be read"), "{log}");
}

#[test]
fn a_missing_node_and_a_refused_token_on_the_real_control_plane() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let dir = tempfile::tempdir().unwrap();
    let node = format!("startup-missing-{}", std::process::id());
    let agent_kubeconfig = cp.agent_kubeconfig(dir.path());
    let agent = Agent::start(dir.path(), &node, &agent_kubeconfig);
    let waiting = "Node object not found yet; waiting for it to register";
    let ready = wait_until("/readyz to say the Node is missing", Duration::from_secs(30), || {
        let ready = agent.readyz();
        ready.contains(waiting).then_some(ready)
    });
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(count(&agent.log(), waiting), 1, "said once:\n{}", agent.log());
    // The same loop goes on once the Node registers.
    cp.create_node(&node);
    wait_until("the agent to start once its Node exists", Duration::from_secs(60), || {
        agent.log().contains("agent starting").then_some(())
    });
    let (status, _) = agent.stop();
    assert!(status.success());
    cp.kubectl_ok(&["delete", "node", &node]);

    // A token the API server does not know: 401, named as a credentials problem at the URL.
    let bad = cp.token_kubeconfig(dir.path(), "bad-token", "not-a-valid-token");
    let agent = Agent::start(dir.path(), "startup-bad-token", &bad);
    let expected = format!("the API server at {}/ does not accept our credentials", cp.api_url.trim_end_matches('/'));
    let ready = wait_until("/readyz to say the credentials are refused", Duration::from_secs(30), || {
        let ready = agent.readyz();
        ready.contains(&expected).then_some(ready)
    });
    assert!(ready.contains("401") || ready.contains("Unauthorized"), "{ready}");
    let (status, _) = agent.stop();
    assert!(status.success());
}

/// `discover` of one tmpfs in a class with setPVOwnerRef, as JSON.
fn discover(config: &Path, node: &str, uid: Option<&str>) -> (Value, String) {
    let mut cmd = Command::new(binary());
    cmd.args(["discover", "--node-name", node, "--output", "json"]).arg("--config-dir").arg(config);
    if let Some(uid) = uid {
        cmd.args(["--node-uid", uid]);
    }
    let out = cmd.env_remove("NODE_UID").output().unwrap();
    assert!(out.status.success(), "discover: {}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).unwrap(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn discover_output_applied_with_owner_refs_survives_garbage_collection() {
    let _area = support::area(module_path!());
    if !require_root("discover_output_applied_with_owner_refs_survives_garbage_collection") {
        return;
    }
    let cp = ControlPlane::get();
    let dir = tempfile::tempdir().unwrap();
    let node = format!("startup-gc-{}", std::process::id());
    let uid = cp.create_node(&node);
    let volumes = dir.path().join("disks");
    let _mount = mount_tmpfs(&volumes.join("vol1"), 8);
    // One class per case, so each case's PV has its own name.
    let config_for = |class: &str| {
        let config = dir.path().join(format!("config-{class}"));
        let map = format!("{class}:\n  hostDir: {0}\n  mountDir: {0}\n", volumes.display());
        write_config(&config, &[("storageClassMap", &map), ("setPVOwnerRef", "true\n")]);
        config
    };
    let apply = |list: &Value| {
        let out = cp.kubectl_stdin(&cp.kubeconfig, &["apply", "-f", "-"], Some(&list.to_string()));
        assert!(out.status.success(), "kubectl apply: {}", String::from_utf8_lossy(&out.stderr));
    };
    let name_of = |list: &Value| list["items"][0]["metadata"]["name"].as_str().unwrap().to_string();

    // No --node-uid: no owner reference at all, and a warning that says how to add it.
    let (without, stderr) = discover(&config_for("gc-no-uid"), &node, None);
    assert_eq!(without["items"].as_array().map(Vec::len), Some(1), "{without}");
    assert!(without["items"][0]["metadata"].get("ownerReferences").is_none(), "{without}");
    assert!(stderr.contains("WITHOUT their ownerReference"), "{stderr}");
    assert!(stderr.contains(&format!("kubectl get node {node} -o jsonpath='{{.metadata.uid}}'")), "{stderr}");
    // The real UID: the owner reference is the Node's.
    let (with_uid, _) = discover(&config_for("gc-real-uid"), &node, Some(&uid));
    assert_eq!(with_uid["items"][0]["metadata"]["ownerReferences"][0]["uid"], uid.as_str(), "{with_uid}");
    // A well-formed UID that is not the Node's: what a placeholder amounts to for the collector.
    let (wrong, _) = discover(&config_for("gc-wrong-uid"), &node, Some("00000000-0000-4000-8000-000000000000"));
    let (no_uid_pv, real_pv, wrong_pv) = (name_of(&without), name_of(&with_uid), name_of(&wrong));
    apply(&without);
    apply(&with_uid);
    apply(&wrong);

    // The collector deletes the PV whose owner does not exist (our finalizer keeps it
    // Terminating): proof that it ran over these PVs.
    let deleting = |pv: &str| cp.get_json(&["pv", pv]).is_some_and(|v| v["metadata"]["deletionTimestamp"].is_string());
    wait_until("the garbage collector to delete the PV with a wrong owner UID", Duration::from_secs(90), || {
        deleting(&wrong_pv).then_some(())
    });
    std::thread::sleep(Duration::from_secs(5));
    assert!(!deleting(&no_uid_pv), "the PV discover printed without --node-uid survives the garbage collector");
    assert!(!deleting(&real_pv), "the PV owned by the real Node survives");

    for pv in [&no_uid_pv, &real_pv, &wrong_pv] {
        cp.kubectl_ok(&["patch", "pv", pv, "--type=merge", "-p", r#"{"metadata":{"finalizers":null}}"#]);
        let _ = cp.kubectl(&["delete", "pv", pv, "--wait=false"]);
    }
    cp.kubectl_ok(&["delete", "node", &node]);
}

#[test]
fn discover_refuses_a_node_uid_that_is_not_one() {
    let _area = support::area(module_path!());
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &[("storageClassMap", ""), ("setPVOwnerRef", "true\n")]);
    let out = Command::new(binary())
        .args(["discover", "--node-name", "n1", "--node-uid", "REPLACE-WITH-NODE-UID", "--config-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(out.stdout.is_empty(), "nothing printed to apply");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a Node UID") && err.contains("--node-uid"), "{err}");
}
