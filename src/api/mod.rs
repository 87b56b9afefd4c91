//! Everything that talks to the Kubernetes API: the client (with our request rate limit), the
//! label-scoped PV watch, creates and patches, StorageClasses, Nodes, claims, the leader Lease
//! and Events. Nothing else calls the API.
//!
//! node-cleanup's writes are fenced (`Cluster::with_fence`): after the rate limiter, right
//! before a create, patch, delete or Event goes out, leadership must still hold for the whole of
//! the request's deadline, and the request is abandoned when that deadline passes. Reads and the
//! Lease's own requests are never fenced.
//!
//! This file holds the client and its request path (rate limit, fence, deadline, metrics);
//! `pvs`, `nodes` and `events` the calls about each kind of object, `error` why a call failed.

mod error;
mod events;
pub mod inventory;
pub mod lease;
mod nodes;
mod patch;
mod pvs;
mod recorder;
mod watch;

pub use error::{ApiError, error_chain};
pub use events::{
    EVENT_NOTE_CUT, EVENT_NOTE_MAX, claim_reference, class_reference, event_note, node_reference, pv_reference,
};
pub use nodes::{NodeMeta, node_owner};
pub use patch::{AnnotationPatch, TakeOver};

use std::future::Future;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, Resource};

use crate::core::volumes::pv_facts::PvFacts;

/// The User-Agent of our requests: role and instance (node name, Lease identity), so the API
/// server's audit log tells the agents and the node-cleanup replicas apart. Characters a header
/// cannot carry become `_`.
pub fn user_agent(role: &str, instance: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_graphic() && !"();".contains(c) { c } else { '_' }).collect()
    };
    format!("local-static-provisioner/{} ({}; {})", env!("CARGO_PKG_VERSION"), clean(role), clean(instance))
}

/// Whether a write may go out: asked with the request's deadline, it answers whether this
/// replica still leads for at least that long.
type FenceCheck = Arc<dyn Fn(Duration) -> bool + Send + Sync>;

#[derive(Clone)]
struct Fence {
    holds_for: FenceCheck,
    deadline: Duration,
}

/// Objects per page of a list we filter (adoption's PVs): each page is held whole while it is
/// filtered, so its size is the agent's start-up peak. Measured with bench/scale-foreign.sh
/// (20,000 foreign PVs, peak of an agent started after them): 21.6 MiB with client-go's 500,
/// 14.7 MiB with 100; 250 keeps the requests of a start-up in a big cluster at 80, not 200.
const LIST_PAGE: u32 = 250;

/// Objects per page of the list that reads only whose PV each is (adoption: metadata only,
/// decoded as `PvOwnership`): a page is held whole as text while it is decoded (about 1.1 KiB
/// a PV, most of it managedFields), and what is decoded of each PV is its name and a few keys,
/// so a page of 1000 holds about as much as one of 250 decoded whole did, in a quarter of the
/// requests. Measured with bench/scale-foreign.sh (20,000 foreign PVs).
const OWNERSHIP_PAGE: u32 = 1000;

/// Nodes per page of the Node watch's (re-)list: each Node's metadata arrives whole (with its
/// managedFields) before it is trimmed, so smaller pages keep that transient small; measured
/// with bench/node-cleanup-nodes.sh (2000 Nodes: about 3 MiB less than pages of 500). A
/// re-list is rare, so the extra requests do not count.
const NODE_PAGE: u32 = 100;

/// Requests per second and burst of the leader election's own bucket: its loop sends two
/// requests per retry period, and they must never wait behind a pass's writes.
const ELECTION_QPS: u32 = 10;

/// How to reach the API server and how hard to use it.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Path of a kubeconfig file; in-cluster config (or ~/.kube/config) when absent.
    pub kubeconfig: Option<PathBuf>,
    /// Sustained requests per second the agent's own calls may make.
    pub qps: u32,
    /// Requests that may go out at once above the sustained rate.
    pub burst: u32,
    /// The kubeconfig context to use instead of its current one (the plugin's `--context`).
    pub context: Option<String>,
    /// The user to act as (`Impersonate-User`, the plugin's `--as`), as kubectl's `--as`.
    pub impersonate: Option<String>,
    /// The groups to act as (`Impersonate-Group`, `--as-group`).
    pub impersonate_groups: Vec<String>,
}

/// The result of trying to create a PV.
#[derive(Debug)]
pub enum Created {
    /// The PV was created, with this UID (which goes on the disk's used mark).
    Created { uid: String },
    /// A PV with that name already existed; here it is, for the planner to judge.
    AlreadyExists(Box<PvFacts>),
}

/// A connection to the cluster for one node's agent, node-cleanup or the cleanup command.
#[derive(Clone)]
pub struct Cluster {
    client: Client,
    /// The API server's URL, for messages ("" for a client made elsewhere).
    server: String,
    limiter: Arc<DefaultDirectRateLimiter>,
    recorder: recorder::Recorder,
    metrics: Option<crate::metrics::Metrics>,
    fence: Option<Fence>,
}

impl Cluster {
    /// Connects as the agent of node `reporter_instance` (see `connect_as`).
    pub async fn connect(opts: &ClientOptions, reporter_instance: &str) -> Result<Self, ApiError> {
        Self::connect_as(opts, "agent", reporter_instance).await
    }

    /// Connects using the kubeconfig or the in-cluster service account, as `role` (agent,
    /// node-cleanup, cleanup) and `instance` (node name, Lease identity): both go into the
    /// User-Agent, `instance` also into our Events' reporting instance.
    pub async fn connect_as(opts: &ClientOptions, role: &str, instance: &str) -> Result<Self, ApiError> {
        let options = KubeConfigOptions { context: opts.context.clone(), ..Default::default() };
        let mut config = match (&opts.kubeconfig, &opts.context) {
            (Some(path), _) => {
                let cfg_err = |message: String| ApiError::Config { source_name: path.display().to_string(), message };
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| cfg_err(e.to_string()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| cfg_err(e.to_string()))?
            }
            // A context is one of a kubeconfig's: KUBECONFIG's files (merged) or ~/.kube/config.
            (None, Some(_)) => Config::from_kubeconfig(&options).await.map_err(|e| ApiError::Config {
                source_name: "KUBECONFIG or ~/.kube/config".into(),
                message: e.to_string(),
            })?,
            // In a pod this is the in-cluster service account; on a workstation ~/.kube/config.
            (None, None) => Config::infer().await.map_err(|e| ApiError::Config {
                source_name: "in-cluster or ~/.kube/config".into(),
                message: e.to_string(),
            })?,
        };
        let header = |name: &str, value: &str| {
            hyper::header::HeaderValue::from_str(value)
                .map_err(|e| ApiError::Config { source_name: name.to_string(), message: e.to_string() })
        };
        config.headers.push((hyper::header::USER_AGENT, header("user agent", &user_agent(role, instance))?));
        // Impersonation as kubectl's --as and --as-group: the API server authorizes the
        // request as that user (the caller needs the `impersonate` verb).
        if let Some(user) = &opts.impersonate {
            config.headers.push((hyper::header::HeaderName::from_static("impersonate-user"), header("--as", user)?));
        }
        for group in &opts.impersonate_groups {
            config
                .headers
                .push((hyper::header::HeaderName::from_static("impersonate-group"), header("--as-group", group)?));
        }
        let server = config.cluster_url.to_string();
        tracing::info!(server = %server, kubeconfig = ?opts.kubeconfig, "API server");
        let client = Client::try_from(config)
            .map_err(|e| ApiError::Config { source_name: "client".into(), message: e.to_string() })?;
        Ok(Cluster { server, ..Self::from_client(client, opts, instance) })
    }

    /// "the API server at URL", for messages about reaching it.
    pub fn describe_server(&self) -> String {
        if self.server.is_empty() { "the API server".into() } else { format!("the API server at {}", self.server) }
    }

    /// A connection over a client made elsewhere (the unit tests' mock service), rate-limited
    /// as `opts` says; `instance` goes into our Events' reporting instance.
    pub fn from_client(client: Client, opts: &ClientOptions, instance: &str) -> Self {
        let qps = NonZeroU32::new(opts.qps.max(1)).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(opts.burst.max(1)).unwrap_or(NonZeroU32::MIN);
        let limiter = Arc::new(RateLimiter::direct(Quota::per_second(qps).allow_burst(burst)));
        let recorder = recorder::Recorder::new(client.clone(), instance);
        Cluster { client, server: String::new(), limiter, recorder, metrics: None, fence: None }
    }

    /// Fences every write from now on: after the rate limiter, `holds_for(deadline)` must be
    /// true or the request is not sent (`ApiError::Fenced`), and one that has no answer by
    /// `deadline` is abandoned (`ApiError::Deadline`). Reads and Lease requests stay unfenced.
    pub fn with_fence(
        mut self,
        deadline: Duration,
        holds_for: impl Fn(Duration) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.fence = Some(Fence { holds_for: Arc::new(holds_for), deadline });
        self
    }

    /// The same connection for the leader election: never fenced (the fence asks the election),
    /// and with its own small rate-limit bucket, so a renewal never queues behind a pass's
    /// requests and lets leadership lapse.
    pub fn for_leader_election(&self) -> Cluster {
        let quota = NonZeroU32::new(ELECTION_QPS).unwrap_or(NonZeroU32::MIN);
        Cluster {
            limiter: Arc::new(RateLimiter::direct(Quota::per_second(quota).allow_burst(quota))),
            fence: None,
            ..self.clone()
        }
    }

    async fn throttle(&self) {
        self.limiter.until_ready().await;
    }

    /// Runs a read (or a Lease request: the election is never fenced) under the rate limit.
    async fn call<T>(
        &self,
        method: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        self.throttle().await;
        self.measured(method, request).await
    }

    /// Runs a write under the rate limit and, when fenced, the fence and its deadline. The outer
    /// error is the fence's (nothing sent, or abandoned); the inner result is the API's answer.
    async fn send<T>(
        &self,
        method: &'static str,
        action: &'static str,
        object: &str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<Result<T, kube::Error>, ApiError> {
        let result = self.gated(action, object, self.measured(method, request)).await;
        if let (Err(ApiError::Deadline { deadline, .. }), Some(m)) = (&result, &self.metrics) {
            m.api_request(method, false, *deadline);
        }
        result
    }

    /// The rate limiter, then the fence (when set), then the request under its deadline. The
    /// check comes after the limiter, which may have waited (or the process been stopped while
    /// it waited), and nothing yields between the check and the request's first poll.
    ///
    /// What remains: once polled, hyper hands the request to its connection task, which writes
    /// it to the socket; a pause between the check and that write (microseconds, normally)
    /// still lets the request out when the process resumes, and a request the API server queued
    /// may be applied after we abandoned it. The margin between the end of our leadership and
    /// the earliest takeover (half of lease duration minus renew deadline) is for those.
    async fn gated<T>(
        &self,
        action: &'static str,
        object: &str,
        request: impl Future<Output = T>,
    ) -> Result<T, ApiError> {
        self.throttle().await;
        let Some(fence) = &self.fence else { return Ok(request.await) };
        // Taken before the check, so the deadline never outlasts the leadership the check saw.
        let deadline = tokio::time::Instant::now() + fence.deadline;
        if !(fence.holds_for)(fence.deadline) {
            return Err(ApiError::Fenced { action, object: object.to_string() });
        }
        deadline_first(deadline, request).await.ok_or_else(|| ApiError::Deadline {
            action,
            object: object.to_string(),
            deadline: fence.deadline,
        })
    }

    /// Records a request in upstream's apiserver_requests metrics (a 404 or 409 the caller
    /// handles still counts as a failed request, as upstream), timed from its first poll.
    async fn measured<T>(
        &self,
        method: &'static str,
        request: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let started = Instant::now();
        let result = request.await;
        if let Some(m) = &self.metrics {
            m.api_request(method, result.is_ok(), started.elapsed());
        }
        result
    }

    /// Records this cluster's requests in `metrics` from now on.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Lists in pages of `LIST_PAGE` objects, following continue tokens to the end, and keeps
    /// only what `keep` keeps, page by page: each page is dropped before the next is asked for,
    /// so memory follows the objects kept and one page, never the size of the cluster.
    async fn list_paged<T: Clone>(
        &self,
        object: &'static str,
        limit: u32,
        mut keep: impl FnMut(&T) -> bool,
        mut page: impl AsyncFnMut(&ListParams) -> Result<kube::core::ObjectList<T>, kube::Error>,
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut params = ListParams::default().limit(limit);
        loop {
            let list = self.call("list", page(&params)).await.map_err(ApiError::request("list", object))?;
            let next = list.metadata.continue_.filter(|token| !token.is_empty());
            out.extend(list.items.into_iter().filter(|item| keep(item)));
            match next {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(out),
            }
        }
    }

    /// A reflector over StorageClasses (few per cluster) for reclaim policy and mount options.
    pub fn watch_storage_classes(
        &self,
    ) -> (Store<StorageClass>, impl Stream<Item = Result<(), watcher::Error>> + Send + 'static) {
        let (reader, writer) = reflector::store();
        let api: Api<StorageClass> = Api::all(self.client.clone());
        let watch =
            watch::watch_objects("storageclasses", api, watcher::Config::default()).default_backoff().modify(trim);
        let stream = reflector::reflector(writer, watch).touched_objects().map(|r| r.map(|_| ()));
        (reader, stream)
    }
}

/// The annotation `kubectl apply` keeps a whole copy of the object in.
const ANN_LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object what no decision of ours reads and what often outweighs the rest
/// of it: the server-side-apply bookkeeping (`managedFields`) and kubectl's copy of the applied
/// object. Only our stores' copies are trimmed: every write we send is a merge or JSON patch
/// naming its own fields, so nothing on the server is lost.
fn trim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(ANN_LAST_APPLIED);
    }
}

/// Polls `request` only while `deadline` has not passed, and looks at the clock *before* each
/// poll: after a pause (SIGSTOP, a frozen VM) a late request is dropped, not driven on, which
/// `tokio::time::timeout` would do (it polls the inner future first). None: the deadline passed.
async fn deadline_first<F: Future>(deadline: tokio::time::Instant, request: F) -> Option<F::Output> {
    let mut request = std::pin::pin!(request);
    let mut timer = std::pin::pin!(tokio::time::sleep_until(deadline));
    std::future::poll_fn(|cx| {
        if tokio::time::Instant::now() >= deadline {
            return Poll::Ready(None);
        }
        if let Poll::Ready(out) = request.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::collections::BTreeMap;
    use std::pin::pin;

    use k8s_openapi::api::core::v1::{Node, PersistentVolume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kube::core::PartialObjectMeta;

    use super::nodes::trim_node;
    use super::*;
    use crate::core::volumes::naming::LABEL_HOSTNAME;

    #[test]
    fn error_chain_names_the_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        assert_eq!(error_chain(&Outer(refused)), "client error (Connect): Connection refused");
        // A wrapper that repeats its cause's text does not repeat it twice.
        #[derive(Debug, thiserror::Error)]
        #[error("watch failed: {0}")]
        struct Repeats(#[source] std::io::Error);
        let e = Repeats(std::io::Error::other("timed out"));
        assert_eq!(error_chain(&e), "watch failed: timed out");
    }

    /// A request that is pending on its first poll and ready on the next, counting its polls.
    fn two_step(polls: &Cell<u32>) -> impl Future<Output = &'static str> + '_ {
        std::future::poll_fn(move |cx| {
            polls.set(polls.get() + 1);
            if polls.get() == 1 {
                cx.waker().wake_by_ref();
                Poll::Pending
            } else {
                Poll::Ready("sent")
            }
        })
    }

    #[tokio::test]
    async fn a_deadline_already_passed_never_polls_the_request() {
        let polls = Cell::new(0);
        assert_eq!(deadline_first(tokio::time::Instant::now(), two_step(&polls)).await, None);
        assert_eq!(polls.get(), 0);
    }

    #[tokio::test]
    async fn a_request_in_time_completes() {
        let polls = Cell::new(0);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        assert_eq!(deadline_first(deadline, two_step(&polls)).await, Some("sent"));
        assert_eq!(polls.get(), 2);
    }

    #[tokio::test]
    async fn a_pause_past_the_deadline_drops_the_request_unpolled() {
        // The process is stopped between two polls (the thread sleeps past the deadline).
        let polls = Cell::new(0);
        let mut fenced =
            pin!(deadline_first(tokio::time::Instant::now() + Duration::from_millis(50), two_step(&polls)));
        assert!(futures::poll!(fenced.as_mut()).is_pending());
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(futures::poll!(fenced.as_mut()), Poll::Ready(None));
        assert_eq!(polls.get(), 1, "the request was driven on after its deadline");

        // tokio's timeout polls the request first: after the same pause, it would be sent.
        let polls = Cell::new(0);
        let mut timeout = pin!(tokio::time::timeout(Duration::from_millis(50), two_step(&polls)));
        assert!(futures::poll!(timeout.as_mut()).is_pending());
        std::thread::sleep(Duration::from_millis(80));
        assert!(matches!(futures::poll!(timeout.as_mut()), Poll::Ready(Ok("sent"))));
    }

    #[tokio::test]
    async fn a_request_with_no_answer_is_abandoned_at_its_deadline() {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(deadline_first(deadline, std::future::pending::<()>()).await, None);
    }

    /// A PV list page as the API server sends it.
    fn pv_page(names: &[&str], continue_token: &str) -> Vec<u8> {
        let items: Vec<serde_json::Value> = names
            .iter()
            .map(|n| serde_json::json!({"metadata": {"name": n}, "spec": {"local": {"path": format!("/mnt/{n}")}}}))
            .collect();
        let list = serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeList",
            "metadata": {"resourceVersion": "7", "continue": continue_token},
            "items": items,
        });
        serde_json::to_vec(&list).expect("a page serializes")
    }

    #[tokio::test]
    async fn filtered_listing_follows_continue_tokens_and_keeps_only_what_the_caller_keeps() {
        use hyper::{Request, Response};
        use kube::client::Body;

        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let pages = [(&["ours-a", "foreign-1", "foreign-2"][..], "token-1"), (&["foreign-3", "ours-b"][..], "")];
            let mut asked = Vec::new();
            for (names, token) in pages {
                let (request, respond) = handle.next_request().await.expect("a list request");
                asked.push(request.uri().to_string());
                respond.send_response(Response::new(Body::from(pv_page(names, token))));
            }
            // Nothing more once the last page said there is no continuation.
            let extra = handle.next_request().await.map(|(request, _)| request.uri().to_string());
            (asked, extra)
        });
        let opts = ClientOptions { kubeconfig: None, qps: 100, burst: 100, ..Default::default() };
        let cluster = Cluster::from_client(Client::new(service, "default"), &opts, "test");
        let kept = cluster
            .list_pvs_where(|pv| pv.metadata.name.as_deref().is_some_and(|n| n.starts_with("ours-")))
            .await
            .expect("the list succeeds");
        drop(cluster); // Ends the mock service, so the server sees no further request.
        let (asked, extra) = server.await.expect("the mock server ran");

        let names: Vec<_> = kept.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
        assert_eq!(names, ["ours-a", "ours-b"]);
        assert_eq!(kept[1].local_path(), Some("/mnt/ours-b"));
        assert_eq!(asked.len(), 2, "{asked:?}");
        assert!(asked.iter().all(|uri| uri.starts_with("/api/v1/persistentvolumes?")), "{asked:?}");
        assert!(asked.iter().all(|uri| uri.contains(&format!("limit={LIST_PAGE}"))), "{asked:?}");
        assert!(!asked[0].contains("continue="), "{asked:?}");
        assert!(asked[1].contains("continue=token-1"), "{asked:?}");
        assert_eq!(extra, None);
    }

    #[tokio::test]
    async fn ownership_listing_reads_every_pvs_metadata_in_larger_pages_and_keeps_only_names_and_our_keys() {
        use hyper::{Request, Response};
        use kube::client::Body;

        let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.expect("a list request");
            let accept = request.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).map(String::from);
            let uri = request.uri().to_string();
            let item = |name: &str, labels: serde_json::Value| {
                serde_json::json!({
                    "metadata": {"name": name, "labels": labels, "annotations": {"pv.kubernetes.io/provisioned-by": "p", "other": "x"},
                                 "managedFields": [{"manager": "m", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]},
                    "spec": {"local": {"path": "/mnt/a"}, "nodeAffinity": {"required": {"nodeSelectorTerms": []}}},
                })
            };
            let list = serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolumeList", "metadata": {"resourceVersion": "7"},
                "items": [item("a", serde_json::json!({LABEL_HOSTNAME: "h", "team": "t"})), item("b", serde_json::json!(null))],
            });
            respond.send_response(Response::new(Body::from(serde_json::to_vec(&list).expect("serializes"))));
            (uri, accept)
        });
        let opts = ClientOptions { kubeconfig: None, qps: 100, burst: 100, ..Default::default() };
        let cluster = Cluster::from_client(Client::new(service, "default"), &opts, "test");
        let kept = cluster.list_pv_ownership_where(|_| true).await.expect("the list succeeds");
        let (uri, accept) = server.await.expect("the mock server ran");
        // Metadata only: the API server encodes no spec.
        assert!(accept.as_deref().is_some_and(|a| a.contains("as=PartialObjectMetadataList")), "{accept:?}");
        // Every PV of the cluster: upstream's carry no label of ours to select them by.
        assert!(uri.starts_with("/api/v1/persistentvolumes?"), "{uri}");
        assert!(!uri.contains("labelSelector"), "{uri}");
        assert!(uri.contains(&format!("limit={OWNERSHIP_PAGE}")), "{uri}");
        let names: Vec<_> = kept.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(kept[0].label(LABEL_HOSTNAME).map(String::as_str), Some("h"));
        assert_eq!(kept[0].label("team"), None);
        assert_eq!(kept[0].annotation("pv.kubernetes.io/provisioned-by").map(String::as_str), Some("p"));
        assert_eq!(kept[0].annotation("other"), None);
        assert_eq!(kept[1].label(LABEL_HOSTNAME), None);
        assert_eq!(kept[0].metadata.managed_fields, None);
    }

    #[test]
    fn trimming_drops_managed_fields_and_the_applied_copy_only() {
        let mut pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pv-1",
                "labels": {"local-static-provisioner.io/node": "n1"},
                "annotations": {
                    "pv.kubernetes.io/provisioned-by": "local-volume-provisioner-n1-u",
                    ANN_LAST_APPLIED: "{\"apiVersion\":\"v1\"}",
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}],
            },
            "spec": {"local": {"path": "/mnt/a"}},
        }))
        .expect("a PV");
        let before = pv.clone();
        trim(&mut pv);
        assert_eq!(pv.metadata.managed_fields, None);
        let annotations = pv.metadata.annotations.as_ref().expect("annotations kept");
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["pv.kubernetes.io/provisioned-by"]);
        assert_eq!((&pv.metadata.name, &pv.metadata.labels), (&before.metadata.name, &before.metadata.labels));
        assert_eq!(pv.spec, before.spec);
    }

    #[test]
    fn a_node_is_trimmed_to_name_uid_and_a_hostname_label_other_than_its_name() {
        let mut node: PartialObjectMeta<Node> = serde_json::from_value(serde_json::json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "n1",
                "uid": "u-1",
                "resourceVersion": "42",
                "labels": {"kubernetes.io/hostname": "n1-host", "kubernetes.io/os": "linux", "zone": "a"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                "managedFields": [{"manager": "kubelet", "operation": "Update"}],
            },
        }))
        .expect("node metadata");
        trim_node(&mut node);
        let m = &node.metadata;
        assert_eq!(
            (m.name.as_deref(), m.uid.as_deref(), m.resource_version.as_deref()),
            (Some("n1"), Some("u-1"), Some("42"))
        );
        assert_eq!(m.labels, Some(BTreeMap::from([(LABEL_HOSTNAME.to_string(), "n1-host".to_string())])));
        assert_eq!((&m.annotations, &m.managed_fields), (&None, &None));

        assert!(node.types.is_none());

        // A Node without the label, or whose label is its name, keeps no labels at all.
        for labels in [[("zone", "b")], [(LABEL_HOSTNAME, "n2")]] {
            let mut bare = PartialObjectMeta::<Node>::default();
            bare.metadata.name = Some("n2".into());
            bare.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            trim_node(&mut bare);
            assert_eq!(bare.metadata, ObjectMeta { name: Some("n2".into()), ..ObjectMeta::default() });
        }

        // The node-wide volume fence is kept (node-cleanup fences a node whose agent's
        // heartbeat lapsed only when it carries none), with or without the hostname label.
        let fence = crate::core::fence::fence_label::LABEL_VOLUMES_UNVERIFIED;
        let mut fenced = PartialObjectMeta::<Node>::default();
        fenced.metadata.name = Some("n3".into());
        fenced.metadata.labels = Some(BTreeMap::from([
            (fence.to_string(), "agent-stopped".to_string()),
            ("zone".to_string(), "c".to_string()),
        ]));
        trim_node(&mut fenced);
        assert_eq!(fenced.metadata.labels, Some(BTreeMap::from([(fence.to_string(), "agent-stopped".to_string())])));
    }

    #[test]
    fn user_agent_names_role_and_instance_and_stays_a_valid_header() {
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(
            user_agent("node-cleanup", "nc-7d9f-x2"),
            format!("local-static-provisioner/{version} (node-cleanup; nc-7d9f-x2)")
        );
        let odd = user_agent("agent", "a b;(c)\n\u{e9}");
        assert_eq!(odd, format!("local-static-provisioner/{version} (agent; a_b__c___)"));
        assert!(hyper::header::HeaderValue::from_str(&odd).is_ok());
    }

    #[test]
    fn event_notes_are_cut_once_at_the_api_limit_keeping_the_marker() {
        assert_eq!(event_note("short".into()), "short");
        // Up to the limit: sent whole, no marker.
        let exact = "y".repeat(EVENT_NOTE_MAX);
        assert_eq!(event_note(exact.clone()), exact);
        let cases = [
            "x".repeat(EVENT_NOTE_MAX + 1),
            "x".repeat(5000),
            // A three-byte character straddling the cut is left out whole.
            format!("{}€€€", "x".repeat(EVENT_NOTE_MAX - EVENT_NOTE_CUT.len() - 1)),
            "é".repeat(EVENT_NOTE_MAX),
            "€".repeat(EVENT_NOTE_MAX),
        ];
        for long in cases {
            let cut = event_note(long.clone());
            assert!(
                cut.len() <= EVENT_NOTE_MAX && cut.len() > EVENT_NOTE_MAX - EVENT_NOTE_CUT.len() - 4,
                "{}",
                cut.len()
            );
            assert!(cut.ends_with(EVENT_NOTE_CUT), "{cut}");
            assert!(long.starts_with(cut.strip_suffix(EVENT_NOTE_CUT).unwrap()), "a prefix of the note");
            // One cut: a note already cut is what the API accepts, and cutting it again
            // changes nothing (the marker is never cut off).
            assert_eq!(event_note(cut.clone()), cut);
        }
    }
}
