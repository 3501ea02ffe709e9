//! Requests, the sequences they fork into, and their lifecycle.

use std::fmt;

/// A token id in the model's vocabulary.
pub type TokenId = u32;

/// One sequence (one completion of one request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(pub u64);

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq {}", self.0)
    }
}

/// A request as the caller named it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub String);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a sequence stopped, with vLLM's names (`finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the maximum model length.
    Length,
    /// Aborted by the caller.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What ended a `Stop`: vLLM's `stop_reason` (None for EOS).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StopReason {
    Token(TokenId),
    String(String),
}
