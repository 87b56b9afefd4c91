//! The metrics every process exposes: its build (`local_static_provisioner_build_info`) and
//! the standard `process_*` figures read from /proc at each scrape.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;

/// Registers the build-info gauge and the process collector in `registry`.
pub(super) fn register(registry: &mut Registry) {
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&BuildLabels {
            version: crate::build_info::VERSION.into(),
            commit: crate::build_info::GIT_COMMIT.into(),
            build_date: crate::build_info::BUILD_DATE.into(),
            rustc: crate::build_info::RUSTC_VERSION.into(),
            target: crate::build_info::TARGET.into(),
        })
        .set(1);
    registry.register(
        "local_static_provisioner_build_info",
        "Always 1; the labels say which version, git commit, build date, rustc and target run",
        build_info,
    );
    registry.register_collector(Box::new(ProcessCollector));
}

/// Labels of the build-info metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
    build_date: String,
    rustc: String,
    target: String,
}

/// The standard `process_*` metrics (client_golang's names, types and help), read from /proc
/// at each scrape; a figure that cannot be read is left out of that scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
            let metric = ConstGauge::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
        }
        use crate::host::process;
        match process::read_stats() {
            Ok(stats) => {
                let cpu = ConstCounter::new(stats.cpu_seconds);
                cpu.encode(encoder.encode_descriptor(
                    "process_cpu_seconds",
                    "Total user and system CPU time spent in seconds.",
                    None,
                    cpu.metric_type(),
                )?)?;
                gauge(
                    &mut encoder,
                    "process_resident_memory_bytes",
                    "Resident memory size in bytes.",
                    stats.resident_bytes as f64,
                )?;
                gauge(
                    &mut encoder,
                    "process_virtual_memory_bytes",
                    "Virtual memory size in bytes.",
                    stats.virtual_bytes as f64,
                )?;
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds.",
                    stats.start_time_seconds,
                )?;
            }
            Err(e) => tracing::debug!(error = %e, "process metrics left out of this scrape"),
        }
        match process::open_fds() {
            Ok(n) => gauge(&mut encoder, "process_open_fds", "Number of open file descriptors.", n as f64)?,
            Err(e) => tracing::debug!(error = %e, "process_open_fds left out of this scrape"),
        }
        // Unlimited is 2^64 - 1 in client_golang's output (procfs reads "unlimited" so); an
        // unlimited file limit does not happen on Linux (RLIMIT_NOFILE is capped by nr_open).
        let (max_fds, max_vm) = process::limits();
        if let Some(n) = max_fds {
            gauge(&mut encoder, "process_max_fds", "Maximum number of open file descriptors.", n as f64)?;
        }
        gauge(
            &mut encoder,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            max_vm.map_or(u64::MAX as f64, |n| n as f64),
        )?;
        Ok(())
    }
}
