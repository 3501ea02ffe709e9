//! `POST /v1/completions`.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;
use serde_json::{json, Value};

use super::protocol::{ApiError, CompletionRequest, PromptField};
use super::request_memory::{LogprobFormat, ResponseShape};
use super::server_state::{AppState, RequestId, Shared};
use super::serving_engine::{
    admit, check_model, check_request_width, encode, finish_reason, json_response, last_output,
    merge, now, off_async, parse, prompt_logprobs, stop_reason, submit, token_text, Held, Prompt,
    Streams,
};
use super::usage::Usage;
use crate::engine::input_processor::CheckedParams;
use crate::engine::tokenizer::Tokenizer;
use crate::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use crate::sampling_params::SamplingParams;
use crate::sequence::TokenId;

pub async fn completions(
    State(s): State<Shared>,
    Extension(rid): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (req, prompts, base, params, held) = off_async(&s, move |s| prepare(s, body)).await?;
    let tok = s.engine.tokenizer().clone();
    let streams = submit(&s, &rid, "cmpl", &prompts, params).await?;
    let reply = Reply {
        _held: held,
        id: format!("cmpl-{}", rid.0),
        created: now(),
        model: s.config.served_model_name.clone(),
        n: base.n,
        echo: req.echo,
        logprobs: req.logprobs.is_some(),
        prompt_logprobs: req.common.prompt_logprobs.is_some(),
        tok,
        prompts,
        prompt_tokens_details: s.config.prompt_tokens_details,
    };
    if req.common.stream {
        let include_usage = req.common.include_usage();
        return Ok(super::serving_engine::sse(move |tx| {
            reply.stream(streams, include_usage, tx)
        }));
    }
    let mut outs = Vec::with_capacity(streams.len());
    for rx in streams {
        outs.push(last_output(rx).await?);
    }
    Ok(off_async(&s, move |_| json_response(&reply.full(&outs))).await)
}

/// The request parsed and checked, its prompts tokenised, and each prompt's sampling
/// parameters (after the shared ones).
type Prepared = (
    CompletionRequest,
    Vec<Prompt>,
    SamplingParams,
    Vec<CheckedParams>,
    Held,
);

fn prepare(s: &AppState, body: Result<Bytes, BytesRejection>) -> Result<Prepared, ApiError> {
    let req: CompletionRequest = parse(body)?;
    req.common.check()?;
    check_model(s, req.common.model.as_deref())?;
    let mut base = (req.common).sampling_params(&s.config.generation, req.max_tokens, req.logprobs);
    if req.echo {
        // Echoed prompts carry their tokens' logprobs too, as in OpenAI's legacy API.
        base.prompt_logprobs = base.prompt_logprobs.max(req.logprobs);
    }
    // Before any prompt is tokenised or any state is sized by their number.
    let checked = s.engine.check(base.clone(), req.common.priority)?;
    check_request_width(s, &base, req.prompt.len())?;
    let prompts = prompts(s, req.prompt.clone(), "prompt")?;
    let response = ResponseShape {
        echo: req.echo,
        // vLLM's field, in every choice, only when asked for (echo's logprobs are the
        // completions-style ones).
        prompt_logprobs_objects: if req.common.prompt_logprobs.is_some() {
            base.n as u64
        } else {
            0
        },
        format: LogprobFormat::Completions,
    };
    let (params, held) = admit(s, checked, &prompts, response)?;
    Ok((req, prompts, base, params, held))
}

/// Each prompt of `field` (the request's `param`) tokenised, or its ids with their text.
pub fn prompts(s: &AppState, field: PromptField, param: &str) -> Result<Vec<Prompt>, ApiError> {
    let tok = s.engine.tokenizer();
    let texts_or_ids: Vec<Result<String, Vec<TokenId>>> = match field {
        PromptField::Text(t) => vec![Ok(t)],
        PromptField::Texts(v) => v.into_iter().map(Ok).collect(),
        PromptField::Ids(ids) => vec![Err(ids)],
        PromptField::IdLists(v) => v.into_iter().map(Err).collect(),
    };
    if texts_or_ids.is_empty() {
        return Err(ApiError::bad_request(
            format!("{param} must not be empty"),
            Some(param),
        ));
    }
    texts_or_ids
        .into_iter()
        .map(|p| {
            Ok(match p {
                Ok(text) => Prompt {
                    ids: encode(s, &text, true)?,
                    text,
                },
                Err(ids) => Prompt {
                    text: tok.decode(&ids, false).unwrap_or_default(),
                    ids,
                },
            })
        })
        .collect()
}

/// What every response of one request shares.
struct Reply {
    /// Released when the response is done.
    _held: Held,
    id: String,
    created: u64,
    model: String,
    n: usize,
    echo: bool,
    logprobs: bool,
    /// vLLM's `prompt_logprobs` field was asked for: each choice carries them.
    prompt_logprobs: bool,
    tok: std::sync::Arc<Tokenizer>,
    prompts: Vec<Prompt>,
    /// `--enable-prompt-tokens-details`.
    prompt_tokens_details: bool,
}

impl Reply {
    fn body(&self, choices: Value) -> Value {
        json!({
            "id": self.id, "object": "text_completion", "created": self.created,
            "model": self.model, "choices": choices,
        })
    }

    fn choice(&self, index: usize, text: String, logprobs: Value, o: &CompletionOutput) -> Value {
        json!({
            "index": index, "text": text, "logprobs": logprobs,
            "finish_reason": finish_reason(o), "stop_reason": stop_reason(o),
        })
    }

    /// Logprobs of `o`'s tokens, after those of `out`'s prompt when `with_prompt`. Text
    /// offsets start at `*offset`, which is left just past the last token.
    fn logprobs(
        &self,
        out: &RequestOutput,
        o: &CompletionOutput,
        with_prompt: bool,
        offset: &mut usize,
    ) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let mut lp = CompletionLogprobs {
            pos: *offset,
            ..CompletionLogprobs::default()
        };
        if with_prompt {
            let prompt_lps = out.prompt_logprobs.as_deref().unwrap_or(&[]);
            for (i, &id) in out.prompt_token_ids.iter().enumerate() {
                lp.push(&self.tok, id, prompt_lps.get(i).and_then(Option::as_ref));
            }
        }
        let generated = o.logprobs.as_deref().unwrap_or(&[]);
        for (i, &id) in o.token_ids.iter().enumerate() {
            lp.push(&self.tok, id, generated.get(i));
        }
        *offset = lp.pos;
        lp.into_json()
    }

    fn full(&self, outs: &[RequestOutput]) -> Value {
        let mut choices = Vec::new();
        let mut usage = Usage::default();
        for (i, out) in outs.iter().enumerate() {
            usage.add(out);
            for o in &out.outputs {
                let text = if self.echo {
                    format!("{}{}", self.prompts[i].text, o.text)
                } else {
                    o.text.clone()
                };
                let logprobs = self.logprobs(out, o, self.echo, &mut 0);
                let mut choice = self.choice(i * self.n + o.index, text, logprobs, o);
                if self.prompt_logprobs {
                    choice["prompt_logprobs"] = prompt_logprobs(&self.tok, out);
                }
                choices.push(choice);
            }
        }
        let mut body = self.body(Value::Array(choices));
        body["usage"] = usage.json(self.prompt_tokens_details);
        if let Some(kv) = outs.iter().find_map(|o| o.kv_transfer_params.as_ref()) {
            body["kv_transfer_params"] = json!(kv);
        }
        body
    }

    async fn stream(
        self,
        streams: Streams,
        include_usage: bool,
        tx: tokio::sync::mpsc::Sender<Value>,
    ) {
        let mut choices = vec![ChoiceStream::default(); self.prompts.len() * self.n];
        let mut merged = merge(streams);
        let mut usage = Usage::default();
        // Each prompt's first output, without its completions: the prompt's logprobs, which
        // its echoed choices start with. The engine's deltas are sent as they come (a delta's
        // tokens come with the text they release).
        let mut firsts: Vec<Option<RequestOutput>> = vec![None; self.prompts.len()];
        while let Some((i, mut out)) = merged.recv().await {
            usage.add_delta(&out, firsts[i].is_none());
            let outputs = std::mem::take(&mut out.outputs);
            let first = &*firsts[i].get_or_insert(out);
            for mut o in outputs {
                let index = i * self.n + o.index;
                let c = &mut choices[index];
                let echo = self.echo && !c.started;
                c.started = true;
                let mut text = std::mem::take(&mut o.text);
                if echo {
                    text.insert_str(0, &self.prompts[i].text);
                }
                let logprobs = self.logprobs(first, &o, echo, &mut c.offset);
                let chunk = self.body(json!([self.choice(index, text, logprobs, &o)]));
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let mut chunk = self.body(json!([]));
            chunk["usage"] = usage.json(self.prompt_tokens_details);
            let _ = tx.send(chunk).await;
        }
    }
}

/// What one choice of a stream has sent so far.
#[derive(Debug, Clone, Default)]
struct ChoiceStream {
    /// Characters its logprobs' `text_offset`s have covered (the echoed prompt included).
    offset: usize,
    started: bool,
}

/// OpenAI's completions `logprobs` object, built token by token.
#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
    pos: usize,
}

impl CompletionLogprobs {
    /// `lps` is `None` where there is nothing to report (a prompt's first token).
    fn push(&mut self, tok: &Tokenizer, id: TokenId, lps: Option<&TokenLogprobs>) {
        let t = token_text(tok, id);
        self.text_offset.push(self.pos);
        // Offsets count characters, as Python's len() does in OpenAI's and vLLM's servers.
        self.pos += t.chars().count();
        match lps {
            None => {
                self.token_logprobs.push(Value::Null);
                self.top_logprobs.push(Value::Null);
            }
            Some(lp) => {
                self.token_logprobs
                    .push(lp.get(id).map_or(Value::Null, |x| json!(x)));
                // vLLM's order: the chosen token first, then the others best first.
                let alts: serde_json::Map<String, Value> = lp
                    .chosen_first()
                    .into_iter()
                    .map(|(a, x, _)| (token_text(tok, a), json!(x)))
                    .collect();
                self.top_logprobs.push(Value::Object(alts));
            }
        }
        self.tokens.push(t);
    }

    fn into_json(self) -> Value {
        json!({
            "tokens": self.tokens, "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top_logprobs, "text_offset": self.text_offset,
        })
    }
}
