//! `POST /v1/chat/completions`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::api_server::{AppState, RequestId, Shared};
use super::protocol::{
    chat_messages, ApiError, ChatCompletionRequest, ChatMessageIn, TemplateMode,
};
use super::request_memory::{LogprobFormat, ResponseShape};
use super::serving_engine::{
    admit, check_model, data_sse, delta, encode, finish_reason, fold, json_response, last_output,
    now, off_async, parse, prompt_logprobs, stop_reason, submit, token_text, top, Held, Prompt,
    Usage,
};
use super::tool_calls::{message_fields, ReplyStream, ToolUse};
use super::tool_parsers::{ParsedOutput, ToolParser};
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::{CompletionOutput, RequestOutput};
use crate::reasoning::{PromptThinking, ReasoningParser};
use crate::sampling_params::SamplingParams;
use crate::sequence::FinishReason;
use crate::sequence::TokenId;

/// Renders `messages` with the model's chat template and tokenises the result.
/// `tools`: OpenAI's tool objects, for templates that describe them to the model.
pub fn render_chat(
    s: &AppState,
    messages: &[ChatMessageIn],
    tools: &[Value],
    mode: TemplateMode,
    add_special_tokens: bool,
) -> Result<Prompt, ApiError> {
    let tok = s.engine.tokenizer();
    let messages = chat_messages(messages)?;
    let add_generation_prompt = mode == TemplateMode::GenerationPrompt;
    let mut rendered = tok
        .apply_chat_template_with_tools(&messages, tools, add_generation_prompt)
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

pub async fn chat_completions(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req = off_async(&s, move |_| parse::<ChatCompletionRequest>(body)).await?;
    let options = RunOptions {
        include_usage: req.common.include_usage(),
        usage_details: s.config.prompt_tokens_details,
        logprob_format: LogprobFormat::Chat,
    };
    Ok(match run_chat(&s, &rid, req, options).await? {
        ChatRun::Full { body, .. } => off_async(&s, move |_| json_response(&body)).await,
        ChatRun::Stream { chunks, .. } => data_sse(chunks),
    })
}

/// A chat request under way: its reply whole (`chat.completion`), or its stream of
/// `chat.completion.chunk` objects. The routes that speak other APIs (Anthropic's
/// Messages, OpenAI's Responses) run their requests as chat requests and translate these.
pub enum ChatRun {
    Full {
        prompt_tokens: usize,
        body: Value,
    },
    Stream {
        prompt_tokens: usize,
        chunks: mpsc::Receiver<Value>,
    },
}

/// What the route running a chat request wants of it.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// A stream ends with a usage chunk.
    pub include_usage: bool,
    /// The usage has `prompt_tokens_details`.
    pub usage_details: bool,
    /// How the route's response will hold logprobs (for the request memory estimate).
    pub logprob_format: LogprobFormat,
}

/// Checks, renders and runs `req` as `options` say. Dropping the stream's receiver aborts
/// the request.
pub async fn run_chat(
    s: &Shared,
    rid: &RequestId,
    req: ChatCompletionRequest,
    options: RunOptions,
) -> Result<ChatRun, ApiError> {
    let RunOptions {
        include_usage,
        usage_details,
        logprob_format,
    } = options;
    let (req, prompt, params, held, tools) =
        off_async(s, move |s| prepare(s, req, logprob_format)).await?;
    let reasoning = s
        .config
        .reasoning_parser
        .map(|name| (ReasoningParser::new(name), PromptThinking::of(&prompt.text)));
    let logprobs = req.logprobs.then_some(req.top_logprobs.unwrap_or(0));
    let n = params.n;
    let prompt_tokens = prompt.ids.len();
    let prompts = [prompt];
    let mut streams = submit(
        s,
        rid,
        "chatcmpl",
        &prompts,
        vec![params],
        req.common.priority,
    )
    .await?;
    let rx = streams.remove(0);
    let reply = Reply {
        _held: held,
        id: format!("chatcmpl-{}", rid.0),
        created: now(),
        model: s.config.served_model_name.clone(),
        n,
        top_logprobs: logprobs,
        prompt_logprobs: req.common.prompt_logprobs.is_some(),
        tok: s.engine.tokenizer().clone(),
        tools,
        reasoning,
        prompt_tokens_details: usage_details,
    };
    if req.common.stream {
        let (tx, chunks) = mpsc::channel(64);
        tokio::spawn(reply.stream(rx, include_usage, tx));
        return Ok(ChatRun::Stream {
            prompt_tokens,
            chunks,
        });
    }
    let out = last_output(rx).await?;
    let body = off_async(s, move |_| reply.full(&out)).await;
    Ok(ChatRun::Full {
        prompt_tokens,
        body,
    })
}

/// The request checked, its messages rendered and tokenised, and its sampling parameters.
#[allow(clippy::type_complexity)]
fn prepare(
    s: &AppState,
    req: ChatCompletionRequest,
    logprob_format: LogprobFormat,
) -> Result<(ChatCompletionRequest, Prompt, SamplingParams, Held, ToolUse), ApiError> {
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
    let prompt = render_chat(s, &req.messages, &tools.template_tools, mode, false)?;
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
    let (mut params, held) = admit(s, &base, std::slice::from_ref(&prompt), response)?;
    Ok((req, prompt, params.remove(0), held, tools))
}

/// What every response of one request shares.
struct Reply {
    /// Released when the response is done.
    _held: Held,
    id: String,
    created: u64,
    model: String,
    n: usize,
    /// `Some(k)` when the request asked for logprobs, with `k` alternatives each.
    top_logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs` was asked for: the response carries them.
    prompt_logprobs: bool,
    tok: Arc<Tokenizer>,
    tools: ToolUse,
    /// `--reasoning-parser`, and where the prompt left the model's thinking.
    reasoning: Option<(ReasoningParser, PromptThinking)>,
    /// `--enable-prompt-tokens-details`.
    prompt_tokens_details: bool,
}

impl Reply {
    fn body(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id, "object": object, "created": self.created,
            "model": self.model, "choices": choices,
        })
    }

    fn logprobs(&self, o: &CompletionOutput, from: usize) -> Value {
        match self.top_logprobs {
            Some(k) => chat_logprobs(&self.tok, o, from, k),
            None => Value::Null,
        }
    }

    fn full(&self, out: &RequestOutput) -> Value {
        let choices: Vec<Value> = out
            .outputs
            .iter()
            .map(|o| {
                let mut message = json!({"role": "assistant", "content": o.text});
                let mut finish = finish_reason(o);
                if let Some(parsed) = self.read(&o.text, true) {
                    finish = self.finish_with_calls(o, !parsed.tool_calls.is_empty());
                    message
                        .as_object_mut()
                        .expect("an object")
                        .extend(message_fields(&parsed, self.reasoning.is_some()));
                }
                json!({
                    "index": o.index,
                    "message": message,
                    "logprobs": self.logprobs(o, 0),
                    "finish_reason": finish,
                    "stop_reason": stop_reason(o),
                })
            })
            .collect();
        let mut body = self.body("chat.completion", Value::Array(choices));
        body["usage"] = self.usage(out);
        if self.prompt_logprobs {
            body["prompt_logprobs"] = prompt_logprobs(&self.tok, out);
        }
        body
    }

    /// The reply as the reasoning and tool-call parsers read it; `None` without them (the
    /// text is all content).
    fn read(&self, text: &str, finished: bool) -> Option<ParsedOutput> {
        read_reply(
            self.reasoning.as_ref(),
            self.tools.parser.as_deref(),
            text,
            finished,
        )
    }

    /// `tool_calls` for a reply that stopped after calling tools, as OpenAI says it.
    fn finish_with_calls(&self, o: &CompletionOutput, called: bool) -> Value {
        match o.finish_reason {
            Some(FinishReason::Stop) if called && self.tools.finish_as_tool_calls => {
                "tool_calls".into()
            }
            _ => finish_reason(o),
        }
    }

    async fn stream(
        self,
        mut rx: mpsc::UnboundedReceiver<RequestOutput>,
        include_usage: bool,
        tx: mpsc::Sender<Value>,
    ) {
        const OBJECT: &str = "chat.completion.chunk";
        let mut sent = vec![0usize; self.n];
        let mut sent_tokens = vec![0usize; self.n];
        // With n > 1 a finished choice keeps coming back while its siblings run.
        let mut done = vec![false; self.n];
        let mut replies: Vec<ReplyStream> = (0..self.n).map(|_| ReplyStream::default()).collect();
        for i in 0..self.n {
            let first = json!([{
                "index": i, "delta": {"role": "assistant", "content": ""},
                "logprobs": null, "finish_reason": null,
            }]);
            if tx.send(self.body(OBJECT, first)).await.is_err() {
                return;
            }
        }
        // The deltas folded together, so chunks can carry held-back text and logprobs.
        let mut last = None;
        while let Some(next) = rx.recv().await {
            let changed: Vec<usize> = next.outputs.iter().map(|o| o.index).collect();
            let out = &*fold(&mut last, next);
            for o in out.outputs.iter().filter(|o| changed.contains(&o.index)) {
                if done[o.index] {
                    continue;
                }
                let finished = o.finish_reason.is_some();
                done[o.index] = finished;
                let (delta, finish) = match self.read(&o.text, finished) {
                    None => {
                        let text = delta(&o.text, &mut sent[o.index]);
                        let d = (!text.is_empty()).then(|| json!({"content": text}));
                        (d, finish_reason(o))
                    }
                    Some(parsed) => {
                        let reply = &mut replies[o.index];
                        let d = reply.delta(&parsed);
                        let finish = self.finish_with_calls(o, reply.called());
                        (d.map(Value::Object), finish)
                    }
                };
                if delta.is_none() && !finished {
                    // Text held back (half a character, a possible stop string, what may be
                    // a tool call): its tokens' logprobs go with the chunk that releases it.
                    continue;
                }
                let lp = self.logprobs(o, sent_tokens[o.index]);
                sent_tokens[o.index] = o.token_ids.len();
                let c = json!([{
                    "index": o.index, "delta": delta.unwrap_or_else(|| json!({})), "logprobs": lp,
                    "finish_reason": finish, "stop_reason": stop_reason(o),
                }]);
                if tx.send(self.body(OBJECT, c)).await.is_err() {
                    return;
                }
            }
        }
        if let (true, Some(out)) = (include_usage, last) {
            let mut c = self.body(OBJECT, json!([]));
            c["usage"] = self.usage(&out);
            let _ = tx.send(c).await;
        }
    }
}

impl Reply {
    fn usage(&self, out: &RequestOutput) -> Value {
        Usage::of(out).json(self.prompt_tokens_details)
    }
}

/// Chat-style logprobs: `{"content": [{token, logprob, bytes, top_logprobs}]}`.
fn chat_logprobs(tok: &Tokenizer, o: &CompletionOutput, from: usize, k: usize) -> Value {
    let Some(lps) = &o.logprobs else {
        return Value::Null;
    };
    let entry = |id: TokenId, lp: f32| {
        let t = token_text(tok, id);
        json!({"token": t, "logprob": lp, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = o
        .token_ids
        .iter()
        .zip(lps)
        .skip(from)
        .map(|(&id, lp)| {
            let mut e = entry(id, lp.get(id).unwrap_or(f32::NEG_INFINITY));
            e["top_logprobs"] = top(lp)
                .into_iter()
                .take(k)
                .map(|(a, x)| entry(a, x))
                .collect();
            e
        })
        .collect();
    json!({"content": content})
}

/// The reply as a reasoning parser (and where the prompt left the thinking) and a tool-call
/// parser read it; `None` without either (the text is all content).
fn read_reply(
    reasoning: Option<&(ReasoningParser, PromptThinking)>,
    tools: Option<&dyn ToolParser>,
    text: &str,
    finished: bool,
) -> Option<ParsedOutput> {
    // A whole-reply parser (harmony's) reads the thinking too: the reply is parsed once.
    if let Some(parser) = tools.filter(|p| p.reads_whole_reply()) {
        let mut parsed = parser.parse(text, finished);
        if reasoning.is_none() {
            parsed.reasoning.clear();
        }
        return Some(parsed);
    }
    if tools.is_none() && reasoning.is_none() {
        return None;
    }
    let (thought, answer) = match reasoning {
        Some((parser, prompt)) => parser.split(*prompt, text, finished),
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
        let reasoning = (
            ReasoningParser::new(ReasoningParserName::OpenAiGptOss),
            PromptThinking::Absent,
        );
        let tools = OpenAiToolParser;
        let mut whole_replies = Vec::new();
        for tokens in REPLIES {
            let text: String = tokens.concat();
            let whole = read_reply(Some(&reasoning), Some(&tools), &text, true).unwrap();
            // A stream: the deltas of each token's read, folded.
            let mut stream = ReplyStream::default();
            let (mut thought, mut content) = (String::new(), String::new());
            let mut calls: Vec<(String, String)> = Vec::new();
            for n in 1..=tokens.len() {
                let so_far = tokens[..n].concat();
                let parsed =
                    read_reply(Some(&reasoning), Some(&tools), &so_far, n == tokens.len()).unwrap();
                let Some(d) = stream.delta(&parsed) else {
                    continue;
                };
                let text_of = |k: &str| d.get(k).and_then(Value::as_str).unwrap_or("");
                thought += text_of("reasoning_content");
                content += text_of("content");
                for piece in d
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let i = piece["index"].as_u64().unwrap() as usize;
                    if i == calls.len() {
                        calls.push((
                            piece["function"]["name"].as_str().unwrap().into(),
                            String::new(),
                        ));
                    }
                    calls[i].1 += piece["function"]["arguments"].as_str().unwrap();
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
            whole_replies.push(message_fields(&whole, true));
        }
        let [answer, call, role_call] = &whole_replies[..] else {
            unreachable!()
        };
        assert_eq!(answer["reasoning_content"], "The user wants 2+2.");
        assert_eq!(answer["content"], "2 + 2 = 4.");
        assert!(answer.get("tool_calls").is_none());
        assert_eq!(call["reasoning_content"], "Need weather.");
        assert_eq!(call["content"], "Checking…");
        assert_eq!(call["tool_calls"][0]["function"]["name"], "get_weather");
        assert_eq!(
            call["tool_calls"][0]["function"]["arguments"],
            "{\"location\": \"Tokyo\"}"
        );
        assert_eq!(role_call["reasoning_content"], Value::Null);
        assert_eq!(role_call["content"], Value::Null);
        assert_eq!(role_call["tool_calls"][0]["function"]["name"], "lookup");
        assert_eq!(role_call["tool_calls"][0]["function"]["arguments"], "{}");
    }

    /// Without a tool parser the reasoning parser alone gives thinking and answer; both keep
    /// the special tokens the format is written in.
    #[test]
    fn harmony_without_tools_and_the_settings_it_needs() {
        let reasoning = (
            ReasoningParser::new(ReasoningParserName::OpenAiGptOss),
            PromptThinking::Absent,
        );
        let text = REPLIES[0].concat();
        let parsed = read_reply(Some(&reasoning), None, &text, true).unwrap();
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
