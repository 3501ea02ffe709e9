//! Summaries of a serving benchmark, with the field names of vLLM's JSON result.

use serde_json::{json, Map, Value};

use super::client::Outcome;

/// Mean, median, 99th percentile and (population) standard deviation, like numpy's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    pub mean: f64,
    pub median: f64,
    pub p99: f64,
    pub std: f64,
}

/// Zeros for no values, as vLLM reports metrics no request produced.
pub fn stats(values: &[f64]) -> Stats {
    if values.is_empty() {
        return Stats::default();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let mean = sorted.iter().sum::<f64>() / n;
    let var = sorted.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    Stats {
        mean,
        median: percentile(&sorted, 50.0),
        p99: percentile(&sorted, 99.0),
        std: var.sqrt(),
    }
}

/// numpy's default (`linear`) percentile of sorted, non-empty values.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p / 100.0 * (sorted.len() - 1) as f64;
    let (lo, hi) = (rank.floor() as usize, rank.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
}

/// What the run was asked to do, reported beside the measurements.
pub struct Settings {
    pub model_id: String,
    pub tokenizer_id: String,
    pub num_prompts: usize,
    pub request_rate: f64,
    pub max_concurrency: Option<usize>,
}

/// What a burst's TTFT could at best be: its prompts prefilled one after another at the
/// rate the server prefills one prompt alone.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillBound {
    /// Prompt tokens per second, of one request sent alone.
    pub rate: f64,
    pub median_ttft_ms: f64,
}

/// The mixed workload's long prompt (`--long-prompt-len`): its latency alone and with the
/// others arriving during its prefill.
#[derive(Debug, Clone, Copy)]
pub struct LongPrompt {
    pub tokens: usize,
    pub alone_s: f64,
    pub loaded_s: f64,
}

pub struct Report {
    pub settings: Settings,
    pub duration: f64,
    pub completed: usize,
    pub failed: usize,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    /// In milliseconds.
    pub ttft: Stats,
    pub tpot: Stats,
    pub itl: Stats,
    pub e2el: Stats,
    /// For requests sent all at once, when the probe succeeded.
    pub prefill_bound: Option<PrefillBound>,
    pub long_prompt: Option<LongPrompt>,
}

impl Report {
    /// `count_tokens` counts generated text for servers that send no usage.
    pub fn new(
        settings: Settings,
        outcomes: &[Outcome],
        duration: f64,
        count_tokens: impl Fn(&str) -> usize,
    ) -> Report {
        let done: Vec<_> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let (mut ttft, mut tpot, mut itl, mut e2el) = (vec![], vec![], vec![], vec![]);
        let (mut input, mut output) = (0, 0);
        for d in &done {
            let out = d.output_tokens.unwrap_or_else(|| count_tokens(&d.text));
            input += d.prompt_tokens;
            output += out;
            ttft.push(d.ttft * 1e3);
            e2el.push(d.latency * 1e3);
            itl.extend(d.itl.iter().map(|g| g * 1e3));
            // One token has no per-token time after the first.
            if out > 1 {
                tpot.push((d.latency - d.ttft) / (out - 1) as f64 * 1e3);
            }
        }
        Report {
            settings,
            duration,
            completed: done.len(),
            failed: outcomes.len() - done.len(),
            total_input_tokens: input,
            total_output_tokens: output,
            ttft: stats(&ttft),
            tpot: stats(&tpot),
            itl: stats(&itl),
            e2el: stats(&e2el),
            prefill_bound: None,
            long_prompt: None,
        }
    }

    fn per_second(&self, n: usize) -> f64 {
        if self.duration > 0.0 {
            n as f64 / self.duration
        } else {
            0.0
        }
    }

    fn metrics(&self) -> [(&'static str, &'static str, Stats); 4] {
        [
            ("ttft", "TTFT", self.ttft),
            ("tpot", "TPOT", self.tpot),
            ("itl", "ITL", self.itl),
            ("e2el", "E2EL", self.e2el),
        ]
    }

    pub fn to_json(&self) -> Value {
        let s = &self.settings;
        // JSON has no infinity; vLLM writes the string "inf".
        let rate = if s.request_rate.is_finite() {
            json!(s.request_rate)
        } else {
            json!("inf")
        };
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("model_id", json!(s.model_id));
        put("tokenizer_id", json!(s.tokenizer_id));
        put("num_prompts", json!(s.num_prompts));
        put("request_rate", rate);
        put("max_concurrency", json!(s.max_concurrency));
        put("duration", json!(self.duration));
        put("completed", json!(self.completed));
        put("failed", json!(self.failed));
        put("total_input_tokens", json!(self.total_input_tokens));
        put("total_output_tokens", json!(self.total_output_tokens));
        put("request_throughput", json!(self.per_second(self.completed)));
        put(
            "output_throughput",
            json!(self.per_second(self.total_output_tokens)),
        );
        put(
            "total_token_throughput",
            json!(self.per_second(self.total_input_tokens + self.total_output_tokens)),
        );
        for (key, _, st) in self.metrics() {
            put(&format!("mean_{key}_ms"), json!(st.mean));
            put(&format!("median_{key}_ms"), json!(st.median));
            put(&format!("p99_{key}_ms"), json!(st.p99));
            put(&format!("std_{key}_ms"), json!(st.std));
        }
        if let Some(b) = self.prefill_bound {
            put("probe_prefill_throughput", json!(b.rate));
            put("prefill_bound_median_ttft_ms", json!(b.median_ttft_ms));
        }
        if let Some(l) = self.long_prompt {
            put("long_prompt_len", json!(l.tokens));
            put("long_prompt_alone_s", json!(l.alone_s));
            put("long_prompt_under_load_s", json!(l.loaded_s));
        }
        Value::Object(m)
    }

    /// The block `vllm bench serve` prints.
    pub fn table(&self) -> String {
        let mut t = format!("{:=^50}\n", " Serving Benchmark Result ");
        let row = |t: &mut String, label: &str, value: String| {
            t.push_str(&format!("{label:<40} {value}\n"))
        };
        let s = &self.settings;
        row(&mut t, "Successful requests:", self.completed.to_string());
        row(&mut t, "Failed requests:", self.failed.to_string());
        if let Some(c) = s.max_concurrency {
            row(&mut t, "Maximum request concurrency:", c.to_string());
        }
        row(
            &mut t,
            "Request rate configured (RPS):",
            format!("{:.2}", s.request_rate),
        );
        row(
            &mut t,
            "Benchmark duration (s):",
            format!("{:.2}", self.duration),
        );
        row(
            &mut t,
            "Total input tokens:",
            self.total_input_tokens.to_string(),
        );
        row(
            &mut t,
            "Total generated tokens:",
            self.total_output_tokens.to_string(),
        );
        let rates = [
            ("Request throughput (req/s):", self.completed),
            ("Output token throughput (tok/s):", self.total_output_tokens),
            (
                "Total token throughput (tok/s):",
                self.total_input_tokens + self.total_output_tokens,
            ),
        ];
        for (label, n) in rates {
            row(&mut t, label, format!("{:.2}", self.per_second(n)));
        }
        for (_, name, st) in self.metrics() {
            t.push_str(&format!("{:-^50}\n", metric_title(name)));
            row(
                &mut t,
                &format!("Mean {name} (ms):"),
                format!("{:.2}", st.mean),
            );
            row(
                &mut t,
                &format!("Median {name} (ms):"),
                format!("{:.2}", st.median),
            );
            if let (Some(b), "TTFT") = (self.prefill_bound, name) {
                row(
                    &mut t,
                    "Prefill-bound median TTFT (ms):",
                    format!("{:.2}", b.median_ttft_ms),
                );
            }
            row(
                &mut t,
                &format!("P99 {name} (ms):"),
                format!("{:.2}", st.p99),
            );
        }
        if let Some(b) = self.prefill_bound {
            row(&mut t, "Prefill alone (tok/s):", format!("{:.2}", b.rate));
        }
        if let Some(l) = self.long_prompt {
            t.push_str(&format!("{:-^50}\n", "Long Prompt"));
            row(&mut t, "Long prompt (tokens):", l.tokens.to_string());
            row(&mut t, "Alone (s):", format!("{:.2}", l.alone_s));
            row(&mut t, "Under the load (s):", format!("{:.2}", l.loaded_s));
        }
        t.push_str(&"=".repeat(50));
        t
    }
}

fn metric_title(name: &str) -> &'static str {
    match name {
        "TTFT" => "Time to First Token",
        "TPOT" => "Time per Output Token (excl. 1st token)",
        "ITL" => "Inter-token Latency",
        _ => "End-to-end Latency",
    }
}

#[cfg(test)]
mod tests {
    use super::super::client::Success;
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn stats_match_numpy() {
        // np.mean/median/percentile(.., 99)/std of [1, 2, 3, 4, 10]
        let s = stats(&[4.0, 1.0, 10.0, 3.0, 2.0]);
        assert!(close(s.mean, 4.0));
        assert!(close(s.median, 3.0));
        assert!(close(s.p99, 9.76), "{}", s.p99);
        assert!(close(s.std, 10f64.sqrt()), "{}", s.std);
        // Even count: the median interpolates between the middle two.
        let s = stats(&[1.0, 2.0, 3.0, 4.0]);
        assert!(close(s.median, 2.5));
        assert!(close(s.p99, 3.97));
        assert_eq!(
            stats(&[7.0]),
            Stats {
                mean: 7.0,
                median: 7.0,
                p99: 7.0,
                std: 0.0
            }
        );
        assert_eq!(stats(&[]), Stats::default());
    }

    fn settings() -> Settings {
        Settings {
            model_id: "m".into(),
            tokenizer_id: "t".into(),
            num_prompts: 3,
            request_rate: f64::INFINITY,
            max_concurrency: Some(2),
        }
    }

    #[test]
    fn report_counts_only_completed_requests() {
        let ok = Success {
            ttft: 0.1,
            itl: vec![0.05, 0.05],
            latency: 0.2,
            text: "abc".into(),
            prompt_tokens: 10,
            output_tokens: Some(3),
        };
        let no_usage = Success {
            output_tokens: None,
            ..ok.clone()
        };
        let outcomes = vec![Ok(ok), Ok(no_usage), Err("HTTP 500".into())];
        let r = Report::new(settings(), &outcomes, 2.0, |t| t.len() + 1);
        assert_eq!((r.completed, r.failed), (2, 1));
        assert_eq!((r.total_input_tokens, r.total_output_tokens), (20, 7));
        assert!(close(r.ttft.mean, 100.0));
        // (200 - 100) ms over 2 and over 3 tokens after the first.
        assert!(close(r.tpot.mean, (50.0 + 100.0 / 3.0) / 2.0));
        assert!(close(r.itl.median, 50.0));
        let j = r.to_json();
        assert_eq!(j["request_rate"], "inf");
        assert_eq!(j["max_concurrency"], 2);
        assert!(close(j["output_throughput"].as_f64().unwrap(), 3.5));
        assert!(close(j["p99_e2el_ms"].as_f64().unwrap(), 200.0));
        assert!(r
            .table()
            .contains("Successful requests:                     2"));
        assert!(j.get("prefill_bound_median_ttft_ms").is_none());
        let r = Report {
            prefill_bound: Some(PrefillBound {
                rate: 400.0,
                median_ttft_ms: 1850.0,
            }),
            ..r
        };
        assert_eq!(r.to_json()["prefill_bound_median_ttft_ms"], 1850.0);
        assert!(r
            .table()
            .contains("Prefill-bound median TTFT (ms):          1850.00"));
    }
}
