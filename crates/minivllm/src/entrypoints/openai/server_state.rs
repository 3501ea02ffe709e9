//! What every route shares: the server's configuration, the engine, the memory pool
//! requests hold against, and the id of the HTTP request being served. Its own module, below
//! the routes and the router that assembles them, so that no route imports the router.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::request_memory::{headroom, MemoryLimits, MemoryPool};
use super::tool_calls::ToolCallConfig;
use crate::engine::async_engine::AsyncEngine;
use crate::reasoning::ReasoningParserName;
use crate::sampling_params::{GenerationDefaults, PoolingParams};

/// How the server presents itself and whom it lets in.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model name clients send and `/v1/models` lists.
    pub served_model_name: String,
    /// When set, `/v1/*` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Origins browsers may call from (`*` for any); empty: no CORS headers at all.
    pub allowed_origins: Vec<String>,
    /// Larger request bodies get 413 before any of it is parsed (from `Content-Length`
    /// when the client sends one, before any of the body is read).
    pub max_request_body_bytes: usize,
    /// A request's body must arrive within this time (sooner for short bodies: see
    /// [`body_deadline`]), or the request gets 408 and its connection closes.
    pub body_read_timeout: Duration,
    /// The most one request may make the server hold (`--max-request-memory`); `None`: an
    /// eighth of the memory left once the model is loaded, at most 1 GiB.
    pub max_request_memory: Option<u64>,
    /// `--enable-auto-tool-choice` and `--tool-call-parser`.
    pub tool_calls: ToolCallConfig,
    /// `--reasoning-parser`: chat replies' thinking goes in `reasoning_content`.
    pub reasoning_parser: Option<ReasoningParserName>,
    /// `--pooler-config`: how `/v1/embeddings` pools a prompt's hidden states.
    pub pooler: PoolingParams,
    /// The chat page at `/` (off with `--disable-frontend`).
    pub frontend: bool,
    /// `--enable-prompt-tokens-details`: `usage.prompt_tokens_details.cached_tokens` in
    /// completions and chat replies.
    pub prompt_tokens_details: bool,
    /// `--generation-config`: the sampling defaults for fields a request leaves out.
    pub generation: GenerationDefaults,
    /// `--default-chat-template-kwargs`: template variables for every chat request, under
    /// the request's own `chat_template_kwargs`.
    pub default_chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl ServerConfig {
    pub(crate) const DEFAULT_MAX_REQUEST_BODY_BYTES: usize = 8 << 20;
    pub(crate) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

    pub fn new(served_model_name: impl Into<String>) -> Self {
        Self {
            served_model_name: served_model_name.into(),
            api_key: None,
            allowed_origins: Vec::new(),
            max_request_body_bytes: Self::DEFAULT_MAX_REQUEST_BODY_BYTES,
            body_read_timeout: Self::DEFAULT_BODY_READ_TIMEOUT,
            max_request_memory: None,
            tool_calls: ToolCallConfig::default(),
            reasoning_parser: None,
            pooler: PoolingParams::default(),
            frontend: true,
            prompt_tokens_details: false,
            generation: GenerationDefaults::default(),
            default_chat_template_kwargs: serde_json::Map::new(),
        }
    }

    /// The memory limits this configuration gives, read against the memory left now.
    pub(crate) fn memory_limits(&self) -> MemoryLimits {
        // Without /proc (not Linux), as if 8 GiB were left.
        let auto = MemoryLimits::from_headroom(headroom().unwrap_or(8 << 30));
        match self.max_request_memory {
            Some(per_request) => auto.with_per_request(per_request),
            None => auto,
        }
    }
}

pub struct AppState {
    pub engine: AsyncEngine,
    pub config: ServerConfig,
    /// What requests in flight hold, against the memory limits.
    pub memory: Arc<MemoryPool>,
    /// Permits for requests' CPU work off the async workers (see `serving_engine::off_async`):
    /// one per core, so such work queues instead of taking every thread.
    pub cpu: Semaphore,
}

pub type Shared = Arc<AppState>;

/// The id of one HTTP request: the client's `X-Request-Id` when it sent a usable one. It
/// names the engine requests, the response's `id`, and every log line of the request.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);
