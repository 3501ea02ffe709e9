//! An OpenAI-compatible HTTP API over the async engine, laid out like vLLM's
//! `vllm/entrypoints/openai`.

pub mod api_server;
pub(crate) mod chat_run;
pub mod protocol;
pub(crate) mod reply_events;
pub(crate) mod request_memory;
pub mod responses;
pub mod server_state;
pub(crate) mod serving_chat;
pub(crate) mod serving_completion;
pub mod serving_embedding;
pub(crate) mod serving_engine;
pub(crate) mod serving_tokenization;
pub(crate) mod structured_outputs;
pub(crate) mod template_kwargs;
pub mod tool_calls;
pub mod tool_parsers;
pub(crate) mod usage;
