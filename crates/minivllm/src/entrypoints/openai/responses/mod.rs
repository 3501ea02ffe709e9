//! OpenAI's Responses API (`POST /v1/responses`), stateless, as vLLM's
//! `entrypoints/openai/responses`: requests read as chat requests, replies written back as
//! output items and the Responses stream events.

pub mod protocol;
pub(crate) mod serving;
