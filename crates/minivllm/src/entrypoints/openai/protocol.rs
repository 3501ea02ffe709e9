//! OpenAI's request bodies (with vLLM's extra sampling fields) and its error object.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::engine::chat_template::ChatMessage;
use crate::engine::llm_engine::EngineError;
use crate::sampling_params::{SamplingParams, ValidationError};
use crate::sequence::TokenId;

/// The four prompt shapes `/v1/completions` takes. Untagged, so order matters: a bare list of
/// numbers must not be read as a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<TokenId>),
    IdLists(Vec<Vec<TokenId>>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling fields the two endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonParams {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<usize>,
    pub stop: Option<StopField>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub top_k: Option<i32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_tokens: Option<usize>,
    #[serde(default)]
    pub ignore_eos: bool,
    pub stop_token_ids: Option<Vec<TokenId>>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    #[serde(default)]
    pub priority: i32,
}

impl CommonParams {
    pub fn sampling_params(
        &self,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
    ) -> SamplingParams {
        let d = SamplingParams::default();
        SamplingParams {
            n: self.n.unwrap_or(d.n),
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            seed: self.seed,
            stop: self
                .stop
                .clone()
                .map(StopField::into_vec)
                .unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos,
            max_tokens,
            min_tokens: self.min_tokens.unwrap_or(d.min_tokens),
            logprobs,
            include_stop_str_in_output: self
                .include_stop_str_in_output
                .unwrap_or(d.include_stop_str_in_output),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(d.skip_special_tokens),
            ..d
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: PromptField,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: Option<usize>,
    /// Completions-style: how many top alternatives to return per token.
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
}

fn default_max_tokens() -> Option<usize> {
    Some(16)
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    #[serde(flatten)]
    pub common: CommonParams,
}

fn default_true() -> bool {
    true
}

/// An error as OpenAI's API returns it: `{"error": {message, type, param, code}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: param.map(str::to_string),
        }
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self::bad_request(e.message(), e.param())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Validation(v) => v.into(),
            EngineError::EmptyPrompt
            | EngineError::PromptTooLong { .. }
            | EngineError::TokenOutOfVocab { .. }
            | EngineError::DuplicateRequest(_)
            | EngineError::Tokenizer(_) => Self::bad_request(e.to_string(), None),
            other => Self {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                message: other.to_string(),
                param: None,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status == StatusCode::BAD_REQUEST {
            "BadRequestError"
        } else {
            "InternalServerError"
        };
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completion(body: &str) -> CompletionRequest {
        serde_json::from_str(body).unwrap()
    }

    #[test]
    fn prompt_shapes() {
        assert!(matches!(
            completion(r#"{"prompt": "a"}"#).prompt,
            PromptField::Text(_)
        ));
        assert!(
            matches!(completion(r#"{"prompt": ["a", "b"]}"#).prompt, PromptField::Texts(v) if v.len() == 2)
        );
        assert!(
            matches!(completion(r#"{"prompt": [1, 2]}"#).prompt, PromptField::Ids(v) if v == [1, 2])
        );
        assert!(
            matches!(completion(r#"{"prompt": [[1], [2, 3]]}"#).prompt, PromptField::IdLists(v) if v.len() == 2)
        );
    }

    #[test]
    fn defaults_and_vllm_extras() {
        let r = completion(r#"{"prompt": "a", "stop": "x", "top_k": 5, "ignore_eos": true}"#);
        assert_eq!(r.max_tokens, Some(16));
        let p = r.common.sampling_params(r.max_tokens, r.logprobs);
        assert_eq!(
            (p.top_k, p.ignore_eos, p.stop),
            (5, true, vec!["x".to_string()])
        );
        assert_eq!(p.temperature, 1.0);
        let chat: ChatCompletionRequest =
            serde_json::from_str(r#"{"messages": [{"role": "user", "content": "hi"}]}"#).unwrap();
        assert!(chat.add_generation_prompt);
        assert_eq!(chat.max_tokens, None);
    }

    #[test]
    fn validation_errors_name_their_param() {
        let p = SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        };
        let e = ApiError::from(EngineError::from(p.validate().unwrap_err()));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("temperature"));
    }
}
