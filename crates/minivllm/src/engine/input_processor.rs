//! A request on its way in (vLLM v1's `Processor`): its prompt, from either of vLLM's forms
//! to checked token ids, and its parameters checked against the engine's settings.

use crate::core::policy::Policy;
use crate::core::scheduler::SchedulerConfig;
use crate::engine::arg_utils::check_width;
use crate::engine::errors::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::TokenId;
use crate::sampling_params::{RequestOutputKind, SamplingParams, ValidationError};

/// A prompt in either of vLLM's two forms.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    TokenIds(Vec<TokenId>),
}

impl From<&str> for PromptInput {
    fn from(s: &str) -> Self {
        PromptInput::Text(s.to_string())
    }
}

impl From<String> for PromptInput {
    fn from(s: String) -> Self {
        PromptInput::Text(s)
    }
}

impl From<Vec<TokenId>> for PromptInput {
    fn from(ids: Vec<TokenId>) -> Self {
        PromptInput::TokenIds(ids)
    }
}

/// A prompt ready for the engine: its text when it came as text, and its token ids.
pub struct ProcessedPrompt {
    pub text: Option<String>,
    pub token_ids: Vec<TokenId>,
}

/// What a request must satisfy to run on the engine, beyond the scheduler's settings: its
/// prompt, the model's context and vocabulary; its logprobs, `--max-logprobs`.
#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// `--max-logprobs` ([`ALL_LOGPROBS`](crate::sampling_params::ALL_LOGPROBS) for -1).
    pub max_logprobs: usize,
}

/// The engine's settings a request's parameters are checked against, copied out of the
/// engine so that whoever submits (a route, `LLM`, Python) checks on its own thread, before
/// it spends anything on the request.
#[derive(Debug, Clone)]
pub struct RequestChecks {
    pub(crate) limits: RequestLimits,
    /// The tokenizer's vocabulary (logit biases and allowed tokens name its ids).
    tokenizer_vocab_size: usize,
    /// `--max-num-seqs`: the widest a request may be.
    pub(crate) max_num_seqs: usize,
    policy: Policy,
}

impl RequestChecks {
    pub(crate) fn new(
        tokenizer: &Tokenizer,
        limits: RequestLimits,
        sched: &SchedulerConfig,
    ) -> Self {
        RequestChecks {
            limits,
            tokenizer_vocab_size: tokenizer.vocab_size(),
            max_num_seqs: sched.max_num_seqs,
            policy: sched.policy,
        }
    }

    /// vLLM's checks of a request's parameters, with its messages: on their own, against the
    /// tokenizer's vocabulary and `--max-logprobs`, its width against `--max-num-seqs`, and a
    /// priority only under the priority policy (under FCFS it would be silently ignored).
    /// The one place they are made: the engine takes the result without checking again.
    pub fn check(
        &self,
        params: SamplingParams,
        priority: i32,
    ) -> Result<CheckedParams, EngineError> {
        params.validate()?;
        params.validate_for_model(self.tokenizer_vocab_size, self.limits.max_logprobs)?;
        check_width(&params, self.max_num_seqs)?;
        if priority != 0 && self.policy != Policy::Priority {
            return Err(ValidationError::new(
                Some("priority"),
                format!("Got priority {priority} but Priority scheduling is not enabled."),
            )
            .into());
        }
        Ok(CheckedParams { params, priority })
    }
}

/// A request's parameters and priority once [`RequestChecks::check`] passed them; nothing
/// else makes one, so the engine admits it without checking again.
#[derive(Debug, Clone)]
pub struct CheckedParams {
    params: SamplingParams,
    priority: i32,
}

impl CheckedParams {
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    pub fn priority(&self) -> i32 {
        self.priority
    }

    pub fn into_params(self) -> SamplingParams {
        self.params
    }

    /// The same request with its output budget fixed for one prompt (`max_tokens_for`):
    /// the budget's own rules are checked again, nothing else changed.
    pub fn with_max_tokens(mut self, max_tokens: usize) -> Result<Self, EngineError> {
        self.params.max_tokens = Some(max_tokens);
        self.params.check_max_tokens()?;
        Ok(self)
    }

    /// The same request with outputs of `kind`, as the async front streams them: how the
    /// caller reads its outputs changes nothing the checks looked at.
    pub(crate) fn with_output_kind(mut self, kind: RequestOutputKind) -> Self {
        self.params.output_kind = kind;
        self
    }
}

/// Tokenises a text prompt and checks the ids against the model: never empty, within the
/// context, every id in the vocabulary.
pub fn process_prompt(
    tokenizer: &Tokenizer,
    prompt: PromptInput,
    limits: &RequestLimits,
) -> Result<ProcessedPrompt, EngineError> {
    let (text, token_ids) = match prompt {
        PromptInput::Text(t) => {
            let ids = tokenizer.encode(&t, true)?;
            (Some(t), ids)
        }
        PromptInput::TokenIds(ids) => (None, ids),
    };
    if token_ids.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    if token_ids.len() > limits.max_model_len {
        return Err(EngineError::PromptTooLong {
            len: token_ids.len(),
            max_model_len: limits.max_model_len,
        });
    }
    if let Some(&token) = token_ids.iter().find(|&&t| t as usize >= limits.vocab_size) {
        return Err(EngineError::TokenOutOfVocab {
            token,
            vocab_size: limits.vocab_size,
        });
    }
    Ok(ProcessedPrompt { text, token_ids })
}
