//! An OpenAI-compatible HTTP server (`minivllm serve`), in the line of vLLM's.

pub mod protocol;
pub mod server;
