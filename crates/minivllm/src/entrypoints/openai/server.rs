//! The HTTP routes of the OpenAI-compatible server.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::protocol::{
    ApiError, ChatCompletionRequest, CommonParams, CompletionRequest, PromptField,
};
use crate::engine::async_engine::AsyncEngine;
use crate::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use crate::sampling_params::SamplingParams;
use crate::sequence::TokenId;

/// vLLM's default cap on requested logprobs.
const MAX_LOGPROBS: usize = 20;

struct AppState {
    engine: AsyncEngine,
    served_model_name: String,
}

type Shared = Arc<AppState>;

pub fn router(engine: AsyncEngine, served_model_name: String) -> Router {
    let state = Arc::new(AppState {
        engine,
        served_model_name,
    });
    Router::new()
        .route("/health", get(|| async {}))
        .route(
            "/version",
            get(|| async { Json(json!({"version": env!("CARGO_PKG_VERSION")})) }),
        )
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then lets requests in flight finish.
pub async fn serve(
    listener: TcpListener,
    engine: AsyncEngine,
    served_model_name: String,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(engine, served_model_name))
        .with_graceful_shutdown(shutdown)
        .await
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn random_id(prefix: &str) -> String {
    format!(
        "{prefix}-{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

async fn models(State(s): State<Shared>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.served_model_name,
            "object": "model",
            "created": now(),
            "owned_by": "minivllm",
            "root": s.served_model_name,
            "max_model_len": s.engine.max_model_len(),
        }]
    }))
}

/// Parsed by hand so that malformed JSON gets OpenAI's error object, not axum's plain text.
fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}"), None))
}

fn check_model(s: &AppState, common: &CommonParams) -> Result<(), ApiError> {
    match &common.model {
        Some(m) if *m != s.served_model_name => Err(ApiError::bad_request(
            format!("The model `{m}` does not exist."),
            Some("model"),
        )),
        _ => Ok(()),
    }
}

/// Validates `params` for a prompt of `prompt_len` tokens and fixes its output budget, so a
/// prompt that fills the context is refused here with OpenAI's message.
fn checked_params(
    s: &AppState,
    mut params: SamplingParams,
    prompt_len: usize,
) -> Result<SamplingParams, ApiError> {
    params.validate()?;
    params.validate_for_model(s.engine.tokenizer().vocab_size(), MAX_LOGPROBS)?;
    params.max_tokens = Some(params.max_tokens_for(prompt_len, s.engine.max_model_len())?);
    Ok(params)
}

/// One prompt of a request, tokenised, with the text to echo.
struct Prompt {
    text: String,
    ids: Vec<TokenId>,
}

type Streams = Vec<mpsc::UnboundedReceiver<RequestOutput>>;

async fn submit(
    s: &AppState,
    prefix: &str,
    prompts: &[Prompt],
    params: &[SamplingParams],
    priority: i32,
) -> Result<Streams, ApiError> {
    let base = random_id(prefix);
    let mut streams = Vec::with_capacity(prompts.len());
    for (i, (p, params)) in prompts.iter().zip(params).enumerate() {
        // On error the streams already opened drop here, which aborts their requests.
        streams.push(
            s.engine
                .generate(
                    format!("{base}-{i}"),
                    p.ids.clone().into(),
                    params.clone(),
                    priority,
                )
                .await?,
        );
    }
    Ok(streams)
}

async fn last_output(
    mut rx: mpsc::UnboundedReceiver<RequestOutput>,
) -> Result<RequestOutput, ApiError> {
    let mut last = None;
    while let Some(out) = rx.recv().await {
        last = Some(out);
    }
    last.filter(|o| o.finished).ok_or_else(|| ApiError {
        status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        message: "the engine ended the request early".into(),
        param: None,
    })
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

fn finish_reason(o: &CompletionOutput) -> Value {
    o.finish_reason.map_or(Value::Null, |r| r.as_str().into())
}

fn stop_reason(o: &CompletionOutput) -> Value {
    serde_json::to_value(o)
        .ok()
        .and_then(|v| v.get("stop_reason").cloned())
        .unwrap_or(Value::Null)
}

/// The part of `text` not sent yet; empty if the text went back over a boundary already sent.
fn delta(text: &str, sent: &mut usize) -> String {
    let d = text.get(*sent..).unwrap_or("").to_string();
    *sent = (*sent).max(text.len());
    d
}

/// Sends each chunk as an SSE event; `[DONE]` ends the stream. A client that disconnects
/// drops the body, which ends `produce` and so aborts its requests.
fn sse<F, Fut>(produce: F) -> Response
where
    F: FnOnce(mpsc::Sender<Value>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Value>(64);
    let (bytes_tx, bytes_rx) = mpsc::channel::<String>(64);
    let fut = produce(tx);
    tokio::spawn(fut);
    tokio::spawn(async move {
        let mut rx = rx;
        while let Some(chunk) = rx.recv().await {
            if bytes_tx.send(format!("data: {chunk}\n\n")).await.is_err() {
                return;
            }
        }
        let _ = bytes_tx.send("data: [DONE]\n\n".to_string()).await;
    });
    let stream = futures_util::stream::unfold(bytes_rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| {
            ApiError::bad_request("cannot build the response", None).into_response()
        })
}

/// Merges the requests' streams, tagging each output with its prompt's index.
fn merge(streams: Streams) -> mpsc::UnboundedReceiver<(usize, RequestOutput)> {
    let (tx, rx) = mpsc::unbounded_channel();
    for (i, mut s) in streams.into_iter().enumerate() {
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(out) = s.recv().await {
                if tx.send((i, out)).is_err() {
                    return;
                }
            }
        });
    }
    rx
}

// ---------------------------------------------------------------------------- completions

async fn completions(State(s): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse(&body)?;
    check_model(&s, &req.common)?;
    let tok = s.engine.tokenizer().clone();
    let texts_or_ids: Vec<Result<String, Vec<TokenId>>> = match req.prompt {
        PromptField::Text(t) => vec![Ok(t)],
        PromptField::Texts(v) => v.into_iter().map(Ok).collect(),
        PromptField::Ids(ids) => vec![Err(ids)],
        PromptField::IdLists(v) => v.into_iter().map(Err).collect(),
    };
    if texts_or_ids.is_empty() {
        return Err(ApiError::bad_request(
            "prompt must not be empty",
            Some("prompt"),
        ));
    }
    let mut prompts = Vec::new();
    for p in texts_or_ids {
        prompts.push(match p {
            Ok(text) => Prompt {
                ids: tok
                    .encode(&text, true)
                    .map_err(crate::engine::llm_engine::EngineError::from)?,
                text,
            },
            Err(ids) => Prompt {
                text: tok.decode(&ids, false).unwrap_or_default(),
                ids,
            },
        });
    }
    let base = req.common.sampling_params(req.max_tokens, req.logprobs);
    let params = prompts
        .iter()
        .map(|p| checked_params(&s, base.clone(), p.ids.len()))
        .collect::<Result<Vec<_>, _>>()?;
    let n = base.n;
    let streams = submit(&s, "cmpl", &prompts, &params, req.common.priority).await?;
    let id = random_id("cmpl");
    let created = now();
    let model = s.served_model_name.clone();
    if req.common.stream {
        let include_usage = req.common.include_usage();
        let echo = req.echo;
        let want_logprobs = req.logprobs.is_some();
        return Ok(sse(move |tx| async move {
            let mut merged = merge(streams);
            let mut sent = vec![0usize; prompts.len() * n];
            let mut sent_tokens = vec![0usize; prompts.len() * n];
            let mut prompt_tokens = 0;
            let mut completion_tokens = 0;
            let mut echoed = vec![false; prompts.len() * n];
            while let Some((i, out)) = merged.recv().await {
                for o in &out.outputs {
                    let index = i * n + o.index;
                    let mut text = delta(&o.text, &mut sent[index]);
                    if echo && !echoed[index] {
                        echoed[index] = true;
                        text = format!("{}{text}", prompts[i].text);
                    }
                    let logprobs = if want_logprobs {
                        let from = sent_tokens[index];
                        completion_logprobs(&tok, o, from, 0)
                    } else {
                        Value::Null
                    };
                    sent_tokens[index] = o.token_ids.len();
                    if text.is_empty() && o.finish_reason.is_none() {
                        continue;
                    }
                    let chunk = json!({
                        "id": id, "object": "text_completion", "created": created, "model": model,
                        "choices": [{
                            "index": index, "text": text, "logprobs": logprobs,
                            "finish_reason": finish_reason(o), "stop_reason": stop_reason(o),
                        }],
                    });
                    if tx.send(chunk).await.is_err() {
                        return;
                    }
                }
                if out.finished {
                    prompt_tokens += out.prompt_token_ids.len();
                    completion_tokens +=
                        out.outputs.iter().map(|o| o.token_ids.len()).sum::<usize>();
                }
            }
            if include_usage {
                let chunk = json!({
                    "id": id, "object": "text_completion", "created": created, "model": model,
                    "choices": [], "usage": usage(prompt_tokens, completion_tokens),
                });
                let _ = tx.send(chunk).await;
            }
        }));
    }
    let mut choices = Vec::new();
    let (mut prompt_tokens, mut completion_tokens) = (0, 0);
    for (i, rx) in streams.into_iter().enumerate() {
        let out = last_output(rx).await?;
        prompt_tokens += out.prompt_token_ids.len();
        for o in &out.outputs {
            completion_tokens += o.token_ids.len();
            let (text, offset) = if req.echo {
                (
                    format!("{}{}", prompts[i].text, o.text),
                    prompts[i].text.len(),
                )
            } else {
                (o.text.clone(), 0)
            };
            let logprobs = if req.logprobs.is_some() {
                completion_logprobs(&tok, o, 0, offset)
            } else {
                Value::Null
            };
            choices.push(json!({
                "index": i * n + o.index, "text": text, "logprobs": logprobs,
                "finish_reason": finish_reason(o), "stop_reason": stop_reason(o),
            }));
        }
    }
    Ok(Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

fn token_text(tok: &crate::engine::tokenizer::Tokenizer, id: TokenId) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// The alternatives at one position, best first, each token once.
fn top(lps: &TokenLogprobs) -> Vec<(TokenId, f32)> {
    let mut v: Vec<(TokenId, f32)> = Vec::new();
    for &(t, lp) in &lps.0 {
        if !v.iter().any(|(u, _)| *u == t) {
            v.push((t, lp));
        }
    }
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// Completions-style logprobs of tokens `from..`, offsets counted from `offset`.
fn completion_logprobs(
    tok: &crate::engine::tokenizer::Tokenizer,
    o: &CompletionOutput,
    from: usize,
    offset: usize,
) -> Value {
    let Some(lps) = &o.logprobs else {
        return Value::Null;
    };
    let (mut tokens, mut token_logprobs, mut top_logprobs, mut text_offset) =
        (vec![], vec![], vec![], vec![]);
    let mut pos = offset;
    for (&id, lp) in o.token_ids.iter().zip(lps).skip(from) {
        let t = token_text(tok, id);
        text_offset.push(pos);
        pos += t.len();
        token_logprobs.push(lp.get(id).map_or(Value::Null, |x| json!(x)));
        let alts: serde_json::Map<String, Value> = top(lp)
            .into_iter()
            .map(|(a, x)| (token_text(tok, a), json!(x)))
            .collect();
        top_logprobs.push(Value::Object(alts));
        tokens.push(t);
    }
    json!({
        "tokens": tokens, "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs, "text_offset": text_offset,
    })
}

// ----------------------------------------------------------------------- chat completions

async fn chat_completions(State(s): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse(&body)?;
    check_model(&s, &req.common)?;
    let tok = s.engine.tokenizer().clone();
    let rendered = tok
        .apply_chat_template(&req.messages, req.add_generation_prompt)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    // The template writes the BOS itself.
    let ids = tok
        .encode(&rendered, false)
        .map_err(crate::engine::llm_engine::EngineError::from)?;
    let top_logprobs = req.top_logprobs.unwrap_or(0);
    let logprobs = req.logprobs.then_some(top_logprobs);
    let params = checked_params(
        &s,
        req.common
            .sampling_params(req.max_completion_tokens.or(req.max_tokens), logprobs),
        ids.len(),
    )?;
    let n = params.n;
    let prompts = [Prompt {
        text: rendered,
        ids,
    }];
    let mut streams = submit(&s, "chatcmpl", &prompts, &[params], req.common.priority).await?;
    let rx = streams.remove(0);
    let id = random_id("chatcmpl");
    let created = now();
    let model = s.served_model_name.clone();
    if req.common.stream {
        let include_usage = req.common.include_usage();
        return Ok(sse(move |tx| async move {
            let mut rx = rx;
            let mut sent = vec![0usize; n];
            let mut sent_tokens = vec![0usize; n];
            let chunk = |choices: Value| {
                json!({
                    "id": id, "object": "chat.completion.chunk", "created": created,
                    "model": model, "choices": choices,
                })
            };
            for i in 0..n {
                let first = json!([{
                    "index": i, "delta": {"role": "assistant", "content": ""},
                    "logprobs": null, "finish_reason": null,
                }]);
                if tx.send(chunk(first)).await.is_err() {
                    return;
                }
            }
            let mut last = None;
            while let Some(out) = rx.recv().await {
                for o in &out.outputs {
                    let text = delta(&o.text, &mut sent[o.index]);
                    let lp = if logprobs.is_some() {
                        chat_logprobs(&tok, o, sent_tokens[o.index], top_logprobs)
                    } else {
                        Value::Null
                    };
                    sent_tokens[o.index] = o.token_ids.len();
                    if text.is_empty() && o.finish_reason.is_none() {
                        continue;
                    }
                    let delta = if text.is_empty() {
                        json!({})
                    } else {
                        json!({"content": text})
                    };
                    let c = json!([{
                        "index": o.index, "delta": delta, "logprobs": lp,
                        "finish_reason": finish_reason(o), "stop_reason": stop_reason(o),
                    }]);
                    if tx.send(chunk(c)).await.is_err() {
                        return;
                    }
                }
                last = Some(out);
            }
            if let (true, Some(out)) = (include_usage, last) {
                let completion: usize = out.outputs.iter().map(|o| o.token_ids.len()).sum();
                let mut c = chunk(json!([]));
                c["usage"] = usage(out.prompt_token_ids.len(), completion);
                let _ = tx.send(c).await;
            }
        }));
    }
    let out = last_output(rx).await?;
    let completion: usize = out.outputs.iter().map(|o| o.token_ids.len()).sum();
    let choices: Vec<Value> = out
        .outputs
        .iter()
        .map(|o| {
            let lp = if logprobs.is_some() {
                chat_logprobs(&tok, o, 0, top_logprobs)
            } else {
                Value::Null
            };
            json!({
                "index": o.index,
                "message": {"role": "assistant", "content": o.text},
                "logprobs": lp,
                "finish_reason": finish_reason(o),
                "stop_reason": stop_reason(o),
            })
        })
        .collect();
    Ok(Json(json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": usage(out.prompt_token_ids.len(), completion),
    }))
    .into_response())
}

/// Chat-style logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(
    tok: &crate::engine::tokenizer::Tokenizer,
    o: &CompletionOutput,
    from: usize,
    k: usize,
) -> Value {
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
