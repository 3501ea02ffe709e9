//! `minivllm generate`: greedy completions for prompts given on the command line or in a file.

use std::path::PathBuf;

use anyhow::{bail, Context};
use minivllm::engine::chat_template::ChatMessage;
use minivllm::engine::greedy::generate_greedy;

use crate::ModelArgs;

#[derive(clap::Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A prompt (repeat for several; they run as one batch).
    #[arg(long)]
    prompt: Vec<String>,
    /// A file of prompts: one per line, or JSONL objects with `prompt` or `prompt_token_ids`.
    #[arg(long)]
    prompts_file: Option<PathBuf>,
    /// Most tokens to generate per prompt.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Wrap each prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
}

/// A prompt as text or as token ids (vLLM's two prompt forms).
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let prompts = collect_prompts(&args)?;
    let mut rt = args.model.load()?;
    let mut ids = Vec::with_capacity(prompts.len());
    for p in &prompts {
        ids.push(match p {
            Prompt::Ids(ids) => ids.clone(),
            Prompt::Text(text) if args.chat => {
                let msg = ChatMessage {
                    role: "user".into(),
                    content: text.clone(),
                };
                let rendered = rt.tokenizer.apply_chat_template(&[msg], true)?;
                rt.tokenizer.encode(&rendered, false)?
            }
            Prompt::Text(text) => rt.tokenizer.encode(text, true)?,
        });
    }
    let eos = rt.tokenizer.eos_token_ids().to_vec();
    let outputs = generate_greedy(
        &mut rt.runner,
        &ids,
        args.max_tokens,
        &eos,
        rt.max_model_len,
    )?;
    for (i, out) in outputs.iter().enumerate() {
        let text = rt.tokenizer.decode(&out.token_ids, true)?;
        if outputs.len() > 1 {
            println!("--- completion {i} ---");
        }
        println!("{text}");
    }
    Ok(())
}

fn collect_prompts(args: &GenerateArgs) -> anyhow::Result<Vec<Prompt>> {
    let mut prompts: Vec<Prompt> = args.prompt.iter().cloned().map(Prompt::Text).collect();
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
fn parse_prompt_line(line: &str) -> anyhow::Result<Prompt> {
    if !line.trim_start().starts_with('{') {
        return Ok(Prompt::Text(line.to_string()));
    }
    let v: serde_json::Value = serde_json::from_str(line).context("invalid JSON")?;
    if let Some(p) = v.get("prompt").and_then(|p| p.as_str()) {
        return Ok(Prompt::Text(p.to_string()));
    }
    if let Some(ids) = v.get("prompt_token_ids").and_then(|p| p.as_array()) {
        let ids = ids
            .iter()
            .map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
            .collect::<Option<Vec<u32>>>()
            .context("prompt_token_ids must be non-negative integers")?;
        return Ok(Prompt::Ids(ids));
    }
    bail!("JSON prompt lines need a \"prompt\" string or \"prompt_token_ids\" list")
}
