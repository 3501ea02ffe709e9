//! `minivllm serve`: the OpenAI-compatible HTTP server.

use anyhow::Context;
use minivllm::engine::async_engine::AsyncEngine;
use minivllm::engine::llm_engine::LLMEngine;

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
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let engine_args = args.engine.engine_args()?;
    let engine = LLMEngine::from_engine_args(&engine_args).context("cannot start the engine")?;
    let name = args
        .served_model_name
        .unwrap_or_else(|| engine_args.model.clone());
    let engine = AsyncEngine::new(engine);
    let rt = tokio::runtime::Builder::new_multi_thread()
        // The engine has its own thread and kernel pool; the server only shuffles bytes.
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!("serving {name} on http://{addr}");
        minivllm::entrypoints::openai::server::serve(listener, engine, name, shutdown_signal())
            .await
            .context("server error")
    })
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
