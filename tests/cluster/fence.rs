//! Volume fences against the real control plane (the kubelet side is tests/real_node.rs): two
//! ext4 disks swapped between their mount points get their PVs fenced by node labels that the
//! PVs' own node affinity forbids, lifted when the disks are put back; an agent that stops sets
//! the node-wide fence and the next one lifts it only after checking every disk, also when the
//! disks were swapped meanwhile; the boot hook (`fence-node`) sets it with a node's own
//! credentials. The agent runs under the ServiceAccount, RBAC and admission policy of deploy/.
//! Needs root.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use local_static_provisioner::core::fence::volume_fence::{FENCE_PREFIX, LABEL_VOLUMES_UNVERIFIED};
use local_static_provisioner::core::volumes::naming::pv_name;
use serde_json::Value;
use support::{AgentProcess, ControlPlane, LoopDevice, Mount, binary, require_root, run, wait_until, write_config};

const WAIT: Duration = Duration::from_secs(60);

/// An ext4 disk on a loop device, mounted at `at` (a swap remounts it elsewhere).
struct Disk {
    dev: LoopDevice,
    _mount: Option<Mount>,
}

impl Disk {
    fn new(scratch: &Path, name: &str, at: &Path) -> Disk {
        let dev = LoopDevice::new(&scratch.join(format!("{name}.img")), 64);
        run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev.device));
        let mut disk = Disk { dev, _mount: None };
        disk.mount_at(at);
        disk
    }

    fn mount_at(&mut self, at: &Path) {
        self._mount = None;
        std::fs::create_dir_all(at).unwrap();
        run(Command::new("mount").arg(&self.dev.device).arg(at));
        self._mount = Some(Mount { path: at.to_path_buf() });
    }

    fn unmount(&mut self) {
        self._mount = None;
    }
}

fn node_labels(cp: &ControlPlane, node: &str) -> serde_json::Map<String, Value> {
    cp.get_json(&["node", node]).and_then(|n| n["metadata"]["labels"].as_object().cloned()).unwrap_or_default()
}

fn label(cp: &ControlPlane, node: &str, key: &str) -> Option<String> {
    node_labels(cp, node).get(key).and_then(|v| v.as_str()).map(str::to_string)
}

fn fence_of(pv: &str) -> String {
    format!("{FENCE_PREFIX}{pv}")
}

/// The events of a claim with this reason.
fn claim_events(cp: &ControlPlane, claim: &str, reason: &str) -> Vec<String> {
    let list = cp
        .get_json(&[
            "events.v1.events.k8s.io",
            "-n",
            "default",
            "--field-selector",
            &format!("regarding.name={claim},reason={reason}"),
        ])
        .unwrap_or_default();
    list["items"].as_array().into_iter().flatten().filter_map(|e| e["note"].as_str().map(str::to_string)).collect()
}

/// Swaps the two disks between their mount points, as a reboot by device name would.
fn swap(a: &mut Disk, b: &mut Disk, path_a: &Path, path_b: &Path) {
    a.unmount();
    b.unmount();
    a.mount_at(path_b);
    b.mount_at(path_a);
}

fn put_back(a: &mut Disk, b: &mut Disk, path_a: &Path, path_b: &Path) {
    a.unmount();
    b.unmount();
    a.mount_at(path_a);
    b.mount_at(path_b);
}

#[test]
fn swapped_disks_are_fenced_on_the_node_and_an_agent_stop_fences_all_until_the_next_has_checked() {
    let _area = support::area(module_path!());
    if !require_root("swapped_disks_are_fenced_on_the_node_and_an_agent_stop_fences_all_until_the_next_has_checked") {
        return;
    }
    let cp = ControlPlane::get();
    // Named per process, like the class and the entries: what an earlier run on this control
    // plane left (Released PVs whose loop devices' backing files had the same inode numbers)
    // belongs to another node.
    let node = &format!("fence-swap-{}", std::process::id());
    cp.create_node(node);
    // A class per process: claims bind only to this run's PVs, never to ones an earlier run on
    // this control plane left Available.
    let class = format!("fence-fs-{}", std::process::id());
    cp.create_storage_class(&class, "Retain");
    let scratch = tempfile::tempdir().unwrap();
    let disks = scratch.path().join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    // Entries named per process: PVs an earlier run on this control plane left Released keep
    // their names.
    let (entry_a, entry_b) = (format!("a-{}", std::process::id()), format!("b-{}", std::process::id()));
    let (path_a, path_b) = (disks.join(&entry_a), disks.join(&entry_b));
    let mut a = Disk::new(scratch.path(), "a", &path_a);
    let mut b = Disk::new(scratch.path(), "b", &path_b);
    let config = scratch.path().join("config");
    let map = format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display());
    write_config(&config, &[("storageClassMap", &map)]);
    let kubeconfig = cp.agent_kubeconfig(scratch.path());
    let log = scratch.path().join("agent.log");
    let agent = AgentProcess::start(&config, node, &kubeconfig, &log);
    let (pv_a, pv_b) = (pv_name(&entry_a, node, &class), pv_name(&entry_b, node, &class));
    for pv in [&pv_a, &pv_b] {
        wait_until(&format!("PV {pv}"), WAIT, || cp.pv_state(pv));
        // Its affinity honours the fence: every term requires both labels to be absent.
        let terms = cp.get_json(&["pv", pv]).unwrap()["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].clone();
        let text = terms.to_string();
        assert!(text.contains(&fence_of(pv)) && text.contains(LABEL_VOLUMES_UNVERIFIED), "{text}");
    }
    // Bound to two tenants (no kubelet here: the pods stay Pending, the PVs Bound).
    let claims: Vec<(String, String)> = ["tenant-a", "tenant-b"]
        .iter()
        .map(|c| (c.to_string(), cp.bind_claim(&format!("fence-{}-{c}", std::process::id()), &class, false)))
        .collect();
    let claim_of = |pv: &str| {
        claims.iter().find(|(_, v)| v == pv).map(|(c, _)| format!("fence-{}-{c}", std::process::id())).unwrap()
    };
    assert!(label(&cp, node, &fence_of(&pv_a)).is_none() && label(&cp, node, &fence_of(&pv_b)).is_none());

    // The disks swap places: both PVs fenced within about a second, their claims told why.
    let swapped = Instant::now();
    swap(&mut a, &mut b, &path_a, &path_b);
    for pv in [&pv_a, &pv_b] {
        wait_until(&format!("{pv} fenced"), WAIT, || {
            (label(&cp, node, &fence_of(pv)).as_deref() == Some("not-its-disk")).then_some(())
        });
    }
    let fenced_in = swapped.elapsed();
    eprintln!("both PVs fenced {} ms after the swap", fenced_in.as_millis());
    assert!(fenced_in < Duration::from_secs(10), "fenced after {fenced_in:?}");
    for pv in [&pv_a, &pv_b] {
        let claim = claim_of(pv);
        // The note names the PV and whose disk is there.
        let other = if *pv == pv_a { &pv_b } else { &pv_a };
        let whose = format!("The disk there is the disk of PV {other}");
        wait_until(&format!("VolumeFenced on {claim} naming {other}"), WAIT, || {
            let notes = claim_events(&cp, &claim, "VolumeFenced");
            notes.iter().any(|n| n.contains(pv.as_str()) && n.contains(&whose)).then_some(())
        });
    }
    let metrics = agent.admin_get("/metrics");
    assert!(
        metrics
            .contains(&format!("local_static_provisioner_fenced_volumes{{pv=\"{pv_a}\",reason=\"not-its-disk\"}} 1")),
        "{metrics}"
    );

    // A fence label removed by hand is back within seconds: the agent watches its Node (no
    // resync in between: the default resync is minutes).
    let removed = Instant::now();
    cp.kubectl_ok(&["label", "node", node, &format!("{}-", fence_of(&pv_a))]);
    wait_until(&format!("{pv_a} fenced again"), WAIT, || {
        (label(&cp, node, &fence_of(&pv_a)).as_deref() == Some("not-its-disk")).then_some(())
    });
    let back_in = removed.elapsed();
    eprintln!("a fence label removed by hand was back {} ms later", back_in.as_millis());
    assert!(back_in < Duration::from_secs(5), "back after {back_in:?}");
    // The node-wide fence set while the agent runs (kubelet's start sets it so): the running
    // agent sees it and lifts it after a pass that checked the disks, the swapped ones fenced.
    cp.kubectl_ok(&["label", "node", node, &format!("{LABEL_VOLUMES_UNVERIFIED}=kubelet-restarted")]);
    wait_until("the node-wide fence lifted by the running agent", WAIT, || {
        label(&cp, node, LABEL_VOLUMES_UNVERIFIED).is_none().then_some(())
    });
    for pv in [&pv_a, &pv_b] {
        assert_eq!(label(&cp, node, &fence_of(pv)).as_deref(), Some("not-its-disk"), "{pv} stays fenced");
    }

    // Put back: both fences lifted, the claims told.
    put_back(&mut a, &mut b, &path_a, &path_b);
    for pv in [&pv_a, &pv_b] {
        wait_until(&format!("{pv} unfenced"), WAIT, || label(&cp, node, &fence_of(pv)).is_none().then_some(()));
        let claim = claim_of(pv);
        wait_until(&format!("VolumeUnfenced on {claim}"), WAIT, || {
            (!claim_events(&cp, &claim, "VolumeUnfenced").is_empty()).then_some(())
        });
    }

    // The agent stops: the node-wide fence goes up.
    let stopped_log = agent.stop();
    assert!(stopped_log.contains("node-wide volume fence set"), "{stopped_log}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("agent-stopped"));

    // Swapped while no agent runs. The next agent lifts the node-wide fence only with each
    // swapped PV fenced on its own: at no moment is either PV unfenced.
    swap(&mut a, &mut b, &path_a, &path_b);
    let agent = AgentProcess::start(&config, node, &kubeconfig, &scratch.path().join("agent2.log"));
    let deadline = Instant::now() + WAIT;
    loop {
        let labels = node_labels(&cp, node);
        let node_wide = labels.contains_key(LABEL_VOLUMES_UNVERIFIED);
        let own = |pv: &str| labels.get(&fence_of(pv)).and_then(|v| v.as_str()).map(str::to_string);
        for pv in [&pv_a, &pv_b] {
            assert!(node_wide || own(pv).is_some(), "{pv} was unfenced: {labels:?}");
        }
        if !node_wide {
            assert_eq!(own(&pv_a).as_deref(), Some("not-its-disk"));
            assert_eq!(own(&pv_b).as_deref(), Some("not-its-disk"));
            break;
        }
        assert!(Instant::now() < deadline, "the node-wide fence stayed: {labels:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    put_back(&mut a, &mut b, &path_a, &path_b);
    for pv in [&pv_a, &pv_b] {
        wait_until(&format!("{pv} unfenced"), WAIT, || label(&cp, node, &fence_of(pv)).is_none().then_some(()));
    }
    drop(agent);
    for (c, _) in &claims {
        cp.release_claim(&format!("fence-{}-{c}", std::process::id()));
    }
}

/// A kubeconfig with a client certificate of `user` in `group`, signed by the test CA (how
/// kubelet authenticates: O=system:nodes, CN=system:node:<name>).
fn cert_kubeconfig(cp: &ControlPlane, dir: &Path, user: &str, group: &str) -> PathBuf {
    let (key, csr, crt) = (dir.join("client.key"), dir.join("client.csr"), dir.join("client.crt"));
    // A version 3 certificate (rustls refuses version 1), for client authentication.
    let ext = dir.join("client.ext");
    std::fs::write(
        &ext,
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    run(Command::new("openssl")
        .args(["req", "-newkey", "rsa:2048", "-nodes", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&csr)
        .args(["-subj", &format!("/O={group}/CN={user}")]));
    run(Command::new("openssl")
        .args(["x509", "-req", "-in"])
        .arg(&csr)
        .arg("-CA")
        .arg(cp.dir.join("pki/ca.crt"))
        .arg("-CAkey")
        .arg(cp.dir.join("pki/ca.key"))
        .args(["-CAcreateserial", "-days", "1", "-extfile"])
        .arg(&ext)
        .arg("-out")
        .arg(&crt));
    let path = dir.join("node.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters: [{{name: local, cluster: {{server: \"{}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: u, user: {{client-certificate: \"{}\", client-key: \"{}\"}}}}]\ncontexts: [{{name: local, context: {{cluster: local, user: u}}}}]\ncurrent-context: local\n",
        cp.api_url,
        cp.dir.join("pki/ca.crt").display(),
        crt.display(),
        key.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `fence-node` with this test's own boot marker (the host's, under /run, is the real node's)
/// and state directory (whose lock tells whether an agent runs).
fn fence_node(node: &str, kubeconfig: &Path, wait: &str, marker: &Path) -> (i32, String) {
    let state = marker.parent().unwrap().join("state");
    let out = Command::new(binary())
        .args(["fence-node", "--node", node, "--wait", wait, "--kubeconfig"])
        .arg(kubeconfig)
        .arg("--boot-marker")
        .arg(marker)
        .arg("--state-dir")
        .arg(&state)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn the_boot_hook_sets_the_node_wide_fence_with_the_nodes_own_credentials_and_says_why_it_cannot() {
    let _area = support::area(module_path!());
    let cp = ControlPlane::get();
    let node = "fence-node-boot";
    cp.create_node(node);
    let scratch = tempfile::tempdir().unwrap();
    let creds = cert_kubeconfig(&cp, scratch.path(), &format!("system:node:{node}"), "system:nodes");
    // What a cluster's Node authorizer grants kubelets (the test control plane runs RBAC only;
    // tests/node/start.sh binds the same).
    cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: lsp-test-system-nodes}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node}\nsubjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:nodes}]\n",
    );
    let marker = scratch.path().join("run/boot-fenced");
    let (code, text) = fence_node(node, &creds, "30s", &marker);
    assert_eq!(code, 0, "{text}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("node-booted"), "{text}");
    assert!(marker.exists(), "the boot is noted as fenced");
    cp.kubectl_ok(&["label", "node", node, &format!("{LABEL_VOLUMES_UNVERIFIED}-")]);

    // kubelet restarted within the same boot while no agent holds the node (its state
    // directory's lock exists and is free: the agent was killed, its SIGTERM fence never set):
    // fenced again, nobody has checked the disks since the agent went.
    let state = marker.parent().unwrap().join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("lock"), b"").unwrap();
    let (code, text) = fence_node(node, &creds, "30s", &marker);
    assert_eq!(code, 0, "{text}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("agent-gone"), "{text}");
    assert!(text.contains("Gone"), "{text}");
    cp.kubectl_ok(&["label", "node", node, &format!("{LABEL_VOLUMES_UNVERIFIED}-")]);
    // ... and while an agent holds it (an exclusive flock on the lock, as the agent takes it):
    // fenced too, the running agent lifts it after a pass.
    let mut holder = Command::new("flock").arg("-o").arg(state.join("lock")).args(["sleep", "60"]).spawn().unwrap();
    wait_until("the lock held", WAIT, || {
        std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .any(|l| l.contains(&format!(" {} ", holder.id())))
            .then_some(())
    });
    let (code, text) = fence_node(node, &creds, "30s", &marker);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(code, 0, "{text}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("kubelet-restarted"), "{text}");
    assert!(text.contains("the running agent"), "{text}");
    cp.kubectl_ok(&["label", "node", node, &format!("{LABEL_VOLUMES_UNVERIFIED}-")]);
    // The next boot (an empty /run) says so.
    std::fs::remove_file(&marker).unwrap();
    let (code, text) = fence_node(node, &creds, "30s", &marker);
    assert_eq!(code, 0, "{text}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("node-booted"), "{text}");
    cp.kubectl_ok(&["label", "node", node, &format!("{LABEL_VOLUMES_UNVERIFIED}-")]);
    std::fs::remove_file(&marker).unwrap();

    // A node never registered (first boot): nothing to fence, kubelet may start.
    let (code, text) = fence_node("fence-node-never-registered", &creds, "30s", &marker);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("no such Node"), "{text}");

    // Credentials that may not label the Node: refused at once, exit 2, saying what to use.
    let (code, text) = fence_node(node, &cp.token_kubeconfig(scratch.path(), "nobody", "not-a-token"), "30s", &marker);
    assert_eq!(code, 2, "{text}");
    assert!(text.contains("kubelet's kubeconfig"), "{text}");

    // No API server: retried until --wait, then exit 1 (kubelet may start: it cannot learn of
    // any pod without the API either).
    let unreachable = scratch.path().join("unreachable.kubeconfig");
    let text = std::fs::read_to_string(&creds).unwrap().replace(&cp.api_url, "https://127.0.0.1:1");
    std::fs::write(&unreachable, text).unwrap();
    let started = Instant::now();
    let (code, text) = fence_node(node, &unreachable, "2s", &marker);
    assert_eq!(code, 1, "{text}");
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    assert!(text.contains("did not answer within 2s"), "{text}");
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED), None);
}

/// The heartbeat (issue 40): an agent killed without SIGTERM (SIGKILL, by its PID) sets no fence
/// itself; node-cleanup sees its heartbeat Lease lapse and fences the node (agent-gone) within
/// the Lease's duration and a few seconds; the next agent lifts it after its first pass. An
/// agent that is only stopped (SIGSTOP) past its Lease's duration gets its node fenced too, and
/// lifts the fence itself once it runs again (it watches its Node). Agent and node-cleanup run
/// with the ServiceAccounts and RBAC of deploy/.
#[test]
fn a_killed_agents_lapsed_heartbeat_fences_its_node_and_the_next_agent_lifts_it() {
    let _area = support::area(module_path!());
    if !require_root("a_killed_agents_lapsed_heartbeat_fences_its_node_and_the_next_agent_lifts_it") {
        return;
    }
    let cp = ControlPlane::get();
    let node = &format!("fence-hb-{}", std::process::id());
    cp.create_node(node);
    let class = format!("fence-hb-{}", std::process::id());
    cp.create_storage_class(&class, "Retain");
    let scratch = tempfile::tempdir().unwrap();
    let disks = scratch.path().join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    let config = scratch.path().join("config");
    write_config(
        &config,
        &[("storageClassMap", &format!("{class}:\n  hostDir: {d}\n  mountDir: {d}\n", d = disks.display()))],
    );
    let ns = "local-static-provisioner";
    let lease = format!("local-static-provisioner-agent-{node}");
    let kubeconfig = cp.agent_kubeconfig(scratch.path());
    let cleanup_kubeconfig = cp.node_cleanup_kubeconfig(scratch.path());
    let heartbeat = ["--heartbeat-namespace", ns];
    let start_agent =
        |log: &str| AgentProcess::start_with(&config, node, &kubeconfig, &scratch.path().join(log), &heartbeat);
    let unfenced = || label(&cp, node, LABEL_VOLUMES_UNVERIFIED).is_none().then_some(());
    let fenced_gone = || (label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref() == Some("agent-gone")).then_some(());

    let agent = start_agent("agent1.log");
    let heartbeat_lease = wait_until("the agent's heartbeat Lease", WAIT, || {
        cp.get_json(&["lease", "-n", ns, &lease]).filter(|l| l["spec"]["holderIdentity"] == node.as_str())
    });
    // Owned by its Node: the garbage collector removes it with the Node.
    let node_uid = cp.get_json(&["node", node.as_str()]).map(|n| n["metadata"]["uid"].clone());
    let owners = &heartbeat_lease["metadata"]["ownerReferences"];
    assert_eq!(
        (owners[0]["kind"].as_str(), owners[0]["name"].as_str()),
        (Some("Node"), Some(node.as_str())),
        "{owners}"
    );
    assert_eq!(node_uid.as_ref(), Some(&owners[0]["uid"]), "{owners}");
    // The starting agent's own fence (agent-stopped) lifted after its first pass.
    wait_until("the starting agent's fence lifted", WAIT, unfenced);
    let lease_name = format!("{class}-lease");
    let cleanup = AgentProcess::start_node_cleanup(
        &cleanup_kubeconfig,
        &scratch.path().join("node-cleanup.log"),
        &["--storage-classes", &class, "--lease-name", &lease_name, "--resync-period", "10m"],
    );
    wait_until("node-cleanup leads", WAIT, || cleanup.log_text().contains("leadership acquired").then_some(()));

    // Stopped, not killed: its Lease lapses, node-cleanup fences; resumed, it lifts the fence.
    let pid = nix::unistd::Pid::from_raw(agent.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Instant::now();
    wait_until("node-cleanup fences the stopped agent's node", Duration::from_secs(40 + 15), fenced_gone);
    let took = stopped.elapsed();
    assert!(
        took >= Duration::from_secs(25),
        "fenced after {took:?}: before the Lease (40 s, renewed every 10 s) lapsed"
    );
    assert!(took <= Duration::from_secs(40 + 8), "fenced after {took:?}: lease duration + a few seconds expected");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    wait_until("the resumed agent lifts node-cleanup's fence", WAIT, unfenced);

    // Killed without SIGTERM: nothing of its own fences; node-cleanup does.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
    let killed = Instant::now();
    drop(agent);
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED), None, "a SIGKILLed agent sets nothing itself");
    wait_until("node-cleanup fences the killed agent's node", Duration::from_secs(40 + 15), fenced_gone);
    let took = killed.elapsed();
    assert!(took <= Duration::from_secs(40 + 8), "fenced after {took:?}: lease duration + a few seconds expected");
    // It stays fenced while no agent runs (node-cleanup never lifts it).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(label(&cp, node, LABEL_VOLUMES_UNVERIFIED).as_deref(), Some("agent-gone"));
    assert!(cleanup.log_text().contains("the agent's heartbeat lapsed"), "node-cleanup says why");

    // The next agent checks the disks and lifts it.
    let agent = start_agent("agent2.log");
    wait_until("the next agent lifts the fence", WAIT, unfenced);
    agent.stop();
    cleanup.stop();
    cp.kubectl_ok(&["delete", "lease", "-n", ns, &lease, "--ignore-not-found"]);
}
