//! `minivllm serve`: the OpenAI-compatible HTTP server.

use anyhow::Context;
use minivllm::engine::async_engine::{AsyncEngine, AsyncEngineOptions};
use minivllm::engine::llm_engine::LLMEngine;
use std::time::Duration;

use minivllm::entrypoints::openai::api_server::{self, ConnectionLimits};
use minivllm::entrypoints::openai::server_state::ServerConfig;
use minivllm::entrypoints::openai::tool_calls::ToolCallConfig;
use minivllm::entrypoints::openai::tool_parsers::ToolParserName;

use crate::EngineFlags;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub engine: EngineFlags,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients send and `/v1/models` lists (default: the --model string).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer <key>` on every route but /health, /metrics and
    /// /version (/v1/*, /tokenize and /detokenize included).
    #[arg(long, env = "MINIVLLM_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Origins allowed to call from a browser (CORS), comma-separated, or `*`. Default: none.
    #[arg(long, value_delimiter = ',')]
    pub allowed_origins: Vec<String>,
    /// Answer 503 to a request that would leave more than this many sequences waiting to be
    /// scheduled, a request counting as its `n` (or `best_of`) sequences (default: no
    /// limit).
    #[arg(long)]
    pub max_waiting_requests: Option<usize>,
    /// Larger request bodies are refused with 413, e.g. `8MiB`.
    #[arg(long, default_value = "8MiB", value_parser = crate::parse_bytes)]
    pub max_request_body_size: u64,
    /// Seconds a client has to send a request's headers before its connection is closed.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub header_read_timeout: f64,
    /// Seconds a client has to send a request's body (408 and the connection closed after);
    /// a body with a Content-Length must also come at 64 KiB/s or faster after 5 s.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub body_read_timeout: f64,
    /// The most memory one request may make the server hold (its prompts x n x logprobs,
    /// stop strings, response), estimated before it is queued; above it: 400, e.g. `256MiB`.
    /// Default: an eighth of the memory left after loading (the least of free memory, the
    /// cgroup limit and `ulimit -v`), at most 1 GiB. Requests in flight together may hold
    /// half of that memory, and at least four times this; past it they get 503.
    #[arg(long, value_parser = crate::parse_bytes)]
    pub max_request_memory: Option<u64>,
    /// Seconds a client may accept none of its response (its socket buffer full) before its
    /// connection is closed and its request aborted; as nginx's `send_timeout`.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub send_timeout: f64,
    /// Connections served at once; further ones wait in the listen backlog.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub max_connections: u64,
    /// Seconds a response may take to start before the request gets 408 (off by default:
    /// long prompts queue behind others).
    #[arg(long, value_parser = positive_seconds)]
    pub request_timeout: Option<f64>,
    /// Seconds requests in flight may take to finish after SIGINT/SIGTERM; connections
    /// still open then are closed.
    #[arg(long, default_value_t = 30.0, value_parser = positive_seconds)]
    pub shutdown_timeout: f64,
    /// Variables every chat request's template gets, as vLLM's JSON object: `{"enable_thinking":
    /// true}` turns Gemma 4's and Qwen3's thinking on by default. A request's own
    /// `chat_template_kwargs` take precedence.
    #[arg(long, value_parser = json_object)]
    pub default_chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Let the model decide when to call tools (`tool_choice: "auto"`, the default when a
    /// chat request has `tools`); its calls are read with --tool-call-parser.
    #[arg(long)]
    pub enable_auto_tool_choice: bool,
    /// How the model writes tool calls: hermes (Qwen2.5, Qwen3, Hermes), llama3_json
    /// (Llama 3.1-3.3), mistral, pythonic (Llama 3.2/4), openai (gpt-oss), gemma4. Default with
    /// --enable-auto-tool-choice: the one the model's chat template shows.
    #[arg(long)]
    pub tool_call_parser: Option<ToolParserName>,
    /// How `/v1/embeddings` pools a prompt's final hidden states, as vLLM's JSON:
    /// `{"pooling_type": "LAST" | "MEAN", "normalize": true | false}` (default: LAST,
    /// normalised).
    #[arg(long, value_parser = minivllm::sampling_params::PoolingParams::from_json)]
    pub pooler_config: Option<minivllm::sampling_params::PoolingParams>,
    /// Serve no chat page at `/` (by default a page to talk to the model in a browser).
    #[arg(long)]
    pub disable_frontend: bool,
    /// Report `usage.prompt_tokens_details.cached_tokens` (prompt tokens the prefix cache
    /// held) in completions and chat replies, as vLLM's flag.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
    /// Sampling defaults for fields a request leaves out, as vLLM's flag: `auto` (the
    /// model folder's generation_config.json, when it has one), `vllm` (vLLM's own
    /// defaults), or a folder holding a generation_config.json.
    #[arg(long, default_value = "auto")]
    pub generation_config: String,
    /// A Jinja chat template to use instead of the model's: a file, or the template itself
    /// (as vLLM's --chat-template).
    #[arg(long)]
    pub chat_template: Option<String>,
}

/// `--chat-template`'s value: a file's text, or the value itself when it is a template.
fn chat_template(value: &str) -> anyhow::Result<String> {
    let path = std::path::Path::new(value);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the chat template {value}"));
    }
    if value.contains("{{") || value.contains("{%") {
        return Ok(value.to_string());
    }
    anyhow::bail!("--chat-template {value:?}: no such file, and not a Jinja template either")
}

/// The tool-call settings, the parser read from the chat template when not given.
fn tool_call_config(args: &ServeArgs, engine: &LLMEngine) -> anyhow::Result<ToolCallConfig> {
    let parser = match (args.tool_call_parser, args.enable_auto_tool_choice) {
        (Some(p), _) => Some(p),
        (None, false) => None,
        (None, true) => {
            let template = engine.tokenizer().chat_template().unwrap_or_default();
            let Some(p) = ToolParserName::detect(template) else {
                anyhow::bail!(
                    "--enable-auto-tool-choice needs --tool-call-parser: this model's chat \
                     template shows no tool-call format this server knows ({})",
                    ToolParserName::ALL.map(|p| p.as_str()).join(", ")
                );
            };
            tracing::info!(
                "tool calls read with the {} parser (from the chat template)",
                p.as_str()
            );
            Some(p)
        }
    };
    Ok(ToolCallConfig {
        enable_auto_tool_choice: args.enable_auto_tool_choice,
        parser,
    })
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v < 1e9 => Ok(v),
        _ => Err(format!("{s:?} is not a positive number of seconds")),
    }
}

pub fn run(
    args: ServeArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    let mut engine_args = args.engine.engine_args()?;
    engine_args.chat_template = args
        .chat_template
        .as_deref()
        .map(chat_template)
        .transpose()?;
    let engine = LLMEngine::from_engine_args_with_driver(&engine_args, driver)
        .context("cannot start the engine")?;
    let tool_calls = tool_call_config(&args, &engine)?;
    if let Some((endpoint, replay)) = engine.kv_events_endpoints() {
        // The bound addresses, so that port 0 says which port it got.
        eprintln!(
            "KV cache events on {endpoint}{}",
            replay.map_or(String::new(), |r| format!(", replay on {r}"))
        );
    }
    if let Some(addr) = engine.kv_transfer_endpoint() {
        eprintln!("KV transfer: prefilled requests' KV kept for decode servers on {addr}");
    }
    let config = ServerConfig {
        served_model_name: args
            .served_model_name
            .unwrap_or_else(|| engine_args.model.clone()),
        api_key: args.api_key.filter(|k| !k.is_empty()),
        allowed_origins: args.allowed_origins,
        max_request_body_bytes: usize::try_from(args.max_request_body_size)
            .context("--max-request-body-size is too large")?,
        body_read_timeout: Duration::from_secs_f64(args.body_read_timeout),
        max_request_memory: args.max_request_memory,
        tool_calls,
        reasoning_parser: engine_args.reasoning_parser,
        pooler: args.pooler_config.unwrap_or_default(),
        frontend: !args.disable_frontend,
        prompt_tokens_details: args.enable_prompt_tokens_details,
        generation: generation_defaults(&args.generation_config, &engine_args.model)?,
        default_chat_template_kwargs: args.default_chat_template_kwargs.unwrap_or_default(),
    };
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs_f64(args.header_read_timeout),
        max_connections: args.max_connections as usize,
        shutdown_timeout: Duration::from_secs_f64(args.shutdown_timeout),
        request_timeout: args.request_timeout.map(Duration::from_secs_f64),
        send_timeout: Duration::from_secs_f64(args.send_timeout),
    };
    let options = AsyncEngineOptions {
        max_waiting_requests: args.max_waiting_requests,
    };
    let engine = AsyncEngine::with_options(engine, options);
    let engine_thread = engine.take_thread();
    let rt = tokio::runtime::Builder::new_multi_thread()
        // The engine has its own thread and kernel pool; the server only shuffles bytes.
        .worker_threads(2)
        .enable_all()
        .build()?;
    let (aborted_tx, aborted) = std::sync::mpsc::channel();
    let served = rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        // The bound address, so that `--port 0` says which port it got.
        let addr = listener.local_addr().map_or(addr, |a| a.to_string());
        eprintln!(
            "serving {} on http://{addr}{}",
            config.served_model_name,
            if config.api_key.is_some() {
                " (API key required on /v1)"
            } else {
                ""
            }
        );
        if config.frontend {
            eprintln!("chat in a browser: http://{addr}/");
        }
        let (first_signal, signalled) = tokio::sync::oneshot::channel();
        let in_flight = engine.clone();
        let graceful = async move {
            shutdown_signal().await;
            let s = in_flight.stats();
            eprintln!(
                "shutting down: finishing {} requests in flight (signal again to abort them)",
                s.num_running + s.num_waiting + s.num_swapped
            );
            let _ = first_signal.send(());
        };
        tokio::select! {
            r = api_server::serve(listener, engine, config, limits, graceful) => r.context("server error"),
            // Dropping the runtime drops every response stream, which aborts their requests.
            _ = async { if signalled.await.is_ok() { shutdown_signal().await } else { std::future::pending().await } } => {
                eprintln!("aborting the requests in flight");
                let _ = aborted_tx.send(());
                Ok(())
            }
        }
    });
    if aborted.try_recv().is_ok() {
        // At once, as the second signal asked: work on the blocking threads (a long prompt
        // being tokenised) is not waited for, and it holds handles to the engine, so the
        // engine thread is not joined either; the process exits when this returns.
        rt.shutdown_background();
        return served;
    }
    // Dropping the runtime drops the last handles to the engine; its thread then drops the
    // engine, which, with tensor parallelism, stops the workers, and must do so before this
    // thread ends MPI by dropping the group.
    drop(rt);
    if let Some(thread) = engine_thread {
        let _ = thread.join();
    }
    served
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// `--generation-config`: `auto` reads the model folder's file, `vllm` none, anything else
/// names a folder whose file must be there.
fn generation_defaults(
    flag: &str,
    model: &str,
) -> anyhow::Result<minivllm::sampling_params::GenerationDefaults> {
    use minivllm::sampling_params::GenerationDefaults;
    let dir = match flag {
        "vllm" => return Ok(GenerationDefaults::default()),
        "auto" => std::path::PathBuf::from(model),
        folder => {
            let dir = std::path::PathBuf::from(folder);
            if !dir.join("generation_config.json").is_file() {
                anyhow::bail!("--generation-config {folder}: no generation_config.json there");
            }
            dir
        }
    };
    let d = GenerationDefaults::from_model(&dir).map_err(anyhow::Error::msg)?;
    if !d.from_file.is_empty() {
        tracing::info!(fields = ?d.from_file, "default sampling parameters from generation_config.json");
    }
    Ok(d)
}

/// A JSON object given on the command line.
fn json_object(s: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    match serde_json::from_str(s) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err("expected a JSON object, e.g. '{\"enable_thinking\": true}'".into()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}
