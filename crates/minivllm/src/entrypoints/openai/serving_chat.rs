//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api_server::{AppState, RequestId, Shared};
use super::protocol::{
    chat_messages, ApiError, ChatCompletionRequest, ChatMessageIn, TemplateMode,
};
use super::serving_engine::{
    admit, check_model, delta, finish_reason, fold, json_response, last_output, now, off_async,
    parse, prompt_logprobs, sse, stop_reason, submit, token_text, top, usage, Held, Prompt,
};
use crate::engine::llm_engine::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::{CompletionOutput, RequestOutput};
use crate::sampling_params::SamplingParams;
use crate::sequence::TokenId;

/// Renders `messages` with the model's chat template and tokenises the result.
pub fn render_chat(
    s: &AppState,
    messages: &[ChatMessageIn],
    mode: TemplateMode,
    add_special_tokens: bool,
) -> Result<Prompt, ApiError> {
    let tok = s.engine.tokenizer();
    let messages = chat_messages(messages)?;
    let add_generation_prompt = mode == TemplateMode::GenerationPrompt;
    let mut rendered = tok
        .apply_chat_template(&messages, add_generation_prompt)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    if mode == TemplateMode::ContinueFinalMessage {
        rendered = continue_final_message(rendered, &messages)?;
    }
    let ids = tok
        .encode(&rendered, add_special_tokens)
        .map_err(EngineError::from)?;
    Ok(Prompt {
        text: rendered,
        ids,
    })
}

/// The rendered chat cut just after the final message's text, as transformers does: the
/// template's end-of-turn marks after it would tell the model the turn is over.
fn continue_final_message(
    rendered: String,
    messages: &[crate::engine::chat_template::ChatMessage],
) -> Result<String, ApiError> {
    let last = messages.last().map_or("", |m| m.content.trim());
    match rendered.rfind(last) {
        Some(at) if !last.is_empty() => Ok(rendered[..at + last.len()].to_string()),
        _ => Err(ApiError::bad_request(
            "continue_final_message needs a final message with text that the chat template \
             renders as written",
            Some("messages"),
        )),
    }
}

pub async fn chat_completions(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, prompt, params, held) = off_async(&s, move |s| prepare(s, body)).await?;
    let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
    let n = params.n;
    let prompts = [prompt];
    let mut streams = submit(
        &s,
        &rid,
        "chatcmpl",
        &prompts,
        vec![params],
        req.common.priority,
    )
    .await?;
    let rx = streams.remove(0);
    let reply = Reply {
        _held: held,
        id: format!("chatcmpl-{}", rid.0),
        created: now(),
        model: s.config.served_model_name.clone(),
        n,
        top_logprobs: logprobs,
        prompt_logprobs: req.common.prompt_logprobs.is_some(),
        tok: s.engine.tokenizer().clone(),
    };
    if req.common.stream {
        let include_usage = req.common.include_usage();
        return Ok(sse(move |tx| reply.stream(rx, include_usage, tx)));
    }
    let out = last_output(rx).await?;
    Ok(off_async(&s, move |_| json_response(&reply.full(&out))).await)
}

/// The request parsed and checked, its messages rendered and tokenised, and its sampling
/// parameters.
fn prepare(
    s: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(ChatCompletionRequest, Prompt, SamplingParams, Held), ApiError> {
    let req: ChatCompletionRequest = parse(body)?;
    let mode = req.check()?;
    check_model(s, req.common.model.as_deref())?;
    // The template writes the BOS itself.
    let prompt = render_chat(s, &req.messages, mode, false)?;
    let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let base = req.common.sampling_params(max_tokens, logprobs);
    let (mut params, held) = admit(s, &base, std::slice::from_ref(&prompt), false)?;
    Ok((req, prompt, params.remove(0), held))
}

/// What every response of one request shares.
struct Reply {
    /// Released when the response is done.
    _held: Held,
    id: String,
    created: u64,
    model: String,
    n: usize,
    /// `Some(k)` when the request asked for logprobs, with `k` alternatives each.
    top_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs` was asked for: the response carries them.
    prompt_logprobs: bool,
    tok: Arc<Tokenizer>,
}

impl Reply {
    fn body(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices,
        })
    }

    fn logprobs(&self, o: &CompletionOutput, from: usize) -> Value {
        match self.top_logprobs {
            Some(k) => chat_logprobs(&self.tok, o, from, k),
            None => Value::Null,
        }
    }

    fn full(&self, out: &RequestOutput) -> Value {
        let choices: Vec<Value> = out
            .outputs
            .iter()
            .map(|o| {
                json!({
                    "index": o.index,
                    "message": {"role": "assistant", "content": o.text},
                    "logprobs": self.logprobs(o, 0),
                    "finish_reason": finish_reason(o),
                    "stop_reason": stop_reason(o),
                })
            })
            .collect();
        let mut body = self.body("chat.completion", Value::Array(choices));
        body["usage"] = completion_usage(out);
        if self.prompt_logprobs {
            body["prompt_logprobs"] = prompt_logprobs(&self.tok, out);
        }
        body
    }

    async fn stream(
        self,
        mut rx: mpsc::UnboundedReceiver<RequestOutput>,
        include_usage: bool,
        tx: mpsc::Sender<Value>,
    ) {
        const OBJECT: &str = "chat.completion.chunk";
        let mut sent = vec![0usize; self.n];
        let mut sent_tokens = vec![0usize; self.n];
        // With n > 1 a finished choice keeps coming back while its siblings run.
        let mut done = vec![false; self.n];
        for i in 0..self.n {
            let first = json!([{
                "index": i, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null,
            }]);
            if tx.send(self.body(OBJECT, first)).await.is_err() {
                return;
            }
        }
        // The deltas folded together, so chunks can carry held-back text and logprobs.
        let mut last = None;
        while let Some(next) = rx.recv().await {
            let changed: Vec<usize> = next.outputs.iter().map(|o| o.index).collect();
            let out = &*fold(&mut last, next);
            for o in out.outputs.iter().filter(|o| changed.contains(&o.index)) {
                if done[o.index] {
                    continue;
                }
                done[o.index] = o.finish_reason.is_some();
                let text = delta(&o.text, &mut sent[o.index]);
                if text.is_empty() && o.finish_reason.is_none() {
                    // Text held back (half a character, a possible stop string): its tokens'
                    // logprobs go with the chunk that releases it.
                    continue;
                }
                let lp = self.logprobs(o, sent_tokens[o.index]);
                sent_tokens[o.index] = o.token_ids.len();
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                let c = json!([{
                    "index": o.index, "delta": delta, "logprobs": lp,
                    "finish_reason": finish_reason(o), "stop_reason": stop_reason(o),
                }]);
                if tx.send(self.body(OBJECT, c)).await.is_err() {
                    return;
                }
            }
        }
        if let (true, Some(out)) = (include_usage, last) {
            let mut c = self.body(OBJECT, json!([]));
            c["usage"] = completion_usage(&out);
            let _ = tx.send(c).await;
        }
    }
}

fn completion_usage(out: &RequestOutput) -> Value {
    usage(out.prompt_token_ids.len(), out.num_generated_tokens())
}

/// Chat-style logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(tok: &Tokenizer, o: &CompletionOutput, from: usize, k: usize) -> Value {
    let Some(lps) = &o.logprobs else {
        return Value::Null;
    };
    let entry = |id: TokenId, lp: f32| {
        let t = token_text(tok, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = o
        .token_ids
        .iter()
        .zip(lps)
        .skip(from)
        .map(|(&id, lp)| {
            let mut e = entry(id, lp.get(id).unwrap_or(f32::NEG_INFINITY));
            e["top_logprobs"] = top(lp)
                .into_iter()
                .take(k)
                .map(|(a, x)| entry(a, x))
                .collect();
            e
        })
        .collect();
    json!({"content": content})
}
