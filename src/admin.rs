//! The admin HTTP server: `/metrics` for Prometheus, `/healthz` for liveness and `/readyz`
//! (with upstream's `/ready` alias) for readiness, which says why when not ready.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Readiness shared between the agent and the server: `None` when ready, else the reason; and
/// details worth knowing while ready (a refused config change, for example).
#[derive(Clone, Default)]
pub(crate) struct Readiness {
    not_ready: Arc<Mutex<Option<String>>>,
    detail: Arc<Mutex<Option<String>>>,
    /// The volumes that do not answer (host::ops), named in a ready answer.
    unresponsive: Arc<Mutex<Option<String>>>,
    /// Whether the agent's own loop still turns (`/healthz`).
    liveness: Arc<Mutex<Liveness>>,
}

/// How long a pass may run, and how much longer than its resync period the loop may go
/// without completing one, before `/healthz` fails: the loop is wedged and a restart helps. A
/// wedged *volume* never gets that far (host::ops gives up on it at its deadline), so it never
/// restarts the pod, which would not help.
pub(crate) const PASS_BOUND: Duration = Duration::from_secs(180);

/// The loop's heartbeat: when its current pass started, when the last one ended, the longest
/// it may wait between passes (twice the resync period), and since when the pass has been
/// waiting on the host (a blocking host call on the blocking pool).
#[derive(Debug, Clone, Copy, Default)]
struct Liveness {
    started: Option<Instant>,
    ended: Option<Instant>,
    idle: Duration,
    /// Blocking host calls the pass awaits now, and since when the first of them.
    host_calls: u32,
    host_since: Option<Instant>,
}

/// What the heartbeat says about the agent itself (a pure judgement of [`Liveness`]).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// The loop turns: passes complete (with or without subjects that do not answer).
    Alive,
    /// A pass has waited on the host past the bound: a host call that does not return (a
    /// filesystem or disk that stopped answering). Not the agent's own fault, and a restart
    /// would meet the same host (and a thread stuck in the kernel can keep the process from
    /// exiting at all): reported in `/readyz`, not failed in `/healthz`.
    HostWait(String),
    /// The loop itself does not turn: `/healthz` fails so kubelet restarts it.
    Wedged(String),
}

impl Liveness {
    /// What the heartbeat says at `now`.
    fn verdict(&self, now: Instant) -> Verdict {
        if let Some(started) = self.started.filter(|s| now.duration_since(*s) > PASS_BOUND) {
            let running = now.duration_since(started).as_secs();
            if let Some(since) = self.host_since.filter(|_| self.host_calls > 0) {
                return Verdict::HostWait(format!(
                    "a pass has been running for {running}s, waiting on a host call for {}s (a filesystem or \
                     disk that does not answer; see the unresponsive subjects)",
                    now.duration_since(since).as_secs()
                ));
            }
            return Verdict::Wedged(format!(
                "a pass has been running for {running}s (bound {}s): the agent's loop is wedged",
                PASS_BOUND.as_secs()
            ));
        }
        let Some(since) = self.ended else { return Verdict::Alive };
        let bound = self.idle + PASS_BOUND;
        if self.started.is_none() && now.duration_since(since) > bound {
            return Verdict::Wedged(format!(
                "no pass completed for {}s (bound {}s): the agent's loop is wedged",
                now.duration_since(since).as_secs(),
                bound.as_secs()
            ));
        }
        Verdict::Alive
    }
}

impl Readiness {
    /// Starts not ready, with a reason.
    pub(crate) fn new(reason: &str) -> Self {
        Readiness { not_ready: Arc::new(Mutex::new(Some(reason.to_string()))), ..Default::default() }
    }

    /// Sets the state: `None` for ready, or why not.
    pub(crate) fn set(&self, reason: Option<String>) {
        if let Ok(mut g) = self.not_ready.lock() {
            *g = reason;
        }
    }

    /// Sets or clears the detail shown in a ready answer.
    pub(crate) fn set_detail(&self, detail: Option<String>) {
        if let Ok(mut g) = self.detail.lock() {
            *g = detail;
        }
    }

    pub(crate) fn detail(&self) -> Option<String> {
        let detail = self.detail.lock().ok().and_then(|g| g.clone());
        let waiting = match self.liveness.lock().ok().map(|g| g.verdict(Instant::now())) {
            Some(Verdict::HostWait(why)) => Some(why),
            _ => None,
        };
        let detail = match (detail, waiting) {
            (Some(d), Some(w)) => Some(format!("{d}; {w}")),
            (d, w) => d.or(w),
        };
        let unresponsive = self.unresponsive.lock().ok().and_then(|g| g.clone());
        match (detail, unresponsive) {
            (Some(d), Some(u)) => Some(format!("{d}; unresponsive: {u}")),
            (None, Some(u)) => Some(format!("unresponsive: {u}")),
            (d, None) => d,
        }
    }

    /// Names the volumes that do not answer in ready answers (`None`: all answer).
    pub(crate) fn set_unresponsive(&self, what: Option<String>) {
        if let Ok(mut g) = self.unresponsive.lock() {
            *g = what;
        }
    }

    /// The loop starts a pass. `resync`: the longest it may wait between passes.
    pub(crate) fn pass_started(&self, resync: Duration) {
        if let Ok(mut g) = self.liveness.lock() {
            g.started = Some(Instant::now());
            g.idle = resync;
        }
    }

    /// The loop completed a pass.
    pub(crate) fn pass_ended(&self) {
        if let Ok(mut g) = self.liveness.lock() {
            g.started = None;
            g.ended = Some(Instant::now());
        }
    }

    /// The pass starts waiting on a blocking host call; the guard ends the wait.
    pub(crate) fn host_call(&self) -> HostCall {
        if let Ok(mut g) = self.liveness.lock() {
            if g.host_calls == 0 {
                g.host_since = Some(Instant::now());
            }
            g.host_calls += 1;
        }
        HostCall { liveness: self.liveness.clone() }
    }

    /// Why the loop itself looks wedged, if it does (`/healthz` then fails). A pass waiting on
    /// a host call that does not return is not (see [`Verdict::HostWait`]).
    pub(crate) fn wedged(&self) -> Option<String> {
        match self.liveness.lock().ok()?.verdict(Instant::now()) {
            Verdict::Wedged(why) => Some(why),
            Verdict::Alive | Verdict::HostWait(_) => None,
        }
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.not_ready.lock().map(|g| g.clone()).unwrap_or_else(|_| Some("readiness state poisoned".into()))
    }
}

/// A blocking host call the pass awaits (see [`Readiness::host_call`]); dropped when it returns.
pub(crate) struct HostCall {
    liveness: Arc<Mutex<Liveness>>,
}

impl Drop for HostCall {
    fn drop(&mut self) {
        if let Ok(mut g) = self.liveness.lock() {
            g.host_calls = g.host_calls.saturating_sub(1);
            if g.host_calls == 0 {
                g.host_since = None;
            }
        }
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdminError {
    /// The listen address is not usable.
    #[error("admin server: bad listen address {0:?} (use host:port or :port)")]
    Address(String),
    /// Binding failed.
    #[error("admin server: binding {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Parses upstream's `:8080` form as well as `host:port`.
pub(crate) fn parse_listen_address(s: &str) -> Result<SocketAddr, AdminError> {
    let full = if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_string() };
    full.parse().map_err(|_| AdminError::Address(s.to_string()))
}

/// Binds and serves in the background; returns the bound address (port 0 picks a free one).
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics_path: String,
    metrics: Metrics,
    readiness: Readiness,
) -> Result<SocketAddr, AdminError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|source| AdminError::Bind { addr: addr.to_string(), source })?;
    let local = listener.local_addr().map_err(|source| AdminError::Bind { addr: addr.to_string(), source })?;
    info!(address = %local, "admin server listening (metrics, healthz, readyz)");
    let metrics_path = Arc::new(metrics_path);
    tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    warn!(error = %e, "admin server accept failed");
                    continue;
                }
            };
            let (metrics, readiness, metrics_path) = (metrics.clone(), readiness.clone(), metrics_path.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let resp = respond(req.uri().path(), &metrics_path, &metrics, &readiness);
                    async move { Ok::<_, Infallible>(resp) }
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(local)
}

fn respond(path: &str, metrics_path: &str, metrics: &Metrics, readiness: &Readiness) -> Response<Full<Bytes>> {
    let (status, body, content_type) = if path == metrics_path {
        (StatusCode::OK, metrics.encode(), "application/openmetrics-text; version=1.0.0; charset=utf-8")
    } else {
        match path {
            "/healthz" => match readiness.wedged() {
                None => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
                Some(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("unhealthy: {why}\n"), "text/plain"),
            },
            "/readyz" | "/ready" => match readiness.get() {
                None => match readiness.detail() {
                    None => (StatusCode::OK, "ok\n".to_string(), "text/plain"),
                    Some(detail) => (StatusCode::OK, format!("ok; {detail}\n"), "text/plain"),
                },
                Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {reason}\n"), "text/plain"),
            },
            _ => (StatusCode::NOT_FOUND, "not found\n".to_string(), "text/plain"),
        }
    };
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(parse_listen_address(":8080").unwrap().to_string(), "0.0.0.0:8080");
        assert_eq!(parse_listen_address("127.0.0.1:0").unwrap().port(), 0);
        assert!(parse_listen_address("nope").is_err());
    }

    #[test]
    fn liveness_fails_only_for_a_wedged_loop() {
        let now = Instant::now();
        let at = |secs: u64| now + Duration::from_secs(secs);
        let idle = Duration::from_secs(600);
        let wedged = |v: Verdict, text: &str| matches!(v, Verdict::Wedged(w) if w.contains(text));
        let fresh = Liveness::default();
        assert_eq!(fresh.verdict(at(10_000)), Verdict::Alive, "before the first pass: starting, not wedged");
        let running = Liveness { started: Some(now), idle, ..Liveness::default() };
        assert_eq!(running.verdict(at(179)), Verdict::Alive);
        assert!(wedged(running.verdict(at(181)), "running for 181s"));
        let idle_loop = Liveness { ended: Some(now), idle, ..Liveness::default() };
        assert_eq!(idle_loop.verdict(at(600 + 179)), Verdict::Alive, "waiting for events within the resync bound");
        assert!(wedged(idle_loop.verdict(at(600 + 181)), "no pass completed"));
        // A pass held by a host call that does not return: the host's fault, not the loop's.
        let waiting =
            Liveness { started: Some(now), idle, host_calls: 1, host_since: Some(at(5)), ..Liveness::default() };
        assert_eq!(waiting.verdict(at(100)), Verdict::Alive);
        assert!(
            matches!(waiting.verdict(at(200)), Verdict::HostWait(w) if w.contains("waiting on a host call for 195s"))
        );
        // Passes that complete with subjects that do not answer are progress.
        let completing = Liveness { ended: Some(at(10_000)), idle, ..Liveness::default() };
        assert_eq!(completing.verdict(at(10_001)), Verdict::Alive);
        let m = Metrics::new();
        let r = Readiness::new("starting");
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        if let Ok(mut g) = r.liveness.lock() {
            g.started = Some(now - Duration::from_secs(200));
        }
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::SERVICE_UNAVAILABLE);
        // The same pass, in a host call since long ago: alive, and /readyz says what it waits on.
        let call = r.host_call();
        if let Ok(mut g) = r.liveness.lock() {
            g.host_since = Some(now - Duration::from_secs(190));
        }
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        r.set(None);
        let body = format!("{:?}", respond("/readyz", "/metrics", &m, &r).body());
        assert!(body.contains("waiting on a host call"), "{body}");
        drop(call);
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::SERVICE_UNAVAILABLE);
        r.pass_ended();
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        r.set_unresponsive(Some("/mnt/disks/v1 (mark, 42s)".into()));
        let body = respond("/readyz", "/metrics", &m, &r);
        assert_eq!(body.status(), StatusCode::OK, "a wedged volume does not make the agent unready");
    }

    #[test]
    fn readiness_reports_reason() {
        let m = Metrics::new();
        let r = Readiness::new("starting");
        assert_eq!(respond("/readyz", "/metrics", &m, &r).status(), StatusCode::SERVICE_UNAVAILABLE);
        r.set(None);
        assert_eq!(respond("/ready", "/metrics", &m, &r).status(), StatusCode::OK);
        r.set_detail(Some("config: last change refused".into()));
        let resp = respond("/readyz", "/metrics", &m, &r);
        assert_eq!(resp.status(), StatusCode::OK);
        let body = format!("{:?}", resp.body());
        assert!(body.contains("last change refused"), "{body}");
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        assert_eq!(respond("/metrics", "/metrics", &m, &r).status(), StatusCode::OK);
        assert_eq!(respond("/other", "/metrics", &m, &r).status(), StatusCode::NOT_FOUND);
    }
}
