//! How callers reach the engine: the library API (and, next, the HTTP server).

pub mod llm;
