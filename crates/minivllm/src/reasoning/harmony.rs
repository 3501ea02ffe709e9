//! OpenAI's harmony format, in which gpt-oss writes its replies: a run of messages, each
//! `<|start|>{role}{header}<|message|>{content}<|end|>`, the header naming a channel
//! (`<|channel|>analysis`: thinking; `final`: the answer; `commentary`: tool calls and
//! preambles to them), maybe a recipient (`to=functions.get_weather`, in the role part or
//! after the channel) and a content type (`<|constrain|>json`, or a bare `json`). The chat
//! template ends the prompt with `<|start|>assistant`, so the reply opens with the first
//! message's header; a reply ends with `<|return|>` or, calling a tool, `<|call|>`, both
//! end-of-generation tokens that the text leaves out.
//!
//! [`parse`] reads the text generated so far (special tokens kept in it), as vLLM's
//! `openai_gptoss` reasoning parser and `openai` tool parser read the token stream. While
//! the text grows, each message's content only grows and messages are only added, so the
//! thinking, answer and calls read from them only grow too: a stream can send differences.

use super::{PromptThinking, Reply};

/// The Lark rule (named `reasoning`) that a structured-output constraint follows with
/// `--reasoning-parser openai_gptoss`: any number of whole `analysis` or `commentary`
/// messages (thinking, preambles), then the `final` channel's header, after which only the
/// constraint's text and `<|return|>`. The markers are special tokens, matched by name; no
/// text matches them, so a message's content runs to its `<|end|>`. A tool call (which ends
/// the reply with `<|call|>`) is not an answer the constraint can describe, so it is refused.
pub(crate) const GRAMMAR_PREFIX: &str = r#"reasoning: harmony_message* <|channel|> "final" <|message|>
harmony_message: <|channel|> ("analysis" | "commentary") <|message|> harmony_text? <|end|> <|start|> "assistant"
harmony_text: /(.|\n)+/"#;

/// One message read from a reply.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Message {
    pub channel: String,
    /// `functions.get_weather` for a tool call; `None` for one addressed to the user.
    pub recipient: Option<String>,
    /// `json` (from `<|constrain|>json` or a bare word after the channel).
    pub content_type: Option<String>,
    pub content: String,
    /// Whether its end marker was read (or the reply finished after it).
    pub complete: bool,
}

impl Message {
    /// The function a tool-call message calls.
    pub fn function(&self) -> Option<&str> {
        self.recipient.as_deref()?.strip_prefix("functions.")
    }
}

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const MESSAGE: &str = "<|message|>";
/// What ends a message: `<|end|>` within a reply, the two end-of-generation tokens when the
/// text keeps them, and the next message's start.
const ENDS: [&str; 4] = ["<|end|>", "<|return|>", "<|call|>", START];

/// The messages of `text`, the last one partial unless `finished`. A message whose header
/// is still being written is left out until its `<|message|>` comes; so is a tail of its
/// content that may be the start of an end marker.
pub fn parse(text: &str, finished: bool) -> Vec<Message> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let Some(m) = rest.find(MESSAGE) else {
            // A reply that never wrote a header is, finished, read as an answer; a header
            // left unfinished says nothing.
            let plain = !rest.starts_with("<|") && !rest.trim_start().starts_with("to=");
            if finished && out.is_empty() && plain && !rest.trim().is_empty() {
                out.push(Message {
                    channel: "final".into(),
                    content: rest.trim().to_string(),
                    complete: true,
                    ..Message::default()
                });
            }
            break;
        };
        let mut msg = header(&rest[..m]);
        let body = &rest[m + MESSAGE.len()..];
        let end = ENDS
            .iter()
            .filter_map(|e| body.find(e).map(|at| (at, *e)))
            .min_by_key(|&(at, _)| at);
        match end {
            Some((at, marker)) => {
                msg.content = body[..at].to_string();
                msg.complete = true;
                out.push(msg);
                // The next message's start is its own header's.
                rest = &body[at + if marker == START { 0 } else { marker.len() }..];
            }
            None => {
                let held = if finished { 0 } else { partial_marker(body) };
                msg.content = body[..body.len() - held].to_string();
                msg.complete = finished;
                out.push(msg);
                break;
            }
        }
    }
    out
}

/// The channel, recipient and content type of a header (`<|start|>assistant to=functions.f
/// <|channel|>commentary <|constrain|>json`, or the reply's first, which starts after the
/// role).
fn header(h: &str) -> Message {
    let h = h.strip_prefix(START).unwrap_or(h);
    let (role_part, channel_part) = match h.find(CHANNEL) {
        Some(at) => (&h[..at], &h[at + CHANNEL.len()..]),
        None => (h, ""),
    };
    let mut msg = Message::default();
    let words = |s: &str| {
        s.replace(CONSTRAIN, " <|constrain|>")
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    for w in words(role_part) {
        if let Some(to) = w.strip_prefix("to=") {
            msg.recipient = Some(to.to_string());
        }
    }
    for (i, w) in words(channel_part).into_iter().enumerate() {
        if i == 0 {
            msg.channel = w;
        } else if let Some(to) = w.strip_prefix("to=") {
            msg.recipient = Some(to.to_string());
        } else if let Some(ty) = w.strip_prefix(CONSTRAIN) {
            msg.content_type = Some(ty.to_string());
        } else if msg.content_type.is_none() {
            msg.content_type = Some(w);
        }
    }
    msg
}

/// Bytes at the end of `s` that may be the beginning of a marker.
fn partial_marker(s: &str) -> usize {
    let longest = ENDS.iter().map(|e| e.len()).max().unwrap_or(0);
    (1..longest.min(s.len() + 1))
        .rev()
        .find(|&k| {
            s.is_char_boundary(s.len() - k)
                && ENDS
                    .iter()
                    .any(|e| e.len() > k && e.starts_with(&s[s.len() - k..]))
        })
        .unwrap_or(0)
}

/// Where a harmony prompt leaves the reply: inside an open `final` message (an answer the
/// caller began) it is all answer; otherwise its channels decide.
pub(crate) fn prompt_thinking(prompt: &str) -> PromptThinking {
    if let Some(at) = prompt.rfind("<|channel|>final") {
        let rest = &prompt[at..];
        let ended = ["<|end|>", "<|return|>", "<|call|>", START];
        if rest.contains(MESSAGE) && !ended.iter().any(|m| rest.contains(m)) {
            return PromptThinking::Closed;
        }
    }
    PromptThinking::Absent
}

/// [`parse`], sorted into what the reply says: messages of one kind joined by newlines, in
/// the order written.
pub fn read(text: &str, finished: bool) -> Reply {
    let mut reply = Reply::default();
    let join = |to: &mut String, s: &str, first: &mut bool| {
        if !*first {
            to.push('\n');
        }
        to.push_str(s);
        *first = false;
    };
    let (mut first_thought, mut first_said) = (true, true);
    for m in parse(text, finished) {
        if let Some(f) = m.function() {
            reply
                .calls
                .push((f.to_string(), m.content.trim().to_string()));
        } else if m.channel == "analysis" {
            join(&mut reply.reasoning, &m.content, &mut first_thought);
        } else if m.recipient.is_none() {
            join(&mut reply.content, &m.content, &mut first_said);
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Written from the harmony format's description: thinking, a preamble, a call with its
    /// recipient after the channel and a constrained type, then (next turn's shape) a call
    /// with the recipient in the role and a bare content type.
    const THINK_THEN_ANSWER: &str = "<|channel|>analysis<|message|>User asks 2+2. Simple.<|end|><|start|>assistant<|channel|>final<|message|>2 + 2 = 4.";
    const THINK_THEN_CALL: &str = "<|channel|>analysis<|message|>Need the weather tool.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\": \"Tokyo\"}";

    #[test]
    fn messages_and_their_headers() {
        let m = parse(THINK_THEN_CALL, true);
        assert_eq!(m.len(), 3);
        assert_eq!(
            (m[0].channel.as_str(), m[0].content.as_str()),
            ("analysis", "Need the weather tool.")
        );
        assert_eq!(m[1].recipient, None);
        assert_eq!(m[2].function(), Some("get_weather"));
        assert_eq!(m[2].content_type.as_deref(), Some("json"));
        assert!(m.iter().all(|m| m.complete));
        let role = parse(
            " to=functions.lookup<|channel|>commentary json<|message|>{}",
            true,
        );
        assert_eq!(role[0].function(), Some("lookup"));
        assert_eq!(role[0].content_type.as_deref(), Some("json"));
        assert_eq!(role[0].channel, "commentary");
    }

    #[test]
    fn a_reply_reads_as_thinking_answer_and_calls() {
        let r = read(THINK_THEN_ANSWER, true);
        assert_eq!(r.reasoning, "User asks 2+2. Simple.");
        assert_eq!(r.content, "2 + 2 = 4.");
        assert!(r.calls.is_empty());
        let r = read(THINK_THEN_CALL, true);
        assert_eq!(r.content, "Checking the weather.");
        assert_eq!(
            r.calls,
            [("get_weather".into(), "{\"location\": \"Tokyo\"}".into())]
        );
        // With its end-of-generation token kept, the same.
        assert_eq!(
            read(&format!("{THINK_THEN_ANSWER}<|return|>"), true).content,
            "2 + 2 = 4."
        );
        // A reply with no harmony at all is an answer; a header cut off is nothing.
        assert_eq!(read("plain text", true).content, "plain text");
        let cut = format!("{THINK_THEN_ANSWER}<|end|><|start|>assistant");
        assert_eq!(read(&cut, true), read(THINK_THEN_ANSWER, true));
    }

    /// A character at a time, nothing read is ever taken back, and a marker being written is
    /// not shown as content.
    #[test]
    fn streamed_reads_only_grow() {
        for text in [THINK_THEN_ANSWER, THINK_THEN_CALL] {
            let mut before = Reply::default();
            for end in crate::testing::prefix_ends(text) {
                let now = read(&text[..end], false);
                assert!(
                    now.reasoning.starts_with(&before.reasoning),
                    "{:?}",
                    &text[..end]
                );
                assert!(
                    now.content.starts_with(&before.content),
                    "{:?}",
                    &text[..end]
                );
                assert!(now.calls.len() >= before.calls.len());
                for (b, n) in before.calls.iter().zip(&now.calls) {
                    assert_eq!(b.0, n.0);
                    assert!(n.1.starts_with(&b.1));
                }
                assert!(!now.content.contains("<|") && !now.reasoning.contains("<|"));
                before = now;
            }
            assert_eq!(
                read(text, true),
                before,
                "the finished read adds nothing here"
            );
        }
    }
}
