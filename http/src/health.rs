//! `GET /healthz`, `GET /readyz` and `GET /metrics` (axum), for a component that says through
//! [`Endpoints`] what its checks find and what its metrics are, and the answer to a request that no
//! route takes ([`no_route`]), for this router and for a component's own larger one.
//!
//! A check that passes answers 200, one that fails 503, each with the component's text as the body,
//! unchanged (`text/plain; charset=utf-8`). `/metrics` answers the OpenMetrics text, or 500 when it
//! could not be encoded. A path served asked with another method answers 405 with an `Allow` header
//! naming the method to use; any other request answers 404; both with a text naming what was asked
//! and the routes served.

use std::borrow::Cow;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use carma_core::text::truncate_at_char_boundary;

/// Content type of `/metrics`: the OpenMetrics text that prometheus-client encodes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A router's routes as `(method, path)` pairs, in the order [`no_route`] lists them.
pub type Routes = &'static [(&'static str, &'static str)];

/// The routes of [`router`] (and of [`routes`]).
pub const ROUTES: Routes = &[("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics")];

/// Longest request text (the method, the path) that [`no_route`] repeats, in bytes; longer text is
/// cut by [`clip`]: it comes from the client.
pub const SHOWN_REQUEST_LIMIT: usize = 256;

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

/// The router of `/healthz`, `/readyz` and `/metrics`, answered by `endpoints`; any other request
/// gets [`no_route`] with [`ROUTES`].
pub fn router(endpoints: Arc<dyn Endpoints>) -> Router {
    let unrouted = |method: Method, uri: Uri| async move { no_route(ROUTES, &method, &uri) };
    routes(endpoints)
        .fallback(unrouted)
        .method_not_allowed_fallback(unrouted)
}

/// The three routes of [`router`] without its fallbacks, to merge into a component's larger router
/// (which then sets its own, [`no_route`] with its whole route list, after merging).
pub fn routes(endpoints: Arc<dyn Endpoints>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
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

/// The answer to `method uri` when no route of `routes` takes it.
///
/// A path of `routes` asked with another method answers 405 with an `Allow` header listing the
/// methods it takes (RFC 9110, section 15.5.6) and `method M is not allowed on P; use A (routes:
/// …)`; any other request answers 404 with `no route M P; routes: …`. The method and the path are
/// cut by [`clip`] to [`SHOWN_REQUEST_LIMIT`] bytes.
pub fn no_route(routes: Routes, method: &Method, uri: &Uri) -> Response {
    let path = uri.path();
    let method = clip(method.as_str(), SHOWN_REQUEST_LIMIT);
    let list = routes
        .iter()
        .map(|(m, p)| format!("{m} {p}"))
        .collect::<Vec<_>>()
        .join(", ");
    let allowed = routes
        .iter()
        .filter(|(_, p)| *p == path)
        .map(|(m, _)| *m)
        .collect::<Vec<_>>()
        .join(", ");
    if allowed.is_empty() {
        let path = clip(path, SHOWN_REQUEST_LIMIT);
        (
            StatusCode::NOT_FOUND,
            format!("no route {method} {path}; routes: {list}\n"),
        )
            .into_response()
    } else {
        (
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, allowed.clone())],
            format!("method {method} is not allowed on {path}; use {allowed} (routes: {list})\n"),
        )
            .into_response()
    }
}

/// `text` cut to at most `limit` bytes (on a character boundary), followed by `… (N bytes)` naming
/// the full length when cut; unchanged when it fits.
pub fn clip(text: &str, limit: usize) -> Cow<'_, str> {
    if text.len() <= limit {
        return Cow::Borrowed(text);
    }
    let head = truncate_at_char_boundary(text, limit);
    Cow::Owned(format!("{head}… ({} bytes)", text.len()))
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

    /// Status, `Allow` header and body of `method path`.
    async fn refused(method: &str, path: &str) -> (u16, Option<String>, String) {
        let request = Request::builder()
            .method(method)
            .uri(path)
            .body(Body::empty())
            .unwrap();
        let response = router(Arc::new(passing())).oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let allow = response
            .headers()
            .get(header::ALLOW)
            .map(|v| v.to_str().unwrap().to_string());
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, allow, String::from_utf8(body.to_vec()).unwrap())
    }

    const LIST: &str = "GET /healthz, GET /readyz, GET /metrics";

    #[tokio::test]
    async fn another_method_gets_405_with_allow() {
        for (method, path) in [
            ("POST", "/metrics"),
            ("DELETE", "/readyz"),
            ("PUT", "/healthz"),
        ] {
            assert_eq!(
                refused(method, path).await,
                (
                    405,
                    Some("GET".into()),
                    format!("method {method} is not allowed on {path}; use GET (routes: {LIST})\n")
                ),
                "{method} {path}"
            );
        }
    }

    #[tokio::test]
    async fn an_unknown_path_gets_404_naming_it_and_the_routes() {
        for (method, path) in [("GET", "/nope"), ("POST", "/"), ("GET", "/metrics/x")] {
            assert_eq!(
                refused(method, path).await,
                (
                    404,
                    None,
                    format!("no route {method} {path}; routes: {LIST}\n")
                ),
                "{method} {path}"
            );
        }
        let long = format!("/{}", "x".repeat(1000));
        let (status, _, body) = refused("GET", &long).await;
        assert_eq!(status, 404);
        assert_eq!(
            body,
            format!(
                "no route GET {}… (1001 bytes); routes: {LIST}\n",
                &long[..SHOWN_REQUEST_LIMIT]
            )
        );
    }

    #[test]
    fn clip_cuts_on_a_character_boundary_and_names_the_length() {
        assert_eq!(clip("short", 5), Cow::Borrowed("short"));
        assert_eq!(clip("abcdef", 4), "abcd… (6 bytes)");
        // "é" is two bytes: a cut inside it moves back before it.
        assert_eq!(clip("aéb", 2), "a… (4 bytes)");
    }
}
