//! Requests, their sequences (`n` or `best_of` of them), and their lifecycle.

use std::collections::HashMap;
use std::sync::Arc;

use crate::distributed::kv_transfer::KvPayload;
pub use crate::ids::{RequestId, SeqId, TokenId};
use crate::sampling_params::{PoolingType, SamplingParams};
use crate::spec_decode::draft_length::DraftAcceptance;
use crate::structured_output::StructuredOutputGrammar;

/// Why a sequence stopped, with vLLM's names (`finish_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// EOS, a stop token id or a stop string.
    Stop,
    /// `max_tokens` or the maximum model length.
    Length,
    /// Aborted by the caller.
    Abort,
    /// The sequence could not go on: its structured-output grammar broke (over its limits).
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
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

/// Where an unfinished sequence is: which of the scheduler's queues holds it (that queue
/// is the one record of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(test)]
pub(crate) enum SequenceStatus {
    /// Not started, or preempted and waiting to be recomputed.
    Waiting,
    Running,
    /// Preempted with its K/V copied to the CPU swap pool, waiting to be copied back.
    Swapped,
}

/// The unfinished sequences by id: the scheduler owns them, the executor and the output
/// processor read them (one record of each sequence's tokens and settings).
pub(crate) type Sequences = HashMap<SeqId, Sequence>;

/// One sequence, owned by the scheduler while it runs (vLLM v1's `Request`): its tokens,
/// how many have K/V in the cache, and what decides when it stops.
#[derive(Debug, Clone)]
pub struct Sequence {
    pub id: SeqId,
    /// The request it is a completion of: its parent, of `n` (or `best_of`) children.
    pub request: RequestId,
    /// Its place among its request's completions; it picks the sequence's RNG stream.
    pub index: usize,
    /// Prompt then generated tokens.
    pub token_ids: Vec<TokenId>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the cache; the rest are fed to the model in coming steps.
    pub num_computed_tokens: usize,
    /// Lower runs first under the priority policy.
    pub priority: i32,
    /// Request arrival order; ties within a request broken by `id`.
    pub arrival: u64,
    /// Compute the whole prompt even when the prefix cache holds part of it (its logits are
    /// needed, e.g. for prompt logprobs).
    pub skip_prefix_cache: bool,
    pub params: Arc<SamplingParams>,
    /// Output tokens at which it stops for length: `max_tokens`, or what the model's
    /// context leaves after the prompt when that is less.
    pub max_tokens: usize,
    /// The model's end-of-sequence tokens (ignored with `ignore_eos`).
    pub eos_token_ids: Arc<[TokenId]>,
    /// Whether the worker has been sent its prompt and settings: it keeps them from the
    /// first step that schedules the sequence until the sequence finishes.
    pub known_to_worker: bool,
    /// Constrains which tokens it may sample (structured output).
    pub grammar: Option<Box<dyn StructuredOutputGrammar>>,
    /// Tokens a draft proposer guessed come next, for the next step to verify
    /// (speculative decoding).
    pub spec_token_ids: Vec<TokenId>,
    /// How its recent guesses fared: sets how many it gets next.
    pub draft_acceptance: DraftAcceptance,
    /// Prompt tokens the prefix cache held when it was first scheduled (vLLM's
    /// `num_cached_tokens`); `None` until then.
    pub num_cached_tokens: Option<usize>,
    /// Its prompt's KV, pulled from a prefill server, until the scheduler admits it.
    pub kv_import: Option<Arc<KvPayload>>,
}

impl Sequence {
    /// Whether a decode server is to pull its prompt's KV once it finishes.
    pub(crate) fn exports_kv(&self) -> bool {
        (self.params.kv_transfer_params.as_ref()).is_some_and(|p| p.do_remote_decode)
    }

    pub fn new(id: SeqId, prompt: Vec<TokenId>, priority: i32, arrival: u64) -> Self {
        Self {
            id,
            request: RequestId(String::new()),
            prompt_len: prompt.len(),
            token_ids: prompt,
            num_computed_tokens: 0,
            priority,
            arrival,
            skip_prefix_cache: false,
            index: 0,
            params: Arc::default(),
            max_tokens: usize::MAX,
            eos_token_ids: Arc::from([]),
            known_to_worker: false,
            grammar: None,
            spec_token_ids: Vec::new(),
            draft_acceptance: DraftAcceptance::default(),
            num_cached_tokens: None,
            kv_import: None,
        }
    }

    /// The same sequence, as completion `index` of `request`.
    pub(crate) fn of_request(self, request: RequestId, index: usize) -> Self {
        Self {
            request,
            index,
            ..self
        }
    }

    /// The same sequence, sampled with `params` and stopping as they and `max_tokens` say.
    pub(crate) fn with_sampling(
        self,
        params: Arc<SamplingParams>,
        max_tokens: usize,
        eos_token_ids: Arc<[TokenId]>,
    ) -> Self {
        Self {
            params,
            max_tokens,
            eos_token_ids,
            ..self
        }
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

    pub(crate) fn num_uncomputed(&self) -> usize {
        self.token_ids.len() - self.num_computed_tokens
    }

    /// Whether it scores its prompt's tokens: the first completion of a request that asked
    /// for prompt logprobs.
    pub(crate) fn scores_prompt(&self) -> bool {
        self.index == 0 && self.params.prompt_logprobs.is_some()
    }

    /// An embedding request that averages every prompt position's hidden state: cached
    /// prefix blocks have none, so it computes its prompt whole.
    pub(crate) fn pools_every_position(&self) -> bool {
        self.params
            .pooling
            .is_some_and(|p| p.pooling_type == PoolingType::Mean)
    }

    /// How many of its draft tokens a step may verify: none under a grammar (its mask is
    /// for the next token only), and none past `max_tokens`.
    pub(crate) fn num_spec_tokens(&self) -> usize {
        if self.grammar.is_some() {
            return 0;
        }
        let room = self.max_tokens.saturating_sub(self.output_ids().len() + 1);
        self.spec_token_ids.len().min(room)
    }

    /// Whether the token just appended ends the sequence, on ids and length alone (vLLM
    /// v1's `check_stop`): a stop token or EOS once `min_tokens` are out, or `max_tokens`.
    /// Stop strings need the text, which the output processor checks.
    /// Whether the last token is the EOS or stop id that ends the sequence: a mark, not
    /// text (vLLM leaves it out of the output text).
    pub(crate) fn ends_on_stop_token(&self) -> bool {
        let Some(&last) = self.output_ids().last() else {
            return false;
        };
        let n_out = self.output_ids().len();
        (n_out >= self.params.min_tokens && self.params.stop_token_ids.contains(&last))
            || self.stops_on_eos(last, n_out)
    }

    fn stops_on_eos(&self, last: TokenId, n_out: usize) -> bool {
        n_out >= self.params.min_tokens
            && !self.params.ignore_eos
            && self.eos_token_ids.contains(&last)
    }

    pub(crate) fn check_stop(&self) -> Option<(FinishReason, Option<StopReason>)> {
        let &last = self.output_ids().last()?;
        let n_out = self.output_ids().len();
        let p = &self.params;
        let after_min = n_out >= p.min_tokens;
        if after_min && p.stop_token_ids.contains(&last) {
            Some((FinishReason::Stop, Some(StopReason::Token(last))))
        } else if self.grammar.as_ref().is_some_and(|g| g.error().is_some()) {
            // Before EOS: the broken grammar's mask forced the EOS (its reason is logged).
            Some((FinishReason::Error, None))
        } else if self.stops_on_eos(last, n_out) {
            Some((FinishReason::Stop, None))
        } else if self.grammar.as_ref().is_some_and(|g| g.is_terminated()) {
            // Nothing may follow but EOS, which `min_tokens` or `ignore_eos` could ban,
            // leaving no token to sample.
            Some((FinishReason::Stop, None))
        } else if n_out >= self.max_tokens {
            Some((FinishReason::Length, None))
        } else {
            None
        }
    }
}
