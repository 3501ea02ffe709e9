//! Requests, their sequences (`n` or `best_of` of them), and their lifecycle.

pub use crate::ids::{RequestId, SeqId, TokenId};

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

/// What ended a `Stop`: vLLM's `stop_reason` (None for EOS). Serialises as the bare token id
/// or string, as vLLM writes it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(untagged)]
pub enum StopReason {
    Token(TokenId),
    String(String),
}

/// Where a sequence is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceStatus {
    /// Not started, or preempted and waiting to be recomputed.
    Waiting,
    Running,
    /// Preempted with its K/V copied to the CPU swap pool, waiting to be copied back.
    Swapped,
    Finished(FinishReason),
}

/// The scheduler's view of one sequence: its tokens and how many have K/V in the cache.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    /// The request it is a completion of: its sequence group.
    pub request: RequestId,
    /// Prompt then generated tokens.
    pub token_ids: Vec<TokenId>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache; the rest are fed to the model in coming steps.
    pub num_computed_tokens: usize,
    pub status: SequenceStatus,
    /// Lower runs first under the priority policy.
    pub priority: i32,
    /// Request arrival order; ties within a request broken by `id`.
    pub arrival: u64,
    /// Compute the whole prompt even when the prefix cache holds part of it (its logits are
    /// needed, e.g. for prompt logprobs).
    pub skip_prefix_cache: bool,
}

impl Sequence {
    pub fn new(id: SeqId, prompt: Vec<TokenId>, priority: i32, arrival: u64) -> Self {
        Self {
            id,
            request: RequestId(String::new()),
            prompt_len: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            status: SequenceStatus::Waiting,
            priority,
            arrival,
            skip_prefix_cache: false,
        }
    }

    /// The same sequence, as a completion of `request`.
    pub fn of_request(self, request: RequestId) -> Self {
        Self { request, ..self }
    }

    pub fn len(&self) -> usize {
        self.token_ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    pub fn output_ids(&self) -> &[TokenId] {
        &self.token_ids[self.prompt_len..]
    }

    pub fn num_uncomputed(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    pub fn is_finished(&self) -> bool {
        matches!(self.status, SequenceStatus::Finished(_))
    }
}
