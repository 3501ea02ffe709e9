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
//! block itself. A prompt that ends inside an open block (after a tool's response) leaves the
//! reply thinking from its first token. Some checkpoints drop the opening marker and start
//! with the bare `thought\n` label: that is thinking too.

use super::{gemma4_args, PromptThinking, Reply};

pub(crate) const THINK_START: &str = "<|channel>";
pub(crate) const THINK_END: &str = "<channel|>";
const CALL_START: &str = "<|tool_call>";
const CALL_END: &str = "<tool_call|>";
const LABEL: &str = "thought\n";
/// What ends the model's turn (and so the reply) when the text keeps it.
const TURN_ENDS: [&str; 4] = ["<turn|>", "<|tool_response>", "<|turn>", "<eos>"];
const MARKERS: [&str; 4] = [THINK_START, THINK_END, CALL_START, CALL_END];

/// The Lark rule (named `reasoning`) a structured-output constraint follows with
/// `--reasoning-parser gemma4` when the reply may think first: one channel block. Its markers
/// are special tokens, matched by name; no text matches them, so the block's text runs to its
/// closer. The prefix is optional: the reply may answer at once.
pub(crate) const GRAMMAR_PREFIX: &str = r#"reasoning: <|channel> gemma4_thinking? <channel|>
gemma4_thinking: /(.|\n)+/"#;
/// The same when the prompt left the block open: its rest, then the closer.
pub(crate) const GRAMMAR_PREFIX_OPEN: &str = r#"reasoning: gemma4_thinking? <channel|>
gemma4_thinking: /(.|\n)+/"#;

/// Where the prompt leaves the thinking, read from Gemma 4's markers; `None` when its last
/// model turn has none (another format's prompt, or an older template).
pub(crate) fn prompt_thinking(prompt: &str) -> Option<PromptThinking> {
    let start = prompt.rfind(THINK_START)?;
    let after = &prompt[start..];
    let closed = [THINK_END, CALL_START]
        .into_iter()
        .chain(TURN_ENDS)
        .any(|m| after.contains(m));
    Some(if !closed {
        PromptThinking::Open
    } else if after.contains(THINK_END)
        && prompt[start + after.find(THINK_END)? + THINK_END.len()..]
            .trim()
            .is_empty()
    {
        // The empty block the template writes when thinking is off.
        PromptThinking::Closed
    } else {
        PromptThinking::Absent
    })
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
                // The label without its block, as the reply's first words.
                if rest.len() == text.len() && prompt != PromptThinking::Closed {
                    if rest.starts_with(LABEL) {
                        state = State::Thinking { fresh: true };
                        continue;
                    }
                    if !finished && LABEL.starts_with(rest) {
                        break;
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
                    if let Some(after) = rest.strip_prefix(LABEL) {
                        rest = after;
                    } else if (!finished && LABEL.starts_with(rest))
                        || (finished && rest == LABEL.trim_end())
                    {
                        // The label being written, or all a finished block has.
                        break;
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
                let name_part = body
                    .trim_start()
                    .strip_prefix("call:")
                    .or_else(|| body.trim_start().strip_prefix(':'));
                match name_part.and_then(|p| p.find(['{', '(']).map(|at| (p, at))) {
                    Some((p, at)) => {
                        let args = match p[at..].strip_prefix('(') {
                            // Some checkpoints write `call:f(args)`: read as braces, closed
                            // once the `)` is read.
                            Some(inner) => match inner.trim_end().strip_suffix(')') {
                                Some(inner) => format!("{{{inner}}}"),
                                None => format!("{{{inner}"),
                            },
                            None => p[at..].to_string(),
                        };
                        let arguments = gemma4_args::to_json(&args, complete);
                        reply.calls.push((p[..at].trim().to_string(), arguments));
                    }
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
    let held = (1..16)
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
        assert_eq!(prompt_thinking(off), Some(PromptThinking::Closed));
        assert_eq!(prompt_thinking(on), None);
        assert_eq!(prompt_thinking(after_tool), Some(PromptThinking::Open));
        let old = format!("{off}Hello<turn|>\n<|turn>user\nAgain<turn|>\n<|turn>model\n");
        assert_eq!(prompt_thinking(&old), Some(PromptThinking::Absent));
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
        // The bare label with no block opened: thinking as well (unless the prompt closed it).
        let r = read(
            "thought\nHmm.<channel|>Yes.",
            PromptThinking::Absent,
            true,
            true,
        );
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Hmm.", "Yes."));
        let r = read("thought\nHmm.", PromptThinking::Closed, true, true);
        assert_eq!(r.content, "thought\nHmm.");
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
        }
    }
}
