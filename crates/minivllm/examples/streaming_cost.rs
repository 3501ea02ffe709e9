//! What streaming a long completion costs per token, at its start and at its end.
//!
//! Runs one 2,000-token completion (with 5 logprobs per token, the heaviest output) once
//! per `RequestOutputKind` and times every engine step. The model's share of a step is the
//! same in every kind, so the kinds' differences are the cost of building the outputs: with
//! `CUMULATIVE` every step copies the whole history, with `DELTA` only the new token.
//!
//! `cargo run --release -p minivllm --example streaming_cost [model.gguf] [tokens]`

use std::time::Instant;

use minivllm::engine::llm_engine::{EngineArgs, LLMEngine, PromptInput};
use minivllm::sampling_params::{RequestOutputKind, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    let model = argv
        .next()
        .unwrap_or_else(|| "models/SmolLM2-135M-Instruct.Q4_1.gguf".into());
    let tokens: usize = argv.next().map_or(Ok(2000), |s| s.parse())?;
    let args = EngineArgs {
        model,
        max_model_len: Some(tokens + 64),
        ..EngineArgs::default()
    };
    let mut engine = LLMEngine::from_engine_args(&args)?;
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = cpu.lines().find_map(|l| l.strip_prefix("model name\t: "));
    println!(
        "CPU {}, ISA {:?}, {} tokens",
        name.unwrap_or("unknown"),
        minivllm::kernels::cpu::isa(),
        tokens
    );
    println!("| output kind | ms/step, first 100 | ms/step, last 100 | bytes out, last step |");
    println!("|---|---|---|---|");
    for kind in [
        RequestOutputKind::Cumulative,
        RequestOutputKind::Delta,
        RequestOutputKind::Cumulative,
        RequestOutputKind::Delta,
    ] {
        let params = SamplingParams {
            temperature: 0.8,
            seed: Some(1),
            logprobs: Some(5),
            ignore_eos: true,
            max_tokens: Some(tokens),
            output_kind: kind,
            ..SamplingParams::default()
        };
        let prompt = PromptInput::Text("Tell me a long story about the sea.".into());
        engine.add_request(format!("{kind:?}-{}", engine.uptime()), prompt, params, 0)?;
        let mut times = Vec::with_capacity(tokens);
        let mut last_bytes = 0;
        while engine.has_unfinished_requests() {
            let start = Instant::now();
            let outs = engine.step()?;
            times.push(start.elapsed().as_secs_f64() * 1e3);
            last_bytes = outs.iter().map(output_bytes).sum();
        }
        let mean = |t: &[f64]| t.iter().sum::<f64>() / t.len() as f64;
        let (head, tail) = (&times[1..101], &times[times.len() - 100..]);
        println!(
            "| {kind:?} | {:.3} | {:.3} | {last_bytes} |",
            mean(head),
            mean(tail)
        );
    }
    Ok(())
}

/// Bytes an output holds in its text, token ids and logprobs (what a step builds and sends).
fn output_bytes(out: &minivllm::outputs::RequestOutput) -> usize {
    out.outputs
        .iter()
        .map(|o| {
            let lps = o
                .logprobs
                .as_ref()
                .map_or(0, |l| l.iter().map(|t| t.entries.len() * 8).sum::<usize>());
            o.text.len() + o.token_ids.len() * 4 + lps
        })
        .sum()
}
