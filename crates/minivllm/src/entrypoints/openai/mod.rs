//! An OpenAI-compatible HTTP API over the async engine, laid out like vLLM's
//! `vllm/entrypoints/openai`.

pub mod api_server;
pub mod chat_run;
pub mod protocol;
pub mod reply_events;
pub mod request_memory;
pub mod responses;
pub mod server_state;
pub mod serving_chat;
pub mod serving_completion;
pub mod serving_embedding;
pub mod serving_engine;
pub mod serving_tokenization;
pub mod structured_outputs;
pub mod tool_calls;
pub mod tool_parsers;
pub mod usage;
