//! How callers reach the engine: the library API and the HTTP server (OpenAI's API, and
//! Anthropic's Messages).

pub mod anthropic;
pub mod llm;
pub mod openai;
