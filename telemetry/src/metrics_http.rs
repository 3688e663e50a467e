//! The HTTP side of both binaries' Prometheus metrics: `GET /metrics` in
//! the OpenMetrics text format, on a router each binary may extend (the
//! operator adds its health probes), served until shutdown.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

/// The media type prometheus-client's text encoder writes.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// A set of metrics that renders itself in the OpenMetrics text format.
pub trait OpenMetrics: Send + Sync + 'static {
    fn encode(&self) -> Result<String, std::fmt::Error>;
}

async fn scrape<M: OpenMetrics>(State(metrics): State<Arc<M>>) -> Response {
    match metrics.encode() {
        Ok(text) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

/// A router that answers `GET /metrics` with `metrics`.
pub fn metrics_router<M: OpenMetrics>(metrics: Arc<M>) -> Router {
    Router::new()
        .route("/metrics", get(scrape::<M>))
        .with_state(metrics)
}

/// Serves `app` on `listener` until `shutdown` resolves; `what` names it in
/// the log line that says where.
pub async fn serve_http(
    listener: TcpListener,
    app: Router,
    what: &'static str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving {what}");
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Fixed(Result<&'static str, ()>);

    impl OpenMetrics for Fixed {
        fn encode(&self) -> Result<String, std::fmt::Error> {
            self.0.map(str::to_owned).map_err(|()| std::fmt::Error)
        }
    }

    /// One HTTP/1.0 GET of `path` from a server of `metrics`: the status
    /// line, headers and body as sent.
    async fn get(metrics: Fixed, path: &str) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_http(
            listener,
            metrics_router(Arc::new(metrics)),
            "metrics",
            async {
                let _ = stopped.await;
            },
        ));
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        conn.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).await.expect("read");
        let _ = stop.send(());
        server.await.expect("join").expect("served");
        answer
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics_text() {
        let answer = get(Fixed(Ok("up 1\n# EOF\n")), "/metrics").await;
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        assert!(
            answer.contains(&format!("content-type: {OPENMETRICS_CONTENT_TYPE}")),
            "{answer}"
        );
        assert!(answer.ends_with("up 1\n# EOF\n"), "{answer}");
    }

    #[tokio::test]
    async fn a_failed_encoding_is_a_server_error_and_other_paths_are_not_found() {
        let answer = get(Fixed(Err(())), "/metrics").await;
        assert!(answer.starts_with("HTTP/1.0 500"), "{answer}");
        let answer = get(Fixed(Ok("up 1\n")), "/other").await;
        assert!(answer.starts_with("HTTP/1.0 404"), "{answer}");
    }
}
