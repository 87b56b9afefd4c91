//! The agent's heartbeat (core::cluster::heartbeat): its own task renews the Lease named after its node
//! every HEARTBEAT_RENEW, apart from the pass loop, so a renewal never costs a pass and a long
//! pass never delays a renewal. A failed renewal is retried with the project's backoff (from
//! 1 s, doubling, capped at the renewal period) and said once per run of failures; node-cleanup
//! fences the node if none succeeds for the Lease's duration, and this agent lifts that fence
//! after its next pass.

use std::time::Duration;

use tracing::{debug, info, warn};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::api::lease::{ReadLease, Written};
use crate::api::node_owner;
use crate::api::{ApiError, Cluster};
use crate::core::cluster::heartbeat::{HEARTBEAT_DURATION, HEARTBEAT_RENEW, heartbeat_lease_name};
use crate::core::reconcile::backoff::Backoff;

/// Renews the heartbeat Lease of `node` in `namespace` until the task is dropped (the agent's
/// process ends with it). Nothing is done when the node's name makes no valid Lease name.
pub(crate) fn spawn(
    cluster: Cluster,
    namespace: String,
    node: String,
    node_uid: String,
) -> Option<tokio::task::JoinHandle<()>> {
    let Some(name) = heartbeat_lease_name(&node) else {
        warn!(node = %node, "the node's name is too long for a heartbeat Lease name; no heartbeat (node-cleanup cannot fence this node when the agent dies)");
        return None;
    };
    info!(lease = %format!("{namespace}/{name}"), "heartbeat: renewing the agent's Lease every {}s", HEARTBEAT_RENEW.as_secs());
    let owner = node_owner(&node, &node_uid);
    Some(tokio::spawn(async move {
        let mut backoff = Backoff::new(Duration::from_secs(1), HEARTBEAT_RENEW);
        let mut failing = false;
        let mut last = None;
        loop {
            let outcome = match renew(&cluster, &namespace, &name, &node, &owner, &mut last).await {
                Ok(Written::Done) => Ok(()),
                Ok(Written::Lost) => Err("a concurrent write won twice in a row".to_string()),
                Err(e) => Err(e.to_string()),
            };
            let delay = match outcome {
                Ok(()) => {
                    if std::mem::take(&mut failing) {
                        info!(lease = %name, "heartbeat renewed again");
                    }
                    backoff = Backoff::new(Duration::from_secs(1), HEARTBEAT_RENEW);
                    HEARTBEAT_RENEW
                }
                Err(e) => {
                    if std::mem::replace(&mut failing, true) {
                        debug!(lease = %name, error = %e, "heartbeat renewal failed again; retrying with backoff");
                    } else {
                        warn!(lease = %name, error = %e, "heartbeat renewal failed; retrying with backoff (node-cleanup fences this node if none succeeds for {}s)", HEARTBEAT_DURATION.as_secs());
                    }
                    backoff.next_delay(crate::runtime::random_fraction())
                }
            };
            tokio::time::sleep(delay).await;
        }
    }))
}

/// One renewal: one write, from `last`, the Lease as the API server answered this task's last
/// write (its resourceVersion); the Lease is read first only when there is none (the first
/// renewal, or after a failed one). It is created when it does not exist (owned by the Node,
/// so the garbage collector removes it with the Node), else replaced with a new renewTime.
/// Lost (409: someone else wrote it since; 404: it is gone): read again at once, once.
/// `last` holds the answer of a successful write, and nothing after a failure.
async fn renew(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    node: &str,
    owner: &OwnerReference,
    last: &mut Option<ReadLease>,
) -> Result<Written, ApiError> {
    for attempt in 0..2 {
        let current = match last.take() {
            Some(answered) if attempt == 0 => Some(answered),
            _ => cluster.read_lease(namespace, name).await?,
        };
        let acquire = current.as_ref().is_none_or(|c| c.record.holder.as_deref() != Some(node));
        let answered = cluster
            .write_lease_answered(namespace, name, current.as_ref(), node, HEARTBEAT_DURATION, acquire, Some(owner))
            .await?;
        if answered.is_some() {
            *last = answered;
            return Ok(Written::Done);
        }
    }
    Ok(Written::Lost)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use http::{Request, Response};
    use kube::client::Body;

    use super::*;
    use crate::api::ClientOptions;

    /// A Lease store behind a mock API: GET answers the Lease (404 before it exists), POST
    /// creates it, PUT replaces it when its resourceVersion matches (409 otherwise, or when
    /// `conflicts` says so; 404 when there is none). Keeps every request and every body written.
    #[derive(Clone, Default)]
    struct Leases {
        lease: Arc<Mutex<Option<serde_json::Value>>>,
        conflicts: Arc<Mutex<u32>>,
        requests: Arc<Mutex<Vec<String>>>,
        written: Arc<Mutex<Vec<serde_json::Value>>>,
    }

    impl Leases {
        fn cluster(&self) -> Cluster {
            let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let me = self.clone();
            tokio::spawn(async move {
                while let Some((request, send)) = handle.next_request().await {
                    let method = request.method().to_string();
                    let path = request.uri().path().to_string();
                    let body = request.into_body().collect_bytes().await.unwrap_or_default();
                    let (status, reply) = me.answer(&method, &body);
                    me.requests.lock().unwrap().push(format!("{method} {path}"));
                    send.send_response(
                        Response::builder().status(status).body(Body::from(reply.into_bytes())).unwrap(),
                    );
                }
            });
            let opts = ClientOptions { kubeconfig: None, qps: 1000, burst: 1000, ..Default::default() };
            Cluster::from_client(kube::Client::new(service, "default"), &opts, "n1")
        }

        fn answer(&self, method: &str, body: &[u8]) -> (u16, String) {
            let status = |code: u16, reason: &str| {
                let s = serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason});
                (code, s.to_string())
            };
            let mut lease = self.lease.lock().unwrap();
            match method {
                "GET" => lease.as_ref().map_or_else(|| status(404, "NotFound"), |l| (200, l.to_string())),
                "PUT" if lease.is_none() => status(404, "NotFound"),
                "POST" | "PUT" => {
                    let mut obj: serde_json::Value = serde_json::from_slice(body).unwrap();
                    self.written.lock().unwrap().push(obj.clone());
                    let mut conflicts = self.conflicts.lock().unwrap();
                    let stale = method == "PUT"
                        && lease.as_ref().map(|l| &l["metadata"]["resourceVersion"])
                            != Some(&obj["metadata"]["resourceVersion"]);
                    if *conflicts > 0 || stale || (method == "POST" && lease.is_some()) {
                        *conflicts = conflicts.saturating_sub(1);
                        return status(409, "Conflict");
                    }
                    let version = lease
                        .as_ref()
                        .map_or(0, |l| l["metadata"]["resourceVersion"].as_str().unwrap().parse::<u32>().unwrap());
                    obj["metadata"]["resourceVersion"] = serde_json::json!((version + 1).to_string());
                    *lease = Some(obj.clone());
                    (if method == "POST" { 201 } else { 200 }, obj.to_string())
                }
                _ => status(405, "MethodNotAllowed"),
            }
        }
    }

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

    #[tokio::test]
    async fn the_heartbeat_is_created_then_renewed_with_its_resource_version_held_by_its_node() {
        let api = Leases::default();
        let cluster = api.cluster();
        let name = "local-static-provisioner-agent-n1";
        let mut last = None;
        for _ in 0..3 {
            assert_eq!(renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap(), Written::Done);
        }
        let requests = api.requests.lock().unwrap().clone();
        // Read once, when there is no answer to start from; then one write per renewal.
        assert_eq!(
            requests,
            [
                format!("GET {PATH}/{name}"),
                format!("POST {PATH}"),
                format!("PUT {PATH}/{name}"),
                format!("PUT {PATH}/{name}"),
            ]
        );
        let written = api.written.lock().unwrap().clone();
        // Created owned by the Node (gone with it); a renewal keeps what it started from.
        assert_eq!(
            written[0]["metadata"]["ownerReferences"],
            serde_json::json!([{
                "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "node-uid-1"
            }])
        );
        for lease in &written {
            assert_eq!(lease["metadata"]["name"], name);
            assert_eq!(lease["spec"]["holderIdentity"], "n1");
            assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
            assert!(lease["spec"]["renewTime"].as_str().is_some_and(|t| t.contains('.')), "a MicroTime: {lease}");
        }
        // Each renewal replaces what the last write's answer said.
        assert_eq!(written[1]["metadata"]["resourceVersion"], "1");
        assert_eq!(written[2]["metadata"]["resourceVersion"], "2");
    }

    fn owner() -> OwnerReference {
        node_owner("n1", "node-uid-1")
    }

    #[tokio::test]
    async fn a_renewal_lost_to_a_concurrent_write_reads_again_once() {
        let api = Leases::default();
        let cluster = api.cluster();
        let name = "local-static-provisioner-agent-n1";
        let mut last = None;
        renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap();
        *api.conflicts.lock().unwrap() = 1;
        let done = renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap();
        assert_eq!(done, Written::Done, "read again, written");
        // Created (GET, POST); then the write from the answer lost, a read, a write.
        let tail: Vec<String> = api.requests.lock().unwrap()[2..].iter().map(|r| r[..3].to_string()).collect();
        assert_eq!(tail, ["PUT", "GET", "PUT"]);
        // Someone else wrote it meanwhile (its resourceVersion moved on): the write from the
        // last answer is refused, the Lease read again, written from that.
        {
            let mut lease = api.lease.lock().unwrap();
            let l = lease.as_mut().unwrap();
            l["metadata"]["resourceVersion"] = serde_json::json!("40");
        }
        let done = renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap();
        assert_eq!(done, Written::Done);
        assert_eq!(last.as_ref().and_then(|l| l.object.metadata.resource_version.as_deref()), Some("41"));
        // Lost twice: said as lost (the loop retries with backoff), not taken for done, and the
        // next renewal reads first.
        *api.conflicts.lock().unwrap() = 2;
        assert_eq!(renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap(), Written::Lost);
        assert!(last.is_none());
        // Gone (deleted by hand): the replace finds nothing, the Lease is read and created again.
        let mut last = None;
        renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap();
        *api.lease.lock().unwrap() = None;
        let before = api.requests.lock().unwrap().len();
        assert_eq!(renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.unwrap(), Written::Done);
        let tail: Vec<String> = api.requests.lock().unwrap()[before..].iter().map(|r| r[..4].to_string()).collect();
        assert_eq!(tail, ["PUT ", "GET ", "POST"]);
        // An API error is an error, and leaves nothing to start the next renewal from.
        *api.lease.lock().unwrap() = Some(serde_json::json!("not a lease"));
        let mut last = None;
        assert!(renew(&cluster, "ns", name, "n1", &owner(), &mut last).await.is_err());
        assert!(last.is_none());
    }
}
