//! Per-request sampling parameters, with vLLM's names, defaults and validation messages.
//!
//! The messages are vLLM's word for word (floats printed as Python prints them) so that
//! clients written against vLLM see the same errors from the HTTP server.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::distributed::kv_transfer::KvTransferParams;
use crate::ids::TokenId;
use crate::model_executor::sampling_metadata::SamplingOptions;

mod generation_config;
pub mod logprob_count;
mod pooling_params;
mod structural_tag;
mod structured_outputs;
pub use generation_config::GenerationDefaults;
pub use logprob_count::ALL_LOGPROBS;
pub use pooling_params::{PoolingParams, PoolingType};
pub use structural_tag::{StructuralTag, Structure};
pub use structured_outputs::{Constraint, StructuredOutputsParams, MAX_CONSTRAINT_BYTES};

/// Below this temperature sampling is greedy (vLLM's `_SAMPLING_EPS`).
pub(crate) const SAMPLING_EPS: f32 = 1e-5;

/// A sampling parameter out of range: vLLM's message, and the parameter at fault where
/// there is one (the OpenAI error's `param`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ValidationError {
    param: Option<&'static str>,
    message: String,
}

impl ValidationError {
    pub fn new(param: Option<&'static str>, message: impl Into<String>) -> Self {
        Self {
            param,
            message: message.into(),
        }
    }

    fn of(param: &'static str, message: impl Into<String>) -> Self {
        Self::new(Some(param), message)
    }

    pub fn param(&self) -> Option<&'static str> {
        self.param
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Most stop strings one request may have, and the longest each may be: they bound the
/// work of building a request's stop-string automaton (matching then costs per output
/// byte, whatever the list). OpenAI allows 4; llama.cpp and vLLM set no bound.
pub(crate) const MAX_STOP_STRINGS: usize = 1024;
pub(crate) const MAX_STOP_STRING_BYTES: usize = 4096;

/// Most `stop_token_ids` one request may have: each sampled token is looked up in them,
/// and each prompt holds a copy. vLLM sets no bound; a vocabulary's special tokens are a
/// few hundred at most.
pub(crate) const MAX_STOP_TOKEN_IDS: usize = 2048;

/// Most log-probabilities a request may ask for per position unless the engine allows more
/// (vLLM's `max_logprobs` default): each costs a top-k pass over the vocabulary and a share
/// of every output.
pub(crate) const MAX_LOGPROBS: usize = 20;

/// What each `RequestOutput` of a request carries (vLLM's `RequestOutputKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RequestOutputKind {
    /// Everything generated so far, after every step that advanced the request.
    #[default]
    Cumulative,
    /// Only what is new since the request's previous output (text, token ids, logprobs),
    /// so a streamed completion costs the same per token at its end as at its start;
    /// `RequestOutput::add` folds deltas back together. Tokens whose text is held back (half
    /// a character, a possible stop string) come in the delta whose text they release.
    Delta,
    /// One output, when the request has finished. A `best_of > n` request gives only this,
    /// whatever kind it asks for: its `n` completions are known only at its end.
    FinalOnly,
}

/// How to sample the completions of one request (vLLM's `SamplingParams`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Completions to return.
    pub n: usize,
    /// Completions to generate, of which the `n` best are returned (`None`: `n`).
    pub best_of: Option<usize>,
    /// Subtracted once from every token already in the output.
    pub presence_penalty: f32,
    /// Subtracted from every token once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Divides positive (multiplies negative) logits of tokens in the prompt or output.
    pub repetition_penalty: f32,
    /// Below [`SAMPLING_EPS`]: greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// 0 or -1: off.
    pub top_k: i32,
    pub min_p: f32,
    /// Makes the request's samples reproducible, whatever else shares its batches.
    pub seed: Option<u64>,
    /// Strings that end a completion (JSON: one string or a list).
    #[serde(deserialize_with = "string_or_list")]
    pub stop: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub stop_token_ids: Vec<TokenId>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// `None`: up to the model's context length.
    pub max_tokens: Option<usize>,
    /// EOS and stop tokens are banned until this many tokens have been generated.
    pub min_tokens: usize,
    /// Log-probabilities of this many most likely tokens per output token (plus the chosen
    /// one); [`ALL_LOGPROBS`] (JSON `-1`) for the whole vocabulary.
    #[serde(
        deserialize_with = "logprob_count::deserialize_opt",
        serialize_with = "logprob_count::serialize_opt"
    )]
    pub logprobs: Option<usize>,
    /// The same for every prompt token.
    #[serde(
        deserialize_with = "logprob_count::deserialize_opt",
        serialize_with = "logprob_count::serialize_opt"
    )]
    pub prompt_logprobs: Option<usize>,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    /// Added to the logits of these tokens before anything else.
    #[serde(deserialize_with = "null_as_default")]
    pub logit_bias: BTreeMap<TokenId, f32>,
    /// The constraint every completion follows (JSON schema, regex, choice, grammar).
    pub structured_outputs: Option<StructuredOutputsParams>,
    /// Set by the caller's front end, not by clients: the server streams deltas and
    /// `LLM::generate` wants final outputs only.
    #[serde(skip)]
    pub output_kind: RequestOutputKind,
    /// An embedding request (`LLM::embed`, `/v1/embeddings`): its prompt is run and pooled,
    /// and nothing is sampled. Set by the front end, as `output_kind`.
    #[serde(skip)]
    pub pooling: Option<PoolingParams>,
    /// Prefill/decode disaggregation (vLLM's `kv_transfer_params`, which its
    /// `SamplingParams` carries in `extra_args`): keep this request's KV for a decode
    /// server, or pull it from a prefill server.
    pub kv_transfer_params: Option<KvTransferParams>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            n: 1,
            best_of: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: None,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            max_tokens: Some(16),
            min_tokens: 0,
            logprobs: None,
            prompt_logprobs: None,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            spaces_between_special_tokens: true,
            logit_bias: BTreeMap::new(),
            structured_outputs: None,
            output_kind: RequestOutputKind::Cumulative,
            pooling: None,
            kv_transfer_params: None,
        }
    }
}

impl SamplingParams {
    /// Defaults, but temperature 0.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    pub(crate) fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS
    }

    /// What the sampler reads of these settings, for one step.
    pub(crate) fn sampling_options(&self) -> SamplingOptions<'_> {
        SamplingOptions {
            greedy: self.is_greedy(),
            temperature: self.temperature,
            top_k: self.top_k(),
            top_p: self.top_p,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            logit_bias: &self.logit_bias,
            min_tokens: self.min_tokens,
            stop_token_ids: &self.stop_token_ids,
            logprobs: self.logprobs,
        }
    }

    /// How many sequences the request runs: `best_of` when set, else `n` (the larger, for
    /// parameters not checked yet). The one formula every layer uses.
    pub(crate) fn num_sequences(&self) -> usize {
        self.best_of.unwrap_or(self.n).max(self.n)
    }

    /// `top_k` as a count, `None` when off.
    pub fn top_k(&self) -> Option<usize> {
        (self.top_k > 0).then_some(self.top_k as usize)
    }

    /// The output budget's own rules (at least one token, and no fewer than `min_tokens`):
    /// part of [`validate`](Self::validate), and all that changes when a checked request's
    /// budget is fixed for its prompt.
    pub(crate) fn check_max_tokens(&self) -> Result<(), ValidationError> {
        if let Some(max_tokens) = self.max_tokens {
            if max_tokens < 1 {
                return Err(ValidationError::of(
                    "max_tokens",
                    format!("max_tokens must be at least 1, got {max_tokens}."),
                ));
            }
            if self.min_tokens > max_tokens {
                return Err(ValidationError::of(
                    "min_tokens",
                    format!(
                        "min_tokens must be less than or equal to max_tokens={max_tokens}, got {}.",
                        self.min_tokens
                    ),
                ));
            }
        }
        Ok(())
    }

    /// vLLM's `_verify_args` (and `_verify_greedy_sampling`): the checks that need no model.
    /// Negative counts (n, min_tokens, logprobs) are rejected by the types already.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(so) = &self.structured_outputs {
            so.constraint()?;
        }
        if self.pooling.is_some() && (self.num_sequences() > 1 || self.prompt_logprobs.is_some()) {
            return Err(ValidationError::new(
                None,
                "an embedding request pools one pass over its prompt: n, best_of and \
                 prompt_logprobs do not apply",
            ));
        }
        if let Some(kv) = &self.kv_transfer_params {
            if kv.do_remote_decode && kv.do_remote_prefill {
                return Err(ValidationError::of(
                    "kv_transfer_params",
                    "kv_transfer_params cannot set both do_remote_decode and do_remote_prefill.",
                ));
            }
            if (kv.do_remote_decode || kv.do_remote_prefill)
                && (self.num_sequences() > 1 || self.pooling.is_some())
            {
                return Err(ValidationError::of(
                    "kv_transfer_params",
                    "prefill/decode disaggregation moves one completion's KV: n and best_of \
                     must be 1, and embedding requests have no decode.",
                ));
            }
        }
        if self.n < 1 {
            return Err(ValidationError::of(
                "n",
                format!("n must be at least 1, got {}.", self.n),
            ));
        }
        if let Some(best_of) = self.best_of {
            if best_of < self.n {
                return Err(ValidationError::of(
                    "best_of",
                    format!(
                        "best_of must be greater than or equal to n, got n={} and best_of={best_of}.",
                        self.n
                    ),
                ));
            }
            // vLLM refuses it too: the n best are known only when all have finished, and
            // deltas sent before then may belong to completions that are dropped.
            if best_of > self.n && self.output_kind == RequestOutputKind::Delta {
                return Err(ValidationError::of(
                    "best_of",
                    "best_of > n is not supported with output_kind DELTA (streaming).",
                ));
            }
        }
        // OpenAI's bound: -100 and 100 already ban or force a token, and larger values
        // (or NaN) would only poison the softmax.
        if let Some((id, bias)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(*b))
        {
            return Err(ValidationError::of(
                "logit_bias",
                format!(
                    "logit_bias values must be in [-100, 100], got {} for token {id}.",
                    py_float(*bias)
                ),
            ));
        }
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            // Written so that NaN fails, as `not -2 <= x <= 2` does in Python.
            if !(-2.0..=2.0).contains(&value) {
                return Err(ValidationError::of(
                    name,
                    format!("{name} must be in [-2, 2], got {}.", py_float(value)),
                ));
            }
        }
        let rp = self.repetition_penalty;
        if !rp.is_finite() {
            return Err(ValidationError::of(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be a finite number, got {}.",
                    py_float(rp)
                ),
            ));
        }
        if rp <= 0.0 {
            return Err(ValidationError::of(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be greater than zero, got {}.",
                    py_float(rp)
                ),
            ));
        }
        let t = self.temperature;
        if !t.is_finite() {
            return Err(ValidationError::of(
                "temperature",
                format!("temperature must be a finite number, got {}.", py_float(t)),
            ));
        }
        if t < 0.0 {
            return Err(ValidationError::of(
                "temperature",
                format!("temperature must be non-negative, got {}.", py_float(t)),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ValidationError::of(
                "top_p",
                format!("top_p must be in (0, 1], got {}.", py_float(self.top_p)),
            ));
        }
        // vLLM quietly accepts -1 as "off" too, but names only 0.
        if self.top_k < -1 {
            return Err(ValidationError::of(
                "top_k",
                format!(
                    "top_k must be 0 (disable), or at least 1, got {}.",
                    self.top_k
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ValidationError::of(
                "min_p",
                format!("min_p must be in [0, 1], got {}.", py_float(self.min_p)),
            ));
        }
        self.check_max_tokens()?;
        if self.stop.iter().any(String::is_empty) {
            return Err(ValidationError::of(
                "stop",
                "stop cannot contain an empty string.",
            ));
        }
        if self.stop.len() > MAX_STOP_STRINGS {
            return Err(ValidationError::of(
                "stop",
                format!(
                    "stop may hold at most {MAX_STOP_STRINGS} strings, got {}.",
                    self.stop.len()
                ),
            ));
        }
        if let Some(long) = self.stop.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
            return Err(ValidationError::of(
                "stop",
                format!(
                    "each stop string may be at most {MAX_STOP_STRING_BYTES} bytes long, got one of {}.",
                    long.len()
                ),
            ));
        }
        if self.stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(ValidationError::of(
                "stop_token_ids",
                format!(
                    "stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {}.",
                    self.stop_token_ids.len()
                ),
            ));
        }
        if self.is_greedy() {
            if let Some(best_of) = self.best_of.filter(|&b| b > 1) {
                return Err(ValidationError::of(
                    "best_of",
                    format!("best_of must be 1 when using greedy sampling, got {best_of}."),
                ));
            }
            if self.n > 1 {
                return Err(ValidationError::of(
                    "n",
                    format!("n must be 1 when using greedy sampling, got {}.", self.n),
                ));
            }
        }
        Ok(())
    }

    /// The checks that need the model: token ids inside the vocabulary, `top_k` and the
    /// logprob counts no larger than allowed. Call after [`validate`](Self::validate).
    pub fn validate_for_model(
        &self,
        vocab_size: usize,
        max_logprobs: usize,
    ) -> Result<(), ValidationError> {
        if let Some(k) = self.top_k() {
            if k > vocab_size {
                return Err(ValidationError::of(
                    "top_k",
                    format!(
                        "top_k cannot be greater than vocabulary size({vocab_size}), but got {k}."
                    ),
                ));
            }
        }
        // vLLM's `_validate_logprobs`: -1 is the vocabulary, as a request and as the limit.
        let max_logprobs = logprob_count::resolve(max_logprobs, vocab_size);
        for (name, what, requested) in [
            ("logprobs", "sample", self.logprobs),
            ("prompt_logprobs", "prompt", self.prompt_logprobs),
        ] {
            let requested = requested.map(|n| logprob_count::resolve(n, vocab_size));
            if let Some(n) = requested.filter(|&n| n > max_logprobs) {
                return Err(ValidationError::of(
                    name,
                    format!(
                        "Requested {what} logprobs of {n}, which is greater than max allowed: {max_logprobs}"
                    ),
                ));
            }
        }
        let out_of_vocab = |ids: &mut dyn Iterator<Item = TokenId>| -> Vec<TokenId> {
            ids.filter(|&id| id as usize >= vocab_size).collect()
        };
        for (name, bad) in [
            (
                "stop_token_ids",
                out_of_vocab(&mut self.stop_token_ids.iter().copied()),
            ),
            (
                "logit_bias",
                out_of_vocab(&mut self.logit_bias.keys().copied()),
            ),
        ] {
            if !bad.is_empty() {
                return Err(ValidationError::of(
                    name,
                    format!(
                        "token_id(s) {bad:?} in {name} contain out-of-vocab token ids. Vocabulary size: {vocab_size}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The output budget for a prompt of `prompt_len` tokens: `max_tokens`, or with `None`
    /// whatever the context leaves. Errors as vLLM's OpenAI server when the prompt fills the
    /// context or `max_tokens` does not fit beside it.
    pub fn max_tokens_for(
        &self,
        prompt_len: usize,
        max_model_len: usize,
    ) -> Result<usize, ValidationError> {
        if prompt_len >= max_model_len {
            return Err(ValidationError::new(
                None,
                format!(
                    "This model's maximum context length is {max_model_len} tokens. However, your \
                     request has {prompt_len} input tokens. Please reduce the length of the input \
                     messages."
                ),
            ));
        }
        let room = max_model_len - prompt_len;
        match self.max_tokens {
            None => Ok(room),
            Some(max_tokens) if max_tokens > room => Err(ValidationError::of(
                "max_tokens",
                format!(
                    "'max_tokens' is too large: {max_tokens}. This model's maximum context length \
                     is {max_model_len} tokens and your request has {prompt_len} input tokens \
                     ({max_tokens} > {max_model_len} - {prompt_len})."
                ),
            )),
            Some(max_tokens) => Ok(max_tokens),
        }
    }
}

/// A float as Python's `repr` writes it (`3.0`, `nan`, `1e+20`), for vLLM's messages.
fn py_float(x: f32) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.into();
    }
    let s = format!("{x:?}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let exp: i32 = exp.parse().unwrap_or(0);
            let sign = if exp < 0 { '-' } else { '+' };
            format!("{mantissa}e{sign}{:02}", exp.abs())
        }
        None => s,
    }
}

/// OpenAI's `stop` is a string or a list of strings, and may be null.
fn string_or_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match Option::<OneOrMany>::deserialize(d)? {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    })
}

/// Clients send `null` for "not set".
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests;
