//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API. A
//! request runs as the chat request it reads as; its reply (thinking, text, tool calls,
//! as `--reasoning-parser` and `--tool-call-parser` split it) is written back as content
//! blocks, and a stream as Anthropic's events.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::protocol::{error_body, MessagesRequest};
use crate::entrypoints::openai::chat_run::{render_chat, run_chat, ChatRun};
use crate::entrypoints::openai::protocol::ApiError;
use crate::entrypoints::openai::reply_events::{ChatReply, Finish, Piece, ReplyEvents};
use crate::entrypoints::openai::request_memory::LogprobFormat;
use crate::entrypoints::openai::server_state::{RequestId, Shared};
use crate::entrypoints::openai::serving_engine::{
    check_model, json_response, named_sse, off_async, parse,
};
use crate::entrypoints::openai::tool_calls::ToolUse;
use crate::entrypoints::openai::usage::Usage;
use crate::sequence::{FinishReason, StopReason};

pub async fn messages(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = off_async(&s, move |_| parse::<MessagesRequest>(body)).await?;
    let chat = req.to_chat(true)?;
    let head = Head {
        id: format!("msg_{}", rid.0),
        model: s.config.served_model_name.clone(),
    };
    Ok(match run_chat(&s, &rid, chat, LogprobFormat::Chat).await? {
        ChatRun::Full { reply, .. } => json_response(&head.message(&reply)),
        ChatRun::Stream {
            prompt_tokens,
            events,
            ..
        } => named_sse(|tx| head.stream(events, prompt_tokens, tx)),
    })
}

/// The prompt's tokens as the request would render it: `{"input_tokens": n}`.
pub async fn count_tokens(
    State(s): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let count = off_async(&s, move |s| {
        let req = parse::<MessagesRequest>(body)?;
        check_model(s, req.model.as_deref())?;
        let chat = req.to_chat(false)?;
        let mode = chat.check()?;
        // The tools as a chat request with `tool_choice: "none"` renders them.
        let tools = ToolUse::from_request(
            chat.tools.as_deref(),
            Some(&json!("none")),
            None,
            false,
            &s.config.tool_calls,
        )?;
        let kwargs = chat.template_kwargs(&s.config.default_chat_template_kwargs);
        let prompt = render_chat(
            s,
            &chat.messages,
            &tools.template_tools,
            &kwargs,
            mode,
            false,
        )?;
        Ok::<_, ApiError>(prompt.ids.len())
    })
    .await?;
    Ok(json_response(&json!({"input_tokens": count})))
}

/// What a reply's message object says of itself.
struct Head {
    id: String,
    model: String,
}

impl Head {
    /// The message object around `content` (nothing yet, when a stream starts).
    fn object(&self, content: Value, stop: (Value, Value), usage: Value) -> Value {
        json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content, "stop_reason": stop.0, "stop_sequence": stop.1,
            "usage": usage,
        })
    }

    /// A whole reply as a message.
    fn message(&self, reply: &ChatReply) -> Value {
        let mut content = Vec::new();
        let Some(choice) = reply.choices.first() else {
            return self.object(
                json!([]),
                (json!("end_turn"), Value::Null),
                usage(reply.usage),
            );
        };
        if let Some(thought) = choice.reasoning.as_deref().filter(|t| !t.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": thought, "signature": ""}));
        }
        let text = choice.content.as_deref().unwrap_or_default();
        // An empty reply still has its (empty) text block; one cut while thinking does not.
        if !text.is_empty() || (choice.tool_calls.is_empty() && content.is_empty()) {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in &choice.tool_calls {
            content.push(json!({
                "type": "tool_use", "id": tool_use_id(), "name": call.name,
                "input": serde_json::from_str::<Value>(&call.arguments)
                    .unwrap_or_else(|_| json!({})),
            }));
        }
        self.object(
            Value::Array(content),
            stop_reason(choice.finish.as_ref()),
            usage(reply.usage),
        )
    }

    /// Writes the reply's events as Anthropic's: `message_start`, then for each
    /// content block `content_block_start`, its deltas and `content_block_stop`, then
    /// `message_delta` (stop reason, output tokens) and `message_stop`. A stream that ends
    /// before the reply finished ends with an `error` event instead.
    async fn stream(
        self,
        mut events: ReplyEvents,
        prompt_tokens: usize,
        tx: mpsc::Sender<(&'static str, Value)>,
    ) {
        let mut out = Events {
            tx,
            blocks: 0,
            open: None,
        };
        // What the prefix cache held is known at the end: `message_delta` says it.
        let start = self.object(
            json!([]),
            (Value::Null, Value::Null),
            json!({"input_tokens": prompt_tokens, "output_tokens": 0}),
        );
        if !out
            .send(
                "message_start",
                json!({"type": "message_start", "message": start}),
            )
            .await
        {
            return;
        }
        let mut finish = None;
        while let Some(d) = events.next_delta().await {
            for piece in &d.pieces {
                let ok = match piece {
                    Piece::Reasoning(t) => out.text(Block::Thinking, t).await,
                    Piece::Text(t) => out.text(Block::Text, t).await,
                    Piece::CallStart { name, .. } => out.start_tool(name).await,
                    Piece::CallArguments { text, .. } => out.tool_input(text).await,
                };
                if !ok {
                    return;
                }
            }
            if let Some(f) = &d.finish {
                finish = Some(stop_reason(Some(f)));
            }
        }
        let Some((reason, sequence)) = finish else {
            let e = error_body(StatusCode::INTERNAL_SERVER_ERROR, "the reply ended early");
            out.send("error", e).await;
            return;
        };
        if !out.close().await {
            return;
        }
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(events.usage.unwrap_or(Usage {
                prompt: prompt_tokens,
                ..Usage::default()
            })),
        });
        if out.send("message_delta", delta).await {
            out.send("message_stop", json!({"type": "message_stop"}))
                .await;
        }
    }
}

/// Anthropic's usage: `input_tokens` are the prompt's tokens the
/// prefix cache did not hold and `cache_read_input_tokens` those it did, so that their sum
/// is the prompt, as Anthropic counts (agents add the fields up for the context's size).
/// Nothing is reported as written to a cache: the prefix cache keeps blocks unasked.
fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt.saturating_sub(u.cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.cached.min(u.prompt),
        "output_tokens": u.completion,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Thinking,
    Tool,
}

/// The stream's content blocks: how many were started, and the one open.
struct Events {
    tx: mpsc::Sender<(&'static str, Value)>,
    blocks: usize,
    open: Option<Block>,
}

impl Events {
    /// False once the client has gone (the request is then aborted as its chunks drop).
    async fn send(&self, name: &'static str, data: Value) -> bool {
        self.tx.send((name, data)).await.is_ok()
    }

    async fn close(&mut self) -> bool {
        match self.open.take() {
            Some(_) => {
                let stop = json!({"type": "content_block_stop", "index": self.blocks - 1});
                self.send("content_block_stop", stop).await
            }
            None => true,
        }
    }

    async fn start(&mut self, kind: Block, block: Value) -> bool {
        if !self.close().await {
            return false;
        }
        self.open = Some(kind);
        self.blocks += 1;
        let start = json!({
            "type": "content_block_start", "index": self.blocks - 1, "content_block": block,
        });
        self.send("content_block_start", start).await
    }

    async fn delta(&self, delta: Value) -> bool {
        let d = json!({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta});
        self.send("content_block_delta", d).await
    }

    /// Text or thinking, in a block of its kind (started if the open one is another).
    async fn text(&mut self, kind: Block, text: &str) -> bool {
        if self.open != Some(kind) {
            let block = match kind {
                Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                _ => json!({"type": "text", "text": ""}),
            };
            if !self.start(kind, block).await {
                return false;
            }
        }
        self.delta(match kind {
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            _ => json!({"type": "text_delta", "text": text}),
        })
        .await
    }

    async fn start_tool(&mut self, name: &str) -> bool {
        let block = json!({"type": "tool_use", "id": tool_use_id(), "name": name, "input": {}});
        self.start(Block::Tool, block).await
    }

    /// A piece of the open call's arguments (the parsers finish one call before the next).
    async fn tool_input(&mut self, json_text: &str) -> bool {
        if self.open != Some(Block::Tool) {
            return true;
        }
        self.delta(json!({"type": "input_json_delta", "partial_json": json_text}))
            .await
    }
}

fn tool_use_id() -> String {
    format!("toolu_{:024x}", rand::random::<u128>() >> 32)
}

/// Anthropic's `stop_reason` and `stop_sequence` for a finished choice: a length limit is
/// `max_tokens`, calls are `tool_use`, a stop string is `stop_sequence` (with the string),
/// the model's own end `end_turn`.
fn stop_reason(finish: Option<&Finish>) -> (Value, Value) {
    match finish {
        Some(f) if f.reason == FinishReason::Length => (json!("max_tokens"), Value::Null),
        Some(f) if f.called => (json!("tool_use"), Value::Null),
        Some(Finish {
            stop_reason: Some(StopReason::String(s)),
            ..
        }) => (json!("stop_sequence"), json!(s)),
        _ => (json!("end_turn"), Value::Null),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::reply_events::fixtures::{assert_matches, rendered};

    /// Anthropic's event sequence for a reply that thinks, answers and calls a tool: each
    /// content block started, its deltas, stopped; then the stop reason with the usage
    /// (input tokens less the cached ones), as `testdata/stream_events.jsonl` pins it.
    #[tokio::test]
    async fn a_streamed_reply_is_anthropics_event_sequence() {
        let head = Head {
            id: "msg_1".into(),
            model: "m".into(),
        };
        let events = rendered(|ev, tx| head.stream(ev, 10, tx)).await;
        assert_matches(&events, include_str!("testdata/stream_events.jsonl"));
    }
}
