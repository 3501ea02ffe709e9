//! `POST /v1/responses`: OpenAI's Responses API. A request runs as the chat request it
//! reads as; the reply (thinking, text, tool calls, as `--reasoning-parser` and
//! `--tool-call-parser` split it) is written back as output items, and a stream as the
//! Responses events, numbered, each item announced, filled and closed in turn.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::protocol::ResponsesRequest;
use crate::entrypoints::openai::chat_run::{run_chat, ChatRun};
use crate::entrypoints::openai::protocol::{ApiError, ChatCompletionRequest};
use crate::entrypoints::openai::reply_events::{
    ChoiceReply, Finish, Piece, ReplyEvents, TokenLogprob,
};
use crate::entrypoints::openai::request_memory::LogprobFormat;
use crate::entrypoints::openai::server_state::{RequestId, Shared};
use crate::entrypoints::openai::serving_engine::{json_response, named_sse, now, off_async, parse};
use crate::entrypoints::openai::usage::Usage;
use crate::sampling_params::logprob_count;
use crate::sequence::FinishReason;

pub async fn responses(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = off_async(&s, move |_| parse::<ResponsesRequest>(body)).await?;
    let chat = req.to_chat()?;
    let head = Head::new(&req, &chat, &rid, &s.config.served_model_name);
    Ok(
        match run_chat(&s, &rid, chat, LogprobFormat::Responses).await? {
            ChatRun::Full { mut reply, .. } => {
                let usage = usage(reply.usage);
                let (status, items) = match reply.choices.first_mut() {
                    Some(choice) => {
                        let status = status(choice.finish.as_ref());
                        (status, output_items(choice, status))
                    }
                    None => ("completed", Vec::new()),
                };
                json_response(&head.response(status, items, usage))
            }
            ChatRun::Stream {
                prompt_tokens,
                events,
                ..
            } => named_sse(|tx| head.stream(events, prompt_tokens, tx)),
        },
    )
}

/// `GET /v1/responses/{id}`: nothing is kept, so every id is unknown.
pub(crate) async fn retrieve(Path(id): Path<String>) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("Response with id '{id}' not found: this server keeps no responses"),
        Some("response_id"),
    )
}

/// The fields every Response object of one request repeats.
struct Head {
    id: String,
    created_at: u64,
    fields: serde_json::Map<String, Value>,
}

impl Head {
    fn new(
        req: &ResponsesRequest,
        chat: &ChatCompletionRequest,
        rid: &RequestId,
        model: &str,
    ) -> Self {
        let json = json!({
            "model": model,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata.clone().unwrap_or_else(|| json!({})),
            "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": null,
            "reasoning": null,
            "store": false,
            "temperature": chat.common.temperature.unwrap_or(1.0),
            "top_p": chat.common.top_p.unwrap_or(1.0),
            "top_logprobs": req.top_logprobs.map(logprob_count::as_i64),
            "text": req.text.clone().unwrap_or_else(|| json!({"format": {"type": "text"}})),
            "tool_choice": req.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": req.tools.clone().unwrap_or_default(),
            "truncation": "disabled",
            "user": req.user,
        });
        let Value::Object(fields) = json else {
            unreachable!("a JSON object")
        };
        Head {
            id: format!("resp_{}", rid.0),
            created_at: now(),
            fields,
        }
    }

    fn response(&self, status: &str, output: Vec<Value>, usage: Value) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "output": output, "usage": usage, "error": null,
            "incomplete_details": if status == "incomplete" {
                json!({"reason": "max_output_tokens"})
            } else {
                Value::Null
            },
        });
        let fields = r.as_object_mut().expect("an object");
        fields.extend(self.fields.clone());
        r
    }

    /// Writes the reply's events as the Responses events: `response.created` and
    /// `response.in_progress`; per output item `output_item.added`, its deltas, their
    /// `done` events and `output_item.done`; then `response.completed` (or
    /// `response.incomplete` when `max_output_tokens` cut it, as OpenAI) with the whole
    /// output. A stream that ends before the reply finished ends with `response.failed`.
    async fn stream(
        self,
        mut events: ReplyEvents,
        prompt_tokens: usize,
        tx: mpsc::Sender<(&'static str, Value)>,
    ) {
        let mut out = Events {
            tx,
            seq: 0,
            items: Vec::new(),
            open: false,
        };
        let start = self.response("in_progress", Vec::new(), Value::Null);
        for name in ["response.created", "response.in_progress"] {
            if !out.send(name, json!({"response": start})).await {
                return;
            }
        }
        let mut finish = None;
        while let Some(d) = events.next_delta().await {
            // The delta's tokens' logprobs (when asked for) go with its text.
            let mut logprobs = d.logprobs.unwrap_or_default();
            for piece in &d.pieces {
                let ok = match piece {
                    Piece::Reasoning(t) => out.text(Kind::Reasoning, t, Vec::new()).await,
                    Piece::Text(t) => {
                        out.text(Kind::Message, t, std::mem::take(&mut logprobs))
                            .await
                    }
                    Piece::CallStart { id, name, .. } => out.start_call(id, name).await,
                    Piece::CallArguments { text, .. } => out.arguments(text).await,
                };
                if !ok {
                    return;
                }
            }
            if d.finish.is_some() {
                finish = d.finish;
            }
        }
        let Some(finish) = finish else {
            let mut failed = self.response("failed", Vec::new(), Value::Null);
            failed["error"] = json!({"code": "server_error", "message": "the reply ended early"});
            out.send("response.failed", json!({"response": failed}))
                .await;
            return;
        };
        let status = status(Some(&finish));
        if !out.close(status).await {
            return;
        }
        let items = out.items.iter().map(Item::json).collect();
        let usage = usage(events.usage.unwrap_or(Usage {
            prompt: prompt_tokens,
            ..Usage::default()
        }));
        let last = self.response(status, items, usage);
        let name = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        out.send(name, json!({"response": last})).await;
    }
}

/// `completed`, or `incomplete` when the length limit cut the reply.
fn status(finish: Option<&Finish>) -> &'static str {
    match finish {
        Some(f) if f.reason == FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

fn usage(u: Usage) -> Value {
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": 0},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt + u.completion,
    })
}

fn new_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

/// A whole choice as output items: its thinking, its text (when there is any, or nothing
/// else; with every token's logprobs, as vLLM), its calls.
fn output_items(choice: &mut ChoiceReply, status: &'static str) -> Vec<Value> {
    let mut items = Vec::new();
    if let Some(t) = choice.reasoning.take().filter(|t| !t.is_empty()) {
        items.push(Item::new(Kind::Reasoning, t));
    }
    let text = choice.content.take().unwrap_or_default();
    // An empty reply still has its (empty) message; one cut while thinking does not.
    if !text.is_empty() || (choice.tool_calls.is_empty() && items.is_empty()) {
        let mut item = Item::new(Kind::Message, text);
        item.logprobs = choice.logprobs.take().unwrap_or_default();
        items.push(item);
    }
    for c in std::mem::take(&mut choice.tool_calls) {
        let mut item = Item::new(Kind::Call, c.arguments);
        item.call = Some((c.id, c.name));
        items.push(item);
    }
    for item in &mut items {
        item.status = status;
    }
    items.iter().map(Item::json).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

/// One output item as it grows: its text (or a call's arguments so far).
struct Item {
    kind: Kind,
    id: String,
    text: String,
    /// A call's `call_id` and function name.
    call: Option<(String, String)>,
    status: &'static str,
    /// A message's tokens' logprobs, when asked for.
    logprobs: Vec<TokenLogprob>,
}

impl Item {
    fn new(kind: Kind, text: String) -> Self {
        let prefix = match kind {
            Kind::Reasoning => "rs",
            Kind::Message => "msg",
            Kind::Call => "fc",
        };
        Item {
            kind,
            id: new_id(prefix),
            text,
            call: None,
            status: "in_progress",
            logprobs: Vec::new(),
        }
    }

    /// Its text part (of a message: `output_text`; of reasoning: `reasoning_text`).
    fn part(&self) -> Value {
        match self.kind {
            Kind::Reasoning => json!({"type": "reasoning_text", "text": self.text}),
            _ => json!({"type": "output_text", "text": self.text, "annotations": [],
                        "logprobs": self.logprobs}),
        }
    }

    /// The item as the Response's `output` lists it; `content` empty while it is announced.
    fn json_with(&self, content: bool) -> Value {
        let parts = if content {
            vec![self.part()]
        } else {
            Vec::new()
        };
        match self.kind {
            Kind::Reasoning => json!({"type": "reasoning", "id": self.id, "summary": [],
                                      "content": parts, "status": self.status}),
            Kind::Message => json!({"type": "message", "id": self.id, "role": "assistant",
                                    "status": self.status, "content": parts}),
            Kind::Call => {
                let (call_id, name) = self.call.clone().unwrap_or_default();
                json!({"type": "function_call", "id": self.id, "call_id": call_id,
                       "name": name, "status": self.status,
                       "arguments": if content { self.text.as_str() } else { "" }})
            }
        }
    }

    fn json(&self) -> Value {
        self.json_with(true)
    }
}

/// The stream's events so far: their count (`sequence_number`) and the items, the last
/// one open while `open`.
struct Events {
    tx: mpsc::Sender<(&'static str, Value)>,
    seq: u64,
    items: Vec<Item>,
    open: bool,
}

impl Events {
    /// False once the client has gone (the request is then aborted as its chunks drop).
    async fn send(&mut self, name: &'static str, mut data: Value) -> bool {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.tx.send((name, data)).await.is_ok()
    }

    /// Where the open item's events point.
    fn at(&self) -> Value {
        let i = self.items.len() - 1;
        json!({"item_id": self.items[i].id, "output_index": i})
    }

    fn with(&self, extra: Value) -> Value {
        let mut v = self.at();
        if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
            v.extend(extra);
        }
        v
    }

    async fn open(&mut self, item: Item) -> bool {
        if !self.close("completed").await {
            return false;
        }
        let announced = item.json_with(false);
        let kind = item.kind;
        self.items.push(item);
        self.open = true;
        let output_index = self.items.len() - 1;
        let added = json!({"output_index": output_index, "item": announced});
        if !self.send("response.output_item.added", added).await {
            return false;
        }
        if kind != Kind::Message {
            return true;
        }
        let part = json!({"type": "output_text", "text": "", "annotations": []});
        let added = self.with(json!({"content_index": 0, "part": part}));
        self.send("response.content_part.added", added).await
    }

    /// Ends the open item, if any, as `status`: its `done` events with the whole text.
    async fn close(&mut self, status: &'static str) -> bool {
        if !std::mem::take(&mut self.open) {
            return true;
        }
        let i = self.items.len() - 1;
        self.items[i].status = status;
        let item = &self.items[i];
        let (kind, text, done) = (item.kind, item.text.clone(), item.json());
        let (part, logprobs) = (item.part(), item.logprobs.clone());
        let name = item.call.as_ref().map(|c| c.1.clone());
        let ok = match kind {
            Kind::Message => {
                let text_done =
                    self.with(json!({"content_index": 0, "text": text, "logprobs": logprobs}));
                self.send("response.output_text.done", text_done).await
                    && self
                        .send(
                            "response.content_part.done",
                            self.with(json!({"content_index": 0, "part": part})),
                        )
                        .await
            }
            Kind::Reasoning => {
                let d = self.with(json!({"content_index": 0, "text": text}));
                self.send("response.reasoning_text.done", d).await
            }
            Kind::Call => {
                let d = self.with(json!({"arguments": text, "name": name}));
                self.send("response.function_call_arguments.done", d).await
            }
        };
        ok && self
            .send(
                "response.output_item.done",
                json!({"output_index": i, "item": done}),
            )
            .await
    }

    /// Text (with its tokens' logprobs) or thinking, in an item of its kind (opened if the
    /// open one is another).
    async fn text(&mut self, kind: Kind, text: &str, logprobs: Vec<TokenLogprob>) -> bool {
        let same = self.open && self.items.last().is_some_and(|i| i.kind == kind);
        if !same && !self.open(Item::new(kind, String::new())).await {
            return false;
        }
        if let Some(item) = self.items.last_mut() {
            item.text.push_str(text);
            item.logprobs.extend(logprobs.iter().cloned());
        }
        let (name, delta) = match kind {
            Kind::Reasoning => (
                "response.reasoning_text.delta",
                json!({"content_index": 0, "delta": text}),
            ),
            _ => (
                "response.output_text.delta",
                json!({"content_index": 0, "delta": text, "logprobs": logprobs}),
            ),
        };
        let d = self.with(delta);
        self.send(name, d).await
    }

    async fn start_call(&mut self, call_id: &str, name: &str) -> bool {
        let mut item = Item::new(Kind::Call, String::new());
        item.call = Some((call_id.to_string(), name.to_string()));
        self.open(item).await
    }

    /// A piece of the open call's arguments (the parsers finish one call before the next).
    async fn arguments(&mut self, piece: &str) -> bool {
        match self.items.last_mut() {
            Some(item) if self.open && item.kind == Kind::Call => item.text.push_str(piece),
            _ => return true,
        }
        let d = self.with(json!({"delta": piece}));
        self.send("response.function_call_arguments.delta", d).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::reply_events::fixtures::{assert_matches, rendered};

    /// The Responses events for a reply that thinks, answers and calls a tool: the
    /// response created and in progress, each output item added, its deltas and `done`
    /// events, then `response.completed` with the whole output and the usage, as
    /// `testdata/stream_events.jsonl` pins it.
    #[tokio::test]
    async fn a_streamed_reply_is_the_responses_event_sequence() {
        let req: ResponsesRequest = serde_json::from_value(json!({
            "model": "m", "input": "Weather in Paris?", "tools": [{"type": "function",
            "name": "get_weather", "parameters": {"type": "object"}}]
        }))
        .unwrap();
        let chat = req.to_chat().unwrap();
        let head = Head::new(&req, &chat, &RequestId("1".into()), "m");
        let events = rendered(|ev, tx| head.stream(ev, 10, tx)).await;
        assert_matches(&events, include_str!("testdata/stream_events.jsonl"));
    }
}
