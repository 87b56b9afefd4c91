//! Prometheus metrics. Upstream's metrics keep their names, types, labels and label values
//! (pkg/metrics of the Go provisioner and of its node-cleanup), and the standard `process_*`
//! metrics its Go client exposed, so existing dashboards and alerts keep working after the
//! image swap; ours are added under `local_static_provisioner_`. docs/operations.md and
//! docs/node-cleanup.md list them. One file per role's family groups (`agent`, `node_cleanup`)
//! and one for what every process exposes (`process`); the API's, common to both, are here.

mod agent;
mod node_cleanup;
mod process;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use agent::{Claims, Health, Passes, Published, Wipes};
pub use agent::{FinishedWipe, WipeRunning};
use node_cleanup::Cleanup;

/// client_golang's `prometheus.DefBuckets`, which upstream's histograms use: dashboards that
/// pick a bucket (`le="1"`) find the same ones.
const GO_DEFAULT_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upstream's `mode` label values are Kubernetes volume modes ("Filesystem", "Block"); the
/// agent's callers say "fs" and "block".
fn upstream_mode(mode: &str) -> String {
    match mode {
        "fs" => "Filesystem".into(),
        "block" => "Block".into(),
        other => other.into(),
    }
}

/// Labels with only a volume mode.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModeLabels {
    mode: String,
}

/// All metrics of the agent, cheap to clone and share between tasks.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Registry,
    api: Api,
    published: Published,
    claims: Claims,
    wipes: Wipes,
    passes: Passes,
    health: Health,
    cleanup: Cleanup,
}

/// Which process the metrics belong to: each exposes only its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The per-node agent.
    Agent,
    /// The node-cleanup Deployment.
    NodeCleanup,
}

/// Labels of upstream's API request metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

/// Upstream's API request metrics, common to both roles.
struct Api {
    api_requests: Family<MethodLabels, Counter>,
    api_requests_failed: Family<MethodLabels, Counter>,
    api_duration: Family<MethodLabels, Histogram>,
}

impl Api {
    /// The families, registered in `registry`.
    fn register(registry: &mut Registry) -> Self {
        let group = Api {
            api_requests: Family::default(),
            api_requests_failed: Family::default(),
            api_duration: Family::new_with_constructor(|| Histogram::new(GO_DEFAULT_BUCKETS)),
        };
        registry.register(
            "local_volume_provisioner_apiserver_requests",
            "API requests made by the agent, watches excluded (upstream name)",
            group.api_requests.clone(),
        );
        registry.register(
            "local_volume_provisioner_apiserver_requests_failed",
            "API requests that failed (upstream name)",
            group.api_requests_failed.clone(),
        );
        registry.register(
            "local_volume_provisioner_apiserver_requests_duration_seconds",
            "Duration of API requests (upstream name)",
            group.api_duration.clone(),
        );
        group
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The agent's metrics.
    pub fn new() -> Self {
        Self::for_role(Role::Agent)
    }

    /// Registers the metrics of `role` (API request metrics are common to both).
    pub fn for_role(role: Role) -> Self {
        let mut registry = Registry::default();
        process::register(&mut registry);
        let api = Api::register(&mut registry);
        // Each process exposes only its own metrics; the other role's go to a registry nobody reads.
        let mut unused = Registry::default();
        let (agent_registry, cleanup_registry) = match role {
            Role::Agent => (&mut registry, &mut unused),
            Role::NodeCleanup => (&mut unused, &mut registry),
        };
        let published = Published::register(agent_registry);
        let claims = Claims::register(agent_registry);
        let wipes = Wipes::register(agent_registry);
        let passes = Passes::register(agent_registry);
        let health = Health::register(agent_registry);
        let cleanup = Cleanup::register(cleanup_registry);
        Metrics { inner: Arc::new(Inner { registry, api, published, claims, wipes, passes, health, cleanup }) }
    }

    /// Records one API request.
    pub fn api_request(&self, method: &str, ok: bool, elapsed: Duration) {
        let labels = MethodLabels { method: method.to_string() };
        self.inner.api.api_requests.get_or_create(&labels).inc();
        if !ok {
            self.inner.api.api_requests_failed.get_or_create(&labels).inc();
        }
        self.inner.api.api_duration.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::agent::capacity_breakdown;
    use super::*;

    /// The type a `# TYPE` line gives `name` (OpenMetrics names a counter without `_total`).
    fn type_of<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.strip_prefix("# TYPE ")?.strip_prefix(name)?.strip_prefix(' '))
    }

    fn assert_types(text: &str, expected: &[(&str, &str)]) {
        for (name, kind) in expected {
            assert_eq!(type_of(text, name), Some(*kind), "# TYPE of {name} in:\n{text}");
        }
    }

    fn assert_lines(text: &str, lines: &[&str]) {
        for line in lines {
            assert!(text.lines().any(|l| l == *line), "missing line {line:?} in:\n{text}");
        }
    }

    fn finished<'a>(mode: &'a str, ok: bool, capacity_bytes: u64, cleanup_command: &'a str) -> FinishedWipe<'a> {
        FinishedWipe {
            mode,
            ok,
            elapsed: Duration::from_millis(300),
            bytes_wiped: 4096,
            capacity_bytes,
            cleanup_command,
        }
    }

    #[test]
    fn upstream_agent_metrics_keep_their_names_types_and_labels() {
        let m = Metrics::new();
        let gib = 1024 * 1024 * 1024;
        m.wipe_finished(&finished("fs", true, 10 * gib, "/scripts/quick_reset.sh"));
        m.wipe_finished(&finished("block", true, 600 * gib, ""));
        m.wipe_finished(&finished("block", false, 600 * gib, ""));
        m.pv_created("fs", 10 * gib);
        m.pv_created("fs", 5 * gib);
        m.set_volumes(&std::collections::BTreeMap::from([("Bound".to_string(), 3)]));
        m.set_flagged(1, 0, 2);
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        m.api_request("create", true, Duration::from_millis(3));
        m.api_request("create", false, Duration::from_millis(3));
        let text = m.encode();
        // pkg/metrics/metrics.go of the Go provisioner.
        assert_types(
            &text,
            &[
                ("local_volume_provisioner_persistentvolume_capacity_bytes", "gauge"),
                ("local_volume_provisioner_persistentvolume_discovery", "counter"),
                ("local_volume_provisioner_persistentvolume_discovery_duration_seconds", "histogram"),
                ("local_volume_provisioner_persistentvolume_delete", "counter"),
                ("local_volume_provisioner_persistentvolume_delete_failed", "counter"),
                ("local_volume_provisioner_persistentvolume_delete_duration_seconds", "histogram"),
                ("local_volume_provisioner_apiserver_requests", "counter"),
                ("local_volume_provisioner_apiserver_requests_failed", "counter"),
                ("local_volume_provisioner_apiserver_requests_duration_seconds", "histogram"),
                ("local_volume_provisioner_proctable_running", "gauge"),
            ],
        );
        assert_lines(
            &text,
            &[
                // Kubernetes volume modes, as upstream's label values.
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Filesystem\"} 16106127360",
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Block\"} 0",
                "local_volume_provisioner_persistentvolume_discovery_total{mode=\"Filesystem\"} 2",
                "local_volume_provisioner_persistentvolume_delete_total{mode=\"Filesystem\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_total{mode=\"Block\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_failed_total{mode=\"Block\",type=\"process\"} 1",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_count{mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 1",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_count{mode=\"Block\",type=\"process\",capacity=\"1000G\",cleanup_command=\"\"} 1",
                // client_golang's DefBuckets.
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket{le=\"0.25\",mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 0",
                "local_volume_provisioner_persistentvolume_delete_duration_seconds_bucket{le=\"0.5\",mode=\"Filesystem\",type=\"process\",capacity=\"500G\",cleanup_command=\"/scripts/quick_reset.sh\"} 1",
                "local_volume_provisioner_persistentvolume_discovery_duration_seconds_count{mode=\"all\"} 1",
                "local_volume_provisioner_apiserver_requests_total{method=\"create\"} 2",
                "local_volume_provisioner_apiserver_requests_failed_total{method=\"create\"} 1",
                "local_volume_provisioner_proctable_running 0",
                "local_static_provisioner_wipe_bytes_total{mode=\"Filesystem\"} 4096",
                "local_static_provisioner_volumes{state=\"Bound\"} 3",
                "local_static_provisioner_volumes{state=\"Available\"} 0",
                "local_static_provisioner_flagged_volumes{flag=\"missing\"} 1",
                "local_static_provisioner_flagged_volumes{flag=\"stale\"} 0",
                "local_static_provisioner_flagged_volumes{flag=\"moved\"} 2",
            ],
        );
        // A failed wipe has no duration, as upstream.
        assert!(!text.contains(
            "delete_duration_seconds_count{mode=\"Block\",type=\"process\",capacity=\"1000G\",cleanup_command=\"\"} 2"
        ));
        assert!(!text.contains("node_cleanup"), "the agent exposes no node-cleanup metrics");

        // The capacity gauge is the last pass's: a pass that publishes nothing sets it to 0.
        m.pv_created("block", 64 * 1024 * 1024);
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        m.pass_done(Duration::from_millis(20), Duration::from_millis(5));
        let text = m.encode();
        assert_lines(
            &text,
            &[
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Filesystem\"} 0",
                "local_volume_provisioner_persistentvolume_capacity_bytes{mode=\"Block\"} 0",
            ],
        );
    }

    #[test]
    fn capacity_label_is_upstreams_500g_breakdown() {
        let gib = 1024 * 1024 * 1024;
        assert_eq!(capacity_breakdown(0), "0G");
        assert_eq!(capacity_breakdown(1), "500G");
        assert_eq!(capacity_breakdown(500 * gib), "500G");
        assert_eq!(capacity_breakdown(500 * gib + 1), "1000G");
        assert_eq!(capacity_breakdown(1400 * gib), "1500G");
    }

    #[test]
    fn running_wipes_are_counted_until_they_end() {
        let m = Metrics::new();
        let first = m.wipe_running();
        let second = m.wipe_running();
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 2"]);
        drop(first);
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 1"]);
        drop(second);
        assert_lines(&m.encode(), &["local_volume_provisioner_proctable_running 0"]);
    }

    #[test]
    fn both_roles_expose_process_and_build_info() {
        for role in [Role::Agent, Role::NodeCleanup] {
            let text = Metrics::for_role(role).encode();
            assert_types(
                &text,
                &[
                    ("process_cpu_seconds", "counter"),
                    ("process_resident_memory_bytes", "gauge"),
                    ("process_virtual_memory_bytes", "gauge"),
                    ("process_virtual_memory_max_bytes", "gauge"),
                    ("process_open_fds", "gauge"),
                    ("process_max_fds", "gauge"),
                    ("process_start_time_seconds", "gauge"),
                    ("local_static_provisioner_build_info", "gauge"),
                ],
            );
            let value = |name: &str| -> f64 {
                let line =
                    text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
                line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{line}"))
            };
            assert!(value("process_resident_memory_bytes") > 0.0);
            assert!(value("process_open_fds") >= 3.0);
            assert!(value("process_start_time_seconds") > 1.6e9);
            // Ticks of 10 ms: a test process may not have used one yet.
            assert!(value("process_cpu_seconds_total") >= 0.0);
            let build = format!(
                "local_static_provisioner_build_info{{version=\"{}\",commit=\"{}\",build_date=\"{}\",rustc=\"{}\",target=\"{}\"}} 1",
                crate::build_info::VERSION,
                crate::build_info::GIT_COMMIT,
                crate::build_info::BUILD_DATE,
                crate::build_info::RUSTC_VERSION,
                crate::build_info::TARGET
            );
            assert_lines(&text, &[&build]);
        }
    }

    #[test]
    fn node_cleanup_exposes_upstreams_and_its_own() {
        let m = Metrics::for_role(Role::NodeCleanup);
        m.node_cleanup_action("delete_claim", "node_gone", true);
        m.node_cleanup_action("delete_claim", "node_gone", false);
        m.node_cleanup_action("delete_pv", "stale", false);
        m.node_cleanup_pv_delete("Released", true);
        m.node_cleanup_pv_delete("Available", false);
        m.set_leader(true);
        m.set_absent_nodes(2);
        m.nodes_unreadable();
        m.api_request("delete", true, Duration::from_millis(3));
        let text = m.encode();
        // pkg/metrics/node-cleanup/metrics.go of the Go provisioner.
        assert_types(
            &text,
            &[
                ("local_volume_node_cleanup_persistentvolume_delete", "counter"),
                ("local_volume_node_cleanup_persistentvolume_delete_failed", "counter"),
                ("local_volume_node_cleanup_persistentvolumeclaim_delete", "counter"),
                ("local_volume_node_cleanup_persistentvolumeclaim_delete_failed", "counter"),
            ],
        );
        assert_lines(
            &text,
            &[
                "local_volume_node_cleanup_persistentvolume_delete_total{phase=\"Released\"} 1",
                "local_volume_node_cleanup_persistentvolume_delete_failed_total{phase=\"Available\"} 1",
                "local_volume_node_cleanup_persistentvolumeclaim_delete_total 1",
                "local_volume_node_cleanup_persistentvolumeclaim_delete_failed_total 1",
                "local_static_provisioner_node_cleanup_actions_total{action=\"delete_claim\",cause=\"node_gone\"} 1",
                "local_static_provisioner_node_cleanup_failures_total{action=\"delete_pv\",cause=\"stale\"} 1",
                "local_static_provisioner_node_cleanup_leader 1",
                "local_static_provisioner_node_cleanup_absent_nodes 2",
                "local_static_provisioner_node_cleanup_nodes_unreadable_total 1",
                "local_volume_provisioner_apiserver_requests_total{method=\"delete\"} 1",
            ],
        );
        assert!(!text.contains("persistentvolume_capacity"), "no agent metrics in node-cleanup:\n{text}");
        assert!(!text.contains("local_volume_provisioner_persistentvolume_delete"), "{text}");
    }
}
