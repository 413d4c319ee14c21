//! Reading a request body: size and time limits, and the HTTP 400 / 408 / 413 answers that name
//! what was wrong with it.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use serde::Deserialize;

use crate::clip::clip;
use crate::wire::BadRequest;

/// Largest request body accepted by default (`--max-request-bytes`). The chart
/// sets `nodeCacheCapable: true`, so a request is one Pod (etcd keeps objects
/// under 1.5 MiB) and the candidate node names (5,000 nodes: ~100 KB). The
/// worst body of this size that decodes keeps the extender's peak memory well
/// under the chart's 256Mi limit (docs/hostile-input.md). A scheduler that sends full
/// Node objects (`nodeCacheCapable: false`) needs a larger limit and more memory.
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// How long a request body may take to arrive once its handler runs; then HTTP 408. It bounds how
/// long a caller that stalls mid-body holds one of the
/// [`PLACEMENT_CONCURRENCY`](super::PLACEMENT_CONCURRENCY) turns.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest `/bind` body: four names of at most 253 bytes and a UID fit in well under 1 KiB.
pub const BIND_BODY_LIMIT: usize = 64 * 1024;

/// Marks a verb's answer with its metric outcome.
#[derive(Debug, Clone, Copy)]
pub(super) struct Outcome(pub(super) &'static str);

/// Why a request body was refused: HTTP 400 (or 413 for a body over the
/// limit, [`BODY_LIMIT`] by default) with `{"Error": "..."}` naming the problem.
#[derive(Debug)]
pub(super) struct WireRejection {
    status: StatusCode,
    message: String,
}

impl WireRejection {
    /// HTTP 400 with `message`, for a body that decodes but says nothing usable.
    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }
}

impl IntoResponse for WireRejection {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(BadRequest {
                error: self.message,
            }),
        )
            .into_response();
        r.extensions_mut().insert(Outcome("bad-request"));
        r
    }
}

/// A request body, read whatever its content type.
#[derive(Debug)]
pub(super) struct Body {
    path: String,
    bytes: Bytes,
}

impl Body {
    /// Decode the body as JSON; the value may borrow from the body.
    pub(super) fn decode<'a, T: Deserialize<'a>>(&'a self) -> Result<T, WireRejection> {
        // serde's messages quote the offending value, which may be megabytes.
        serde_json::from_slice(&self.bytes).map_err(|e| WireRejection {
            status: StatusCode::BAD_REQUEST,
            message: format!("malformed {} request: {}", self.path, clip(&e.to_string())),
        })
    }
}

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = WireRejection;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let path = req.uri().path().to_string();
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        let read = tokio::time::timeout(BODY_READ_TIMEOUT, Bytes::from_request(req, state));
        let Ok(read) = read.await else {
            return Err(WireRejection {
                status: StatusCode::REQUEST_TIMEOUT,
                message: format!(
                    "the {path} request body did not arrive within {} s",
                    BODY_READ_TIMEOUT.as_secs()
                ),
            });
        };
        let bytes = read.map_err(|e| WireRejection {
            status: e.status(),
            message: match (e.status(), limit) {
                (StatusCode::PAYLOAD_TOO_LARGE, Some(limit)) if path == "/bind" => format!(
                    "the /bind request body is larger than {limit} bytes, the limit for binds \
                     (a bind names a pod, its namespace, its UID and a node)"
                ),
                (StatusCode::PAYLOAD_TOO_LARGE, Some(limit)) => format!(
                    "the {path} request body is larger than the extender's limit of {limit} \
                     bytes (--max-request-bytes)"
                ),
                _ => format!("cannot read the {path} request body: {}", e.body_text()),
            },
        })?;
        Ok(Body { path, bytes })
    }
}

/// The body limit in force, for the 413 answer's message.
#[derive(Debug, Clone, Copy)]
pub(super) struct BodyLimit(pub(super) usize);
