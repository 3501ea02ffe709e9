//! `POST /v1/chat/completions`: a chat run's reply events written as OpenAI's
//! `chat.completion`, or as its stream of `chat.completion.chunk` objects.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::chat_run::{run_chat, ChatRun};
use super::protocol::{ApiError, ChatCompletionRequest};
use super::reply_events::{ChatReply, ChoiceDelta, Finish, Piece, ReplyEvents, TokenLogprob};
use super::request_memory::LogprobFormat;
use super::server_state::{RequestId, Shared};
use super::serving_engine::{json_response, now, off_async, parse, sse};

pub(crate) async fn chat_completions(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = off_async(&s, move |_| parse::<ChatCompletionRequest>(body)).await?;
    let head = Head {
        id: format!("chatcmpl-{}", rid.0),
        created: now(),
        model: s.config.served_model_name.clone(),
        include_usage: req.common.include_usage(),
        usage_details: s.config.prompt_tokens_details,
    };
    Ok(match run_chat(&s, &rid, req, LogprobFormat::Chat).await? {
        ChatRun::Full { reply, .. } => {
            off_async(&s, move |_| json_response(&head.completion(&reply))).await
        }
        ChatRun::Stream { n, events, .. } => sse(|tx| head.stream(n, events, tx)),
    })
}

/// What every object of one reply repeats, and how its usage is written.
struct Head {
    id: String,
    created: u64,
    model: String,
    /// A stream ends with a usage chunk (`stream_options.include_usage`).
    include_usage: bool,
    /// The usage has `prompt_tokens_details` (`--enable-prompt-tokens-details`).
    usage_details: bool,
}

impl Head {
    fn body(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices,
        })
    }

    fn completion(&self, reply: &ChatReply) -> Value {
        let choices: Vec<Value> = reply
            .choices
            .iter()
            .map(|c| {
                let mut message = json!({"role": "assistant", "content": c.content});
                if reply.reasoning_parser {
                    message["reasoning_content"] = json!(c.reasoning);
                }
                if !c.tool_calls.is_empty() {
                    let calls: Vec<Value> = c
                        .tool_calls
                        .iter()
                        .map(|t| {
                            json!({
                                "id": t.id, "type": "function",
                                "function": {"name": t.name, "arguments": t.arguments},
                            })
                        })
                        .collect();
                    message["tool_calls"] = Value::Array(calls);
                }
                json!({
                    "index": c.index,
                    "message": message,
                    "logprobs": logprobs(c.logprobs.as_deref()),
                    "finish_reason": finish_reason(c.finish.as_ref()),
                    "stop_reason": stop_reason(c.finish.as_ref()),
                })
            })
            .collect();
        let mut body = self.body("chat.completion", Value::Array(choices));
        body["usage"] = reply.usage.json(self.usage_details);
        if let Some(lps) = &reply.prompt_logprobs {
            body["prompt_logprobs"] = lps.clone();
        }
        if let Some(kv) = &reply.kv_transfer_params {
            body["kv_transfer_params"] = json!(kv);
        }
        body
    }

    /// Each choice's first chunk (the role), a chunk per delta, then the usage chunk when
    /// asked for.
    async fn stream(self, n: usize, mut events: ReplyEvents, tx: mpsc::Sender<Value>) {
        const OBJECT: &str = "chat.completion.chunk";
        for i in 0..n {
            let first = json!([{
                "index": i, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null,
            }]);
            if tx.send(self.body(OBJECT, first)).await.is_err() {
                return;
            }
        }
        while let Some(d) = events.next_delta().await {
            let chunk = self.body(OBJECT, json!([choice_chunk(&d)]));
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        if let (true, Some(usage)) = (self.include_usage, events.usage) {
            let mut c = self.body(OBJECT, json!([]));
            c["usage"] = usage.json(self.usage_details);
            let _ = tx.send(c).await;
        }
    }
}

/// One choice's chunk: its delta (`reasoning_content`, `content`, `tool_calls` pieces), the
/// logprobs of the tokens it releases, and how it finished.
fn choice_chunk(d: &ChoiceDelta) -> Value {
    let mut delta = Map::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut append = |key: &str, text: &str| {
        let entry = delta.entry(key).or_insert_with(|| json!(""));
        *entry = json!(format!("{}{text}", entry.as_str().unwrap_or_default()));
    };
    for piece in &d.pieces {
        match piece {
            Piece::Reasoning(t) => append("reasoning_content", t),
            Piece::Text(t) => append("content", t),
            Piece::CallStart { index, id, name } => calls.push(json!({
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            })),
            Piece::CallArguments { index, text } => match calls.last_mut() {
                Some(call) if call["index"] == *index => {
                    let args = &mut call["function"]["arguments"];
                    *args = json!(format!("{}{text}", args.as_str().unwrap_or_default()));
                }
                _ => calls.push(json!({"index": index, "function": {"arguments": text}})),
            },
        }
    }
    if !calls.is_empty() {
        delta.insert("tool_calls".into(), Value::Array(calls));
    }
    json!({
        "index": d.index, "delta": delta, "logprobs": logprobs(d.logprobs.as_deref()),
        "finish_reason": finish_reason(d.finish.as_ref()),
        "stop_reason": stop_reason(d.finish.as_ref()),
    })
}

/// Chat-style logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn logprobs(entries: Option<&[TokenLogprob]>) -> Value {
    entries.map_or(Value::Null, |e| json!({ "content": e }))
}

fn finish_reason(finish: Option<&Finish>) -> Value {
    finish.map_or(Value::Null, |f| f.chat_reason().into())
}

fn stop_reason(finish: Option<&Finish>) -> Value {
    json!(finish.and_then(|f| f.stop_reason.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sequence::{FinishReason, StopReason};

    /// A delta's pieces as OpenAI's chunk: texts joined by kind, a call's start and its first
    /// arguments in one entry, a later call's arguments in one of their own.
    #[test]
    fn a_delta_is_written_as_one_chunk() {
        let d = ChoiceDelta {
            index: 1,
            pieces: vec![
                Piece::Reasoning("Hm.".into()),
                Piece::Text("Sure".into()),
                Piece::Text("!".into()),
                Piece::CallArguments {
                    index: 0,
                    text: "}".into(),
                },
                Piece::CallStart {
                    index: 1,
                    id: "c".into(),
                    name: "f".into(),
                },
                Piece::CallArguments {
                    index: 1,
                    text: "{\"a\"".into(),
                },
            ],
            logprobs: Some(Vec::new()),
            finish: Some(Finish {
                reason: FinishReason::Stop,
                stop_reason: Some(StopReason::Token(7)),
                called: true,
                as_tool_calls: true,
            }),
        };
        assert_eq!(
            choice_chunk(&d),
            json!({
                "index": 1,
                "delta": {
                    "reasoning_content": "Hm.", "content": "Sure!",
                    "tool_calls": [
                        {"index": 0, "function": {"arguments": "}"}},
                        {"index": 1, "id": "c", "type": "function",
                         "function": {"name": "f", "arguments": "{\"a\""}},
                    ],
                },
                "logprobs": {"content": []}, "finish_reason": "tool_calls", "stop_reason": 7,
            })
        );
        let plain = ChoiceDelta {
            index: 0,
            pieces: Vec::new(),
            logprobs: None,
            finish: None,
        };
        assert_eq!(
            choice_chunk(&plain),
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": null,
                   "stop_reason": null})
        );
    }
}
