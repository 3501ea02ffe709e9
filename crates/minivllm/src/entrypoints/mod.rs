//! How callers reach the engine: the library API and the OpenAI-compatible HTTP server.

pub mod llm;
pub mod openai;
