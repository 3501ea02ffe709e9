//! Serving metrics in Prometheus' text format.
//!
//! Names, units, buckets and labels are vLLM's (`vllm:` prefix, `model_name` label), so the
//! Grafana dashboards and alerts written for vLLM read a mini-vllm server unchanged.

use crate::core::scheduler::Scheduler;
use crate::core::spec_decode_stats::SpecDecodingStats;
use crate::spec_decode::draft_length::DraftLength;
use std::fmt::Write;
use std::time::Instant;

use crate::sequence::FinishReason;
use crate::structured_output::GrammarStats;

/// Counters for logs and `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    /// Fraction of KV blocks in use.
    pub kv_cache_usage: f32,
    /// Bytes of the blocks handed out at least once: the KV cache's resident memory (its
    /// pages are allocated on first write and kept).
    pub kv_cache_touched_bytes: u64,
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Prompt tokens whose KV was pulled from a prefill server instead of computed.
    pub external_prefix_cache_hits: u64,
    /// Preemptions of both kinds, swaps and recomputes.
    pub num_preemptions: u64,
    pub num_swapped: usize,
    pub num_swapped_out: u64,
    pub num_swapped_in: u64,
    /// Tokens fed to the model (prompt chunks, recomputes and decodes).
    pub num_computed_tokens: u64,
    pub num_prompt_tokens: u64,
    pub num_generation_tokens: u64,
    pub num_steps: u64,
    /// Seconds in `LLMEngine::step`, over the steps that ran a batch.
    pub step_seconds: f64,
    /// Of those, seconds in the model's forward pass; the rest is the step's overhead
    /// (scheduling, batch preparation, sampling, detokenizing, outputs).
    pub forward_seconds: f64,
    /// Structured output's cost (part of the overhead).
    pub grammar: GrammarStats,
    /// Speculative decoding's drafts and what was kept of them.
    pub spec_decode: SpecDecodingStats,
    /// The step and guess costs speculative decoding measured, which set how long its
    /// drafts are.
    pub spec_draft_length: Option<DraftLength>,
    /// Request latencies and outcomes.
    pub requests: RequestHistograms,
}

impl EngineStats {
    /// Seconds of the steps spent outside the model's forward pass.
    pub fn overhead_seconds(&self) -> f64 {
        (self.step_seconds - self.forward_seconds).max(0.0)
    }

    /// Fraction of looked-up prompt tokens found in the prefix cache.
    pub(crate) fn prefix_cache_hit_rate(&self) -> f64 {
        if self.prefix_cache_queries == 0 {
            0.0
        } else {
            self.prefix_cache_hits as f64 / self.prefix_cache_queries as f64
        }
    }
}

/// What the engine counts itself, step by step; the rest of [`EngineStats`] is read from
/// the scheduler, the cache and the output processor when asked.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EngineCounters {
    pub(crate) num_computed_tokens: u64,
    pub(crate) num_prompt_tokens: u64,
    pub(crate) num_generation_tokens: u64,
    pub(crate) num_steps: u64,
    pub(crate) step_seconds: f64,
    pub(crate) forward_seconds: f64,
}

impl EngineCounters {
    /// The engine's stats: these counters, and what the scheduler, the KV cache manager and
    /// the output processor (`requests`) hold, read now.
    pub(crate) fn stats(
        &self,
        scheduler: &Scheduler,
        bytes_per_block: usize,
        requests: &RequestHistograms,
    ) -> EngineStats {
        let bm = scheduler.kv_cache_manager();
        let pc = bm.prefix_cache_stats();
        EngineStats {
            num_running: scheduler.num_running(),
            num_waiting: scheduler.num_waiting(),
            kv_cache_usage: bm.usage(),
            kv_cache_touched_bytes: (bm.num_blocks_ever_used() as u64)
                .saturating_mul(bytes_per_block as u64),
            prefix_cache_queries: pc.queries,
            prefix_cache_hits: pc.hits,
            external_prefix_cache_hits: scheduler.num_external_kv_tokens(),
            num_preemptions: scheduler.num_preemptions(),
            num_swapped: scheduler.num_swapped(),
            num_swapped_out: scheduler.num_swapped_out(),
            num_swapped_in: scheduler.num_swapped_in(),
            grammar: scheduler.grammar_stats(),
            spec_decode: scheduler.spec_decode_stats(),
            spec_draft_length: scheduler.draft_length().copied(),
            requests: *requests,
            num_computed_tokens: self.num_computed_tokens,
            num_prompt_tokens: self.num_prompt_tokens,
            num_generation_tokens: self.num_generation_tokens,
            num_steps: self.num_steps,
            step_seconds: self.step_seconds,
            forward_seconds: self.forward_seconds,
        }
    }
}

/// Rates between two stats snapshots, for vLLM-style periodic log lines.
pub(crate) struct StatsLogger {
    last: Instant,
    prompt_tokens: u64,
    generation_tokens: u64,
}

impl StatsLogger {
    const INTERVAL_S: f64 = 5.0;

    pub(crate) fn new() -> Self {
        Self {
            last: Instant::now(),
            prompt_tokens: 0,
            generation_tokens: 0,
        }
    }

    pub(crate) fn maybe_log(&mut self, s: &EngineStats) {
        let secs = self.last.elapsed().as_secs_f64();
        if secs < Self::INTERVAL_S {
            return;
        }
        // Each decode feeds back the token it sampled; the rest of the computed tokens are
        // prompt (or recomputed) tokens.
        let prompt = s.num_computed_tokens - s.num_generation_tokens;
        tracing::info!(
            prompt_tokens_per_s = format!("{:.1}", (prompt - self.prompt_tokens) as f64 / secs),
            generation_tokens_per_s = format!(
                "{:.1}",
                (s.num_generation_tokens - self.generation_tokens) as f64 / secs
            ),
            running = s.num_running,
            waiting = s.num_waiting,
            swapped = s.num_swapped,
            kv_cache_usage = format!("{:.1}%", 100.0 * s.kv_cache_usage),
            prefix_cache_hit_rate = format!("{:.1}%", 100.0 * s.prefix_cache_hit_rate()),
            "engine stats"
        );
        self.last = Instant::now();
        self.prompt_tokens = prompt;
        self.generation_tokens = s.num_generation_tokens;
    }
}

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];
const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0,
    50000.0, 100000.0,
];

/// The most buckets a histogram has (TTFT's 22).
const MAX_BUCKETS: usize = 24;

/// A Prometheus histogram: counts per bucket (not cumulative until rendered), sum and count.
/// Fixed-size, so that the engine's stats snapshot after each step copies it without
/// allocating.
#[derive(Debug, Clone, Copy)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: [u64; MAX_BUCKETS],
    sum: f64,
    count: u64,
}

impl Histogram {
    const fn new(bounds: &'static [f64]) -> Self {
        assert!(bounds.len() <= MAX_BUCKETS);
        Self {
            bounds,
            counts: [0; MAX_BUCKETS],
            sum: 0.0,
            count: 0,
        }
    }

    pub(crate) fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn sum(&self) -> f64 {
        self.sum
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        header(out, name, "histogram", help);
        let mut cumulative = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cumulative += c;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, v: f64) {
    header(out, name, kind, help);
    let _ = writeln!(out, "{name}{{{labels}}} {v:?}");
}

/// Per-request latency histograms and outcome counters (vLLM's request-level Prometheus
/// metrics), observed by the engine's output processor at the moments it stamps each
/// request's [`RequestMetrics`](crate::outputs::RequestMetrics): one clock and one owner
/// for a request's times, which reach `/metrics` in the engine's stats snapshot.
#[derive(Debug, Clone, Copy)]
pub struct RequestHistograms {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub time_per_output_token: Histogram,
    pub e2e_latency: Histogram,
    pub prompt_tokens: Histogram,
    pub generation_tokens: Histogram,
    /// Finished requests by reason: stop, length, abort, error.
    pub success: [u64; 4],
}

impl Default for RequestHistograms {
    fn default() -> Self {
        Self {
            time_to_first_token: Histogram::new(TTFT_BUCKETS),
            inter_token_latency: Histogram::new(TPOT_BUCKETS),
            time_per_output_token: Histogram::new(TPOT_BUCKETS),
            e2e_latency: Histogram::new(E2E_BUCKETS),
            prompt_tokens: Histogram::new(TOKEN_BUCKETS),
            generation_tokens: Histogram::new(TOKEN_BUCKETS),
            success: [0; 4],
        }
    }
}

const REASONS: [&str; 4] = ["stop", "length", "abort", "error"];

/// What a finished request's histograms take: its times (seconds, from its
/// [`RequestMetrics`](crate::outputs::RequestMetrics)) and token counts over all its
/// completions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FinishedRequest {
    pub reason: Option<FinishReason>,
    pub e2e_latency: f64,
    pub num_prompt_tokens: usize,
    pub num_generation_tokens: usize,
    /// `last_token_time - first_token_time`, where there were tokens.
    pub decode_time: Option<f64>,
    /// Tokens of its longest completion: the per-token time is `decode_time` over these
    /// (less the first), as vLLM measures each of a request's `n` sequences on its own.
    pub num_decode_tokens: usize,
}

impl RequestHistograms {
    /// A step gave a request new tokens: its first (`since_previous` `None`, `latency` since
    /// arrival) or later ones (`since_previous` since the step that gave the previous ones).
    pub(crate) fn on_tokens(&mut self, latency: f64, since_previous: Option<f64>) {
        match since_previous {
            None => self.time_to_first_token.observe(latency),
            Some(gap) => self.inter_token_latency.observe(gap),
        }
    }

    pub(crate) fn on_finished(&mut self, f: &FinishedRequest) {
        self.e2e_latency.observe(f.e2e_latency);
        self.prompt_tokens.observe(f.num_prompt_tokens as f64);
        self.generation_tokens
            .observe(f.num_generation_tokens as f64);
        let tokens = f.num_decode_tokens;
        if let (Some(decode), true) = (f.decode_time, tokens > 1) {
            self.time_per_output_token
                .observe(decode / (tokens - 1) as f64);
        }
        self.count(f.reason);
    }

    /// A request ended before it finished: `Abort` (its caller gave up) or `Error` (a step
    /// failed under it).
    pub(crate) fn on_ended_early(&mut self, reason: FinishReason) {
        self.count(Some(reason));
    }

    fn count(&mut self, reason: Option<FinishReason>) {
        let at = match reason {
            Some(FinishReason::Length) => 1,
            Some(FinishReason::Abort) => 2,
            Some(FinishReason::Error) => 3,
            _ => 0,
        };
        self.success[at] += 1;
    }
}

impl EngineStats {
    /// The whole exposition, vLLM's names: engine gauges and counters, then the request
    /// histograms.
    pub(crate) fn render_prometheus(&self, model_name: &str) -> String {
        let stats = self;
        let labels = format!("model_name=\"{}\"", escape_label(model_name));
        let l = labels.as_str();
        let mut out = String::with_capacity(16 << 10);
        let gauges: [(&str, &str, f64); 4] = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                stats.num_running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                stats.num_waiting as f64,
            ),
            (
                "vllm:num_requests_swapped",
                "Number of requests swapped to CPU.",
                stats.num_swapped as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                f64::from(stats.kv_cache_usage),
            ),
        ];
        for (name, help, v) in gauges {
            sample(&mut out, name, "gauge", help, l, v);
        }
        sample(
            &mut out,
            "minivllm:kv_cache_touched_bytes",
            "gauge",
            "Bytes of KV-cache blocks written at least once: the cache's resident memory.",
            l,
            stats.kv_cache_touched_bytes as f64,
        );
        // Prometheus' process collector's name, which vLLM's /metrics has too.
        if let Some(rss) = crate::utils::proc_kib_field("/proc/self/status", "VmRSS") {
            let help = "Resident memory size in bytes.";
            header(&mut out, "process_resident_memory_bytes", "gauge", help);
            let _ = writeln!(out, "process_resident_memory_bytes {rss}");
        }
        let counters: [(&str, &str, u64); 6] = [
            (
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                stats.num_prompt_tokens,
            ),
            (
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                stats.num_generation_tokens,
            ),
            (
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                stats.prefix_cache_queries,
            ),
            (
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                stats.prefix_cache_hits,
            ),
            (
                "vllm:external_prefix_cache_hits_total",
                "Prompt tokens whose KV was pulled from a prefill server (KV connector).",
                stats.external_prefix_cache_hits,
            ),
            (
                "vllm:num_preemptions_total",
                "Cumulative number of preemptions from the engine.",
                stats.num_preemptions,
            ),
        ];
        for (name, help, v) in counters {
            sample(&mut out, name, "counter", help, l, v as f64);
        }
        let spec = &stats.spec_decode;
        if spec.num_drafts > 0 {
            for (name, help, v) in [
                (
                    "vllm:spec_decode_num_drafts_total",
                    "Number of spec decoding drafts.",
                    spec.num_drafts,
                ),
                (
                    "vllm:spec_decode_num_draft_tokens_total",
                    "Number of draft tokens.",
                    spec.num_draft_tokens,
                ),
                (
                    "vllm:spec_decode_num_accepted_tokens_total",
                    "Number of accepted tokens.",
                    spec.num_accepted_tokens,
                ),
            ] {
                sample(&mut out, name, "counter", help, l, v as f64);
            }
            let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
            header(
                &mut out,
                name,
                "counter",
                "Accepted tokens per draft position.",
            );
            let per_pos = &spec.num_accepted_tokens_per_pos[..spec.max_draft_len];
            for (pos, n) in per_pos.iter().enumerate() {
                let _ = writeln!(out, "{name}{{{l},position=\"{pos}\"}} {n}");
            }
        }
        let name = "vllm:request_success_total";
        header(
            &mut out,
            name,
            "counter",
            "Count of finished requests by reason.",
        );
        for (reason, n) in REASONS.iter().zip(stats.requests.success) {
            let _ = writeln!(out, "{name}{{{l},finished_reason=\"{reason}\"}} {n}");
        }
        stats.requests.render(&mut out, l);
        out
    }
}

impl RequestHistograms {
    fn render(&self, out: &mut String, l: &str) {
        let histograms = [
            (
                &self.time_to_first_token,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            ),
            (
                &self.inter_token_latency,
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
            ),
            (
                &self.time_per_output_token,
                "vllm:request_time_per_output_token_seconds",
                "Histogram of time_per_output_token_seconds per request.",
            ),
            (
                &self.e2e_latency,
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
            ),
            (
                &self.prompt_tokens,
                "vllm:request_prompt_tokens",
                "Number of prefill tokens processed.",
            ),
            (
                &self.generation_tokens,
                "vllm:request_generation_tokens",
                "Number of generation tokens processed.",
            ),
        ];
        for (h, name, help) in histograms {
            h.render(out, name, l, help);
        }
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_in_the_text() {
        let mut h = Histogram::new(&[1.0, 2.0]);
        for v in [0.5, 1.5, 1.5, 9.0] {
            h.observe(v);
        }
        let mut s = String::new();
        h.render(&mut s, "x", "a=\"b\"", "help");
        assert!(s.contains("x_bucket{a=\"b\",le=\"1.0\"} 1\n"), "{s}");
        assert!(s.contains("x_bucket{a=\"b\",le=\"2.0\"} 3\n"), "{s}");
        assert!(s.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{s}");
        assert!(s.contains("x_sum{a=\"b\"} 12.5\n"), "{s}");
        assert!(s.contains("x_count{a=\"b\"} 4\n"), "{s}");
    }

    #[test]
    fn request_timings_feed_the_histograms() {
        let mut m = RequestHistograms::default();
        m.on_tokens(0.1, None);
        m.on_tokens(0.13, Some(0.03));
        m.on_tokens(0.17, Some(0.04));
        m.on_finished(&FinishedRequest {
            reason: Some(FinishReason::Length),
            e2e_latency: 0.17,
            num_prompt_tokens: 3,
            num_generation_tokens: 3,
            decode_time: Some(0.07),
            num_decode_tokens: 3,
        });
        assert_eq!(m.time_to_first_token.count(), 1);
        assert!((m.time_to_first_token.sum() - 0.1).abs() < 1e-9);
        assert_eq!(m.inter_token_latency.count(), 2);
        assert!((m.inter_token_latency.sum() - 0.07).abs() < 1e-9);
        assert!((m.time_per_output_token.sum() - 0.035).abs() < 1e-9);
        assert!((m.e2e_latency.sum() - 0.17).abs() < 1e-9);
        assert_eq!(m.generation_tokens.sum(), 3.0);
        assert_eq!(m.success, [0, 1, 0, 0]);
        m.on_ended_early(FinishReason::Abort);
        m.on_ended_early(FinishReason::Error);
        assert_eq!(m.success, [0, 1, 1, 1]);
    }

    #[test]
    fn exposition_has_vllm_names_and_labels() {
        let stats = EngineStats {
            num_running: 2,
            kv_cache_usage: 0.25,
            num_prompt_tokens: 6,
            num_generation_tokens: 4,
            kv_cache_touched_bytes: 1 << 20,
            ..EngineStats::default()
        };
        let text = stats.render_prometheus("sm\"ol");
        let l = "{model_name=\"sm\\\"ol\"}";
        assert!(text.contains(&format!("vllm:num_requests_running{l} 2.0\n")));
        assert!(text.contains(&format!("vllm:kv_cache_usage_perc{l} 0.25\n")));
        assert!(text.contains(&format!("minivllm:kv_cache_touched_bytes{l} 1048576.0\n")));
        assert!(text.contains("process_resident_memory_bytes "));
        assert!(text.contains(&format!("vllm:prompt_tokens_total{l} 6.0\n")));
        assert!(text.contains(&format!("vllm:generation_tokens_total{l} 4.0\n")));
        assert!(text.contains("# TYPE vllm:time_to_first_token_seconds histogram\n"));
        assert!(text.contains("finished_reason=\"abort\"} 0\n"));
        assert!(
            !text.contains("spec_decode"),
            "no speculative decoding, no counters"
        );
        let mut spec = SpecDecodingStats::default();
        spec.observe(3, 1);
        let text = EngineStats {
            spec_decode: spec,
            ..EngineStats::default()
        }
        .render_prometheus("m");
        assert!(text.contains("vllm:spec_decode_num_draft_tokens_total{model_name=\"m\"} 3.0\n"));
        assert!(text.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"m\",position=\"0\"} 1\n"));
        assert!(text.contains("position=\"2\"} 0\n"));
    }
}
