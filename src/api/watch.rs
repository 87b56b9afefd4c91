//! Every watch of ours starts with a streaming list (`sendInitialEvents`, the API server's
//! WatchList): the objects that exist arrive as the watch's first events, served from the API
//! server's watch cache, so a reflector costs one request where a list and then a watch cost
//! two, and the API server builds no list response (node-cleanup's watch of every PV).
//!
//! An API server that does not serve streaming lists (the WatchList feature gate off: before
//! Kubernetes 1.32, or turned off) refuses the watch's parameters as invalid. That one answer
//! switches the watch, for the rest of its life, to a list and then a watch, as client-go's
//! informers do (upstream's way): the same events follow, one request more.

use std::fmt::Debug;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::watcher;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tracing::info;

/// How a watch gets the objects that exist when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Start {
    /// One watch request whose first events are the existing objects.
    Streaming,
    /// A list, then a watch from the list's resourceVersion.
    ListThenWatch,
}

/// Whether `error` is the API server refusing a streaming list's parameters
/// (`sendInitialEvents`, `resourceVersionMatch` on a watch): 400 Bad Request or 422 Invalid on
/// the watch's start. Any other error (forbidden, unreachable, a watch that broke later) is the
/// watcher's to retry as it is.
fn refuses_streaming(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchStartFailed(kube::Error::Api(status)) if matches!(status.code, 400 | 422))
}

/// What the watch does next, given how it starts and the item its watcher gave.
fn next_start(start: Start, item: &watcher::Result<watcher::Event<impl Sized>>) -> Start {
    match (start, item) {
        (Start::Streaming, Err(e)) if refuses_streaming(e) => Start::ListThenWatch,
        _ => start,
    }
}

fn start_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
    start: Start,
) -> BoxStream<'static, watcher::Result<watcher::Event<K>>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    match start {
        Start::Streaming => watcher(api, config.streaming_lists()).boxed(),
        Start::ListThenWatch => watcher(api, config).boxed(),
    }
}

/// The events of `api`'s objects selected by `config`, from a streaming list when the API server
/// serves one, else from a list and a watch (module doc). `what` names the watch in the log.
/// Like `kube::runtime::watcher`, errors are items and the stream goes on after them; a backoff
/// goes on top.
pub(super) fn watch_objects<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let first = start_watcher(api.clone(), config.clone(), Start::Streaming);
    // What a switch starts from: kept only while the watch streams, and taken by the switch, so
    // the events themselves copy nothing.
    let fallback = Some((api, config));
    futures::stream::unfold((first, fallback), move |(mut inner, mut fallback)| async move {
        let mut item = inner.next().await?;
        let start = if fallback.is_some() { Start::Streaming } else { Start::ListThenWatch };
        if next_start(start, &item) != start
            && let Some((api, config)) = fallback.take()
        {
            // The refusal itself is not passed on: nothing failed, the other way starts now.
            if let Err(e) = &item {
                info!(watch = what, answer = %e, "the API server does not serve streaming lists; listing, then watching");
            }
            inner = start_watcher(api, config, Start::ListThenWatch);
            item = inner.next().await?;
        }
        Some((item, (inner, fallback)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api_error(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(Status { code, message: format!("answered {code}"), ..Status::default() }))
    }

    /// Only a refusal of the watch's start with 400 or 422 switches a streaming watch to a list
    /// and a watch; every other error, and every error once switched, changes nothing.
    #[test]
    fn only_a_refused_streaming_start_switches_to_list_then_watch() {
        type Item = watcher::Result<watcher::Event<()>>;
        let cases: Vec<(&str, Item, Start)> = vec![
            ("started", Ok(watcher::Event::Init), Start::Streaming),
            ("422 on start", Err(watcher::Error::WatchStartFailed(api_error(422))), Start::ListThenWatch),
            ("400 on start", Err(watcher::Error::WatchStartFailed(api_error(400))), Start::ListThenWatch),
            ("403 on start", Err(watcher::Error::WatchStartFailed(api_error(403))), Start::Streaming),
            ("404 on start", Err(watcher::Error::WatchStartFailed(api_error(404))), Start::Streaming),
            ("410 on start", Err(watcher::Error::WatchStartFailed(api_error(410))), Start::Streaming),
            ("500 on start", Err(watcher::Error::WatchStartFailed(api_error(500))), Start::Streaming),
            ("422 while watching", Err(watcher::Error::WatchFailed(api_error(422))), Start::Streaming),
            ("422 from a list", Err(watcher::Error::InitialListFailed(api_error(422))), Start::Streaming),
            ("no resourceVersion", Err(watcher::Error::NoResourceVersion), Start::Streaming),
        ];
        for (what, item, expected) in &cases {
            assert_eq!(next_start(Start::Streaming, item), *expected, "{what}");
            assert_eq!(next_start(Start::ListThenWatch, item), Start::ListThenWatch, "{what}, once switched");
        }
    }
}
