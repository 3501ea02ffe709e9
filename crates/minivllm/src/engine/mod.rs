//! The engine: requests in, a step at a time, outputs out (vLLM's `LLMEngine` and its
//! async front), with the tokenizer, detokenizer, chat templates and metrics it needs.

pub(crate) mod arg_utils;
pub mod async_engine;
pub mod chat_template;
pub mod detokenizer;
pub mod errors;
pub(crate) mod input_processor;
pub(crate) mod kv_transfer;
pub mod llm_engine;
pub mod metrics;
pub(crate) mod output_processor;
pub(crate) mod speculative;
pub mod stop_strings;
pub(crate) mod structured_output_manager;
pub mod tokenizer;
