//! OpenAI's request bodies (with vLLM's extra sampling fields) and its error object.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::template_kwargs::{self, TemplateKwargs};
use crate::distributed::kv_transfer::KvTransferParams;
use crate::engine::async_engine::AsyncEngineError;
use crate::engine::chat_template::{ChatMessage, ToolCall};
use crate::engine::llm_engine::EngineError;
use crate::entrypoints::openai::structured_outputs::StructuredFields;
use crate::sampling_params::{
    logprob_count, GenerationDefaults, RequestOutputKind, SamplingParams, ValidationError,
};
use crate::sequence::TokenId;
use crate::structured_output::backend_guidance::GrammarError;

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

impl PromptField {
    /// How many prompts: one engine request each.
    pub fn len(&self) -> usize {
        match self {
            PromptField::Text(_) | PromptField::Ids(_) => 1,
            PromptField::Texts(v) => v.len(),
            PromptField::IdLists(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
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
    /// Sequences sampled, of which the `n` most likely are returned (vLLM's `best_of`).
    pub best_of: Option<usize>,
    pub stop: Option<StopField>,
    /// A 64-bit signed integer, as vLLM's server takes it (-1 included).
    pub seed: Option<i64>,
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
    /// Token id (a JSON string key, as OpenAI sends it) to a bias added to its logit.
    pub logit_bias: Option<std::collections::BTreeMap<String, f32>>,
    pub include_stop_str_in_output: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    /// vLLM's: this many alternatives per prompt token (-1: the whole vocabulary).
    #[serde(default, deserialize_with = "logprob_count::deserialize_opt")]
    pub prompt_logprobs: Option<usize>,
    #[serde(default)]
    pub priority: i32,
    /// `response_format`, `structured_outputs`, `guided_*`.
    #[serde(flatten)]
    pub structured: StructuredFields,
    /// Prefill/decode disaggregation, as a router sends it (vLLM's field).
    pub kv_transfer_params: Option<KvTransferParams>,
}

impl CommonParams {
    /// The request's sampling parameters, `defaults` (the model's generation config, or
    /// vLLM's) for the fields it leaves out.
    pub fn sampling_params(
        &self,
        defaults: &GenerationDefaults,
        max_tokens: Option<usize>,
        logprobs: Option<usize>,
    ) -> SamplingParams {
        let d = &defaults.params;
        let max_tokens = max_tokens.or(defaults.max_tokens);
        SamplingParams {
            n: self.n.unwrap_or(d.n),
            best_of: self.best_of,
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            // Any i64 seeds as its bits do: distinct seeds stay distinct.
            seed: self.seed.map(|s| s as u64),
            stop: self
                .stop
                .clone()
                .map(StopField::into_vec)
                .unwrap_or_default(),
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            logit_bias: self.logit_bias().unwrap_or_default(),
            ignore_eos: self.ignore_eos,
            max_tokens,
            min_tokens: self.min_tokens.unwrap_or(d.min_tokens),
            logprobs,
            include_stop_str_in_output: self
                .include_stop_str_in_output
                .unwrap_or(d.include_stop_str_in_output),
            skip_special_tokens: self.skip_special_tokens.unwrap_or(d.skip_special_tokens),
            prompt_logprobs: self.prompt_logprobs,
            // Refused by `check` when it is an error.
            structured_outputs: self.structured.params().ok().flatten(),
            kv_transfer_params: self.kv_transfer_params.clone(),
            // vLLM's rule: a stream is sent as it grows, anything else once, at its end.
            output_kind: if self.stream {
                RequestOutputKind::Delta
            } else {
                RequestOutputKind::FinalOnly
            },
            ..d.clone()
        }
    }

    /// Field combinations vLLM refuses, refused with its messages.
    pub fn check(&self) -> Result<(), ApiError> {
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad_request(
                "Stream options can only be defined when `stream=True`.",
                Some("stream_options"),
            ));
        }
        self.logit_bias()?;
        self.structured.params()?;
        // The n best are known only when all best_of sequences have finished.
        if self.stream && self.best_of.is_some_and(|b| b != self.n.unwrap_or(1)) {
            return Err(ApiError::bad_request(
                "best_of different from n is not supported when streaming.",
                Some("best_of"),
            ));
        }
        Ok(())
    }

    /// `logit_bias` with its keys read as token ids.
    fn logit_bias(&self) -> Result<std::collections::BTreeMap<TokenId, f32>, ApiError> {
        let Some(bias) = &self.logit_bias else {
            return Ok(Default::default());
        };
        bias.iter()
            .map(|(k, &v)| match k.trim().parse::<TokenId>() {
                Ok(id) => Ok((id, v)),
                Err(_) => Err(ApiError::bad_request(
                    format!("logit_bias keys must be token ids, got {k:?}."),
                    Some("logit_bias"),
                )),
            })
            .collect()
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
    /// Completions-style: how many top alternatives to return per token (-1: all).
    #[serde(default, deserialize_with = "logprob_count::deserialize_opt")]
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub common: CommonParams,
}

fn default_max_tokens() -> Option<usize> {
    Some(16)
}

/// A message's `content`: a string, or OpenAI's list of typed parts (only text parts here).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessageIn {
    pub role: String,
    /// Absent or null on assistant turns that only called tools.
    pub content: Option<MessageContent>,
    /// An assistant turn's calls, as a reply gave them.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` turn's answer is to this call.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

impl ChatMessageIn {
    /// A turn of text, as the routes that translate other APIs' requests build them.
    pub fn text(role: &str, content: String) -> Self {
        ChatMessageIn {
            role: role.to_string(),
            content: Some(MessageContent::Text(content)),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// A `tool` turn: the answer to call `call_id`.
    pub(crate) fn tool_result(call_id: Option<String>, content: String) -> Self {
        ChatMessageIn {
            tool_call_id: call_id,
            ..Self::text("tool", content)
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallIn {
    pub name: String,
    /// JSON text as OpenAI sends it (an object is taken too).
    pub arguments: serde_json::Value,
}

/// The messages as the chat template sees them: text parts joined by newlines, as vLLM does;
/// calls' argument strings parsed, as vLLM gives them to templates.
pub fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(MessageContent::Text(t)) => t.clone(),
                Some(MessageContent::Parts(parts)) => text_of_parts(parts)?,
            };
            let mut message = ChatMessage::new(m.role.clone(), content);
            for (j, call) in m.tool_calls.iter().flatten().enumerate() {
                let arguments = match &call.function.arguments {
                    serde_json::Value::String(text) => serde_json::from_str(text).map_err(|e| {
                        ApiError::bad_request(
                            format!(
                                "messages[{i}].tool_calls[{j}].function.arguments is not JSON: {e}"
                            ),
                            Some("messages"),
                        )
                    })?,
                    other => other.clone(),
                };
                message.tool_calls.push(ToolCall {
                    id: call.id.clone().unwrap_or_default(),
                    name: call.function.name.clone(),
                    arguments,
                });
            }
            message.tool_call_id = m.tool_call_id.clone();
            message.name = m.name.clone();
            Ok(message)
        })
        .collect()
}

fn text_of_parts(parts: &[ContentPart]) -> Result<String, ApiError> {
    let mut texts = Vec::with_capacity(parts.len());
    for p in parts {
        match (p.kind.as_str(), &p.text) {
            ("text", Some(t)) => texts.push(t.as_str()),
            ("text", None) => {
                return Err(ApiError::bad_request(
                    "a content part of type `text` needs a `text` field",
                    Some("messages"),
                ))
            }
            (other, _) => {
                return Err(ApiError::bad_request(
                    format!("content parts of type `{other}` are not supported; this model takes `text` parts only"),
                    Some("messages"),
                ))
            }
        }
    }
    Ok(texts.join("\n"))
}

/// The prompt ends where the template leaves it, or with the final message left open so
/// the model continues it (vLLM's `continue_final_message`: a prefilled assistant turn).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateMode {
    GenerationPrompt,
    AsRendered,
    ContinueFinalMessage,
}

impl TemplateMode {
    /// From vLLM's two flags, refusing both at once as vLLM does.
    pub fn of(add_generation_prompt: bool, continue_final_message: bool) -> Result<Self, ApiError> {
        match (add_generation_prompt, continue_final_message) {
            (true, true) => Err(ApiError::bad_request(
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                Some("continue_final_message"),
            )),
            (true, false) => Ok(TemplateMode::GenerationPrompt),
            (false, false) => Ok(TemplateMode::AsRendered),
            (false, true) => Ok(TemplateMode::ContinueFinalMessage),
        }
    }
}

/// One entry of the request's `tools`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatTool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionDefinition,
}

fn function_type() -> String {
    "function".into()
}

impl ChatTool {
    /// Tool `i` of another API's request as chat's function tool; its `description`, when
    /// given, must be a string.
    pub fn function(
        i: usize,
        name: &str,
        description: Option<&serde_json::Value>,
        parameters: Option<serde_json::Value>,
    ) -> Result<Self, ApiError> {
        let description = match description {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::String(d)) => Some(d.clone()),
            Some(_) => {
                return Err(ApiError::bad_request(
                    format!("tools[{i}].description: expected a string"),
                    Some("tools"),
                ))
            }
        };
        Ok(ChatTool {
            kind: "function".into(),
            function: FunctionDefinition {
                name: name.to_string(),
                description,
                parameters,
                strict: None,
            },
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct FunctionDefinition {
    pub name: String,
    pub description: Option<String>,
    /// A JSON schema of the arguments object; absent: no arguments.
    pub parameters: Option<serde_json::Value>,
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<ChatMessageIn>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    #[serde(default)]
    pub logprobs: bool,
    #[serde(default, deserialize_with = "logprob_count::deserialize_opt")]
    pub top_logprobs: Option<usize>,
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    #[serde(default)]
    pub continue_final_message: bool,
    pub tools: Option<Vec<ChatTool>>,
    /// `none`, `auto`, `required` or a named function; read by `ToolUse`.
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Further variables for the chat template (`{"enable_thinking": true}`), over the
    /// server's `--default-chat-template-kwargs`.
    pub chat_template_kwargs: Option<TemplateKwargs>,
    /// `none` … `max`: given to the template as `reasoning_effort` (gpt-oss's reads it), and
    /// as `enable_thinking` (off for `none`) unless `chat_template_kwargs` sets that, as
    /// vLLM does for templates such as Gemma 4's and Qwen3's.
    pub reasoning_effort: Option<String>,
    #[serde(flatten)]
    pub common: CommonParams,
}

impl ChatCompletionRequest {
    /// `messages` with every other field as a client leaving it out gets it: for the routes
    /// that translate other APIs' requests.
    pub fn new(messages: Vec<ChatMessageIn>) -> Self {
        ChatCompletionRequest {
            messages,
            max_tokens: None,
            max_completion_tokens: None,
            logprobs: false,
            top_logprobs: None,
            add_generation_prompt: true,
            continue_final_message: false,
            tools: None,
            tool_choice: None,
            parallel_tool_calls: None,
            chat_template_kwargs: None,
            reasoning_effort: None,
            common: CommonParams::default(),
        }
    }

    /// The template's extra variables: the server's defaults, the request's own over them,
    /// then what `reasoning_effort` implies.
    pub fn template_kwargs(&self, defaults: &TemplateKwargs) -> TemplateKwargs {
        let own = self.chat_template_kwargs.as_ref();
        let kwargs = template_kwargs::merged(defaults, own);
        template_kwargs::with_effort(kwargs, own, self.reasoning_effort.as_deref())
    }

    /// The checks that need nothing but the request; returns how to render its template.
    pub fn check(&self) -> Result<TemplateMode, ApiError> {
        self.common.check()?;
        let mode = TemplateMode::of(self.add_generation_prompt, self.continue_final_message)?;
        if self.messages.is_empty() {
            return Err(ApiError::bad_request(
                "messages must not be empty",
                Some("messages"),
            ));
        }
        template_kwargs::check_effort(self.reasoning_effort.as_deref())
            .map_err(|e| ApiError::bad_request(e, Some("reasoning_effort")))?;
        if self.top_logprobs.is_some_and(|k| k > 0) && !self.logprobs {
            return Err(ApiError::bad_request(
                "when using `top_logprobs`, `logprobs` must be set to true.",
                Some("top_logprobs"),
            ));
        }
        Ok(mode)
    }
}

pub(crate) fn default_true() -> bool {
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
    pub fn new(status: StatusCode, message: impl Into<String>, param: Option<&str>) -> Self {
        Self {
            status,
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message, param)
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message, None)
    }

    /// OpenAI's `type` for each status, which its client libraries turn into exception classes.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::UNAUTHORIZED => "AuthenticationError",
            StatusCode::NOT_FOUND => "NotFoundError",
            StatusCode::PAYLOAD_TOO_LARGE => "RequestTooLargeError",
            StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
            _ => "InternalServerError",
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
            EngineError::TooManySequences { .. } => Self::bad_request(e.to_string(), Some("n")),
            EngineError::Grammar(GrammarError::Unavailable(m)) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, m, None)
            }
            EngineError::Grammar(_) => Self::bad_request(e.to_string(), Some("structured_outputs")),
            // The prefill server's KV could not be had: an upstream's failure.
            EngineError::KvTransfer(m) => {
                Self::new(StatusCode::BAD_GATEWAY, format!("KV transfer: {m}"), None)
            }
            other => Self::internal(other.to_string()),
        }
    }
}

impl From<AsyncEngineError> for ApiError {
    fn from(e: AsyncEngineError) -> Self {
        match e {
            AsyncEngineError::Engine(e) => e.into(),
            AsyncEngineError::Overloaded { .. } | AsyncEngineError::Stopped => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), None)
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), "{}", self.message);
        } else {
            tracing::info!(status = self.status.as_u16(), "{}", self.message);
        }
        let body = serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
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
        let p =
            (r.common).sampling_params(&GenerationDefaults::default(), r.max_tokens, r.logprobs);
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
    fn chat_content_as_parts() {
        let chat: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages": [
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null}
            ]}"#,
        )
        .unwrap();
        let m = chat_messages(&chat.messages).unwrap();
        assert_eq!(m[0], ChatMessage::new("system", "Be brief."));
        assert_eq!(m[1], ChatMessage::new("user", "a\nb"));
        assert_eq!(m[2], ChatMessage::new("assistant", ""));
        let image: ChatCompletionRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}"#,
        )
        .unwrap();
        let e = chat_messages(&image.messages).unwrap_err();
        assert!(e.message.contains("image_url"), "{}", e.message);
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn overload_is_503() {
        let e = ApiError::from(AsyncEngineError::Overloaded { max_waiting: 4 });
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.kind(), "ServiceUnavailableError");
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
