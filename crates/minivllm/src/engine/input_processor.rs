//! A request on its way in (vLLM v1's `Processor`): its prompt, from either of vLLM's forms
//! to checked token ids, and its parameters checked against the engine's settings.

use crate::core::policy::Policy;
use crate::core::scheduler::SchedulerConfig;
use crate::engine::arg_utils::check_width;
use crate::engine::errors::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::TokenId;
use crate::sampling_params::{SamplingParams, ValidationError};

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
pub struct RequestLimits {
    pub max_model_len: usize,
    pub vocab_size: usize,
    /// `--max-logprobs` ([`ALL_LOGPROBS`](crate::sampling_params::ALL_LOGPROBS) for -1).
    pub max_logprobs: usize,
}

/// vLLM's checks of a request's parameters, with its messages: on their own, against the
/// tokenizer's vocabulary and `--max-logprobs`, its width against the scheduler's
/// `--max-num-seqs`, and a priority only under its priority policy (under FCFS it would be
/// silently ignored).
pub fn check_params(
    tokenizer: &Tokenizer,
    params: &SamplingParams,
    priority: i32,
    limits: &RequestLimits,
    sched: &SchedulerConfig,
) -> Result<(), EngineError> {
    params.validate()?;
    params.validate_for_model(tokenizer.vocab_size(), limits.max_logprobs)?;
    check_width(params, sched.max_num_seqs)?;
    if priority != 0 && sched.policy != Policy::Priority {
        return Err(ValidationError::new(
            Some("priority"),
            format!("Got priority {priority} but Priority scheduling is not enabled."),
        )
        .into());
    }
    Ok(())
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
