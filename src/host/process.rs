//! This process's own resource use, read from /proc at each metrics scrape for the standard
//! Prometheus `process_*` metrics (the Go provisioner exposed them through client_golang, so
//! dashboards and alerts on CPU, memory and file descriptors keep working after the swap).
//!
//! Read here rather than through a crate: the one collector written for prometheus-client
//! (kubert-prometheus-process) is built against an older prometheus-client than ours and pulls
//! in procfs; the four files and one rlimit needed are a few lines with rustix.

use std::path::PathBuf;

/// Why a figure could not be read; the metrics it feeds are left out of that scrape.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProcessStatsError {
    /// A /proc file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A /proc file did not have the expected layout.
    #[error("unexpected content in {path}: {what}")]
    Parse { path: PathBuf, what: String },
}

/// Fields of /proc/self/stat the process metrics need, in the kernel's units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StatFields {
    /// User-mode CPU time, clock ticks.
    pub utime_ticks: u64,
    /// Kernel-mode CPU time, clock ticks.
    pub stime_ticks: u64,
    /// Start time after boot, clock ticks.
    pub start_ticks: u64,
    /// Virtual memory size, bytes.
    pub vsize_bytes: u64,
    /// Resident set size, pages.
    pub rss_pages: u64,
}

/// The process figures behind the `process_*` metrics, in the units the metrics use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ProcessStats {
    /// User plus system CPU time, seconds.
    pub cpu_seconds: f64,
    /// Resident memory, bytes.
    pub resident_bytes: u64,
    /// Virtual memory, bytes.
    pub virtual_bytes: u64,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: f64,
}

/// Parses a /proc/PID/stat line. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so the fields are counted from the last ')'.
pub(crate) fn parse_stat(text: &str) -> Result<StatFields, String> {
    let after = text.rfind(')').map(|i| &text[i + 1..]).ok_or("no ')' after the command name")?;
    // After the name: field 3 (state) is index 0 here, so field N is index N - 3.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, String> {
        let raw = fields.get(n - 3).ok_or_else(|| format!("only {} fields after the command name", fields.len()))?;
        raw.parse::<u64>().map_err(|e| format!("field {n} {raw:?}: {e}"))
    };
    Ok(StatFields {
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_ticks: field(22)?,
        vsize_bytes: field(23)?,
        rss_pages: field(24)?,
    })
}

/// The boot time (`btime`, seconds since the epoch) from /proc/stat.
pub(crate) fn parse_boot_time(text: &str) -> Result<u64, String> {
    let line = text.lines().find_map(|l| l.strip_prefix("btime ")).ok_or("no btime line")?;
    line.trim().parse::<u64>().map_err(|e| format!("btime {line:?}: {e}"))
}

/// Converts the kernel's units: ticks by `ticks_per_second`, pages by `page_size`.
pub(crate) fn stats_from(stat: &StatFields, boot_time: u64, ticks_per_second: u64, page_size: u64) -> ProcessStats {
    let ticks = ticks_per_second.max(1) as f64;
    ProcessStats {
        cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / ticks,
        resident_bytes: stat.rss_pages.saturating_mul(page_size),
        virtual_bytes: stat.vsize_bytes,
        start_time_seconds: boot_time as f64 + stat.start_ticks as f64 / ticks,
    }
}

fn read(path: &str) -> Result<String, ProcessStatsError> {
    std::fs::read_to_string(path).map_err(|source| ProcessStatsError::Read { path: path.into(), source })
}

/// CPU, memory and start time of this process.
pub(crate) fn read_stats() -> Result<ProcessStats, ProcessStatsError> {
    fn parse_err(path: &'static str) -> impl FnOnce(String) -> ProcessStatsError {
        move |what| ProcessStatsError::Parse { path: path.into(), what }
    }
    let stat = parse_stat(&read("/proc/self/stat")?).map_err(parse_err("/proc/self/stat"))?;
    let boot = parse_boot_time(&read("/proc/stat")?).map_err(parse_err("/proc/stat"))?;
    let ticks = rustix::param::clock_ticks_per_second();
    let page = rustix::param::page_size() as u64;
    Ok(stats_from(&stat, boot, ticks, page))
}

/// How many file descriptors this process has open (entries of /proc/self/fd, less the one the
/// listing itself holds).
pub(crate) fn open_fds() -> Result<u64, ProcessStatsError> {
    let path = "/proc/self/fd";
    let err = |source| ProcessStatsError::Read { path: path.into(), source };
    let mut n = 0u64;
    for entry in std::fs::read_dir(path).map_err(err)? {
        entry.map_err(err)?;
        n += 1;
    }
    Ok(n.saturating_sub(1))
}

/// The soft limits on open files and on address space; `None` when unlimited.
pub(crate) fn limits() -> (Option<u64>, Option<u64>) {
    use rustix::process::{Resource, getrlimit};
    (getrlimit(Resource::Nofile).current, getrlimit(Resource::As).current)
}

#[cfg(test)]
mod tests {
    use super::*;

    // A real line (systemd's), with fields 14, 15, 22, 23, 24 changed to tell them apart.
    const STAT: &str = "1 (sys temd) (x) S 0 1 1 0 -1 4194560 61434 6390823 157 2519 \
        1234 567 18862 7046 20 0 1 0 42000 176226304 3071 18446744073709551615 1 1 0 0 0 0 \
        671173123 4096 1260 0 0 0 17 0 0 0 15 0 0 0 0 0 0 0 0 0 0";

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let f = parse_stat(STAT).unwrap();
        assert_eq!(
            f,
            StatFields {
                utime_ticks: 1234,
                stime_ticks: 567,
                start_ticks: 42000,
                vsize_bytes: 176_226_304,
                rss_pages: 3071
            }
        );
    }

    #[test]
    fn malformed_stat_is_an_error() {
        assert!(parse_stat("1 systemd S 0").unwrap_err().contains("no ')'"));
        assert!(parse_stat("1 (a) S 0 1").unwrap_err().contains("fields after the command name"));
        let bad = STAT.replace(" 1234 ", " x ");
        assert!(parse_stat(&bad).unwrap_err().contains("field 14"));
    }

    #[test]
    fn boot_time_comes_from_btime() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1700000000\nprocesses 9\n";
        assert_eq!(parse_boot_time(text), Ok(1_700_000_000));
        assert!(parse_boot_time("cpu 1\n").is_err());
    }

    #[test]
    fn units_are_converted() {
        let f = parse_stat(STAT).unwrap();
        let s = stats_from(&f, 1_700_000_000, 100, 4096);
        assert_eq!(s.cpu_seconds, 18.01);
        assert_eq!(s.resident_bytes, 3071 * 4096);
        assert_eq!(s.virtual_bytes, 176_226_304);
        assert_eq!(s.start_time_seconds, 1_700_000_420.0);
    }

    #[test]
    fn this_process_is_read() {
        let s = read_stats().unwrap();
        assert!(s.resident_bytes > 0 && s.virtual_bytes >= s.resident_bytes, "{s:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(s.start_time_seconds > now - 86_400.0 && s.start_time_seconds <= now + 1.0, "{s:?}");
        // At least stdin, stdout and stderr (the listing's own descriptor is not counted).
        assert!(open_fds().unwrap() >= 3);
        assert!(limits().0.is_some_and(|n| n > 0));
    }
}
