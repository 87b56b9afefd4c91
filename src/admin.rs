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

/// The loop's heartbeat: when its current pass started, when the last one ended, and the
/// longest it may wait between passes (twice the resync period).
#[derive(Debug, Clone, Copy, Default)]
struct Liveness {
    started: Option<Instant>,
    ended: Option<Instant>,
    idle: Duration,
}

impl Liveness {
    /// Why the loop looks wedged at `now`, if it does.
    fn problem(&self, now: Instant) -> Option<String> {
        if let Some(started) = self.started.filter(|s| now.duration_since(*s) > PASS_BOUND) {
            return Some(format!(
                "a pass has been running for {}s (bound {}s): the agent's loop is wedged",
                now.duration_since(started).as_secs(),
                PASS_BOUND.as_secs()
            ));
        }
        let since = self.ended?;
        let bound = self.idle + PASS_BOUND;
        (self.started.is_none() && now.duration_since(since) > bound).then(|| {
            format!(
                "no pass completed for {}s (bound {}s): the agent's loop is wedged",
                now.duration_since(since).as_secs(),
                bound.as_secs()
            )
        })
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

    fn detail(&self) -> Option<String> {
        let detail = self.detail.lock().ok().and_then(|g| g.clone());
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

    /// Why the loop looks wedged, if it does (`/healthz` then fails).
    pub(crate) fn wedged(&self) -> Option<String> {
        self.liveness.lock().ok().and_then(|g| g.problem(Instant::now()))
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.not_ready.lock().map(|g| g.clone()).unwrap_or_else(|_| Some("readiness state poisoned".into()))
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
        let fresh = Liveness::default();
        assert_eq!(fresh.problem(at(10_000)), None, "before the first pass: starting, not wedged");
        let running = Liveness { started: Some(now), ended: None, idle };
        assert_eq!(running.problem(at(179)), None);
        assert!(running.problem(at(181)).is_some_and(|p| p.contains("running for 181s")));
        let idle_loop = Liveness { started: None, ended: Some(now), idle };
        assert_eq!(idle_loop.problem(at(600 + 179)), None, "waiting for events within the resync bound");
        assert!(idle_loop.problem(at(600 + 181)).is_some_and(|p| p.contains("no pass completed")));
        let m = Metrics::new();
        let r = Readiness::new("starting");
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        if let Ok(mut g) = r.liveness.lock() {
            g.started = Some(now - Duration::from_secs(200));
        }
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::SERVICE_UNAVAILABLE);
        r.pass_ended();
        assert_eq!(respond("/healthz", "/metrics", &m, &r).status(), StatusCode::OK);
        r.set(None);
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
