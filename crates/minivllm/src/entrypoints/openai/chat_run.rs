//! A chat request run: checked, its messages rendered with the chat template, submitted,
//! and its outputs read by the reasoning and tool-call parsers into typed reply events
//! ([`reply_events`](super::reply_events)) that the chat, Anthropic Messages and Responses
//! routes each write in their own wire format.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::mpsc;

use super::protocol::{
    chat_messages, ApiError, ChatCompletionRequest, ChatMessageIn, TemplateMode,
};
use super::reply_events::{
    ChatEvent, ChatReply, ChoiceDelta, ChoiceReply, Finish, Piece, ReplyEvents, TokenLogprob,
    TopLogprob,
};
use super::request_memory::{LogprobFormat, ResponseShape};
use super::server_state::{AppState, RequestId, Shared};
use super::serving_engine::{
    admit, check_model, encode, last_output, off_async, prompt_logprobs, submit, token_text, Held,
    Prompt,
};
use super::template_kwargs::TemplateKwargs;
use super::tool_calls::{finished_reply, ReplyStream, ToolUse};
use super::tool_parsers::{ParsedOutput, ToolParser};
use super::usage::Usage;
use crate::engine::input_processor::CheckedParams;
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use crate::reasoning::{PromptThinking, ReasoningParser};
use crate::sequence::FinishReason;

/// Renders `messages` with the model's chat template and tokenises the result.
/// `tools`: OpenAI's tool objects, for templates that describe them to the model; `kwargs`:
/// further template variables.
pub fn render_chat(
    s: &AppState,
    messages: &[ChatMessageIn],
    tools: &[Value],
    kwargs: &TemplateKwargs,
    mode: TemplateMode,
    add_special_tokens: bool,
) -> Result<Prompt, ApiError> {
    let tok = s.engine.tokenizer();
    let messages = chat_messages(messages)?;
    let add_generation_prompt = mode == TemplateMode::GenerationPrompt;
    let mut rendered = tok
        .apply_chat_template_with_tools(&messages, tools, add_generation_prompt, kwargs)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
    if mode == TemplateMode::ContinueFinalMessage {
        rendered = continue_final_message(rendered, &messages)?;
    }
    let ids = encode(s, &rendered, add_special_tokens)?;
    Ok(Prompt {
        text: rendered,
        ids,
    })
}

/// The rendered chat cut just after the final message's text, as transformers does: the
/// template's end-of-turn marks after it would tell the model the turn is over.
fn continue_final_message(
    rendered: String,
    messages: &[crate::engine::chat_template::ChatMessage],
) -> Result<String, ApiError> {
    let last = messages.last().map_or("", |m| m.content.trim());
    match rendered.rfind(last) {
        Some(at) if !last.is_empty() => Ok(rendered[..at + last.len()].to_string()),
        _ => Err(ApiError::bad_request(
            "continue_final_message needs a final message with text that the chat template \
             renders as written",
            Some("messages"),
        )),
    }
}

/// A chat request under way: its reply whole, or its stream of events. Dropping the
/// stream's receiver aborts the request.
pub enum ChatRun {
    Full {
        reply: ChatReply,
    },
    Stream {
        prompt_tokens: usize,
        /// Choices the reply has (the request's `n`).
        n: usize,
        events: ReplyEvents,
    },
}

/// Checks, renders and runs `req`; `logprob_format` is how the route's response will hold
/// logprobs (for the request memory estimate).
pub async fn run_chat(
    s: &Shared,
    rid: &RequestId,
    req: ChatCompletionRequest,
    logprob_format: LogprobFormat,
) -> Result<ChatRun, ApiError> {
    let (req, prompt, params, held, tools) =
        off_async(s, move |s| prepare(s, req, logprob_format)).await?;
    let reasoning = s.config.reasoning_parser.map(ReasoningParser::new);
    let format = (s.config.reasoning_parser)
        .or_else(|| tools.parser.as_ref().and_then(|p| p.reply_format()));
    let prompt_thinking = format.map_or(PromptThinking::Absent, |f| {
        PromptThinking::of(&prompt.text, f)
    });
    let n = params.params().n;
    let prompt_tokens = prompt.ids.len();
    let prompts = [prompt];
    let mut streams = submit(s, rid, "chatcmpl", &prompts, vec![params]).await?;
    let rx = streams.remove(0);
    let reply = Reply {
        _held: held,
        n,
        top_logprobs: req.logprobs.then_some(req.top_logprobs.unwrap_or(0)),
        prompt_logprobs: req.common.prompt_logprobs.is_some(),
        tok: s.engine.tokenizer().clone(),
        tools,
        reasoning,
        prompt_thinking,
    };
    if req.common.stream {
        let (tx, events) = mpsc::channel(64);
        tokio::spawn(reply.stream(rx, tx));
        return Ok(ChatRun::Stream {
            prompt_tokens,
            n,
            events: ReplyEvents::new(events),
        });
    }
    let out = last_output(rx).await?;
    let reply = off_async(s, move |_| reply.full(&out)).await;
    Ok(ChatRun::Full { reply })
}

/// The request checked, its messages rendered and tokenised, and its sampling parameters.
#[allow(clippy::type_complexity)]
fn prepare(
    s: &AppState,
    req: ChatCompletionRequest,
    logprob_format: LogprobFormat,
) -> Result<(ChatCompletionRequest, Prompt, CheckedParams, Held, ToolUse), ApiError> {
    let mode = req.check()?;
    check_model(s, req.common.model.as_deref())?;
    let tools = ToolUse::from_request(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        req.common.structured.params()?.is_some(),
        &s.config.tool_calls,
    )?;
    // The template writes the BOS itself.
    let kwargs = req.template_kwargs(&s.config.default_chat_template_kwargs);
    let prompt = render_chat(
        s,
        &req.messages,
        &tools.template_tools,
        &kwargs,
        mode,
        false,
    )?;
    let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
    let max_tokens = req.max_completion_tokens.or(req.max_tokens);
    let mut base = (req.common).sampling_params(&s.config.generation, max_tokens, logprobs);
    tools.adjust_params(&mut base);
    if let Some(name) = s.config.reasoning_parser {
        name.adjust_params(&mut base);
    }
    let response = ResponseShape {
        echo: false,
        // Once, beside the choices.
        prompt_logprobs_objects: u64::from(base.prompt_logprobs.is_some()),
        format: logprob_format,
    };
    let checked = s.engine.check(base, req.common.priority)?;
    let (mut params, held) = admit(s, checked, std::slice::from_ref(&prompt), response)?;
    Ok((req, prompt, params.remove(0), held, tools))
}

/// What the events of one request need.
struct Reply {
    /// Released when the reply is done.
    _held: Held,
    n: usize,
    /// `Some(k)` when the request asked for logprobs, with `k` alternatives each.
    top_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs` was asked for: the reply carries them.
    prompt_logprobs: bool,
    tok: Arc<Tokenizer>,
    tools: ToolUse,
    /// `--reasoning-parser`.
    reasoning: Option<ReasoningParser>,
    /// Where the prompt left the model's thinking.
    prompt_thinking: PromptThinking,
}

impl Reply {
    fn logprobs(&self, o: &CompletionOutput) -> Option<Vec<TokenLogprob>> {
        let k = self.top_logprobs?;
        let lps = o.logprobs.as_deref()?;
        Some(token_logprobs(&self.tok, o, lps, k))
    }

    /// How `o` finished, if it has; `called`: the reply called tools.
    fn finish(&self, o: &CompletionOutput, called: bool) -> Option<Finish> {
        let reason = o.finish_reason?;
        Some(Finish {
            reason,
            stop_reason: o.stop_reason.clone(),
            called,
            as_tool_calls: reason == FinishReason::Stop
                && called
                && self.tools.finish_as_tool_calls,
        })
    }

    fn full(&self, out: &RequestOutput) -> ChatReply {
        let choices = out
            .outputs
            .iter()
            .map(|o| {
                let (reasoning, content, tool_calls) = match self.read(&o.text, true) {
                    None => (None, Some(o.text.clone()), Vec::new()),
                    Some(parsed) => finished_reply(&parsed),
                };
                let finish = self.finish(o, !tool_calls.is_empty());
                ChoiceReply {
                    index: o.index,
                    reasoning,
                    content,
                    tool_calls,
                    logprobs: self.logprobs(o),
                    finish,
                }
            })
            .collect();
        ChatReply {
            choices,
            usage: Usage::of(out),
            reasoning_parser: self.reasoning.is_some(),
            prompt_logprobs: self
                .prompt_logprobs
                .then(|| prompt_logprobs(&self.tok, out)),
            kv_transfer_params: out.kv_transfer_params.clone(),
        }
    }

    /// The reply as the reasoning and tool-call parsers read it; `None` without them (the
    /// text is all content).
    fn read(&self, text: &str, finished: bool) -> Option<ParsedOutput> {
        read_reply(
            self.reasoning.as_ref(),
            self.prompt_thinking,
            self.tools.parser.as_deref(),
            text,
            finished,
        )
    }

    /// Sends each choice's delta as the engine's outputs come, then the usage. The engine's
    /// deltas carry each token with the text it releases; the parsers read a choice's whole
    /// reply so far, so only they keep its text.
    async fn stream(
        self,
        mut rx: mpsc::UnboundedReceiver<RequestOutput>,
        tx: mpsc::Sender<ChatEvent>,
    ) {
        let parses = self.reasoning.is_some() || self.tools.parser.is_some();
        let mut choices: Vec<ChoiceStream> = (0..self.n).map(|_| ChoiceStream::default()).collect();
        // `None` until an output comes (a request the engine ended first has no usage).
        let mut usage: Option<Usage> = None;
        while let Some(out) = rx.recv().await {
            let first = usage.is_none();
            usage.get_or_insert_default().add_delta(&out, first);
            for mut o in out.outputs {
                let c = &mut choices[o.index];
                let finished = o.finish_reason.is_some();
                let text = std::mem::take(&mut o.text);
                let parsed = parses
                    .then(|| {
                        c.text.push_str(&text);
                        self.read(&c.text, finished)
                    })
                    .flatten();
                let (pieces, called) = match parsed {
                    Some(parsed) => (c.reply.delta(&parsed), c.reply.called()),
                    None if text.is_empty() => (Vec::new(), false),
                    None => (vec![Piece::Text(text)], false),
                };
                let unsent = match c.unsent.take() {
                    Some(mut held) => {
                        held.append(o);
                        held
                    }
                    None => o,
                };
                if pieces.is_empty() && !finished {
                    // What a parser holds back (what may be a tool call): its tokens'
                    // logprobs go with the delta that releases it.
                    c.unsent = Some(unsent);
                    continue;
                }
                let d = ChoiceDelta {
                    index: unsent.index,
                    pieces,
                    logprobs: self.logprobs(&unsent),
                    finish: self.finish(&unsent, called),
                };
                if tx.send(ChatEvent::Delta(d)).await.is_err() {
                    return;
                }
            }
        }
        if let Some(usage) = usage {
            let _ = tx.send(ChatEvent::Usage(usage)).await;
        }
    }
}

/// What one choice of a stream keeps: its reply's text so far (for the parsers), what of
/// the parsed reply it has sent, and the tokens (with logprobs) whose text a parser holds.
#[derive(Default)]
struct ChoiceStream {
    text: String,
    reply: ReplyStream,
    unsent: Option<CompletionOutput>,
}

/// The generated tokens' logprobs (`lps`, one per token of `o`), `k` alternatives each.
fn token_logprobs(
    tok: &Tokenizer,
    o: &CompletionOutput,
    lps: &[TokenLogprobs],
    k: usize,
) -> Vec<TokenLogprob> {
    o.token_ids
        .iter()
        .zip(lps)
        .map(|(&id, lp)| {
            let token = token_text(tok, id);
            TokenLogprob {
                logprob: lp.get(id).unwrap_or(f32::NEG_INFINITY),
                bytes: token.as_bytes().to_vec(),
                token,
                top_logprobs: lp
                    .ranked()
                    .into_iter()
                    .take(k)
                    .map(|(a, logprob, _)| TopLogprob::new(token_text(tok, a), logprob))
                    .collect(),
            }
        })
        .collect()
}

/// The reply as a reasoning parser and a tool-call parser read it, given where the prompt
/// left the thinking; `None` without either (the text is all content).
fn read_reply(
    reasoning: Option<&ReasoningParser>,
    prompt: PromptThinking,
    tools: Option<&dyn ToolParser>,
    text: &str,
    finished: bool,
) -> Option<ParsedOutput> {
    // A whole-reply parser (harmony's, Gemma 4's) reads the thinking too: the reply is
    // parsed once.
    if let Some(mut parsed) = tools.and_then(|p| p.parse_whole_reply(text, prompt, finished)) {
        if reasoning.is_none() {
            parsed.reasoning.clear();
        }
        return Some(parsed);
    }
    if tools.is_none() && reasoning.is_none() {
        return None;
    }
    let (thought, answer) = match reasoning {
        Some(parser) => parser.split(prompt, text, finished),
        None => (String::new(), text.to_string()),
    };
    let mut parsed = match tools {
        Some(parser) => parser.parse(&answer, finished),
        None => ParsedOutput::content(answer),
    };
    parsed.reasoning = thought;
    Some(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entrypoints::openai::tool_parsers::{OpenAiToolParser, ToolParserName};
    use crate::reasoning::ReasoningParserName;
    use crate::sampling_params::SamplingParams;

    /// gpt-oss replies as the detokenizer hands them over with special tokens kept, one
    /// token's text at a time, written from the harmony format's description: thinking then
    /// an answer; thinking, a preamble and a call (its end-of-generation `<|call|>` left out,
    /// as stop tokens are); a call whose recipient is in the role part.
    const REPLIES: [&[&str]; 3] = [
        &[
            "<|channel|>",
            "analysis",
            "<|message|>",
            "The",
            " user",
            " wants",
            " 2",
            "+",
            "2",
            ".",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "final",
            "<|message|>",
            "2",
            " +",
            " 2",
            " =",
            " 4",
            ".",
        ],
        &[
            "<|channel|>",
            "analysis",
            "<|message|>",
            "Need",
            " weather",
            ".",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "commentary",
            "<|message|>",
            "Checking",
            "…",
            "<|end|>",
            "<|start|>",
            "assistant",
            "<|channel|>",
            "commentary",
            " to",
            "=functions",
            ".get",
            "_weather",
            " ",
            "<|constrain|>",
            "json",
            "<|message|>",
            "{\"",
            "location",
            "\":",
            " \"",
            "Tokyo",
            "\"}",
        ],
        &[
            " to",
            "=functions",
            ".lookup",
            "<|channel|>",
            "commentary",
            " json",
            "<|message|>",
            "{}",
        ],
    ];

    #[test]
    fn harmony_replies_read_alike_streamed_and_whole() {
        let reasoning = ReasoningParser::new(ReasoningParserName::OpenAiGptOss);
        let absent = PromptThinking::Absent;
        let tools = OpenAiToolParser;
        let mut whole_replies = Vec::new();
        for tokens in REPLIES {
            let text: String = tokens.concat();
            let whole = read_reply(Some(&reasoning), absent, Some(&tools), &text, true).unwrap();
            // A stream: the deltas of each token's read, folded.
            let mut stream = ReplyStream::default();
            let (mut thought, mut content) = (String::new(), String::new());
            let mut calls: Vec<(String, String)> = Vec::new();
            for n in 1..=tokens.len() {
                let so_far = tokens[..n].concat();
                let parsed = read_reply(
                    Some(&reasoning),
                    absent,
                    Some(&tools),
                    &so_far,
                    n == tokens.len(),
                )
                .unwrap();
                for piece in stream.delta(&parsed) {
                    match piece {
                        Piece::Reasoning(t) => thought += &t,
                        Piece::Text(t) => content += &t,
                        Piece::CallStart { index, name, .. } => {
                            assert_eq!(index, calls.len());
                            calls.push((name, String::new()));
                        }
                        Piece::CallArguments { index, text } => calls[index].1 += &text,
                    }
                }
                assert!(
                    !content.contains("<|") && !thought.contains("<|"),
                    "{so_far:?}"
                );
            }
            let want: Vec<(String, String)> = whole
                .tool_calls
                .iter()
                .map(|c| (c.name.clone(), c.arguments.clone()))
                .collect();
            assert_eq!(
                (&thought, &content, &calls),
                (&whole.reasoning, &whole.content, &want)
            );
            whole_replies.push(finished_reply(&whole));
        }
        let [answer, call, role_call] = &whole_replies[..] else {
            unreachable!()
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            (&answer.0, &answer.1),
            (&some("The user wants 2+2."), &some("2 + 2 = 4."))
        );
        assert!(answer.2.is_empty());
        assert_eq!(
            (&call.0, &call.1),
            (&some("Need weather."), &some("Checking…"))
        );
        assert_eq!(call.2[0].name, "get_weather");
        assert_eq!(call.2[0].arguments, "{\"location\": \"Tokyo\"}");
        assert_eq!((&role_call.0, &role_call.1), (&None, &None));
        assert_eq!(role_call.2[0].name, "lookup");
        assert_eq!(role_call.2[0].arguments, "{}");
    }

    /// Folds a stream's deltas, a token's text at a time: (thinking, content, calls).
    fn streamed(
        reasoning: Option<&ReasoningParser>,
        prompt: PromptThinking,
        tools: Option<&dyn ToolParser>,
        tokens: &[&str],
    ) -> (String, String, Vec<(String, String)>) {
        let mut stream = ReplyStream::default();
        let (mut thought, mut content, mut calls) = (String::new(), String::new(), Vec::new());
        for n in 1..=tokens.len() {
            let so_far = tokens[..n].concat();
            let parsed = read_reply(reasoning, prompt, tools, &so_far, n == tokens.len()).unwrap();
            for piece in stream.delta(&parsed) {
                match piece {
                    Piece::Reasoning(t) => thought += &t,
                    Piece::Text(t) => content += &t,
                    Piece::CallStart { name, .. } => calls.push((name, String::new())),
                    Piece::CallArguments { index, text } => calls[index].1 += &text,
                }
            }
        }
        (thought, content, calls)
    }

    /// Gemma 4's replies token by token (its markers single tokens, as its vocabulary has
    /// them): a stream gives what the whole reply gives, with and without the tool parser,
    /// and whether the prompt left the thinking open decides where the reply starts.
    #[test]
    fn gemma4_replies_read_alike_streamed_and_whole() {
        use crate::entrypoints::openai::tool_parsers::Gemma4ToolParser;
        let reasoning = ReasoningParser::new(ReasoningParserName::Gemma4);
        let reply: &[&str] = &[
            "<|channel>",
            "thought",
            "\n",
            "Need",
            " weather",
            ".",
            "<channel|>",
            "<|tool_call>",
            "call",
            ":",
            "get",
            "_weather",
            "{",
            "city",
            ":",
            "<|\"|>",
            "Tok",
            "yo",
            "<|\"|>",
            ",",
            "days",
            ":",
            "2",
            "}",
            "<tool_call|>",
        ];
        let tools: &dyn ToolParser = &Gemma4ToolParser;
        let text = reply.concat();
        let whole = read_reply(
            Some(&reasoning),
            PromptThinking::Absent,
            Some(tools),
            &text,
            true,
        );
        let whole = whole.unwrap();
        let call = (
            "get_weather".to_string(),
            r#"{"city": "Tokyo", "days": 2}"#.to_string(),
        );
        assert_eq!(
            (whole.reasoning.as_str(), whole.content.as_str()),
            ("Need weather.", "")
        );
        assert_eq!(
            streamed(Some(&reasoning), PromptThinking::Absent, Some(tools), reply),
            ("Need weather.".into(), String::new(), vec![call])
        );
        // Without a tool parser the call stays in the answer as written.
        let (thought, answer) = reasoning.split(PromptThinking::Absent, &text, true);
        assert_eq!(thought, "Need weather.");
        assert!(
            answer.starts_with("<|tool_call>call:get_weather{"),
            "{answer}"
        );
        // A prompt that ends inside an open block (some templates leave one after a tool's
        // response): thinking from the first token; with thinking off the reply is all
        // answer.
        let open: &[&str] = &["It", " is", " 21", ".", "<channel|>", "Warm", "."];
        assert_eq!(
            streamed(Some(&reasoning), PromptThinking::Open, Some(tools), open),
            ("It is 21.".into(), "Warm.".into(), Vec::new())
        );
        let closed = PromptThinking::of(
            "<|turn>model\n<|channel>thought\n<channel|>",
            ReasoningParserName::Gemma4,
        );
        assert_eq!(
            streamed(Some(&reasoning), closed, None, &["Hi", " there", "."]),
            (String::new(), "Hi there.".into(), Vec::new())
        );
        let mut params = SamplingParams::default();
        ReasoningParserName::Gemma4.adjust_params(&mut params);
        assert!(!params.skip_special_tokens);
        assert_eq!(
            ToolParserName::detect("{{- '<|tool_call>call:' + function['name'] -}}"),
            Some(ToolParserName::Gemma4)
        );
    }

    /// Without a tool parser the reasoning parser alone gives thinking and answer; both keep
    /// the special tokens the format is written in.
    #[test]
    fn harmony_without_tools_and_the_settings_it_needs() {
        let reasoning = ReasoningParser::new(ReasoningParserName::OpenAiGptOss);
        let text = REPLIES[0].concat();
        let parsed =
            read_reply(Some(&reasoning), PromptThinking::Absent, None, &text, true).unwrap();
        assert_eq!(parsed.reasoning, "The user wants 2+2.");
        assert_eq!(parsed.content, "2 + 2 = 4.");
        let mut params = SamplingParams::default();
        ReasoningParserName::OpenAiGptOss.adjust_params(&mut params);
        assert!(!params.skip_special_tokens);
        let mut params = SamplingParams::default();
        OpenAiToolParser.adjust_params(&mut params);
        assert!(!params.skip_special_tokens);
        assert_eq!("openai".parse(), Ok(ToolParserName::OpenAi));
        assert_eq!(
            ToolParserName::detect("<|start|>{{ role }}<|channel|>"),
            Some(ToolParserName::OpenAi)
        );
    }
}
