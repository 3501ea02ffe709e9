//! The engine: requests in, a step at a time, outputs out (vLLM's `LLMEngine` and its
//! async front), with the tokenizer, detokenizer, chat templates and metrics it needs.

pub mod arg_utils;
pub mod async_engine;
pub mod chat_template;
pub mod detokenizer;
pub mod errors;
pub mod input_processor;
pub mod llm_engine;
pub mod metrics;
pub mod output_processor;
pub mod speculative;
pub mod stop_strings;
pub mod structured_output_manager;
pub mod tokenizer;
