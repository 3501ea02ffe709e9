//! Anthropic's Messages API over the same engine, laid out like vLLM's
//! `vllm/entrypoints/anthropic`: requests read as chat requests, replies written back as
//! content blocks and Anthropic's stream events.

pub mod protocol;
pub(crate) mod serving_messages;
