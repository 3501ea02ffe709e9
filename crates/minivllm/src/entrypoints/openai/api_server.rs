//! The OpenAI-compatible HTTP server: routes, the layers every request passes through
//! (request ids and logs, API key, body size limit, CORS), and the accept loop that bounds
//! connections (header-read timeout, connection limit, shutdown deadline).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
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
use tokio_io_timeout::TimeoutStream;
use tower_http::cors::{AllowOrigin, Any, CorsLayer};
use tower_http::timeout::TimeoutLayer;
use tracing::Instrument;

use super::protocol::ApiError;
use super::request_memory::{trim_freed_memory, MemoryPool};
use super::responses::serving::{responses, retrieve};
use super::server_state::{AppState, RequestId, ServerConfig, Shared};
use super::serving_chat::chat_completions;
use super::serving_completion::completions;
use super::serving_embedding::embeddings;
use super::serving_engine::now;
use super::serving_tokenization::{detokenize, tokenize};
use crate::engine::async_engine::AsyncEngine;
use crate::entrypoints::anthropic::protocol::anthropic_errors;
use crate::entrypoints::anthropic::serving_messages::{count_tokens, messages};
use crate::utils::allocator::map_large_allocations;

/// Slower than this, a body's sender is holding a connection, not sending a request.
const MIN_BODY_BYTES_PER_SEC: u64 = 64 << 10;
/// Time any body gets before the rate counts.
const BODY_GRACE: Duration = Duration::from_secs(5);

/// How long a body of `content_length` bytes may take to arrive: the grace period plus
/// its length at the minimum rate, never more than `timeout` (which alone bounds a
/// chunked body, whose length is not known).
pub(crate) fn body_deadline(content_length: Option<u64>, timeout: Duration) -> Duration {
    match content_length {
        Some(len) => timeout
            .min(BODY_GRACE + Duration::from_secs_f64(len as f64 / MIN_BODY_BYTES_PER_SEC as f64)),
        None => timeout,
    }
}

pub fn router(engine: AsyncEngine, config: ServerConfig) -> Router {
    let body_limit = config.max_request_body_bytes;
    let cors = cors_layer(&config.allowed_origins);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let memory = MemoryPool::new(config.memory_limits());
    let limits = memory.limits();
    tracing::info!(
        per_request_mib = limits.per_request >> 20,
        in_flight_mib = limits.in_flight >> 20,
        "request memory limits"
    );
    map_large_allocations();
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(trim_freed_memory());
    }
    let state = Arc::new(AppState {
        engine,
        config,
        memory,
        cpu: Semaphore::new(cores),
    });
    // Layers run outside in: the key is checked before anything else is said about the
    // request (an unknown route or a wrong content type tells a stranger nothing), then
    // the body is read whole, within its size and time bounds, before any handler runs.
    let frontend = state.config.frontend;
    let router = Router::new()
        .route("/health", get(|| async {}))
        .route("/version", get(version))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/responses", post(responses))
        .route("/v1/responses/{id}", get(retrieve))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize));
    let router = if frontend {
        router.route("/", get(chat_page))
    } else {
        router
    };
    let router = router
        .route_layer(middleware::from_fn(require_json))
        // `read_body` enforces the limit; this lifts axum's own (2 MB) to it.
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(state.clone(), read_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .layer(middleware::from_fn(anthropic_errors))
        .with_state(state);
    let router = match cors {
        Some(cors) => router.layer(cors),
        None => router,
    };
    router.layer(middleware::from_fn(request_id_and_log))
}

/// Reads a request's body whole before its handler runs: 413 from `Content-Length` alone
/// when it is over the limit, 408 when the body does not arrive in time (a client sending
/// a byte every few seconds would otherwise hold its connection slot for as long as it
/// likes). The handler then gets the body from memory.
async fn read_body(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let limit = s.config.max_request_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return too_large(limit);
    }
    if declared == Some(0) || req.method() == Method::GET {
        return next.run(req).await;
    }
    let deadline = body_deadline(declared, s.config.body_read_timeout);
    let (parts, body) = req.into_parts();
    let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, limit));
    let bytes = match tokio::time::timeout(deadline, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => return too_large(limit),
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("cannot read the request body: {e}"), None)
                .into_response()
        }
        Err(_) => {
            // The rest of the body is not worth waiting for.
            return closing(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {:.0} s (bodies must arrive within \
                     --body-read-timeout, and at {} KiB/s or faster after the first {} s)",
                    deadline.as_secs_f64(),
                    MIN_BODY_BYTES_PER_SEC >> 10,
                    BODY_GRACE.as_secs()
                ),
                None,
            ));
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn too_large(limit: usize) -> Response {
    closing(ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the server's limit of {limit} bytes (--max-request-body-size)"),
        None,
    ))
}

/// `e` as a response that closes the connection: the body the client is still sending
/// would otherwise have to be read first.
fn closing(e: ApiError) -> Response {
    let mut resp = e.into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
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
    /// A connection whose client accepts none of its response for this long is closed
    /// (its request aborted), so a client that stops reading holds no slot and no memory.
    pub send_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            shutdown_timeout: Duration::from_secs(30),
            request_timeout: None,
            send_timeout: Duration::from_secs(30),
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
        // The timer runs only while a write waits on a full socket buffer.
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(limits.send_timeout));
        let conn = http.serve_connection(
            TokioIo::new(Box::pin(stream)),
            TowerToHyperService::new(app.clone()),
        );
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

/// Routes anyone may call when the server has a key: probes and scrapers keep working, but
/// every route that takes work (the tokenizer routes too: CPU work on any text), and any
/// path the server does not know, needs the key.
const OPEN_ROUTES: [&str; 3] = ["/health", "/version", "/metrics"];

async fn require_api_key(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let Some(key) = &s.config.api_key else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    // The chat page itself is no secret: it asks for the key before it calls the API.
    if OPEN_ROUTES.contains(&path) || (path == "/" && s.config.frontend) {
        return next.run(req).await;
    }
    // Exactly `Bearer <key>`, as vLLM compares it: no other spacing or case; or
    // Anthropic's `x-api-key: <key>` (its SDKs before 2.x send only that).
    let headers = req.headers();
    let bearer = (headers.get(header::AUTHORIZATION))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let x_api_key = headers.get("x-api-key").and_then(|v| v.to_str().ok());
    let ok = [bearer, x_api_key]
        .into_iter()
        .flatten()
        .any(|k| same_secret(k.as_bytes(), key.as_bytes()));
    if ok {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "Unauthorized: send the server's API key as `Authorization: Bearer <key>` (or \
         `x-api-key: <key>`)",
        None,
    )
    .into_response()
}

/// The chat page: plain HTML, CSS and JavaScript, built into the binary (no CDN: it works
/// offline), talking to `/v1/chat/completions` like any client.
const CHAT_PAGE: &str = include_str!("chat_page.html");

async fn chat_page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Its own script and styles, this server as the only place it talks to.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'",
            ),
        ],
        CHAT_PAGE,
    )
        .into_response()
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
