//! A chat run's reply as typed events, for every route that runs a chat request (chat
//! completions, Anthropic's Messages, OpenAI's Responses) to write in its own wire format:
//! what the reasoning and tool-call parsers made of each choice's text, the logprobs of the
//! tokens each piece releases, how the choice finished and the request's usage. No route
//! reads another's JSON.

use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

use super::usage::Usage;
use crate::distributed::kv_transfer::KvTransferParams;
use crate::sequence::{FinishReason, StopReason};

/// One piece of a choice's reply, in the order the client sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Piece {
    /// More thinking (`reasoning_content`, with `--reasoning-parser`).
    Reasoning(String),
    /// More of the answer.
    Text(String),
    /// Tool call `index` begins: its id and function name (its arguments follow).
    CallStart {
        index: usize,
        id: String,
        name: String,
    },
    /// More of call `index`'s arguments (the parsers finish one call before the next).
    CallArguments { index: usize, text: String },
}

/// How a choice finished.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Finish {
    pub reason: FinishReason,
    /// The stop string or token that ended it, as vLLM's `stop_reason`.
    pub stop_reason: Option<StopReason>,
    /// The reply called tools.
    pub called: bool,
    /// OpenAI's chat says `tool_calls` for this finish (a reply that stopped after calling
    /// tools the model chose; not a named function's forced call).
    pub as_tool_calls: bool,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub(crate) fn chat_reason(&self) -> &'static str {
        if self.as_tool_calls {
            "tool_calls"
        } else {
            self.reason.as_str()
        }
    }
}

/// What one step added to one choice: pieces, the logprobs of the tokens they release (when
/// the request asked for logprobs), and how the choice finished once it has.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChoiceDelta {
    pub index: usize,
    pub pieces: Vec<Piece>,
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub finish: Option<Finish>,
}

/// A streamed chat run's events: choice deltas as the engine produces them, then the
/// request's usage once every choice has finished (absent when the run ended early).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ChatEvent {
    Delta(ChoiceDelta),
    Usage(Usage),
}

/// A streamed run's events as its routes read them: the deltas in turn, the usage that
/// ends the stream kept aside. Dropping it aborts the request.
pub(crate) struct ReplyEvents {
    rx: mpsc::Receiver<ChatEvent>,
    /// The request's usage, once the stream has given it.
    pub usage: Option<Usage>,
}

impl ReplyEvents {
    pub fn new(rx: mpsc::Receiver<ChatEvent>) -> Self {
        ReplyEvents { rx, usage: None }
    }

    /// The next choice delta; `None` when the stream is over.
    pub(crate) async fn next_delta(&mut self) -> Option<ChoiceDelta> {
        loop {
            match self.rx.recv().await? {
                ChatEvent::Delta(d) => return Some(d),
                ChatEvent::Usage(u) => self.usage = Some(u),
            }
        }
    }
}

/// One tool call of a finished reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolCallOut {
    pub id: String,
    pub name: String,
    /// JSON text, as the model wrote it.
    pub arguments: String,
}

/// One finished choice, as the parsers read it whole.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChoiceReply {
    pub index: usize,
    /// The thinking, when the model thought (with `--reasoning-parser`).
    pub reasoning: Option<String>,
    /// The answer; `None` when the reply is only calls or only thinking.
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallOut>,
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// `None` only for a choice the engine ended without a reason.
    pub finish: Option<Finish>,
}

/// A whole chat run's reply.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatReply {
    pub choices: Vec<ChoiceReply>,
    pub usage: Usage,
    /// The server splits thinking off (the chat reply then has `reasoning_content`, null
    /// when the model did not think).
    pub reasoning_parser: bool,
    /// vLLM's `prompt_logprobs`, when asked for.
    pub prompt_logprobs: Option<Value>,
    /// A prefill kept for a decode server: where its KV waits.
    pub kv_transfer_params: Option<KvTransferParams>,
}

/// One generated token's logprob and its alternatives, as OpenAI's chat and Responses
/// entries both give them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

impl TopLogprob {
    /// `token`'s entry, its bytes those of its text.
    pub fn new(token: String, logprob: f32) -> Self {
        TopLogprob {
            bytes: token.as_bytes().to_vec(),
            token,
            logprob,
        }
    }
}

/// A scripted streamed reply and what a route's renderer makes of it, for tests that pin
/// each wire format's event sequence.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::sequence::StopReason;

    /// Thinking, then text, then a tool call whose arguments come in two pieces, finished
    /// by the call; then the usage (10 prompt tokens, 4 of them cached, 9 generated).
    pub(crate) fn scripted_reply() -> ReplyEvents {
        let (tx, rx) = mpsc::channel(16);
        let delta = |pieces: Vec<Piece>, finish: Option<Finish>| {
            ChatEvent::Delta(ChoiceDelta {
                index: 0,
                pieces,
                logprobs: None,
                finish,
            })
        };
        let events = [
            delta(vec![Piece::Reasoning("Weather needs a tool.".into())], None),
            delta(vec![Piece::Text("Let me check.".into())], None),
            delta(
                vec![
                    Piece::CallStart {
                        index: 0,
                        id: "call_1".into(),
                        name: "get_weather".into(),
                    },
                    Piece::CallArguments {
                        index: 0,
                        text: "{\"city\": ".into(),
                    },
                ],
                None,
            ),
            delta(
                vec![Piece::CallArguments {
                    index: 0,
                    text: "\"Paris\"}".into(),
                }],
                Some(Finish {
                    reason: FinishReason::Stop,
                    stop_reason: Some(StopReason::Token(2)),
                    called: true,
                    as_tool_calls: true,
                }),
            ),
            ChatEvent::Usage(Usage {
                prompt: 10,
                completion: 9,
                cached: 4,
            }),
        ];
        for e in events {
            tx.try_send(e).expect("room for the script");
        }
        ReplyEvents::new(rx)
    }

    /// The events `render` sends for [`scripted_reply`], with what differs between runs
    /// (ids the route makes, times) replaced by `"<id>"` and `0`.
    pub(crate) async fn rendered<F, Fut>(render: F) -> Vec<(String, Value)>
    where
        F: FnOnce(ReplyEvents, mpsc::Sender<(&'static str, Value)>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let (tx, mut rx) = mpsc::channel(256);
        render(scripted_reply(), tx).await;
        let mut out = Vec::new();
        while let Ok((name, mut data)) = rx.try_recv() {
            normalise(&mut data);
            out.push((name.to_string(), data));
        }
        out
    }

    /// Asserts that `events` are those of `fixture`: one `{"event", "data"}` object a line.
    pub(crate) fn assert_matches(events: &[(String, Value)], fixture: &str) {
        let want: Vec<(String, Value)> = (fixture.lines())
            .map(|line| {
                let v: Value = serde_json::from_str(line).expect("a fixture line is JSON");
                (
                    v["event"].as_str().expect("an event name").into(),
                    v["data"].clone(),
                )
            })
            .collect();
        for (i, (got, want)) in events.iter().zip(&want).enumerate() {
            assert_eq!(got, want, "event {i}");
        }
        assert_eq!(events.len(), want.len(), "events: {events:?}");
    }

    fn normalise(v: &mut Value) {
        match v {
            Value::Object(map) => {
                for (k, x) in map.iter_mut() {
                    match k.as_str() {
                        "id" | "item_id" if x.is_string() => *x = "<id>".into(),
                        "created_at" => *x = 0.into(),
                        _ => normalise(x),
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(normalise),
            _ => {}
        }
    }
}
