//! Gemma 4's replies, as vLLM's `gemma4` reasoning and tool parsers read them: thinking in a
//! channel block, `<|channel>thought\n…<channel|>` (the `thought` label is not part of it),
//! the answer as plain text, and tool calls as `<|tool_call>call:NAME{args}<tool_call|>`
//! (arguments in Gemma's own syntax, [`gemma4_args`](super::gemma4_args)). The markers are
//! special tokens, which such requests keep in their text. A turn ends with `<turn|>`, or
//! `<|tool_response>` after calls; both end generation, so the text leaves them out (and if
//! it keeps them, nothing after them is read).
//!
//! With thinking off the chat template ends the prompt with an empty block
//! (`<|channel>thought\n<channel|>`), so the reply is all answer unless the model opens a
//! block itself. A prompt that ends inside an open block (as some of Gemma 4's templates
//! leave one after a tool's response) has the reply thinking from its first token. Some
//! checkpoints drop the opening marker and start with the bare `thought\n` label: that is
//! thinking too, as vLLM reads it.

use super::{gemma4_args, PromptThinking, Reply};

pub(crate) const THINK_START: &str = "<|channel>";
pub(crate) const THINK_END: &str = "<channel|>";
const CALL_START: &str = "<|tool_call>";
const CALL_END: &str = "<tool_call|>";
const LABEL: &str = "thought";
const MODEL_TURN: &str = "<|turn>model";
/// The tokens that end the model's turn, and so generation (the tokenizer's stop list).
pub(crate) const STOP_TOKENS: [&str; 2] = ["<turn|>", "<|tool_response>"];
/// What ends the reply when the text keeps it (with `ignore_eos`, or stop tokens cleared):
/// nothing after the stop tokens is read. Matched as text, as every marker here; `<|turn>`
/// alone is not among them, since a model that writes it as plain characters (the test
/// model imitating its prompt) has not ended its turn (vLLM matches its id).
const TURN_ENDS: [&str; 2] = STOP_TOKENS;
const MARKERS: [&str; 4] = [THINK_START, THINK_END, CALL_START, CALL_END];
/// The longest marker or turn end (`<|tool_response>`): a tail shorter than it may be one
/// being written.
const LONGEST_MARKER: usize = STOP_TOKENS[1].len();

/// The Lark rule (named `reasoning`) a structured-output constraint follows with
/// `--reasoning-parser gemma4` when the reply may think first: one channel block. Its markers
/// are special tokens, matched by name; no text matches them, so the block's text runs to its
/// closer. The prefix is optional: the reply may answer at once.
pub(crate) const GRAMMAR_PREFIX: &str = r#"reasoning: <|channel> gemma4_thinking? <channel|>
gemma4_thinking: /(.|\n)+/"#;
/// The same when the prompt left the block open: its rest, then the closer.
pub(crate) const GRAMMAR_PREFIX_OPEN: &str = r#"reasoning: gemma4_thinking? <channel|>
gemma4_thinking: /(.|\n)+/"#;

/// Where the prompt leaves the thinking: read from the last model turn's own markers (a
/// user's message that quotes them is in an earlier turn).
pub(crate) fn prompt_thinking(prompt: &str) -> PromptThinking {
    let Some(turn) = prompt.rfind(MODEL_TURN) else {
        return PromptThinking::Absent;
    };
    let turn = &prompt[turn..];
    let Some(start) = turn.rfind(THINK_START) else {
        return PromptThinking::Absent;
    };
    let after = &turn[start..];
    match after.find(THINK_END) {
        // The empty block the template writes when thinking is off.
        Some(end) if after[end + THINK_END.len()..].trim().is_empty() => PromptThinking::Closed,
        Some(_) => PromptThinking::Absent,
        None if [CALL_START]
            .into_iter()
            .chain(TURN_ENDS)
            .any(|m| after.contains(m)) =>
        {
            PromptThinking::Absent
        }
        None => PromptThinking::Open,
    }
}

enum State {
    Answer,
    /// In a channel block; `fresh` at its start (its `thought` label may be ahead, and its
    /// text is a new paragraph of the thinking).
    Thinking {
        fresh: bool,
    },
    Call,
}

/// The reply `text` read so far (`finished`: it is whole): thinking, answer and, if `calls`,
/// the calls (else they stay in the answer as written, for a server with no tool parser).
/// While the text grows each part only grows (a marker or label being written is held back),
/// so a stream can send the differences.
pub(crate) fn read(text: &str, prompt: PromptThinking, finished: bool, calls: bool) -> Reply {
    let end = TURN_ENDS
        .iter()
        .filter_map(|m| text.find(m))
        .min()
        .unwrap_or(text.len());
    let finished = finished || end < text.len();
    let text = &text[..end];
    let mut reply = Reply::default();
    let mut state = if prompt == PromptThinking::Open {
        State::Thinking { fresh: true }
    } else {
        State::Answer
    };
    let mut rest = text;
    while !rest.is_empty() {
        match state {
            State::Answer => {
                // The label without its block, as the reply's first words: thinking.
                if rest.len() == text.len() {
                    match label(rest, finished) {
                        Label::Skip(_) => {
                            state = State::Thinking { fresh: true };
                            continue;
                        }
                        Label::Hold => break,
                        Label::Text => {}
                    }
                }
                let markers: &[&str] = if calls { &MARKERS } else { &MARKERS[..2] };
                let (before, marker) = up_to_marker(rest, markers, finished);
                push_answer(&mut reply.content, before);
                let Some(marker) = marker else { break };
                rest = &rest[before.len() + marker.len()..];
                state = match marker {
                    THINK_START => State::Thinking { fresh: true },
                    CALL_START => State::Call,
                    // A stray closer: not part of the answer.
                    _ => State::Answer,
                };
            }
            State::Thinking { fresh } => {
                if fresh {
                    match label(rest, finished) {
                        Label::Skip(n) => rest = &rest[n..],
                        Label::Hold => break,
                        Label::Text => {}
                    }
                }
                let (before, marker) =
                    up_to_marker(rest, &[THINK_END, CALL_START, THINK_START], finished);
                if !before.is_empty() {
                    if fresh && !reply.reasoning.is_empty() {
                        reply.reasoning.push('\n');
                    }
                    reply.reasoning.push_str(before);
                }
                let Some(marker) = marker else { break };
                rest = &rest[before.len() + marker.len()..];
                state = match marker {
                    THINK_END => State::Answer,
                    CALL_START if calls => State::Call,
                    CALL_START => {
                        push_answer(&mut reply.content, CALL_START);
                        State::Answer
                    }
                    // Opened again inside the block: the template's opener, then the model's.
                    _ => State::Thinking { fresh: true },
                };
            }
            State::Call => {
                let (body, marker) = up_to_marker(rest, &[CALL_END], finished);
                let complete = marker.is_some() || finished;
                match call(body, complete) {
                    Some((name, arguments)) => reply.calls.push((name.to_string(), arguments)),
                    // Not a call after all: what it says is the answer.
                    None if complete => push_answer(&mut reply.content, body),
                    None => {}
                }
                let Some(marker) = marker else { break };
                rest = &rest[body.len() + marker.len()..];
                state = State::Answer;
            }
        }
    }
    reply
}

/// How the start of a block reads against its `thought` label.
enum Label {
    /// The label: this many bytes (with its newline, if any) are not thinking.
    Skip(usize),
    /// It may still become the label: hold it back.
    Hold,
    /// Thinking (or answer) text.
    Text,
}

fn label(rest: &str, finished: bool) -> Label {
    match rest.strip_prefix(LABEL) {
        Some(after) if after.starts_with('\n') => Label::Skip(LABEL.len() + 1),
        // An empty block (`<|channel>thought<channel|>`), or all a finished one has.
        Some(after) if after.starts_with(THINK_END) || (finished && after.is_empty()) => {
            Label::Skip(LABEL.len())
        }
        Some(after) if !finished && THINK_END.starts_with(after) => Label::Hold,
        None if !finished && LABEL.starts_with(rest) => Label::Hold,
        _ => Label::Text,
    }
}

/// The call written in `body` (what follows `<|tool_call>`): its name and its arguments as
/// JSON. `None` until the name is whole, or when it is not a call.
fn call(body: &str, complete: bool) -> Option<(&str, String)> {
    let body = body.trim_start();
    // Some checkpoints leave out `call`.
    let rest = body
        .strip_prefix("call:")
        .or_else(|| body.strip_prefix(':'))?;
    let (name, args) = match rest.find(['{', '(']) {
        Some(at) => (&rest[..at], Some(&rest[at..])),
        // A call with no arguments.
        None if complete => (rest, None),
        None => return None,
    };
    let name = name.trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let arguments = match args.map(|a| (a, a.strip_prefix('('))) {
        None => "{}".to_string(),
        // `call:f(args)` (some checkpoints): read as braces, closed once the call is.
        Some((_, Some(inner))) => {
            let inner = match complete {
                true => inner.trim_end().strip_suffix(')').unwrap_or(inner),
                false => inner,
            };
            let close = if complete { "}" } else { "" };
            gemma4_args::to_json(&format!("{{{inner}{close}"), complete)
        }
        Some((braced, None)) => gemma4_args::to_json(braced, complete),
    };
    Some((name, arguments))
}

/// `s` up to the first of `markers`, and which; with none, `s` less a tail that may be a
/// marker (or a turn's end) being written, unless `finished`.
fn up_to_marker<'a>(
    s: &'a str,
    markers: &[&'static str],
    finished: bool,
) -> (&'a str, Option<&'static str>) {
    let found = markers
        .iter()
        .filter_map(|m| s.find(m).map(|at| (at, *m)))
        .min_by_key(|&(at, _)| at);
    if let Some((at, m)) = found {
        return (&s[..at], Some(m));
    }
    if finished {
        return (s, None);
    }
    let held = (1..LONGEST_MARKER)
        .rev()
        .find(|&k| {
            k <= s.len()
                && s.is_char_boundary(s.len() - k)
                && MARKERS
                    .iter()
                    .chain(&TURN_ENDS)
                    .any(|m| m.len() > k && m.starts_with(&s[s.len() - k..]))
        })
        .unwrap_or(0);
    (&s[..s.len() - held], None)
}

/// The answer's text, its leading whitespace (after a thinking block) dropped.
fn push_answer(content: &mut String, s: &str) {
    if content.is_empty() {
        content.push_str(s.trim_start());
    } else {
        content.push_str(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies as Gemma 4's template teaches them, written from vLLM's `gemma4` parser and
    /// its tests: thinking then an answer; thinking straight into a call, then a second call.
    const THINK_THEN_ANSWER: &str = "<|channel>thought\nThe user wants 2+2.\n<channel|>2 + 2 = 4.";
    const THINK_THEN_CALLS: &str = "<|channel>thought\nNeed the weather.<channel|><|tool_call>call:get_weather{location:<|\"|>Tokyo<|\"|>,days:2}<tool_call|><|tool_call>call:get_time{}<tool_call|>";

    fn calls(r: &Reply) -> Vec<(&str, &str)> {
        r.calls
            .iter()
            .map(|(n, a)| (n.as_str(), a.as_str()))
            .collect()
    }

    #[test]
    fn thinking_answer_and_calls() {
        let r = read(THINK_THEN_ANSWER, PromptThinking::Absent, true, true);
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("The user wants 2+2.\n", "2 + 2 = 4.")
        );
        let r = read(THINK_THEN_CALLS, PromptThinking::Absent, true, true);
        assert_eq!(r.reasoning, "Need the weather.");
        assert_eq!(r.content, "");
        assert_eq!(
            calls(&r),
            [
                ("get_weather", r#"{"location": "Tokyo", "days": 2}"#),
                ("get_time", "{}")
            ]
        );
        // The end of the turn kept in the text: nothing after it is read.
        let kept = format!("{THINK_THEN_ANSWER}<turn|>\n<|turn>user\nmore");
        assert_eq!(
            read(&kept, PromptThinking::Absent, false, true).content,
            "2 + 2 = 4."
        );
        // No markers at all: an answer.
        assert_eq!(
            read("Paris.", PromptThinking::Closed, true, true).content,
            "Paris."
        );
    }

    #[test]
    fn the_prompt_decides_where_the_reply_starts() {
        let off = "<|turn>user\nHi<turn|>\n<|turn>model\n<|channel>thought\n<channel|>";
        let on = "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n";
        let after_tool = "<|turn>model\n<|tool_call>call:f{}<tool_call|><|tool_response>response:f{value:1}<tool_response|><|channel>thought\n";
        assert_eq!(prompt_thinking(off), PromptThinking::Closed);
        assert_eq!(prompt_thinking(on), PromptThinking::Absent);
        assert_eq!(prompt_thinking(after_tool), PromptThinking::Open);
        let old = format!("{off}Hello<turn|>\n<|turn>user\nAgain<turn|>\n<|turn>model\n");
        assert_eq!(prompt_thinking(&old), PromptThinking::Absent);
        // A user's message that quotes a marker is not the model's turn.
        let quoted = "<|turn>user\nWhat is <|channel>?<turn|>\n<|turn>model\n";
        assert_eq!(prompt_thinking(quoted), PromptThinking::Absent);
        // Thinking from the first token, its label dropped.
        let r = read(
            "thought\nSo f gave 1.<channel|>It is 1.",
            PromptThinking::Open,
            true,
            true,
        );
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("So f gave 1.", "It is 1.")
        );
        // The bare label with no block opened: thinking as well, whatever the prompt said
        // (vLLM reads it so); an answer that merely starts with the word is an answer.
        for prompt in [PromptThinking::Absent, PromptThinking::Closed] {
            let r = read("thought\nHmm.<channel|>Yes.", prompt, true, true);
            assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Hmm.", "Yes."));
        }
        let r = read("thoughtful answer", PromptThinking::Closed, true, true);
        assert_eq!(
            (r.reasoning.as_str(), r.content.as_str()),
            ("", "thoughtful answer")
        );
        // An empty block is no thinking.
        let r = read(
            "<|channel>thought<channel|>Hi.",
            PromptThinking::Absent,
            true,
            true,
        );
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("", "Hi."));
        // A call straight from thinking ends it.
        let r = read(
            "Look up.<|tool_call>call:f{}<tool_call|>",
            PromptThinking::Open,
            true,
            true,
        );
        assert_eq!(
            (r.reasoning.as_str(), calls(&r)),
            ("Look up.", vec![("f", "{}")])
        );
    }

    #[test]
    fn what_is_not_a_call_and_calls_cut_short() {
        let r = read(
            "<|tool_call>oops<tool_call|>fine",
            PromptThinking::Closed,
            true,
            true,
        );
        assert_eq!((r.content.as_str(), r.calls.len()), ("oopsfine", 0));
        let r = read(
            "<|tool_call>call:f{q:<|\"|>ab",
            PromptThinking::Closed,
            true,
            true,
        );
        assert_eq!(calls(&r), [("f", r#"{"q": "ab"}"#)]);
        let r = read(
            "<|tool_call>call:f(q:1)<tool_call|>",
            PromptThinking::Closed,
            true,
            true,
        );
        assert_eq!(calls(&r), [("f", r#"{"q": 1}"#)]);
        // No arguments: a call with none; no name: no call.
        let r = read(
            "<|tool_call>call:now<tool_call|>",
            PromptThinking::Closed,
            true,
            true,
        );
        assert_eq!(calls(&r), [("now", "{}")]);
        let r = read(
            "<|tool_call>call:{a:1}<tool_call|>",
            PromptThinking::Closed,
            true,
            true,
        );
        assert_eq!((r.content.as_str(), r.calls.len()), ("call:{a:1}", 0));
        // Without a tool parser the call stays in the answer as written.
        let r = read(THINK_THEN_CALLS, PromptThinking::Absent, true, false);
        assert!(
            r.content.starts_with("<|tool_call>call:get_weather{"),
            "{}",
            r.content
        );
        assert!(r.calls.is_empty());
    }

    /// A character at a time, nothing read is ever taken back, and no marker shows.
    #[test]
    fn streamed_reads_only_grow() {
        let texts = [
            (THINK_THEN_ANSWER, PromptThinking::Absent),
            (THINK_THEN_CALLS, PromptThinking::Absent),
            (
                "thought\nA.<channel|>B <|tool_call>call:f{x:[1,2],y:<|\"|>z<|\"|>}<tool_call|>",
                PromptThinking::Open,
            ),
            ("thought\nHmm.<channel|>Yes.", PromptThinking::Absent),
            // The paren form, a `)` inside a string and a bare value before the last `)`.
            (
                "<|tool_call>call:f(q:<|\"|>g(x)<|\"|>,n:g(1),m:2)<tool_call|>",
                PromptThinking::Closed,
            ),
            // Text of several bytes a character beside markers.
            (
                "<|channel>thought\nÜber ✓<channel|>Grüße — 東京<|tool_call>call:f{s:<|\"|>é<|\"|>}<tool_call|>",
                PromptThinking::Absent,
            ),
            ("<|channel>thought<channel|>Hi.", PromptThinking::Absent),
        ];
        for (text, prompt) in texts {
            let mut before = Reply::default();
            for end in crate::testing::prefix_ends(text) {
                let now = read(&text[..end], prompt, false, true);
                let at = &text[..end];
                assert!(now.reasoning.starts_with(&before.reasoning), "{at:?}");
                assert!(now.content.starts_with(&before.content), "{at:?}");
                assert!(now.calls.len() >= before.calls.len(), "{at:?}");
                for (b, n) in before.calls.iter().zip(&now.calls) {
                    assert_eq!(b.0, n.0, "{at:?}");
                    assert!(n.1.starts_with(&b.1), "{at:?}");
                }
                assert!(
                    !now.content.contains('<') && !now.reasoning.contains('<'),
                    "{at:?}"
                );
                assert!(!now.reasoning.starts_with("thought"), "{at:?}");
                before = now;
            }
            let whole = read(text, prompt, true, true);
            assert!(whole.content.starts_with(&before.content));
            assert!(whole.reasoning.starts_with(&before.reasoning));
            for (b, w) in before.calls.iter().zip(&whole.calls) {
                assert!(w.1.starts_with(&b.1), "{text:?}");
            }
            for (_, args) in &whole.calls {
                serde_json::from_str::<serde_json::Value>(args).unwrap();
            }
        }
        // Calls kept as text grow too.
        let mut before = Reply::default();
        for end in crate::testing::prefix_ends(THINK_THEN_CALLS) {
            let now = read(
                &THINK_THEN_CALLS[..end],
                PromptThinking::Absent,
                false,
                false,
            );
            assert!(now.content.starts_with(&before.content), "{end}");
            before = now;
        }
        let markers = MARKERS.iter().chain(&TURN_ENDS);
        assert!(markers.map(|m| m.len()).max() == Some(LONGEST_MARKER));
    }
}
