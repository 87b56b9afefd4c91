//! Why an API call failed, with the object it was about.

use super::*;

/// An API call that failed, with the object it was about.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("loading Kubernetes client config ({source_name}): {message}")]
    Config { source_name: String, message: String },
    /// A request failed. The message carries the whole cause chain (refused connection, TLS
    /// failure...): kube's own message stops at "client error (Connect)".
    #[error("{action} {object}: {}", error_chain(source))]
    Request {
        action: &'static str,
        object: String,
        #[source]
        source: kube::Error,
    },
    /// The fence refused a write: leadership is lost, or would end before the request's
    /// deadline. Nothing was sent.
    #[error("{action} {object}: not sent: leadership lost (or ending before the request could finish)")]
    Fenced { action: &'static str, object: String },
    /// A watch got an answer that is not a watch's (no resourceVersion).
    #[error("watch {object}: {message}")]
    WatchAnswer { object: String, message: String },
    /// A fenced write got no answer within its deadline and was abandoned; the API server may
    /// or may not have applied it.
    #[error("{action} {object}: no answer within {} ms; abandoned (it may or may not have been applied)", deadline.as_millis())]
    Deadline { action: &'static str, object: String, deadline: Duration },
}

/// An error and its sources as one line ("a: b: c"), skipping a source whose text the message
/// before it already contains (wrappers that repeat their cause).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !part.is_empty() && !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = cause.source();
    }
    text
}

impl ApiError {
    pub(super) fn request(action: &'static str, object: impl Into<String>) -> impl FnOnce(kube::Error) -> ApiError {
        let object = object.into();
        move |source| ApiError::Request { action, object, source }
    }

    /// Why a watch of `object` failed, as a request's error (the watch's start, its list, a
    /// broken stream or an error event all carry the API server's answer or the connection's).
    pub fn from_watch(object: impl Into<String>, error: kube::runtime::watcher::Error) -> ApiError {
        use kube::runtime::watcher::Error as W;
        let object = object.into();
        match error {
            W::InitialListFailed(e) | W::WatchStartFailed(e) | W::WatchFailed(e) => {
                ApiError::request("watch", object)(e)
            }
            W::WatchError(status) => ApiError::request("watch", object)(kube::Error::Api(status)),
            W::NoResourceVersion => ApiError::WatchAnswer { object, message: W::NoResourceVersion.to_string() },
        }
    }

    /// Whether the API refused the request itself (forbidden by RBAC or an admission policy,
    /// or invalid), as opposed to failing to answer: an operator must act, so it is reported.
    pub fn is_refusal(&self) -> bool {
        matches!(self.http_status(), Some(403 | 422))
    }

    /// Whether the API server refused our credentials (401): a token or certificate problem,
    /// not RBAC.
    pub fn is_unauthorized(&self) -> bool {
        self.http_status() == Some(401)
    }

    /// The HTTP status the API server answered with, `None` when there was no answer (no
    /// connection, TLS failure, timeout) or the error is not a request's.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            ApiError::Request { source: kube::Error::Api(s), .. } => Some(s.code),
            _ => None,
        }
    }

    /// Whether the API said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.http_status() == Some(404)
    }

    /// Whether the fence kept the request from being sent (leadership lost).
    pub fn is_fenced(&self) -> bool {
        matches!(self, ApiError::Fenced { .. })
    }

    /// Whether a fenced request was abandoned at its deadline.
    pub fn is_deadline(&self) -> bool {
        matches!(self, ApiError::Deadline { .. })
    }
}
