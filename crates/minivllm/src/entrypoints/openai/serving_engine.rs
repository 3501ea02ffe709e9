//! What the serving endpoints share: parsing and checking requests, submitting them to the
//! engine, and turning engine outputs into OpenAI's JSON and server-sent events.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::protocol::ApiError;
use super::request_memory::{
    estimate, PromptShape, Reservation, ResponseShape, TOKENIZE_BYTES_PER_BYTE,
};
use super::server_state::{AppState, RequestId, Shared};
use crate::engine::async_engine::{collect, NewRequest};
use crate::engine::input_processor::CheckedParams;
use crate::engine::llm_engine::EngineError;
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::{CompletionOutput, RequestOutput};
use crate::sampling_params::{logprob_count, RequestOutputKind, SamplingParams};
use crate::sequence::TokenId;

pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Parsed by hand so that malformed JSON and oversized bodies get OpenAI's error object, not
/// axum's plain text.
pub fn parse<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text(), None))?;
    let mut json = serde_json::Deserializer::from_slice(&body);
    let value = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        // Named by the field it is in (`max_tokens: invalid type: string "x", expected
        // usize`), not only by where in the body the parser was.
        let path = e.path().to_string();
        let field = path.split(['.', '[']).next().filter(|f| !f.is_empty());
        let message = match field {
            Some(_) => format!("invalid request: {path}: {}", e.inner()),
            None => format!("invalid request: {}", e.inner()),
        };
        ApiError::bad_request(message, field)
    })?;
    // One JSON value and nothing after it but whitespace, as vLLM (pydantic) answers: a
    // body with something appended is not the request its sender meant.
    json.end().map_err(|e| {
        ApiError::bad_request(
            format!("invalid request: the body continues after its JSON value: {e}"),
            None,
        )
    })?;
    Ok(value)
}

/// `text` tokenised, the tokenizer's working memory held from the request pool meanwhile:
/// Hugging Face's tokenizers keep offsets, a string and more per token while they encode
/// ([`TOKENIZE_BYTES_PER_BYTE`] at the peak), so a multi-megabyte text is refused above
/// `--max-request-memory` (400) and many at once wait for the pool (503), where two 7.8 MB
/// `/tokenize` requests took 2.9 GB together.
pub fn encode(s: &AppState, text: &str, add_special: bool) -> Result<Vec<TokenId>, ApiError> {
    let bytes = (text.len() as u64).saturating_mul(TOKENIZE_BYTES_PER_BYTE);
    let what = format!("tokenising {} bytes of text: send less text", text.len());
    let _working = s.memory.reserve(bytes, &what)?;
    let ids = s.engine.tokenizer().encode(text, add_special);
    Ok(ids.map_err(EngineError::from)?)
}

/// Runs a request's CPU work (parsing a large body, tokenising, rendering a chat template,
/// building a large response) on tokio's blocking threads, at most one task per core at a
/// time: more wait their turn, and the async workers stay free for I/O, so `/health` and
/// the streams in flight keep answering while a multi-megabyte prompt is tokenised.
pub(crate) async fn off_async<T: Send + 'static>(
    s: &Shared,
    f: impl FnOnce(&AppState) -> T + Send + 'static,
) -> T {
    let _permit = s
        .cpu
        .acquire()
        .await
        .expect("the CPU semaphore is never closed");
    let s = s.clone();
    match tokio::task::spawn_blocking(move || f(&s)).await {
        Ok(v) => v,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// `v` as a JSON response, serialised by the caller's thread.
pub(crate) fn json_response(v: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => ApiError::internal(format!("cannot write the response: {e}")).into_response(),
    }
}

/// vLLM answers a model name it does not serve with 404, which OpenAI's clients raise as
/// `NotFoundError`.
pub(crate) fn check_model(s: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != s.config.served_model_name => Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("The model `{m}` does not exist."),
            Some("model"),
        )),
        _ => Ok(()),
    }
}

/// A request's `n` (or `best_of`) times its prompts must fit in one batch: every sequence
/// of a request is admitted together, and each holds state from the start. Checked before
/// the prompts are tokenised, after the engine's check of one prompt's width.
pub(crate) fn check_request_width(
    s: &AppState,
    params: &SamplingParams,
    prompts: usize,
) -> Result<(), ApiError> {
    let max = s.engine.max_num_seqs();
    let width = params.num_sequences().saturating_mul(prompts);
    if prompts > 1 && width > max {
        return Err(ApiError::bad_request(
            format!(
                "This request asks for {prompts} prompts x {} sequences each = {width} \
                 sequences, more than --max-num-seqs {max}: all of a request's sequences \
                 must fit in one batch. Send fewer prompts per request, or a smaller n.",
                params.num_sequences()
            ),
            Some("prompt"),
        ));
    }
    Ok(())
}

/// What a request holds while it runs: its share of the memory pool.
pub(crate) struct Held {
    _memory: Reservation,
}

/// Admits a request whose parameters the engine has checked (`checked`, from
/// [`AsyncEngine::check`](crate::engine::async_engine::AsyncEngine::check), the one place
/// they are checked): fixes each prompt's output budget (a prompt that fills the context is
/// refused here with OpenAI's message), reserves the request's memory (as `response` says
/// the route writes it), builds its stop strings' automaton (here, off the engine thread;
/// the copies share it), and only then copies the parameters per prompt.
pub(crate) fn admit(
    s: &AppState,
    checked: CheckedParams,
    prompts: &[Prompt],
    response: ResponseShape,
) -> Result<(Vec<CheckedParams>, Held), ApiError> {
    let base = checked.params();
    let max_model_len = s.engine.max_model_len();
    let shapes = prompts
        .iter()
        .map(|p| {
            Ok(PromptShape {
                tokens: p.ids.len(),
                max_tokens: base.max_tokens_for(p.ids.len(), max_model_len)?,
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let what = format!(
        "{} prompt(s) x {} sequence(s), max_tokens {}, logprobs {}, prompt_logprobs {}, {} stop \
         string(s)",
        prompts.len(),
        base.num_sequences(),
        shapes.iter().map(|p| p.max_tokens).max().unwrap_or(0),
        logprob_count::display(base.logprobs.unwrap_or(0)),
        logprob_count::display(base.prompt_logprobs.unwrap_or(0)),
        base.stop.len()
    );
    let vocab = s.engine.tokenizer().vocab_size();
    let memory = s
        .memory
        .reserve(estimate(base, &shapes, response, vocab), &what)?;
    let held = Held { _memory: memory };
    let checked = checked.with_stop_strings();
    let params = shapes
        .iter()
        .map(|p| checked.clone().with_max_tokens(p.max_tokens))
        .collect::<Result<Vec<_>, EngineError>>()?;
    Ok((params, held))
}

/// One prompt of a request, tokenised, with the text to echo.
pub struct Prompt {
    pub text: String,
    pub ids: Vec<TokenId>,
}

pub(crate) type Streams = Vec<mpsc::UnboundedReceiver<RequestOutput>>;

/// Queues one engine request per prompt, all at once, named `{prefix}-{request id}-{serial}-{i}`
/// so engine logs line up with the HTTP request's id; the serial keeps the names unique when
/// two clients send the same `X-Request-Id`.
pub async fn submit(
    s: &AppState,
    request_id: &RequestId,
    prefix: &str,
    prompts: &[Prompt],
    params: Vec<CheckedParams>,
) -> Result<Streams, ApiError> {
    static SERIAL: AtomicU64 = AtomicU64::new(0);
    let serial = SERIAL.fetch_add(1, Ordering::Relaxed);
    let requests = prompts
        .iter()
        .zip(params)
        .enumerate()
        .map(|(i, (p, params))| NewRequest {
            request_id: format!("{prefix}-{}-{serial}-{i}", request_id.0),
            prompt: p.ids.clone().into(),
            params,
        })
        .collect();
    Ok(s.engine.generate_many(requests).await?)
}

/// A request's whole output: its one `FINAL_ONLY` output (what a route that does not
/// stream asks for).
pub(crate) async fn last_output(
    rx: mpsc::UnboundedReceiver<RequestOutput>,
) -> Result<RequestOutput, ApiError> {
    collect(rx, RequestOutputKind::FinalOnly)
        .await
        .filter(|o| o.finished)
        .ok_or_else(|| ApiError::internal("the engine ended the request early"))
}

pub fn finish_reason(o: &CompletionOutput) -> Value {
    o.finish_reason.map_or(Value::Null, |r| r.as_str().into())
}

pub fn stop_reason(o: &CompletionOutput) -> Value {
    json!(o.stop_reason)
}

/// Sends each chunk as an SSE event; `[DONE]` ends the stream. A client that disconnects
/// drops the body and with it the receiver, which ends `produce` and so aborts its requests.
pub(crate) fn sse<F, Fut>(produce: F) -> Response
where
    F: FnOnce(mpsc::Sender<Value>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Value>(64);
    tokio::spawn(produce(tx));
    data_sse(rx)
}

/// `rx`'s chunks as `data:` events, then `[DONE]`.
pub(crate) fn data_sse(rx: mpsc::Receiver<Value>) -> Response {
    sse_events(
        rx,
        |chunk| format!("data: {chunk}\n\n"),
        Some("data: [DONE]\n\n"),
    )
}

/// Named events (`event: <name>` before each `data:`), as Anthropic's Messages and
/// OpenAI's Responses streams send them, as `produce` sends them; no `[DONE]`. A client that
/// disconnects drops the receiver, which ends `produce` (and aborts its request).
pub(crate) fn named_sse<F, Fut>(produce: F) -> Response
where
    F: FnOnce(mpsc::Sender<(&'static str, Value)>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(produce(tx));
    sse_events(
        rx,
        |(name, data)| format!("event: {name}\ndata: {data}\n\n"),
        None,
    )
}

/// The stream of `rx`'s items, each written by `write`, then `last` if any.
pub fn sse_events<T: Send + 'static>(
    rx: mpsc::Receiver<T>,
    write: fn(T) -> String,
    last: Option<&'static str>,
) -> Response {
    // `None` state: the stream is over.
    let stream = futures_util::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        let (event, next) = match rx.recv().await {
            Some(item) => (write(item), Some(rx)),
            None => (last?.to_string(), None),
        };
        Some((Ok::<_, Infallible>(event), next))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::internal("cannot build the response").into_response())
}

/// Merges the requests' streams, tagging each output with its prompt's index.
pub(crate) fn merge(streams: Streams) -> mpsc::UnboundedReceiver<(usize, RequestOutput)> {
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

pub(crate) fn token_text(tok: &Tokenizer, id: TokenId) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// vLLM's `prompt_logprobs`: per prompt token (`null` for the first, which nothing
/// predicts), `{token id: {logprob, rank, decoded_token}}` in vLLM's order (the prompt's
/// token first: [`TokenLogprobs::chosen_first`](crate::outputs::TokenLogprobs::chosen_first)).
pub fn prompt_logprobs(tok: &Tokenizer, out: &RequestOutput) -> Value {
    let positions = out.prompt_logprobs.as_deref().unwrap_or(&[]);
    let list = (0..out.prompt_token_ids.len()).map(|i| {
        let Some(lps) = positions.get(i).and_then(Option::as_ref) else {
            return Value::Null;
        };
        let map = lps.chosen_first().into_iter().map(|(id, lp, rank)| {
            let entry = json!({"logprob": lp, "rank": rank, "decoded_token": token_text(tok, id)});
            (id.to_string(), entry)
        });
        Value::Object(map.collect())
    });
    Value::Array(list.collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_one_json_value_and_nothing_after_it() {
        let body = |b: &'static [u8]| parse::<Value>(Ok(Bytes::from_static(b)));
        assert_eq!(body(b"{\"prompt\": \"x\"} \r\n\t").unwrap()["prompt"], "x");
        for bad in [
            &b"{\"prompt\": \"x\"}garbage"[..],
            b"{\"prompt\": \"x\"}\0",
            b"{} {}",
        ] {
            let e = body(bad).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
            assert!(
                e.message.contains("continues after its JSON value"),
                "{}",
                e.message
            );
        }
    }
}
