//! `minivllm generate`: completions for prompts given on the command line or in a file,
//! through the engine (continuous batching, paged KV cache with prefix caching).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use minivllm::engine::chat_template::ChatMessage;
use minivllm::engine::llm_engine::PromptInput;
use minivllm::entrypoints::llm::LLM;
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::{SamplingParams, StructuredOutputsParams};

use crate::EngineFlags;

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub engine: EngineFlags,
    #[command(flatten)]
    sampling: SamplingFlags,
    /// A prompt (repeat for several; they run as one batch).
    #[arg(long)]
    prompt: Vec<String>,
    /// A file of prompts: one per line, or JSONL objects with `prompt` or `prompt_token_ids`.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Print one JSON object per request (vLLM's RequestOutput fields) instead of the text.
    #[arg(long)]
    json: bool,
    /// Write the JSONL results to this file instead of stdout.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Show a progress bar on stderr.
    #[arg(long)]
    progress: bool,
    #[command(flatten)]
    structured: StructuredFlags,
}

/// The constraint every completion follows (structured output); at most one.
#[derive(clap::Args)]
#[group(multiple = false)]
struct StructuredFlags {
    /// A JSON schema file: each completion is JSON that validates against it.
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Each completion matches this regular expression.
    #[arg(long)]
    regex: Option<String>,
    /// Each completion is one of these strings (comma-separated).
    #[arg(long, value_delimiter = ',')]
    choice: Option<Vec<String>>,
    /// A grammar file in llguidance's Lark dialect.
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

impl StructuredFlags {
    fn params(&self) -> anyhow::Result<Option<StructuredOutputsParams>> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
        };
        Ok(if let Some(path) = &self.json_schema {
            let schema = serde_json::from_str(&read(path)?)
                .with_context(|| format!("{} is not JSON", path.display()))?;
            Some(StructuredOutputsParams::json_schema(schema))
        } else if let Some(regex) = &self.regex {
            Some(StructuredOutputsParams::regex(regex.clone()))
        } else if let Some(choice) = &self.choice {
            Some(StructuredOutputsParams::choice(choice.clone()))
        } else if let Some(path) = &self.grammar {
            Some(StructuredOutputsParams::grammar(read(path)?))
        } else {
            None
        })
    }
}

/// Sampling flags, named as vLLM's `SamplingParams` fields. Unlike vLLM's API default of
/// temperature 1.0, the command line decodes greedily unless told otherwise.
#[derive(clap::Args)]
struct SamplingFlags {
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    #[arg(long, default_value_t = 0)]
    min_tokens: usize,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// 0 or -1: off.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    top_k: i32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Completions per prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    #[arg(long)]
    best_of: Option<usize>,
    /// Per-request seed; with several prompts, prompt i uses seed + i.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Stop token id (repeatable).
    #[arg(long)]
    stop_token_ids: Vec<u32>,
    #[arg(long)]
    ignore_eos: bool,
    /// Top log-probabilities to return per generated token (-1: the whole vocabulary,
    /// with --max-logprobs -1).
    #[arg(long, allow_negative_numbers = true,
          value_parser = minivllm::sampling_params::logprob_count::parse)]
    logprobs: Option<usize>,
    /// Top log-probabilities to return per prompt token (-1: all, as --logprobs).
    #[arg(long, allow_negative_numbers = true,
          value_parser = minivllm::sampling_params::logprob_count::parse)]
    prompt_logprobs: Option<usize>,
}

impl SamplingFlags {
    fn params(&self) -> SamplingParams {
        SamplingParams {
            n: self.n,
            best_of: self.best_of,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            max_tokens: Some(self.max_tokens),
            min_tokens: self.min_tokens,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
            ..SamplingParams::default()
        }
    }
}

pub fn run(
    args: GenerateArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    let prompts = collect_prompts(&args)?;
    let base = SamplingParams {
        structured_outputs: args.structured.params()?,
        ..args.sampling.params()
    };
    base.validate()?;
    let mut llm =
        LLM::with_driver(&args.engine.engine_args()?, driver).context("cannot start the engine")?;
    let tokenizer = llm.engine().tokenizer().clone();
    let mut inputs = Vec::with_capacity(prompts.len());
    for p in prompts {
        inputs.push(match p {
            PromptInput::Text(text) if args.chat => {
                let msg = ChatMessage::new("user", text);
                let rendered = tokenizer.apply_chat_template(&[msg], true)?;
                PromptInput::TokenIds(tokenizer.encode(&rendered, false)?)
            }
            other => other,
        });
    }
    let params: Vec<SamplingParams> = (0..inputs.len())
        .map(|i| SamplingParams {
            seed: base.seed.map(|s| s.wrapping_add(i as u64)),
            ..base.clone()
        })
        .collect();
    let outputs = llm.generate(inputs, &params, args.progress)?;
    if args.json || args.output.is_some() {
        write_jsonl(&outputs, args.output.as_deref())
    } else {
        print_text(&outputs);
        Ok(())
    }
}

fn print_text(outputs: &[RequestOutput]) {
    let many = outputs.len() > 1 || outputs.iter().any(|o| o.outputs.len() > 1);
    for (i, out) in outputs.iter().enumerate() {
        for c in &out.outputs {
            if many {
                println!("--- completion {i}.{} ---", c.index);
            }
            println!("{}", c.text);
        }
    }
}

fn write_jsonl(outputs: &[RequestOutput], path: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut sink: Box<dyn Write> = match path {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot write {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    for out in outputs {
        serde_json::to_writer(&mut sink, out)?;
        sink.write_all(b"\n")?;
    }
    sink.flush()?;
    Ok(())
}

fn collect_prompts(args: &GenerateArgs) -> anyhow::Result<Vec<PromptInput>> {
    let mut prompts: Vec<PromptInput> =
        args.prompt.iter().cloned().map(PromptInput::Text).collect();
    if let Some(path) = &args.prompts_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read prompts file {}", path.display()))?;
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            prompts.push(
                parse_prompt_line(line)
                    .with_context(|| format!("{}:{}: bad prompt line", path.display(), n + 1))?,
            );
        }
    }
    if prompts.is_empty() {
        bail!("no prompt given: use --prompt TEXT or --prompts-file FILE");
    }
    Ok(prompts)
}

/// A line is a JSON object (`{"prompt": ...}` or `{"prompt_token_ids": [...]}`) or plain text.
fn parse_prompt_line(line: &str) -> anyhow::Result<PromptInput> {
    if !line.trim_start().starts_with('{') {
        return Ok(PromptInput::Text(line.to_string()));
    }
    let v: serde_json::Value = serde_json::from_str(line).context("invalid JSON")?;
    if let Some(p) = v.get("prompt").and_then(|p| p.as_str()) {
        return Ok(PromptInput::Text(p.to_string()));
    }
    if let Some(ids) = v.get("prompt_token_ids").and_then(|p| p.as_array()) {
        let ids = ids
            .iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .context("prompt_token_ids must be non-negative integers")?;
        return Ok(PromptInput::TokenIds(ids));
    }
    bail!("JSON prompt lines need a \"prompt\" string or \"prompt_token_ids\" list")
}
