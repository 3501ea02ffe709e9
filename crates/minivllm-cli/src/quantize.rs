//! `minivllm quantize`: writes a GGUF model's weights in another block format.

use std::path::PathBuf;

use anyhow::Context;
use minivllm::model_executor::loader::gguf_quantize::{quantize_gguf, FileQuantization};

#[derive(clap::Args, Debug)]
pub struct QuantizeArgs {
    /// The GGUF file to read.
    #[arg(long, default_value = crate::DEFAULT_MODEL)]
    model: PathBuf,
    /// Where to write the new GGUF file.
    #[arg(long)]
    output: PathBuf,
    /// The format: `q8_0`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q4_k`, `q5_k`, `q6_k`, or
    /// llama.cpp's mixes `q4_k_m` and `q5_k_m`.
    #[arg(long)]
    quantization: FileQuantization,
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let mut last_pct = 0;
    let report = quantize_gguf(
        &args.model,
        &args.output,
        args.quantization,
        |done, total| {
            let pct = 100 * done / total.max(1);
            if pct >= last_pct + 10 || done == total {
                last_pct = pct;
                eprintln!("quantize: {done}/{total} tensors ({pct} %)");
            }
        },
    )
    .with_context(|| format!("quantizing {}", args.model.display()))?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let types: Vec<String> = report
        .tensors_by_type
        .iter()
        .map(|(ty, n)| format!("{n} {ty}"))
        .collect();
    eprintln!(
        "quantize: wrote {} ({:.1} MiB from {:.1} MiB; tensors: {}) in {:.1} s",
        args.output.display(),
        mib(report.output_bytes),
        mib(report.input_bytes),
        types.join(", "),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
