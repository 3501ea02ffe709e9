//! `LLM`: vLLM's offline API. Give it prompts, get every completion back in input order.

use std::time::Instant;

use crate::engine::input_processor::CheckedParams;
use crate::engine::llm_engine::{EngineArgs, EngineError, LLMEngine, PromptInput};
use crate::outputs::{EmbeddingRequestOutput, RequestOutput};
use crate::sampling_params::{PoolingParams, RequestOutputKind, SamplingParams};
use crate::worker::worker_process::Driver;

pub struct LLM {
    engine: LLMEngine,
    next_request: u64,
}

/// The sampling parameters of a `generate` call: one for all prompts, or one per prompt.
pub enum ParamsArg<'a> {
    One(&'a SamplingParams),
    PerPrompt(&'a [SamplingParams]),
}

impl<'a> From<&'a SamplingParams> for ParamsArg<'a> {
    fn from(p: &'a SamplingParams) -> Self {
        ParamsArg::One(p)
    }
}

impl<'a> From<&'a [SamplingParams]> for ParamsArg<'a> {
    fn from(p: &'a [SamplingParams]) -> Self {
        ParamsArg::PerPrompt(p)
    }
}

impl<'a> From<&'a Vec<SamplingParams>> for ParamsArg<'a> {
    fn from(p: &'a Vec<SamplingParams>) -> Self {
        ParamsArg::PerPrompt(p)
    }
}

impl LLM {
    pub fn new(args: &EngineArgs) -> Result<Self, EngineError> {
        Self::with_driver(args, None)
    }

    /// On rank 0 of a tensor-parallel group: see `LLMEngine::from_engine_args_with_driver`.
    pub fn with_driver(args: &EngineArgs, driver: Option<Driver>) -> Result<Self, EngineError> {
        let engine = LLMEngine::from_engine_args_with_driver(args, driver)?;
        Ok(Self::from_engine(engine))
    }

    pub(crate) fn from_engine(engine: LLMEngine) -> Self {
        Self {
            engine,
            next_request: 0,
        }
    }

    pub fn engine(&self) -> &LLMEngine {
        &self.engine
    }

    pub fn engine_mut(&mut self) -> &mut LLMEngine {
        &mut self.engine
    }

    /// Runs all prompts to completion, batched together, and returns their outputs in input
    /// order. An invalid request fails the call before anything runs.
    pub fn generate<'p, P: Into<PromptInput>>(
        &mut self,
        prompts: impl IntoIterator<Item = P>,
        params: impl Into<ParamsArg<'p>>,
        progress: bool,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        let prompts: Vec<PromptInput> = prompts.into_iter().map(Into::into).collect();
        let params = params.into();
        if let ParamsArg::PerPrompt(p) = params {
            if p.len() != prompts.len() {
                return Err(EngineError::Config(format!(
                    "{} sampling parameter sets for {} prompts",
                    p.len(),
                    prompts.len()
                )));
            }
        }
        // Every request is prepared before any is added: one that is refused then leaves
        // nothing to take back.
        let mut prepared = Vec::with_capacity(prompts.len());
        let mut last: Option<CheckedParams> = None;
        for (i, prompt) in prompts.into_iter().enumerate() {
            let p = match params {
                ParamsArg::One(p) => p,
                ParamsArg::PerPrompt(ps) => &ps[i],
            };
            // Only the final outputs are read, so no step builds the others (vLLM does the same).
            let p = SamplingParams {
                output_kind: RequestOutputKind::FinalOnly,
                ..p.clone()
            };
            // Prompts with the same stop strings share one automaton.
            let checked =
                (self.engine.request_checks().check(p, 0))?.with_stop_strings_of(last.as_ref());
            last = Some(checked.clone());
            prepared.push(self.engine.prepare_request(prompt, checked, None)?);
        }
        let base = self.next_request;
        self.next_request += prepared.len() as u64;
        let mut added: Vec<String> = Vec::with_capacity(prepared.len());
        for (i, request) in prepared.into_iter().enumerate() {
            let id = (base + i as u64).to_string();
            if let Err(e) = self.engine.add_prepared_request(id.clone(), request) {
                // Only an id the caller used through `engine_mut` can be refused here.
                for earlier in &added {
                    self.engine.abort_request(earlier);
                }
                return Err(e);
            }
            added.push(id);
        }
        self.run_to_completion(base, added.len(), progress)
    }

    /// vLLM's `LLM.embed`: each prompt's final hidden states pooled (`pooling`: the last
    /// token's or their mean, normalised or not) by a prefill-only pass, the prompts batched
    /// as `generate` batches them; in input order.
    pub fn embed<P: Into<PromptInput>>(
        &mut self,
        prompts: impl IntoIterator<Item = P>,
        pooling: PoolingParams,
        progress: bool,
    ) -> Result<Vec<EmbeddingRequestOutput>, EngineError> {
        let params = SamplingParams {
            pooling: Some(pooling),
            max_tokens: Some(1),
            ..SamplingParams::default()
        };
        let outputs = self.generate(prompts, &params, progress)?;
        Ok(outputs
            .into_iter()
            .map(EmbeddingRequestOutput::from)
            .collect())
    }

    fn run_to_completion(
        &mut self,
        base: u64,
        n: usize,
        progress: bool,
    ) -> Result<Vec<RequestOutput>, EngineError> {
        let mut results: Vec<Option<RequestOutput>> = vec![None; n];
        let bar = progress.then(|| progress_bar(n));
        let start = Instant::now();
        let mut done = 0;
        let mut generated = 0usize;
        while self.engine.has_unfinished_requests() {
            let steps = self.engine.stats().num_steps;
            let outs = self.engine.step()?;
            if self.engine.stats().num_steps == steps {
                // Nothing could be scheduled and nothing is running: waiting cannot help.
                return Err(EngineError::Config(
                    "no request can be scheduled: the KV cache is too small for them".into(),
                ));
            }
            for out in outs {
                if !out.finished {
                    continue;
                }
                let i = out
                    .request_id
                    .parse::<u64>()
                    .ok()
                    .and_then(|id| id.checked_sub(base));
                if let Some(i) = i.filter(|&i| (i as usize) < n) {
                    generated += out.num_generated_tokens();
                    results[i as usize] = Some(out);
                    done += 1;
                    if let Some(bar) = &bar {
                        bar.set_position(done as u64);
                        let secs = start.elapsed().as_secs_f64().max(1e-9);
                        bar.set_message(format!("{:.1} output tokens/s", generated as f64 / secs));
                    }
                }
            }
        }
        if let Some(bar) = bar {
            bar.finish();
        }
        Ok(results
            .into_iter()
            .map(|r| r.expect("every request finishes"))
            .collect())
    }
}

fn progress_bar(n: usize) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(n as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "Processed prompts {pos}/{len} [{elapsed_precise}] {bar:30} {msg}",
        )
        .expect("valid template"),
    );
    bar
}
