//! `minivllm bench sweep`: offline throughput at each of several batch sizes, as a table and
//! an SVG chart of output tokens per second against the number of sequences.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use minivllm::entrypoints::llm::LLM;
use minivllm::sampling_params::SamplingParams;

use crate::bench::{random_prompts, Environment};

#[derive(clap::Args)]
pub struct SweepArgs {
    #[command(flatten)]
    engine: crate::EngineFlags,
    /// Numbers of sequences to run at once, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    num_seqs: Vec<usize>,
    /// Tokens per (random) prompt.
    #[arg(long, default_value_t = 128)]
    input_len: usize,
    /// Tokens generated per sequence (EOS ignored).
    #[arg(long, default_value_t = 128)]
    output_len: usize,
    /// Where to write the chart.
    #[arg(long, default_value = "throughput.svg")]
    svg: PathBuf,
    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
}

/// One batch size's result.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
struct Point {
    num_seqs: usize,
    output_tokens_per_second: f64,
}

impl SweepArgs {
    pub fn model_args(&self) -> &crate::ModelArgs {
        &self.engine.model
    }
}

pub fn run(
    args: SweepArgs,
    driver: Option<minivllm::worker::worker_process::Driver>,
) -> anyhow::Result<()> {
    if args.num_seqs.is_empty() || args.num_seqs.contains(&0) {
        bail!("--num-seqs must list positive numbers of sequences");
    }
    if args.input_len == 0 || args.output_len == 0 {
        bail!("--input-len and --output-len must be positive");
    }
    let mut llm = LLM::with_driver(&args.engine.engine_args()?, driver)?;
    let vocab = llm.engine().tokenizer().vocab_size() as u64;
    // Each run (and the warm-up) gets prompts of its own: repeating earlier ones would hit
    // the prefix cache.
    let total: usize = 1 + args.num_seqs.iter().sum::<usize>();
    let mut prompts = random_prompts(total, args.input_len, vocab).into_iter();
    let params = SamplingParams {
        temperature: 0.0,
        ignore_eos: true,
        max_tokens: Some(args.output_len),
        ..SamplingParams::default()
    };
    // Untimed: page faults and thread start-up would otherwise land on the first size.
    llm.generate(prompts.by_ref().take(1).collect::<Vec<_>>(), &params, false)?;
    let mut points = Vec::new();
    for &n in &args.num_seqs {
        let batch: Vec<Vec<u32>> = prompts.by_ref().take(n).collect();
        let start = Instant::now();
        let outs = llm.generate(batch, &params, false)?;
        let secs = start.elapsed().as_secs_f64();
        let tokens: usize = outs.iter().map(|o| o.num_generated_tokens()).sum();
        let p = Point {
            num_seqs: n,
            output_tokens_per_second: tokens as f64 / secs,
        };
        if !args.json {
            println!(
                "{n:>4} sequences: {:>7.1} output tokens/s",
                p.output_tokens_per_second
            );
        }
        points.push(p);
    }
    let env = Environment::now();
    let title = format!(
        "{} · {} ({} in + {} out per sequence)",
        args.engine.model.model, env.cpu, args.input_len, args.output_len
    );
    let subtitle = format!(
        "isa {}, {} threads, --dtype {}, KV cache {}",
        env.isa,
        env.threads,
        format!("{:?}", args.engine.model.dtype).to_lowercase(),
        args.engine
            .model
            .kv_cache_dtype
            .resolve(args.engine.model.dtype)
    );
    std::fs::write(&args.svg, chart(&points, &title, &subtitle))
        .with_context(|| format!("cannot write {}", args.svg.display()))?;
    if args.json {
        let mut report = serde_json::json!({ "points": points, "svg": args.svg });
        env.add_to(&mut report);
        println!("{report}");
    } else {
        env.print();
        println!("chart written to {}", args.svg.display());
    }
    Ok(())
}

/// An SVG line chart of `points`: sequences on a log2 axis, tokens/s from zero.
fn chart(points: &[Point], title: &str, subtitle: &str) -> String {
    const W: f64 = 720.0;
    const H: f64 = 420.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 30.0;
    const TOP: f64 = 70.0;
    const BOTTOM: f64 = 60.0;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let log2 = |n: usize| (n as f64).log2();
    let x_max = points.iter().map(|p| log2(p.num_seqs)).fold(0.0, f64::max);
    let x_min = points
        .iter()
        .map(|p| log2(p.num_seqs))
        .fold(x_max, f64::min);
    let y_top = nice_ceiling(
        points
            .iter()
            .map(|p| p.output_tokens_per_second)
            .fold(0.0, f64::max),
    );
    let x = |n: usize| LEFT + pw * (log2(n) - x_min) / (x_max - x_min).max(1.0);
    let y = |v: f64| TOP + ph * (1.0 - v / y_top);
    let mut svg = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{LEFT}" y="24" font-size="14" font-weight="bold">{}</text>
<text x="{LEFT}" y="44" fill="#555">{}</text>
"##,
        escape(title),
        escape(subtitle)
    );
    for i in 0..=5 {
        let v = y_top * i as f64 / 5.0;
        let yy = y(v);
        svg += &format!(
            "<line x1=\"{LEFT}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>\n",
            LEFT + pw,
            LEFT - 8.0,
            yy + 4.0
        );
    }
    for p in points {
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n",
            x(p.num_seqs),
            TOP + ph + 20.0,
            p.num_seqs
        );
    }
    let line: Vec<String> = points
        .iter()
        .map(|p| format!("{:.1},{:.1}", x(p.num_seqs), y(p.output_tokens_per_second)))
        .collect();
    svg += &format!(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n",
        line.join(" ")
    );
    for p in points {
        let (cx, cy) = (x(p.num_seqs), y(p.output_tokens_per_second));
        svg += &format!(
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"3.5\" fill=\"#1f77b4\"/>\n\
             <text x=\"{cx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#1f77b4\">{:.0}</text>\n",
            cy - 8.0,
            p.output_tokens_per_second
        );
    }
    svg += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">sequences at once (log scale)</text>\n\
         <text transform=\"translate(18,{:.1}) rotate(-90)\" text-anchor=\"middle\">output tokens/s</text>\n</svg>\n",
        LEFT + pw / 2.0,
        H - 12.0,
        TOP + ph / 2.0
    );
    svg
}

/// The smallest of 1, 2 or 5 times a power of ten that is at least `v` (an axis top).
fn nice_ceiling(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(v.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * p)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_tops_are_round() {
        assert_eq!(nice_ceiling(174.0), 200.0);
        assert_eq!(nice_ceiling(200.0), 200.0);
        assert_eq!(nice_ceiling(201.0), 500.0);
        assert_eq!(nice_ceiling(0.3), 0.5);
        assert_eq!(nice_ceiling(0.0), 1.0);
    }

    #[test]
    fn chart_places_each_point_and_escapes_text() {
        let points = [1, 4, 64].map(|n| Point {
            num_seqs: n,
            output_tokens_per_second: 3.0 * n as f64,
        });
        let svg = chart(&points, "a <b> & c", "sub");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt; &amp; c"));
        assert_eq!(svg.matches("<circle").count(), 3);
        // x: log2 over 1..64 spans the plot (70..690); y: 192 tok/s against a top of 200.
        assert!(svg.contains("cx=\"70.0\""), "{svg}");
        assert!(svg.contains("cx=\"690.0\""), "{svg}");
        let top_y = 70.0 + 290.0 * (1.0 - 192.0 / 200.0);
        assert!(svg.contains(&format!("cy=\"{top_y:.1}\"")), "{svg}");
        assert!(svg.contains(">192</text>"));
    }
}
