//! gpt-oss's calls (vLLM's `openai` tool parser): harmony messages addressed to
//! `functions.NAME` on the `commentary` channel, their content the arguments' JSON; the
//! `final` messages and the preambles (commentary addressed to no one) are the content.
//! The whole reply is read, thinking included, since harmony's calls are messages beside it.

use super::{ParsedOutput, ParsedToolCall, ToolParser};
use crate::reasoning::{harmony, PromptThinking, ReasoningParserName};
use crate::sampling_params::SamplingParams;

#[derive(Debug)]
pub struct OpenAiToolParser;

impl ToolParser for OpenAiToolParser {
    fn parse(&self, text: &str, finished: bool) -> ParsedOutput {
        let reply = harmony::read(text, finished);
        ParsedOutput {
            reasoning: reply.reasoning,
            content: reply.content,
            tool_calls: reply
                .calls
                .into_iter()
                .map(|(name, arguments)| ParsedToolCall { name, arguments })
                .collect(),
        }
    }

    /// Harmony's markers are special tokens.
    fn adjust_params(&self, params: &mut SamplingParams) {
        params.skip_special_tokens = false;
    }

    fn reply_format(&self) -> Option<ReasoningParserName> {
        Some(ReasoningParserName::OpenAiGptOss)
    }

    fn parse_whole_reply(
        &self,
        text: &str,
        _prompt: PromptThinking,
        finished: bool,
    ) -> Option<ParsedOutput> {
        Some(self.parse(text, finished))
    }
}
