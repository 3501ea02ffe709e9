//! Reasoning models think before they answer, between `<think>` and `</think>`. vLLM's
//! `--reasoning-parser` splits that thinking from the answer (`reasoning_content` and
//! `content` in chat replies) and lets structured output constrain only the answer; this is
//! the same, for its two think-tag parsers.
//!
//! - `deepseek_r1`: everything before `</think>` is thinking (R1's template opens the
//!   `<think>` in the prompt); a reply that never closes it is all thinking.
//! - `qwen3`: thinking is what the reply (or, for templates that open it there, the prompt)
//!   opens with `<think>` and closes with `</think>`; a reply that never closes it is an
//!   answer, as vLLM reads Qwen3.
//!
//! Whether the prompt left the model thinking is read from its text: templates that turn
//! thinking off write an empty `<think></think>` into the prompt, and then the reply is all
//! answer.
//!
//! - `openai_gptoss`: gpt-oss's harmony messages ([`harmony`]): the `analysis` channel is
//!   thinking, the `final` channel (and preambles to tool calls) the answer. Their markers
//!   are special tokens, which such requests keep in their text.
//! - `gemma4`: Gemma 4's channel block, `<|channel>thought\n…<channel|>` ([`gemma4`]), its
//!   markers special tokens too.

pub(crate) mod gemma4;
pub(crate) mod gemma4_args;
pub(crate) mod harmony;

const START: &str = "<think>";
const END: &str = "</think>";

/// vLLM's `--reasoning-parser` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParserName {
    #[serde(rename = "deepseek_r1")]
    DeepSeekR1,
    Qwen3,
    #[serde(rename = "openai_gptoss")]
    OpenAiGptOss,
    Gemma4,
}

impl ReasoningParserName {
    pub const ALL: [ReasoningParserName; 4] = [
        ReasoningParserName::DeepSeekR1,
        ReasoningParserName::Qwen3,
        ReasoningParserName::OpenAiGptOss,
        ReasoningParserName::Gemma4,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningParserName::DeepSeekR1 => "deepseek_r1",
            ReasoningParserName::Qwen3 => "qwen3",
            ReasoningParserName::OpenAiGptOss => "openai_gptoss",
            ReasoningParserName::Gemma4 => "gemma4",
        }
    }

    /// Request settings the format needs: harmony's and Gemma 4's markers are special
    /// tokens, kept in the text for the parser to read.
    pub(crate) fn adjust_params(self, params: &mut crate::sampling_params::SamplingParams) {
        if matches!(
            self,
            ReasoningParserName::OpenAiGptOss | ReasoningParserName::Gemma4
        ) {
            params.skip_special_tokens = false;
        }
    }
}

impl std::str::FromStr for ReasoningParserName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|p| p.as_str()).collect();
                format!(
                    "unknown reasoning parser {s:?}; choose one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Where the prompt leaves the model's thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptThinking {
    /// The prompt opened `<think>` and did not close it: the reply starts thinking.
    Open,
    /// The prompt closed the last `<think>` (thinking turned off): the reply is an answer.
    Closed,
    /// No `<think>` in the prompt's final turn: the reply decides.
    Absent,
}

impl PromptThinking {
    /// Where `prompt` leaves the thinking of a model that writes `format`'s markers (each
    /// format reads only its own: a user's message that quotes another format's markers
    /// changes nothing).
    pub fn of(prompt: &str, format: ReasoningParserName) -> Self {
        match format {
            ReasoningParserName::Gemma4 => gemma4::prompt_thinking(prompt),
            ReasoningParserName::OpenAiGptOss => harmony::prompt_thinking(prompt),
            ReasoningParserName::DeepSeekR1 | ReasoningParserName::Qwen3 => think_tags(prompt),
        }
    }
}

/// `<think>` … `</think>` in the prompt.
fn think_tags(prompt: &str) -> PromptThinking {
    let (start, end) = (prompt.rfind(START), prompt.rfind(END));
    match (start, end) {
        (Some(s), Some(e)) if e > s => {
            // Only an empty block at the very end turns thinking off; a closed block
            // in an earlier turn says nothing of this one.
            if prompt[e + END.len()..].trim().is_empty() {
                PromptThinking::Closed
            } else {
                PromptThinking::Absent
            }
        }
        (Some(_), _) => PromptThinking::Open,
        _ => PromptThinking::Absent,
    }
}

/// What a reply says to the user, for formats whose thinking, answer and calls are read in
/// one pass (harmony, Gemma 4).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Reply {
    pub reasoning: String,
    pub content: String,
    /// (function, arguments as JSON text).
    pub calls: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningParser {
    pub name: ReasoningParserName,
}

impl ReasoningParser {
    pub fn new(name: ReasoningParserName) -> Self {
        Self { name }
    }

    /// Whether the reply starts inside the thinking (and so, for structured output, the
    /// constraint waits for `</think>`); `None` when the reply decides (may open `<think>`).
    fn starts_thinking(&self, prompt: PromptThinking) -> Option<bool> {
        match (self.name, prompt) {
            // Harmony decides by channel, not by tags; Gemma 4 by its own markers.
            (ReasoningParserName::OpenAiGptOss | ReasoningParserName::Gemma4, _) => None,
            (_, PromptThinking::Closed) => Some(false),
            (_, PromptThinking::Open) | (ReasoningParserName::DeepSeekR1, _) => Some(true),
            (ReasoningParserName::Qwen3, PromptThinking::Absent) => None,
        }
    }

    /// The reply split into (thinking, answer). Unfinished, both only grow as the text does
    /// (a possible `</think>` or `<think>` being written is held back); the answer's leading
    /// whitespace (the blank line after `</think>`) is dropped.
    pub fn split(&self, prompt: PromptThinking, text: &str, finished: bool) -> (String, String) {
        match self.name {
            ReasoningParserName::OpenAiGptOss => {
                let reply = harmony::read(text, finished);
                return (reply.reasoning, reply.content);
            }
            // Its calls are part of the same reading; without a tool parser they stay in
            // the answer as written.
            ReasoningParserName::Gemma4 => {
                let reply = gemma4::read(text, prompt, finished, false);
                return (reply.reasoning, reply.content);
            }
            _ => {}
        }
        let (body, thinking) = match self.starts_thinking(prompt) {
            Some(false) => return (String::new(), text.to_string()),
            Some(true) if !finished && !text.is_empty() && START.starts_with(text) => {
                return (String::new(), String::new())
            }
            Some(true) => (text.strip_prefix(START).unwrap_or(text), true),
            None => match text.strip_prefix(START) {
                Some(rest) => (rest, true),
                None if !finished && START.starts_with(text) => {
                    return (String::new(), String::new())
                }
                None => (text, false),
            },
        };
        if !thinking {
            return (String::new(), text.to_string());
        }
        match body.find(END) {
            Some(at) => (
                body[..at].to_string(),
                body[at + END.len()..].trim_start().to_string(),
            ),
            // qwen3: a reply that never closes its thinking is read as the answer.
            None if finished
                && self.name == ReasoningParserName::Qwen3
                && prompt != PromptThinking::Open =>
            {
                (String::new(), text.to_string())
            }
            None if finished => (body.to_string(), String::new()),
            None => {
                let held = (1..END.len())
                    .rev()
                    .find(|&k| body.ends_with(&END[..k]))
                    .unwrap_or(0);
                (body[..body.len() - held].to_string(), String::new())
            }
        }
    }

    /// The Lark rule that lets a structured-output constraint start after the thinking:
    /// `None` when the reply is all answer. The rule is named `reasoning`; `optional` says
    /// whether the reply may skip it. For harmony the constraint covers the `final`
    /// channel's content, as vLLM's `openai_gptoss` starts it after that channel's header.
    pub fn grammar_prefix(&self, prompt: PromptThinking) -> Option<(&'static str, bool)> {
        match (self.name, prompt) {
            (
                ReasoningParserName::OpenAiGptOss | ReasoningParserName::Gemma4,
                PromptThinking::Closed,
            ) => return None,
            (ReasoningParserName::OpenAiGptOss, _) => {
                return Some((harmony::GRAMMAR_PREFIX, false))
            }
            (ReasoningParserName::Gemma4, PromptThinking::Open) => {
                return Some((gemma4::GRAMMAR_PREFIX_OPEN, false))
            }
            (ReasoningParserName::Gemma4, _) => return Some((gemma4::GRAMMAR_PREFIX, true)),
            _ => {}
        }
        match self.starts_thinking(prompt) {
            Some(false) => None,
            // Thinking, possibly with its own `<think>`, up to the first `</think>`.
            Some(true) => Some((r#"reasoning[lazy]: /(.|\n)*/ "</think>""#, false)),
            None => Some((r#"reasoning[lazy]: "<think>" /(.|\n)*/ "</think>""#, true)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R1: ReasoningParser = ReasoningParser {
        name: ReasoningParserName::DeepSeekR1,
    };
    const QWEN3: ReasoningParser = ReasoningParser {
        name: ReasoningParserName::Qwen3,
    };

    /// Feeds `text` a character at a time; each unfinished split must extend the one before.
    fn streamed(p: &ReasoningParser, prompt: PromptThinking, text: &str) -> (String, String) {
        let mut before = (String::new(), String::new());
        for end in crate::testing::prefix_ends(text) {
            let now = p.split(prompt, &text[..end], false);
            assert!(
                now.0.starts_with(&before.0),
                "thinking went back at {:?}",
                &text[..end]
            );
            assert!(
                now.1.starts_with(&before.1),
                "answer went back at {:?}",
                &text[..end]
            );
            before = now;
        }
        p.split(prompt, text, true)
    }

    #[test]
    fn prompts_open_close_or_leave_thinking() {
        assert_eq!(
            PromptThinking::of("<|Assistant|><think>\n", ReasoningParserName::DeepSeekR1),
            PromptThinking::Open
        );
        assert_eq!(
            PromptThinking::of(
                "<|im_start|>assistant\n<think>\n\n</think>\n\n",
                ReasoningParserName::Qwen3
            ),
            PromptThinking::Closed
        );
        assert_eq!(
            PromptThinking::of("<|im_start|>assistant\n", ReasoningParserName::Qwen3),
            PromptThinking::Absent
        );
        assert_eq!(
            PromptThinking::of(
                "<think>a</think>old answer<|im_start|>assistant\n",
                ReasoningParserName::Qwen3
            ),
            PromptThinking::Absent
        );
        // Each format reads only its own markers, wherever a user's message puts another's.
        let quoted = "<|im_start|>user\nWhat does <|channel> mean?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
        assert_eq!(
            PromptThinking::of(quoted, ReasoningParserName::Qwen3),
            PromptThinking::Closed
        );
        let quoted = "<|turn>user\nWhat does <think> do?<turn|>\n<|turn>model\n";
        assert_eq!(
            PromptThinking::of(quoted, ReasoningParserName::Gemma4),
            PromptThinking::Absent
        );
    }

    #[test]
    fn deepseek_r1_thinks_until_the_close() {
        let text = "First, 2+2.\nIt is 4.</think>\n\nThe answer is 4.";
        for prompt in [PromptThinking::Open, PromptThinking::Absent] {
            assert_eq!(
                streamed(&R1, prompt, text),
                ("First, 2+2.\nIt is 4.".into(), "The answer is 4.".into())
            );
        }
        assert_eq!(
            streamed(&R1, PromptThinking::Open, "<think>x</think>y"),
            ("x".into(), "y".into())
        );
        assert_eq!(
            streamed(&R1, PromptThinking::Open, "still thinking"),
            ("still thinking".into(), String::new())
        );
        assert_eq!(R1.split(PromptThinking::Open, "abc</th", false).0, "abc");
        assert_eq!(
            streamed(&R1, PromptThinking::Closed, "just <b>answer</think>"),
            (String::new(), "just <b>answer</think>".into())
        );
    }

    #[test]
    fn qwen3_thinks_only_inside_the_tags() {
        let text = "<think>\nLet me see.\n</think>\n\nParis.";
        assert_eq!(
            streamed(&QWEN3, PromptThinking::Absent, text),
            ("\nLet me see.\n".into(), "Paris.".into())
        );
        assert_eq!(
            streamed(&QWEN3, PromptThinking::Absent, "Paris."),
            (String::new(), "Paris.".into())
        );
        // Never closed: an answer, as vLLM reads Qwen3.
        assert_eq!(
            QWEN3.split(PromptThinking::Absent, "<think>hmm", true),
            (String::new(), "<think>hmm".into())
        );
        assert_eq!(
            QWEN3.split(PromptThinking::Absent, "<thi", false),
            (String::new(), String::new())
        );
        // The template opened it: thinking from the first token.
        assert_eq!(
            streamed(&QWEN3, PromptThinking::Open, "hmm</think>Paris."),
            ("hmm".into(), "Paris.".into())
        );
    }

    #[test]
    fn a_harmony_prompt_inside_its_final_message_leaves_the_reply_all_answer() {
        let gptoss = ReasoningParser::new(ReasoningParserName::OpenAiGptOss);
        let fresh = "<|start|>user<|message|>Hi<|end|><|start|>assistant";
        let begun = format!("{fresh}<|channel|>final<|message|>{{\"a\":");
        let done =
            format!("{begun}1}}<|end|><|start|>user<|message|>Again<|end|><|start|>assistant");
        assert_eq!(
            PromptThinking::of(&begun, ReasoningParserName::OpenAiGptOss),
            PromptThinking::Closed
        );
        assert_eq!(
            gptoss.grammar_prefix(PromptThinking::of(
                &begun,
                ReasoningParserName::OpenAiGptOss
            )),
            None
        );
        for prompt in [fresh, &done] {
            assert!(
                gptoss
                    .grammar_prefix(PromptThinking::of(
                        prompt,
                        ReasoningParserName::OpenAiGptOss
                    ))
                    .is_some(),
                "{prompt}"
            );
        }
    }

    #[test]
    fn grammar_prefixes() {
        assert_eq!(R1.grammar_prefix(PromptThinking::Closed), None);
        assert!(!R1.grammar_prefix(PromptThinking::Absent).unwrap().1);
        assert!(QWEN3.grammar_prefix(PromptThinking::Absent).unwrap().1);
        assert!(!QWEN3.grammar_prefix(PromptThinking::Open).unwrap().1);
        assert_eq!("qwen3".parse(), Ok(ReasoningParserName::Qwen3));
        assert!("r1"
            .parse::<ReasoningParserName>()
            .unwrap_err()
            .contains("deepseek_r1, qwen3"));
    }
}
