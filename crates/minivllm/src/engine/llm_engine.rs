//! `LLMEngine`: requests in, one batched step at a time, `RequestOutput`s out.
//!
//! A step is a short pipeline of owned parts: the scheduler decides what runs, the model
//! runner lays it out and runs the model, the sampler picks tokens, and the output
//! processor turns them into text and outputs.

use std::sync::Arc;
use std::time::Instant;

use crate::core::policy::Policy;
use crate::core::scheduler::{ScheduledSeq, Scheduler};
pub use crate::engine::arg_utils::{check_width, resolve_max_model_len, width, EngineArgs};
use crate::engine::arg_utils::{kv_cache_manager, scheduler_config};
pub use crate::engine::errors::EngineError;
pub use crate::engine::input_processor::PromptInput;
use crate::engine::input_processor::{process_prompt, PromptLimits};
pub use crate::engine::metrics::EngineStats;
use crate::engine::metrics::StatsLogger;
use crate::engine::output_processor::OutputProcessor;
use crate::engine::tokenizer::{load_tokenizer, Tokenizer};
use crate::engine::worker_process::{driver_group, model_runner};
use crate::model_executor::layers::sampler::Sampler;
use crate::model_executor::model_loader::load_model_shard;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::outputs::RequestOutput;
use crate::sampling_params::{SamplingParams, ValidationError, MAX_LOGPROBS};
use crate::sequence::{RequestId, SeqId, Sequence};
use crate::worker::model_runner::{LogitsRows, ModelRunner, SeqInput};

pub struct LLMEngine {
    runner: ModelRunner,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    sampler: Sampler,
    outputs: OutputProcessor,
    limits: PromptLimits,
    max_num_seqs: usize,
    next_arrival: u64,
    /// Where each scheduled sequence's logits are; reused between steps.
    rows: Vec<LogitsRows>,
    stats: EngineStats,
    stats_logger: StatsLogger,
    started: Instant,
}

impl LLMEngine {
    /// Loads the model named by `args.model` (this rank's shard, with tensor parallelism)
    /// and sizes the KV cache. With tensor parallelism only rank 0 has an engine: the other
    /// ranks run workers ([`start_rank`](crate::engine::worker_process::start_rank)).
    pub fn from_engine_args(args: &EngineArgs) -> Result<Self, EngineError> {
        let group = driver_group(args)?;
        // The tokenizer first: what building it holds for a moment (a 262k-token
        // vocabulary's maps) then does not come on top of the weights.
        let tokenizer = load_tokenizer(&args.model)?;
        log_rss("tokenizer built");
        let loaded = load_model_shard(&args.model, &args.load, group)?;
        log_rss("weights loaded");
        let engine = Self::new(loaded.model, tokenizer, args);
        log_rss("KV cache allocated");
        engine
    }

    /// Builds an engine around an already loaded model.
    pub fn new(
        model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        args: &EngineArgs,
    ) -> Result<Self, EngineError> {
        let vocab_size = model.config().vocab_size;
        let (runner, max_model_len) = model_runner(model, args)?;
        let cache = runner.cache();
        let sched_cfg = scheduler_config(args, max_model_len)?;
        let kv_cache_manager = kv_cache_manager(args, cache);
        let tokenizer = Arc::new(tokenizer);
        Ok(Self {
            runner,
            outputs: OutputProcessor::new(Arc::clone(&tokenizer), max_model_len),
            tokenizer,
            scheduler: Scheduler::new(sched_cfg, kv_cache_manager),
            sampler: Sampler::default(),
            limits: PromptLimits {
                max_model_len,
                vocab_size,
            },
            max_num_seqs: args.max_num_seqs,
            next_arrival: 0,
            rows: Vec::new(),
            stats: EngineStats::default(),
            stats_logger: StatsLogger::new(),
            started: Instant::now(),
        })
    }

    /// The model the engine runs (for benchmarks' accounting of FLOPs and bytes).
    pub fn model(&self) -> &crate::model_executor::models::llama::LlamaForCausalLM {
        self.runner.model()
    }

    /// Bytes of KV cache one token position takes, over all layers.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.runner.cache().kv_bytes_per_position()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    pub fn max_model_len(&self) -> usize {
        self.limits.max_model_len
    }

    /// Most sequences one step runs (`--max-num-seqs`), and so the widest a request may be
    /// (`n`, or `best_of` when larger).
    pub fn max_num_seqs(&self) -> usize {
        self.max_num_seqs
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// Gives back the memory a past large batch left in the step buffers; the async engine
    /// calls it whenever it goes idle.
    pub fn release_idle_memory(&mut self) {
        self.runner.release_idle_memory();
    }

    pub fn num_unfinished_requests(&self) -> usize {
        self.outputs.len()
    }

    /// The sequences waiting to be admitted: a request of `n` (or `best_of`) completions
    /// waits as that many.
    pub fn num_waiting_sequences(&self) -> usize {
        self.scheduler.num_waiting()
    }

    pub fn stats(&self) -> EngineStats {
        let bm = self.scheduler.kv_cache_manager();
        let pc = bm.prefix_cache_stats();
        EngineStats {
            num_running: self.scheduler.num_running(),
            num_waiting: self.scheduler.num_waiting(),
            kv_cache_usage: bm.usage(),
            prefix_cache_queries: pc.queries,
            prefix_cache_hits: pc.hits,
            num_preemptions: self.scheduler.num_preemptions(),
            num_swapped: self.scheduler.num_swapped(),
            num_swapped_out: self.scheduler.num_swapped_out(),
            num_swapped_in: self.scheduler.num_swapped_in(),
            ..self.stats.clone()
        }
    }

    /// Seconds since the engine started (for throughput figures).
    pub fn uptime(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// KV blocks not held by any sequence (free or only in the prefix cache).
    pub fn num_free_blocks(&self) -> usize {
        self.scheduler.kv_cache_manager().num_free_blocks()
    }

    pub fn num_total_blocks(&self) -> usize {
        self.scheduler.kv_cache_manager().num_blocks()
    }

    /// Blocks of the CPU swap pool not held by a swapped-out sequence.
    pub fn num_free_cpu_blocks(&self) -> usize {
        self.scheduler.num_free_cpu_blocks()
    }

    pub fn num_total_cpu_blocks(&self) -> usize {
        self.scheduler.num_cpu_blocks()
    }

    /// Validates and queues a request. Errors leave the engine and other requests untouched.
    pub fn add_request(
        &mut self,
        request_id: impl Into<String>,
        prompt: PromptInput,
        params: SamplingParams,
        priority: i32,
    ) -> Result<(), EngineError> {
        let request_id = RequestId(request_id.into());
        if self.outputs.contains(&request_id) {
            return Err(EngineError::DuplicateRequest(request_id.0));
        }
        params.validate()?;
        params.validate_for_model(self.tokenizer.vocab_size(), MAX_LOGPROBS)?;
        check_width(&params, self.max_num_seqs)?;
        // vLLM refuses it too: under FCFS a priority would be silently ignored.
        if priority != 0 && self.scheduler.config().policy != Policy::Priority {
            return Err(ValidationError::new(
                Some("priority"),
                format!("Got priority {priority} but Priority scheduling is not enabled."),
            )
            .into());
        }
        let prompt = process_prompt(&self.tokenizer, prompt, &self.limits)?;
        self.stats.num_prompt_tokens += prompt.token_ids.len() as u64;
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let seqs = self
            .outputs
            .add_request(request_id, prompt, params, priority, arrival);
        for seq in seqs {
            self.scheduler.add_seq(seq);
        }
        Ok(())
    }

    /// Drops a request and frees its blocks; unknown ids are ignored (it may have just finished).
    pub fn abort_request(&mut self, request_id: &str) {
        for id in self
            .outputs
            .abort_request(&RequestId(request_id.to_string()))
        {
            self.scheduler.finish_seq(id);
        }
        tracing::debug!(request_id, "aborted");
    }

    /// Runs one scheduled batch and returns the outputs of the requests it advanced, each
    /// of its request's `output_kind`.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let started = Instant::now();
        let sched = self.scheduler.schedule();
        // Even in an empty step: the scheduler's books already say the swaps happened.
        self.runner
            .execute_cache_ops(&sched.swap_out, &sched.swap_in)?;
        if sched.is_empty() {
            return Ok(Vec::new());
        }
        self.stats.num_steps += 1;
        self.stats.num_computed_tokens += sched.num_batched_tokens as u64;
        let requests = self.prepare_input(&sched.scheduled);
        let forward = Instant::now();
        if let Err(e) = self.runner.execute_model().map(<[f32]>::len) {
            self.fail_step(&requests);
            return Err(e.into());
        }
        let logits = self.runner.logits();
        self.stats.forward_seconds += forward.elapsed().as_secs_f64();
        let vocab = self.limits.vocab_size;
        for (s, rows) in sched.scheduled.iter().zip(&self.rows) {
            if let (Some(prompt_rows), Some(seq)) = (&rows.prompt, self.scheduler.seq(s.id)) {
                let prompt_rows = prompt_rows.clone();
                self.outputs
                    .record_prompt_logprobs(&seq.request, prompt_rows, logits, vocab);
            }
        }
        for s in &sched.scheduled {
            self.scheduler.update_seq(s.id, s.num_new_tokens, None);
        }
        // The runner lays the sampled rows out last, in this order.
        let to_sample: Vec<SeqId> = (sched.scheduled.iter().zip(&self.rows))
            .filter(|(_, r)| r.sample.is_some())
            .map(|(s, _)| s.id)
            .collect();
        let seqs: Vec<&Sequence> = to_sample
            .iter()
            .map(|id| self.scheduler.seq(*id).expect("a sampled sequence exists"))
            .collect();
        let samples =
            (self.outputs).sample(&mut self.sampler, self.runner.sample_logits_mut(), &seqs);
        for (id, s) in to_sample.into_iter().zip(samples) {
            self.scheduler.update_seq(id, 0, Some(s.token_id));
            self.stats.num_generation_tokens += 1;
            let seq = self.scheduler.seq(id).expect("sampled sequence exists");
            if self.outputs.process_sample(seq, s)? {
                let seq = self
                    .scheduler
                    .finish_seq(id)
                    .expect("sampled sequence exists");
                self.outputs.on_finished(seq);
            }
        }
        let outputs = self.outputs.make_outputs(&requests, &self.scheduler);
        self.stats.step_seconds += started.elapsed().as_secs_f64();
        if tracing::enabled!(tracing::Level::INFO) {
            let stats = self.stats();
            self.stats_logger.maybe_log(&stats);
        }
        Ok(outputs)
    }

    /// After a forward pass that failed: the state of its requests is unknown, so they end
    /// (their callers see the step's error), and the prefix cache forgets the blocks the
    /// step was to write.
    fn fail_step(&mut self, requests: &[RequestId]) {
        for r in requests {
            for id in self.outputs.abort_request(r) {
                self.scheduler.finish_seq(id);
            }
        }
        self.scheduler.forget_failed_step();
    }

    /// Hands the scheduled sequences to the model runner; returns their requests, each once.
    fn prepare_input(&mut self, scheduled: &[ScheduledSeq]) -> Vec<RequestId> {
        let (scheduler, outputs) = (&self.scheduler, &self.outputs);
        let mut requests: Vec<RequestId> = Vec::new();
        let inputs = scheduled.iter().map(|s| {
            let seq = scheduler.seq(s.id).expect("scheduled sequence exists");
            if !requests.contains(&seq.request) {
                requests.push(seq.request.clone());
            }
            SeqInput {
                token_ids: &seq.token_ids,
                prompt_len: seq.prompt_len,
                num_computed: s.num_computed,
                num_new: s.num_new_tokens,
                block_tables: scheduler.kv_cache_manager().block_tables(s.id),
                prompt_logprobs_from: outputs.prompt_logprobs_from(seq),
            }
        });
        self.runner.prepare_input(inputs, &mut self.rows);
        requests
    }
}

/// The process's resident memory at a stage of start-up, in the debug log (where a model's
/// memory goes: `MINIVLLM_LOG=minivllm=debug`).
fn log_rss(stage: &str) {
    let bytes = |field| crate::utils::proc_kib_field("/proc/self/status", field);
    if let (Some(rss), Some(peak)) = (bytes("VmRSS"), bytes("VmHWM")) {
        tracing::debug!(rss_mib = rss >> 20, peak_mib = peak >> 20, "{stage}");
    }
}
