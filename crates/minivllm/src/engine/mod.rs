pub mod async_engine;
pub mod chat_template;
pub mod detokenizer;
pub mod llm_engine;
pub mod metrics;
pub mod stop_strings;
pub mod tokenizer;
