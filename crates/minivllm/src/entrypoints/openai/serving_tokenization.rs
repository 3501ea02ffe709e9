//! vLLM's `POST /tokenize` and `POST /detokenize`: let clients count and inspect tokens
//! exactly as the server will see them (chat template included).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::json;

use super::chat_run::render_chat;
use super::protocol::{default_true, ApiError, ChatMessageIn, ChatTool, TemplateMode};
use super::server_state::{AppState, Shared};
use super::serving_engine::{check_model, encode, json_response, off_async, parse};
use super::template_kwargs::{self, TemplateKwargs};
use super::tool_calls::ToolUse;
use crate::engine::llm_engine::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::sequence::TokenId;

/// `POST /tokenize`: vLLM's completion form (`prompt`) or chat form (`messages`).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Default: true for a prompt, false for messages (the chat template writes its own BOS).
    pub add_special_tokens: Option<bool>,
    #[serde(default = "default_true")]
    pub add_generation_prompt: bool,
    #[serde(default)]
    pub continue_final_message: bool,
    #[serde(default)]
    pub return_token_strs: bool,
    /// With `messages`: tools for the chat template, as in a chat request.
    pub tools: Option<Vec<ChatTool>>,
    /// With `messages`: further template variables, as in a chat request.
    pub chat_template_kwargs: Option<TemplateKwargs>,
}

#[derive(Debug, Clone, Deserialize)]
pub(crate) struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<TokenId>,
}

pub async fn tokenize(
    State(s): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    off_async(&s, move |s| tokenize_now(s, body)).await
}

fn tokenize_now(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse(body)?;
    check_model(s, req.model.as_deref())?;
    let tok = s.engine.tokenizer();
    let ids = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => encode(s, prompt, req.add_special_tokens.unwrap_or(true))?,
        (None, Some(messages)) => {
            let add_special = req.add_special_tokens.unwrap_or(false);
            let mode = TemplateMode::of(req.add_generation_prompt, req.continue_final_message)?;
            // The tools as a chat request with `tool_choice: "none"` renders them.
            let tools = ToolUse::from_request(
                req.tools.as_deref(),
                Some(&serde_json::json!("none")),
                None,
                false,
                &s.config.tool_calls,
            )?;
            let kwargs = template_kwargs::merged(
                &s.config.default_chat_template_kwargs,
                req.chat_template_kwargs.as_ref(),
            );
            render_chat(
                s,
                messages,
                &tools.template_tools,
                &kwargs,
                mode,
                add_special,
            )?
            .ids
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `prompt` and `messages`",
                None,
            ))
        }
    };
    // Serialised straight from the ids: a JSON value per token would cost ten times the
    // ids' memory on a multi-megabyte prompt.
    let body = TokenizeResponse {
        count: ids.len(),
        max_model_len: s.engine.max_model_len(),
        tokens: &ids,
        token_strs: req.return_token_strs.then_some(TokenStrs(tok, &ids)),
    };
    Ok(json_response(&body))
}

#[derive(Serialize)]
struct TokenizeResponse<'a> {
    count: usize,
    max_model_len: usize,
    tokens: &'a [TokenId],
    token_strs: Option<TokenStrs<'a>>,
}

/// Each id's token string, written as the list is serialised.
struct TokenStrs<'a>(&'a Tokenizer, &'a [TokenId]);

impl Serialize for TokenStrs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(
            self.1
                .iter()
                .map(|&id| self.0.id_to_token(id).unwrap_or_default()),
        )
    }
}

pub async fn detokenize(
    State(s): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    off_async(&s, move |s| detokenize_now(s, body)).await
}

fn detokenize_now(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse(body)?;
    check_model(s, req.model.as_deref())?;
    let tok = s.engine.tokenizer();
    let vocab_size = tok.vocab_size();
    if let Some(&token) = req.tokens.iter().find(|&&t| t as usize >= vocab_size) {
        return Err(ApiError::bad_request(
            EngineError::TokenOutOfVocab { token, vocab_size }.to_string(),
            Some("tokens"),
        ));
    }
    let prompt = tok.decode(&req.tokens, false).map_err(EngineError::from)?;
    Ok(json_response(&json!({ "prompt": prompt })))
}
