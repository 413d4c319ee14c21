//! `GET /healthz`, `GET /readyz` and `GET /metrics` (axum), for a component that says through
//! [`Endpoints`] what its checks find and what its metrics are.
//!
//! A check that passes answers 200, one that fails 503, each with the component's text as the body,
//! unchanged (`text/plain; charset=utf-8`). `/metrics` answers the OpenMetrics text, or 500 when it
//! could not be encoded. Any other request answers 404 (405 for one of the three paths asked with
//! another method) with a text naming what was asked and the routes served.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Content type of `/metrics`: the OpenMetrics text that prometheus-client encodes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The paths served.
const ROUTES: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// What a liveness or readiness check found: `Ok` answers 200, `Err` 503; the text is the whole
/// body (a trailing newline is the component's to add).
pub type Check = Result<Cow<'static, str>, Cow<'static, str>>;

/// What a component serves on the three paths. Each method runs once per request.
pub trait Endpoints: Send + Sync {
    /// `GET /healthz`: whether the process works (a failing check gets the pod restarted).
    fn live(&self) -> Check;

    /// `GET /readyz`: whether the component does its job yet.
    fn ready(&self) -> Check;

    /// `GET /metrics`: the OpenMetrics text; an error answers 500.
    fn metrics(&self) -> Result<String, std::fmt::Error>;
}

/// The router of `/healthz`, `/readyz` and `/metrics`, answered by `endpoints`.
pub fn router(endpoints: Arc<dyn Endpoints>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .method_not_allowed_fallback(no_route)
        .with_state(endpoints)
}

fn answer(check: Check) -> (StatusCode, Cow<'static, str>) {
    match check {
        Ok(text) => (StatusCode::OK, text),
        Err(text) => (StatusCode::SERVICE_UNAVAILABLE, text),
    }
}

async fn healthz(State(e): State<Arc<dyn Endpoints>>) -> (StatusCode, Cow<'static, str>) {
    answer(e.live())
}

async fn readyz(State(e): State<Arc<dyn Endpoints>>) -> (StatusCode, Cow<'static, str>) {
    answer(e.ready())
}

async fn metrics(State(e): State<Arc<dyn Endpoints>>) -> Response {
    match e.metrics() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], body).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "metrics encoding failed\n",
        )
            .into_response(),
    }
}

/// The answer to a request no route takes. The path is shown cut to 256 characters: it comes from
/// the client.
async fn no_route(method: Method, uri: Uri) -> (StatusCode, String) {
    let path = uri.path();
    let status = if ROUTES.contains(&path) {
        StatusCode::METHOD_NOT_ALLOWED
    } else {
        StatusCode::NOT_FOUND
    };
    let shown: String = path.chars().take(256).collect();
    (
        status,
        format!("no route {method} {shown}; routes: GET /healthz, GET /readyz, GET /metrics\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    struct Fixed {
        live: Check,
        ready: Check,
        metrics: Result<String, std::fmt::Error>,
    }

    impl Endpoints for Fixed {
        fn live(&self) -> Check {
            self.live.clone()
        }
        fn ready(&self) -> Check {
            self.ready.clone()
        }
        fn metrics(&self) -> Result<String, std::fmt::Error> {
            self.metrics.clone()
        }
    }

    /// Status, content type and body of `method path`.
    async fn call(e: Fixed, method: &str, path: &str) -> (u16, String, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let response = router(Arc::new(e)).oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    fn passing() -> Fixed {
        Fixed {
            live: Ok("ok".into()),
            ready: Ok("ready\n".into()),
            metrics: Ok("# EOF\n".into()),
        }
    }

    fn failing() -> Fixed {
        Fixed {
            live: Err("stuck\n".into()),
            ready: Err("not ready".into()),
            metrics: Err(std::fmt::Error),
        }
    }

    #[tokio::test]
    async fn checks_answer_their_text_unchanged() {
        let text = "text/plain; charset=utf-8".to_string();
        assert_eq!(
            call(passing(), "GET", "/healthz").await,
            (200, text.clone(), "ok".into())
        );
        assert_eq!(
            call(passing(), "GET", "/readyz").await,
            (200, text.clone(), "ready\n".into())
        );
        assert_eq!(
            call(failing(), "GET", "/healthz").await,
            (503, text.clone(), "stuck\n".into())
        );
        assert_eq!(
            call(failing(), "GET", "/readyz").await,
            (503, text, "not ready".into())
        );
    }

    #[tokio::test]
    async fn metrics_are_openmetrics_or_500() {
        assert_eq!(
            call(passing(), "GET", "/metrics").await,
            (200, OPENMETRICS_CONTENT_TYPE.into(), "# EOF\n".into())
        );
        let (status, _, body) = call(failing(), "GET", "/metrics").await;
        assert_eq!((status, body.as_str()), (500, "metrics encoding failed\n"));
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_explained() {
        for (method, path, status) in [
            ("GET", "/nope", 404),
            ("POST", "/metrics", 405),
            ("DELETE", "/readyz", 405),
        ] {
            let (got, _, body) = call(passing(), method, path).await;
            assert_eq!(got, status, "{method} {path}");
            assert_eq!(
                body,
                format!(
                    "no route {method} {path}; routes: GET /healthz, GET /readyz, GET /metrics\n"
                )
            );
        }
        let long = format!("/{}", "x".repeat(1000));
        let (_, _, body) = call(passing(), "GET", &long).await;
        assert!(
            body.starts_with(&format!("no route GET {}; ", &long[..256])),
            "{body}"
        );
    }
}
