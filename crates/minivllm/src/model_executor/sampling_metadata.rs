//! What the sampler needs to know about one sequence's settings, distilled by the engine
//! from the request's `SamplingParams` (vLLM's `SamplingMetadata`): plain numbers and
//! borrowed lists, so that no request object reaches the model executor.

use std::collections::BTreeMap;

use crate::ids::TokenId;

/// One sequence's sampling settings for a step, borrowed from its request.
#[derive(Debug, Clone, Copy)]
pub struct SamplingOptions<'a> {
    /// Take the argmax (vLLM: temperature below its epsilon).
    pub greedy: bool,
    pub temperature: f32,
    /// `None`: no top-k cut.
    pub top_k: Option<usize>,
    pub top_p: f32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub logit_bias: &'a BTreeMap<TokenId, f32>,
    /// EOS and `stop_token_ids` are banned until this many tokens have been generated.
    pub min_tokens: usize,
    pub stop_token_ids: &'a [TokenId],
    /// How many top logprobs to report per sampled token.
    pub logprobs: Option<usize>,
}
