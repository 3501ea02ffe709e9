//! A request's prompt, from either of vLLM's forms to checked token ids.

use crate::engine::errors::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::ids::TokenId;

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

/// What a prompt must satisfy to run on the engine's model.
pub struct PromptLimits {
    pub max_model_len: usize,
    pub vocab_size: usize,
}

/// Tokenises a text prompt and checks the ids against the model: never empty, within the
/// context, every id in the vocabulary.
pub fn process_prompt(
    tokenizer: &Tokenizer,
    prompt: PromptInput,
    limits: &PromptLimits,
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
