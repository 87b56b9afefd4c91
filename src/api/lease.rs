//! The leader Lease (coordination.k8s.io/v1): read, create, and write guarded by
//! resourceVersion, so two candidates that both decide to take an expired lease cannot both
//! succeed. The decisions themselves are in `core::cluster::lease`. These requests are never fenced
//! (they use `Cluster::call`): the fence on node-cleanup's writes asks the election itself.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use super::{ApiError, Cluster};
use crate::core::cluster::lease::LeaseRecord;

/// The Lease as read, with the record that decides leadership.
#[derive(Debug, Clone)]
pub struct ReadLease {
    /// The decision-relevant fields.
    pub record: LeaseRecord,
    /// The object, to write back with its resourceVersion.
    pub object: Lease,
}

/// The decision-relevant fields of a Lease.
pub fn lease_record(object: &Lease) -> LeaseRecord {
    let spec = object.spec.clone().unwrap_or_default();
    LeaseRecord {
        holder: spec.holder_identity,
        duration: spec.lease_duration_seconds.and_then(|s| u64::try_from(s).ok()).map(Duration::from_secs),
        renew_time: spec.renew_time.map(|t| t.0.to_string()),
        transitions: spec.lease_transitions.unwrap_or(0),
    }
}

/// The outcome of a guarded write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Our write went through.
    Done,
    /// Someone else wrote (or created) it first; read again.
    Lost,
}

impl Cluster {
    fn leases(&self, namespace: &str) -> Api<Lease> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Reads the Lease; None when it does not exist yet.
    pub async fn read_lease(&self, namespace: &str, name: &str) -> Result<Option<ReadLease>, ApiError> {
        let api = self.leases(namespace);
        let lease = self
            .call("get", api.get_opt(name))
            .await
            .map_err(ApiError::request("get lease", format!("{namespace}/{name}")))?;
        Ok(lease.map(|object| ReadLease { record: lease_record(&object), object }))
    }

    /// A watch of the Leases of `namespace` (node-cleanup: the agents' heartbeats, core::cluster::heartbeat).
    /// The stream yields every watch event and must be polled.
    pub fn watch_leases(
        &self,
        namespace: &str,
    ) -> impl futures::Stream<Item = Result<kube::runtime::watcher::Event<Lease>, kube::runtime::watcher::Error>>
    + Send
    + 'static {
        use kube::runtime::WatchStreamExt;
        super::watch::watch_objects("leases", self.leases(namespace), kube::runtime::watcher::Config::default())
            .default_backoff()
    }

    /// Writes `holder` into the Lease: creates it when `current` is None, else replaces it with
    /// `current`'s resourceVersion. An empty holder releases the lease. `acquire` marks a new
    /// term (acquire time set, transitions counted).
    pub async fn write_lease(
        &self,
        namespace: &str,
        name: &str,
        current: Option<&ReadLease>,
        holder: &str,
        duration: Duration,
        acquire: bool,
    ) -> Result<Written, ApiError> {
        let written = self.write_lease_answered(namespace, name, current, holder, duration, acquire, None).await?;
        Ok(if written.is_some() { Written::Done } else { Written::Lost })
    }

    /// [`Self::write_lease`], creating the Lease owned by `owner` when it does not exist yet (an
    /// agent's heartbeat: owned by its Node, so it goes with the Node; a replace keeps the owner
    /// the Lease has), and returning the Lease as the API server answered the write
    /// (with its new resourceVersion), so the next write can start from it instead of a read;
    /// None when the write was lost: someone else wrote it first (409), or the Lease replaced
    /// is gone (404). Either way the caller reads it again.
    #[allow(clippy::too_many_arguments)]
    pub async fn write_lease_answered(
        &self,
        namespace: &str,
        name: &str,
        current: Option<&ReadLease>,
        holder: &str,
        duration: Duration,
        acquire: bool,
        owner: Option<&OwnerReference>,
    ) -> Result<Option<ReadLease>, ApiError> {
        let now = MicroTime(Timestamp::now());
        let old = current.and_then(|c| c.object.spec.clone()).unwrap_or_default();
        let transitions = current.map_or(0, |c| c.record.transitions);
        let spec = LeaseSpec {
            holder_identity: Some(holder.to_string()),
            lease_duration_seconds: Some(i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)),
            acquire_time: if acquire { Some(now.clone()) } else { old.acquire_time },
            renew_time: Some(now),
            lease_transitions: Some(if acquire && current.is_some() { transitions + 1 } else { transitions }),
            ..Default::default()
        };
        let api = self.leases(namespace);
        let object = format!("{namespace}/{name}");
        let result = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        namespace: Some(namespace.to_string()),
                        owner_references: owner.map(|o| vec![o.clone()]),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                self.call("create", api.create(&PostParams::default(), &lease)).await
            }
            Some(c) => {
                let mut lease = c.object.clone();
                lease.spec = Some(spec);
                self.call("update", api.replace(name, &PostParams::default(), &lease)).await
            }
        };
        match result {
            Ok(object) => Ok(Some(ReadLease { record: lease_record(&object), object })),
            Err(kube::Error::Api(s)) if s.code == 409 || (s.code == 404 && current.is_some()) => Ok(None),
            Err(e) => Err(ApiError::request("write lease", object)(e)),
        }
    }
}
