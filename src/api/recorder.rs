//! Publishing events.k8s.io Events, a repeat folded into a series (a count on the first
//! object) as kube's `Recorder` and client-go's recorder do, with one difference: the note is
//! part of what makes a repeat. Theirs fold every Event with the same regarding object,
//! reason, action and related object within 6 minutes into the first one, keeping its note,
//! so a second config mistake told on the Node read as the first one with a count of 2, and a
//! wipe refused for a new reason read as the old reason. Here an Event with another note is
//! an object of its own; the same note again is a count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// How long a published Event takes repeats into its series (kube's and client-go's figure).
pub(super) const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// Who publishes: the controller and this instance of it (the node, the Lease holder).
pub(super) const CONTROLLER: &str = "local-static-provisioner";

/// What one Event says.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Said {
    pub(super) warning: bool,
    pub(super) reason: String,
    pub(super) action: String,
    pub(super) note: String,
    pub(super) related: Option<ObjectReference>,
}

/// An Event published, taking repeats until its series ends.
#[derive(Clone)]
struct Published {
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes Events, folding a repeat of the same one into its series.
#[derive(Clone)]
pub(super) struct Recorder {
    client: Client,
    instance: String,
    published: Arc<Mutex<HashMap<String, Published>>>,
}

/// What makes a repeat: everything the Event says, about the same object.
fn key(said: &Said, regarding: &ObjectReference) -> String {
    let r = |o: &ObjectReference| {
        format!(
            "{}/{}/{}/{}/{}/{}",
            o.api_version.as_deref().unwrap_or(""),
            o.kind.as_deref().unwrap_or(""),
            o.namespace.as_deref().unwrap_or(""),
            o.name.as_deref().unwrap_or(""),
            o.uid.as_deref().unwrap_or(""),
            o.field_path.as_deref().unwrap_or("")
        )
    };
    let related = said.related.as_ref().map(r).unwrap_or_default();
    format!("{}\0{}\0{}\0{}\0{related}\0{}", said.warning, said.reason, said.action, r(regarding), said.note)
}

/// Whether the series of an Event last seen at `last` still takes a repeat at `now`.
pub(super) fn series_open(last: Timestamp, now: Timestamp) -> bool {
    now.duration_since(last) < SERIES_TTL
}

impl Recorder {
    /// A recorder reporting as `instance` of [`CONTROLLER`].
    pub(super) fn new(client: Client, instance: &str) -> Self {
        Recorder { client, instance: instance.to_string(), published: Arc::default() }
    }

    fn published(&self) -> std::sync::MutexGuard<'_, HashMap<String, Published>> {
        self.published.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes `said` about `regarding` (in its namespace, `default` for a cluster-scoped
    /// object): a new Event, or a count on the one that said the same less than
    /// [`SERIES_TTL`] ago. Series that ended are forgotten, so memory holds only the last 6
    /// minutes' Events.
    pub(super) async fn publish(&self, said: &Said, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = key(said, regarding);
        let open = {
            let mut published = self.published();
            published.retain(|_, p| series_open(p.last, now));
            published.get(&key).cloned()
        };
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        let events: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let name = match open {
            Some(p) => {
                let count = p.count + 1;
                let series = serde_json::json!({
                    "series": EventSeries { count, last_observed_time: MicroTime(now) }
                });
                match events.patch(&p.name, &PatchParams::default(), &Patch::Merge(&series)).await {
                    Ok(_) => {
                        self.published().insert(key, Published { name: p.name, count, last: now });
                        return Ok(());
                    }
                    // Gone (the API server's event TTL): a new one says it.
                    Err(kube::Error::Api(s)) if s.code == 404 => self.create(&events, said, regarding, now).await?,
                    Err(e) => return Err(e),
                }
            }
            None => self.create(&events, said, regarding, now).await?,
        };
        self.published().insert(key, Published { name, count: 1, last: now });
        Ok(())
    }

    async fn create(
        &self,
        events: &Api<Event>,
        said: &Said,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> Result<String, kube::Error> {
        let name = format!("{}.{:x}", regarding.name.as_deref().unwrap_or(CONTROLLER), now.as_nanosecond());
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: regarding.namespace.clone(),
                ..Default::default()
            },
            action: Some(said.action.clone()),
            reason: Some(said.reason.clone()),
            note: Some(said.note.clone()),
            type_: Some(if said.warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            related: said.related.clone(),
            reporting_controller: Some(CONTROLLER.into()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        events.create(&PostParams::default(), &event).await?;
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn said(note: &str) -> Said {
        Said {
            warning: true,
            reason: "ConfigInvalid".into(),
            action: "Reload".into(),
            note: note.into(),
            related: None,
        }
    }

    fn node(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("Node".into()),
            name: Some(name.into()),
            uid: Some("u".into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_repeat_is_the_same_note_about_the_same_object_and_nothing_less() {
        let base = key(&said("a"), &node("n1"));
        assert_eq!(key(&said("a"), &node("n1")), base);
        let others = [
            key(&said("b"), &node("n1")),
            key(&said("a"), &node("n2")),
            key(&Said { warning: false, ..said("a") }, &node("n1")),
            key(&Said { reason: "ConfigReloaded".into(), ..said("a") }, &node("n1")),
            key(&Said { action: "Load".into(), ..said("a") }, &node("n1")),
            key(&Said { related: Some(node("pv")), ..said("a") }, &node("n1")),
            key(&said("a"), &ObjectReference { uid: Some("v".into()), ..node("n1") }),
            key(&said("a"), &ObjectReference { kind: Some("PersistentVolume".into()), ..node("n1") }),
        ];
        for (i, k) in others.iter().enumerate() {
            assert_ne!(*k, base, "case {i}");
        }
        // A separator inside a field cannot make two different events one.
        assert_ne!(key(&said("a\0b"), &node("n1")), key(&said("a"), &node("n1\0b")));
    }

    /// A client whose API answers every request (404 to patches of `gone`) and keeps
    /// "METHOD path" of each.
    fn mock(gone: &'static str) -> (Client, Arc<Mutex<Vec<String>>>) {
        use http_body_util::BodyExt as _;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (service, mut handle) =
            tower_test::mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
        let log = seen.clone();
        tokio::spawn(async move {
            while let Some((request, send)) = handle.next_request().await {
                let (method, path) = (request.method().to_string(), request.uri().path().to_string());
                let body = request.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                log.lock().unwrap().push(format!("{method} {path}"));
                let (status, reply) = if method == "PATCH" && path.ends_with(gone) {
                    (
                        404,
                        r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
                            .to_string(),
                    )
                } else {
                    let mut event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                    event["apiVersion"] = "events.k8s.io/v1".into();
                    event["kind"] = "Event".into();
                    (if method == "POST" { 201 } else { 200 }, event.to_string())
                };
                let response =
                    http::Response::builder().status(status).body(kube::client::Body::from(reply.into_bytes()));
                send.send_response(response.unwrap());
            }
        });
        (Client::new(service, "default"), seen)
    }

    #[tokio::test]
    async fn the_same_event_again_is_a_count_and_another_note_a_new_event() {
        let (client, seen) = mock("never");
        let recorder = Recorder::new(client, "n1");
        let n1 = node("n1");
        recorder.publish(&said("hostDir is relative"), &n1).await.unwrap();
        recorder.publish(&said("hostDir is relative"), &n1).await.unwrap();
        recorder.publish(&said("namePatern: did you mean namePattern?"), &n1).await.unwrap();
        recorder.publish(&said("hostDir is relative"), &n1).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let kinds: Vec<&str> = seen.iter().map(|s| s.split(' ').next().unwrap()).collect();
        assert_eq!(kinds, ["POST", "PATCH", "POST", "PATCH"], "{seen:?}");
        assert!(seen.iter().all(|s| s.contains("/apis/events.k8s.io/v1/namespaces/default/events")), "{seen:?}");
        assert_eq!(recorder.published().len(), 2);
        assert_eq!(recorder.published().values().map(|p| p.count).max(), Some(3));
    }

    #[tokio::test]
    async fn a_series_whose_event_is_gone_starts_again() {
        let (client, seen) = mock("");
        let recorder = Recorder::new(client, "n1");
        recorder.publish(&said("x"), &node("n1")).await.unwrap();
        recorder.publish(&said("x"), &node("n1")).await.unwrap();
        let kinds: Vec<String> =
            seen.lock().unwrap().iter().map(|s| s.split(' ').next().unwrap().to_string()).collect();
        assert_eq!(kinds, ["POST", "PATCH", "POST"]);
        assert_eq!(recorder.published().values().map(|p| p.count).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn a_series_takes_repeats_for_six_minutes() {
        let t: Timestamp = "2026-11-28T10:00:00Z".parse().unwrap();
        assert!(series_open(t, t));
        assert!(series_open(t, t + SignedDuration::from_secs(359)));
        assert!(!series_open(t, t + SignedDuration::from_mins(6)));
        // A clock set back keeps it open rather than splitting it.
        assert!(series_open(t, t - SignedDuration::from_mins(1)));
    }
}
