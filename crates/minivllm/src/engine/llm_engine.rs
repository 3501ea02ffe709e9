//! `LLMEngine`: requests in, one batched step at a time, `RequestOutput`s out.
//!
//! A step is vLLM v1's engine-core step: the scheduler decides what runs (`schedule`), the
//! executor runs it on every rank and the driver's model runner samples (`execute`), the
//! scheduler takes the tokens in and
//! decides which sequences stopped (`update_from_output`), and the output processor turns
//! them into text and outputs, sending back the sequences a stop string ended.

use std::sync::Arc;
use std::time::Instant;

use crate::core::scheduler::{Scheduler, SchedulerOutput};
use crate::engine::arg_utils::{check_kv_cache_fits, scheduler, scheduler_config};
pub use crate::engine::arg_utils::{check_width, EngineArgs};
pub use crate::engine::errors::EngineError;
pub use crate::engine::input_processor::PromptInput;
use crate::engine::input_processor::{
    process_prompt, CheckedParams, PreparedRequest, RequestChecks, RequestLimits,
};
use crate::engine::kv_transfer::KvTransfer;
pub use crate::engine::metrics::EngineStats;
use crate::engine::metrics::{EngineCounters, StatsLogger};
use crate::engine::output_processor::{OutputProcessor, ProcessedOutputs};
use crate::engine::speculative::start_proposer;
use crate::engine::structured_output_manager::StructuredOutputManager;
use crate::engine::tokenizer::{load_tokenizer, Tokenizer};
use crate::outputs::RequestOutput;
use crate::reasoning::ReasoningParser;
use crate::sampling_params::SamplingParams;
use crate::sequence::{FinishReason, RequestId, SeqId, TokenId};
use crate::spec_decode::draft_length::DraftLimits;
use crate::structured_output::StructuredOutputGrammar;
use crate::utils::log_rss;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::executor::Executor;
pub use crate::worker::worker_config::resolve_max_model_len;
pub use crate::worker::worker_process::Driver;

pub struct LLMEngine {
    executor: Executor,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    outputs: OutputProcessor,
    checks: RequestChecks,
    next_arrival: u64,
    next_seq_id: u64,
    eos_token_ids: Arc<[TokenId]>,
    counters: EngineCounters,
    stats_logger: StatsLogger,
    started: Instant,
    /// Compiles requests' structured-output constraints (shared with the async front,
    /// which compiles off this engine's thread).
    structured: Arc<StructuredOutputManager>,
    /// Prefill/decode disaggregation, with `--kv-transfer-config`.
    kv_transfer: Option<KvTransfer>,
}

impl LLMEngine {
    /// Loads the model named by `args.model` (this rank's shard, with tensor parallelism)
    /// and sizes the KV cache. With tensor parallelism only rank 0 has an engine: the other
    /// ranks run workers ([`start_rank`](crate::worker::worker_process::start_rank)).
    pub fn from_engine_args(args: &EngineArgs) -> Result<Self, EngineError> {
        Self::from_engine_args_with_driver(args, None)
    }

    /// [`from_engine_args`](Self::from_engine_args) on rank 0 of a tensor-parallel group,
    /// with the [`Driver`] that [`start_rank`](crate::worker::worker_process::start_rank)
    /// gave it (`None`: a process alone).
    pub fn from_engine_args_with_driver(
        args: &EngineArgs,
        driver: Option<Driver>,
    ) -> Result<Self, EngineError> {
        // The tokenizer first: what building it holds for a moment (a 262k-token
        // vocabulary's maps) then does not come on top of the weights. A driver dropped on
        // its error releases the workers.
        let speculative = args.speculative()?;
        let mut tokenizer = load_tokenizer(&args.model)?;
        if let Some(template) = &args.chat_template {
            tokenizer.set_chat_template(Some(template.clone()));
        }
        log_rss("tokenizer built");
        let executor = Executor::start(driver, &args.worker_config())?;
        log_rss("weights loaded and KV cache allocated");
        let max_model_len = executor.max_model_len();
        let cache = executor.cache();
        check_kv_cache_fits(args, cache, max_model_len)?;
        tracing::info!(
            mib = (cache.num_blocks() * cache.bytes_per_block()) >> 20,
            blocks = cache.num_blocks(),
            "KV cache reserved: its pages become resident as blocks are first written \
             (minivllm:kv_cache_touched_bytes in /metrics)"
        );
        let sched_cfg = scheduler_config(args, max_model_len, cache.num_state_slots())?;
        let tokenizer = Arc::new(tokenizer);
        let structured = Arc::new(StructuredOutputManager::new(
            Arc::clone(&tokenizer),
            executor.model().config().vocab_size,
            args.reasoning_parser.map(ReasoningParser::new),
        ));
        let limits = RequestLimits {
            max_model_len,
            vocab_size: executor.model().config().vocab_size,
            max_logprobs: args.max_logprobs,
        };
        let kv_transfer = KvTransfer::for_engine(args, &executor)?;
        let checks = RequestChecks::new(&tokenizer, limits, &sched_cfg, kv_transfer.as_ref());
        let scheduler = scheduler(args, sched_cfg, cache)?;
        let mut engine = Self {
            outputs: OutputProcessor::new(Arc::clone(&tokenizer)),
            eos_token_ids: Arc::from(tokenizer.eos_token_ids()),
            tokenizer,
            scheduler,
            checks,
            executor,
            next_arrival: 0,
            next_seq_id: 0,
            counters: EngineCounters::default(),
            stats_logger: StatsLogger::new(),
            started: Instant::now(),
            structured,
            kv_transfer,
        };
        if let Some(method) = &speculative {
            let (proposer, limits) =
                start_proposer(method, args, &engine.executor, &engine.tokenizer)?;
            engine.executor.set_draft_proposer(proposer);
            engine.scheduler.enable_speculation(limits);
        }
        Ok(engine)
    }

    /// Where the KV cache events go (`--kv-events-config`): the PUB and replay addresses.
    pub fn kv_events_endpoints(&self) -> Option<(&str, Option<&str>)> {
        self.scheduler.kv_events_endpoints()
    }

    /// Where decode servers pull this prefill server's KV from (`--kv-transfer-config`).
    pub fn kv_transfer_endpoint(&self) -> Option<std::net::SocketAddr> {
        self.kv_transfer.as_ref().and_then(KvTransfer::endpoint)
    }

    /// The model the engine runs (for benchmarks' accounting of FLOPs and bytes).
    pub fn model(&self) -> &crate::model_executor::models::llama::LlamaForCausalLM {
        self.executor.model()
    }

    /// Bytes of KV cache one token position takes, over all layers.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.executor.cache().kv_bytes_per_position()
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// What a request's parameters are checked against, for callers that check them on
    /// their own threads and submit them with [`add_checked_request`](Self::add_checked_request).
    pub fn request_checks(&self) -> &RequestChecks {
        &self.checks
    }

    pub fn max_model_len(&self) -> usize {
        self.checks.limits.max_model_len
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.outputs.is_empty()
    }

    /// Gives back the memory a past large batch left in the step buffers and what the
    /// worker held for the sequences that finished (told in an empty step); the async engine
    /// calls it whenever it goes idle.
    pub fn release_idle_memory(&mut self) {
        // A step that runs nothing and moves no block makes no collective call, so it
        // cannot fail.
        let idle = self.scheduler.schedule_idle();
        if let Err(e) = self.executor.execute(&idle, self.scheduler.seqs()) {
            tracing::warn!("an idle step failed: {e}");
        }
        self.executor.release_idle_memory();
    }

    /// Has `proposer` guess draft tokens for every running sequence, verified in the step
    /// after (speculative decoding's seam: `worker/draft_proposer.rs`); as many as pay
    /// (`adaptive`) or always its most.
    pub fn set_draft_proposer(&mut self, proposer: Box<dyn DraftProposer>, adaptive: bool) {
        (self.scheduler).enable_speculation(DraftLimits {
            max_draft_len: proposer.max_draft_len(),
            disable_by_batch_size: None,
            adaptive,
        });
        self.executor.set_draft_proposer(proposer);
    }

    /// Sequences the worker keeps state for (finished ones until the next step or
    /// `release_idle_memory`).
    pub fn num_worker_seqs(&self) -> usize {
        self.executor.num_cached_seqs()
    }

    /// The sequences waiting to be admitted: a request of `n` (or `best_of`) completions
    /// waits as that many.
    pub(crate) fn num_waiting_sequences(&self) -> usize {
        self.scheduler.num_waiting()
    }

    pub fn stats(&self) -> EngineStats {
        let bytes_per_block = self.executor.cache().bytes_per_block();
        (self.counters).stats(&self.scheduler, bytes_per_block, self.outputs.histograms())
    }

    /// Seconds since the engine started (for throughput figures).
    pub fn uptime(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// KV blocks: those not held by any sequence (free or only in the prefix cache), and all.
    pub fn kv_blocks(&self) -> (usize, usize) {
        let m = self.scheduler.kv_cache_manager();
        (m.num_free_blocks(), m.num_blocks())
    }

    /// Blocks of the CPU swap pool: those not held by a swapped-out sequence, and all.
    pub fn cpu_blocks(&self) -> (usize, usize) {
        let s = &self.scheduler;
        (s.num_free_cpu_blocks(), s.num_cpu_blocks())
    }

    /// Validates and queues a request. Errors leave the engine and other requests untouched.
    pub fn add_request(
        &mut self,
        request_id: impl Into<String>,
        prompt: PromptInput,
        params: SamplingParams,
        priority: i32,
    ) -> Result<(), EngineError> {
        let params = self.checks.check(params, priority)?;
        self.add_checked_request(request_id, prompt, params, None)
    }

    /// [`add_request`](Self::add_request) for parameters already checked
    /// ([`request_checks`](Self::request_checks)), with each completion's tokens constrained
    /// by a copy of `grammar` (structured output's seam: `structured_output.rs`) when given.
    pub fn add_checked_request(
        &mut self,
        request_id: impl Into<String>,
        prompt: PromptInput,
        params: CheckedParams,
        grammar: Option<Box<dyn StructuredOutputGrammar>>,
    ) -> Result<(), EngineError> {
        let request = self.prepare_request(prompt, params, grammar)?;
        self.add_prepared_request(request_id, request)
    }

    /// What can refuse a request, done without adding it: its prompt tokenised and checked,
    /// its grammar compiled. `LLM::generate` prepares a whole batch before adding any.
    pub(crate) fn prepare_request(
        &self,
        prompt: PromptInput,
        params: CheckedParams,
        grammar: Option<Box<dyn StructuredOutputGrammar>>,
    ) -> Result<PreparedRequest, EngineError> {
        let grammar = match (grammar, &params.params().structured_outputs) {
            (None, Some(so)) => Some(self.structured.compile(so, &prompt)?),
            (grammar, _) => grammar,
        };
        let prompt = process_prompt(&self.tokenizer, prompt, &self.checks.limits)?;
        Ok(PreparedRequest {
            prompt,
            params,
            grammar,
            kv_import: None,
        })
    }

    /// Queues a prepared request; refused only for an id already in use.
    pub(crate) fn add_prepared_request(
        &mut self,
        request_id: impl Into<String>,
        request: PreparedRequest,
    ) -> Result<(), EngineError> {
        let request_id = RequestId(request_id.into());
        if self.outputs.contains(&request_id) {
            return Err(EngineError::DuplicateRequest(request_id.0));
        }
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        let limits = &self.checks.limits;
        let eos = &self.eos_token_ids;
        let r = request.admit(&request_id, &mut self.next_seq_id, arrival, limits, eos);
        self.counters.num_prompt_tokens += r.prompt.token_ids.len() as u64;
        let seq_ids: Vec<SeqId> = r.seqs.iter().map(|s| s.id).collect();
        for seq in r.seqs {
            self.scheduler.add_seq(seq);
        }
        let (prompt, params, stop, arrived) = (r.prompt, r.params, r.stop, r.arrived);
        (self.outputs).add_request(request_id, prompt, params, stop, &seq_ids, arrived);
        Ok(())
    }

    /// The constraint compiler, for callers that compile on threads of their own.
    pub(crate) fn structured_output_manager(&self) -> &Arc<StructuredOutputManager> {
        &self.structured
    }

    /// Drops a request and frees its blocks; unknown ids are ignored (it may have just finished).
    pub fn abort_request(&mut self, request_id: &str) {
        let request = RequestId(request_id.to_string());
        for id in self.outputs.abort_request(&request, FinishReason::Abort) {
            self.scheduler.finish_seq(id);
        }
        self.retire_ended();
        tracing::debug!(request_id, "aborted");
    }

    /// Runs one step and returns the outputs of the requests it advanced, each of its
    /// request's `output_kind`: schedule, execute, update, outputs.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let started = Instant::now();
        let sched = self.scheduler.schedule();
        (self.outputs).scheduled(sched.new_seqs.iter().copied(), self.scheduler.seqs());
        // Even in an empty step: the scheduler's books already say the swaps happened, and
        // the worker forgets the sequences that finished.
        let results = match self.executor.execute(&sched, self.scheduler.seqs()) {
            Ok(results) => results,
            Err(e) => {
                self.fail_step(&sched);
                return Err(e.into());
            }
        };
        if sched.is_empty() {
            return Ok(Vec::new());
        }
        self.counters.num_steps += 1;
        self.counters.num_computed_tokens += sched.num_batched_tokens as u64;
        self.counters.forward_seconds += results.forward_seconds;
        self.counters.num_generation_tokens += results.sampled.len() as u64;
        let core_outputs = self.scheduler.update_from_output(&sched, results);
        let processed = (self.outputs).process_outputs(core_outputs, self.scheduler.seqs());
        let ProcessedOutputs {
            mut request_outputs,
            stopped,
        } = match processed {
            Ok(p) => p,
            Err(e) => {
                self.fail_step(&sched);
                return Err(e);
            }
        };
        for id in stopped {
            self.scheduler.finish_seq(id);
        }
        if let Some(kv) = &self.kv_transfer {
            let (s, cache) = (&mut self.scheduler, self.executor.cache());
            kv.attach_exports(s, cache, &mut request_outputs);
        }
        self.retire_ended();
        self.counters.step_seconds += started.elapsed().as_secs_f64();
        if tracing::enabled!(tracing::Level::INFO) {
            self.stats_logger.maybe_log(&self.stats());
        }
        Ok(request_outputs)
    }

    /// After a step that failed: the state of its requests is unknown, so they end (their
    /// callers see the step's error), and the prefix cache forgets the blocks the step was
    /// to write.
    fn fail_step(&mut self, sched: &SchedulerOutput) {
        for r in &self.scheduler.requests_in(sched) {
            for id in self.outputs.abort_request(r, FinishReason::Error) {
                self.scheduler.finish_seq(id);
            }
        }
        self.retire_ended();
        self.scheduler.forget_failed_step();
    }

    /// Hands the records of the sequences that ended to the output processor, which keeps
    /// their tokens while their requests' outputs show them.
    fn retire_ended(&mut self) {
        for seq in self.scheduler.take_ended() {
            self.outputs.retire(seq);
        }
    }
}
