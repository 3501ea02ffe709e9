//! The OpenAI-compatible HTTP server: routes, the layers every request passes through
//! (request ids and logs, API key, body size limit, CORS), and the accept loop that bounds
//! connections (header-read timeout, connection limit, shutdown deadline).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument;

use super::protocol::ApiError;
use super::serving_chat::chat_completions;
use super::serving_completion::completions;
use super::serving_engine::now;
use super::serving_tokenization::{detokenize, tokenize};
use crate::engine::async_engine::AsyncEngine;

/// How the server presents itself and whom it lets in.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model name clients send and `/v1/models` lists.
    pub served_model_name: String,
    /// When set, `/v1/*` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Origins browsers may call from (`*` for any); empty: no CORS headers at all.
    pub allowed_origins: Vec<String>,
    /// Larger request bodies get 413 before any of it is parsed.
    pub max_request_body_bytes: usize,
}

impl ServerConfig {
    pub const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 8 << 20;

    pub fn new(served_model_name: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            api_key: None,
            allowed_origins: Vec::new(),
            max_request_body_bytes: Self::DEFAULT_MAX_REQUEST_BODY_BYTES,
        }
    }
}

pub struct AppState {
    pub engine: AsyncEngine,
    pub config: ServerConfig,
    /// Permits for requests' CPU work off the async workers (see `serving_engine::off_async`):
    /// one per core, so such work queues instead of taking every thread.
    pub cpu: Semaphore,
}

pub type Shared = Arc<AppState>;

/// The id of one HTTP request: the client's `X-Request-Id` when it sent a usable one. It
/// names the engine requests, the response's `id`, and every log line of the request.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

pub fn router(engine: AsyncEngine, config: ServerConfig) -> Router {
    let body_limit = config.max_request_body_bytes;
    let cors = cors_layer(&config.allowed_origins);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let state = Arc::new(AppState {
        engine,
        config,
        cpu: Semaphore::new(cores),
    });
    // Every route that takes work needs the key: probes and scrapers keep working, but the
    // tokenizer routes (CPU work on any text) are not open to whoever can reach the port.
    let v1 = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    let router = Router::new()
        .route("/health", get(|| async {}))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .merge(v1)
        .route_layer(middleware::from_fn(require_json))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state);
    let router = match cors {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.layer(middleware::from_fn(request_id_and_log))
}

/// What the server grants each connection.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// A client must send a request's headers within this time, or its connection closes.
    pub header_read_timeout: Duration,
    /// Connections served at once; more wait in the listen backlog (nothing is accepted, so
    /// no file descriptor is spent) until one closes.
    pub max_connections: usize,
    /// After shutdown starts, connections still open this long are closed.
    pub shutdown_timeout: Duration,
    /// A request whose response has not started within this time gets 408 (off: `None`).
    pub request_timeout: Option<Duration>,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            request_timeout: None,
        }
    }
}

/// Serves until `shutdown` resolves, then lets requests in flight finish for up to
/// `limits.shutdown_timeout` and closes what remains.
pub async fn serve(
    listener: TcpListener,
    engine: AsyncEngine,
    config: ServerConfig,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let mut app = router(engine, config);
    if let Some(t) = limits.request_timeout {
        app = app.layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            t,
        ));
    }
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: the error is the listener's, not the
                    // server's end; wait for connections to close instead of spinning.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let conn =
            http.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        connections.spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!("connection: {e}");
            }
            drop(permit);
        });
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let open = connections.len();
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(limits.shutdown_timeout) => {
            tracing::warn!(
                "shutdown: closing the connections still open after {:?} ({open} were open)",
                limits.shutdown_timeout
            );
            // Dropping a connection's task closes its socket and drops its response
            // streams, which aborts their requests.
            connections.shutdown().await;
        }
    }
    Ok(())
}

fn cors_layer(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers(Any),
    )
}

fn usable_request_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    let ok = (1..=128).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    ok.then(|| s.to_string())
}

async fn request_id_and_log(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .and_then(usable_request_id)
        .unwrap_or_else(|| {
            format!(
                "{:016x}{:016x}",
                rand::random::<u64>(),
                rand::random::<u64>()
            )
        });
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!(
        "http",
        request_id = %id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let start = Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    span.in_scope(|| {
        tracing::info!(
            status = resp.status().as_u16(),
            ms = start.elapsed().as_millis() as u64,
            "response"
        )
    });
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert("x-request-id", v);
    }
    resp
}

/// Compares in time independent of where the strings differ, so the key cannot be guessed
/// byte by byte from response times.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// POST bodies must be declared JSON. A form or text body is a CORS "simple request" that a
/// web page may send to a local server without a preflight; refusing it (415, as vLLM's
/// FastAPI does for bodies it cannot parse) keeps such pages from driving a keyless server.
async fn require_json(req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if json {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "the request body must be JSON, sent with Content-Type: application/json",
        None,
    )
    .into_response()
}

async fn require_api_key(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let Some(key) = &s.config.api_key else {
        return next.run(req).await;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match given {
        Some(k) if same_secret(k.trim().as_bytes(), key.as_bytes()) => next.run(req).await,
        _ => ApiError::new(
            StatusCode::UNAUTHORIZED,
            "Unauthorized: send the server's API key as `Authorization: Bearer <key>`",
            None,
        )
        .into_response(),
    }
}

async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

async fn models(State(s): State<Shared>) -> Json<Value> {
    let name = &s.config.served_model_name;
    Json(json!({
        "object": "list",
        "data": [{
            "id": name,
            "object": "model",
            "created": now(),
            "owned_by": "minivllm",
            "root": name,
            "max_model_len": s.engine.max_model_len(),
        }]
    }))
}

async fn metrics(State(s): State<Shared>) -> Response {
    let text = s.engine.metrics_text(&s.config.served_model_name);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_from_clients_are_checked() {
        let ok = HeaderValue::from_static("abc-123_x.y:z");
        assert_eq!(usable_request_id(&ok).as_deref(), Some("abc-123_x.y:z"));
        for bad in ["", "has space", "semi;colon", &"x".repeat(129)] {
            let v = HeaderValue::from_str(bad).unwrap();
            assert_eq!(usable_request_id(&v), None, "{bad:?}");
        }
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"key", b"key"));
        assert!(!same_secret(b"key", b"kez"));
        assert!(!same_secret(b"key", b"key2"));
        assert!(!same_secret(b"", b"k"));
    }
}
