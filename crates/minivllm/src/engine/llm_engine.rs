//! `LLMEngine`: requests in, one batched step at a time, `RequestOutput`s out.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::config::ModelConfig;
use crate::core::block_manager::{BlockManager, BlockManagerConfig};
use crate::core::scheduler::{ScheduledSeq, Scheduler};
use crate::engine::arg_utils::scheduler_config;
pub use crate::engine::arg_utils::{check_width, resolve_max_model_len, width, EngineArgs};
use crate::engine::detokenizer::{DetokenizerConfig, IncrementalDetokenizer};
pub use crate::engine::errors::EngineError;
pub use crate::engine::metrics::EngineStats;
use crate::engine::metrics::StatsLogger;
use crate::engine::tokenizer::Tokenizer;
use crate::model_executor::input_metadata::InputMetadata;
use crate::model_executor::layers::sampler::{
    logprobs_for, SampledToken, Sampler, SamplingContext, SeqSamplingState,
};
use crate::model_executor::model_loader::load_model;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use crate::sampling_params::SamplingParams;
use crate::sequence::{FinishReason, RequestId, SeqId, Sequence, StopReason, TokenId};
use crate::worker::cache_engine::CacheEngine;
use crate::worker::model_runner::ModelRunner;

const WATERMARK: f32 = 0.01;

/// A prompt in either of vLLM's two forms.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    TokenIds(Vec<TokenId>),
}

impl From<&str> for PromptInput {
    fn from(s: &str) -> Self {
        PromptInput::Text(s.to_string())
    }
}

impl From<String> for PromptInput {
    fn from(s: String) -> Self {
        PromptInput::Text(s)
    }
}

impl From<Vec<TokenId>> for PromptInput {
    fn from(ids: Vec<TokenId>) -> Self {
        PromptInput::TokenIds(ids)
    }
}

struct RequestState {
    prompt: Option<String>,
    prompt_ids: Vec<TokenId>,
    params: SamplingParams,
    /// By completion index; grows when the first sequence forks (n/best_of > 1).
    seq_ids: Vec<SeqId>,
    max_tokens: usize,
    prompt_logprobs: Option<Vec<Option<TokenLogprobs>>>,
}

struct SeqState {
    request: RequestId,
    detok: IncrementalDetokenizer,
    sampling: SeqSamplingState,
    cumulative_logprob: f64,
    logprobs: Vec<TokenLogprobs>,
    /// Kept here too because the scheduler forgets a sequence once it finishes.
    output_ids: Vec<TokenId>,
    finish: Option<(FinishReason, Option<StopReason>)>,
}

/// Where one scheduled sequence's rows sit in this step's logits.
struct RowPlan {
    sched: ScheduledSeq,
    /// Rows of prompt-logprob positions: (row, position whose next token is scored).
    prompt_rows: Vec<(usize, usize)>,
    sample_row: Option<usize>,
}

pub struct LLMEngine {
    runner: ModelRunner,
    tokenizer: Arc<Tokenizer>,
    scheduler: Scheduler,
    sampler: Sampler,
    max_model_len: usize,
    max_num_seqs: usize,
    vocab_size: usize,
    requests: HashMap<RequestId, RequestState>,
    seqs: HashMap<SeqId, SeqState>,
    next_seq_id: u64,
    next_arrival: u64,
    input: InputMetadata,
    /// This step's logits rows, and those handed to the sampler; reused between steps.
    step_logits: Vec<f32>,
    sample_logits: Vec<f32>,
    stats: EngineStats,
    stats_logger: StatsLogger,
    started: Instant,
}

impl LLMEngine {
    /// Loads the model named by `args.model` and sizes the KV cache.
    pub fn from_engine_args(args: &EngineArgs) -> Result<Self, EngineError> {
        let threads = args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        minivllm_kernels::threading::init_threads(threads.max(1));
        let loaded = load_model(&args.model, &args.load)?;
        let tokenizer = Tokenizer::load(&loaded.location)?;
        Self::new(loaded.model, tokenizer, args)
    }

    /// Builds an engine around an already loaded model.
    pub fn new(
        mut model: LlamaForCausalLM,
        tokenizer: Tokenizer,
        args: &EngineArgs,
    ) -> Result<Self, EngineError> {
        let config: ModelConfig = model.config().clone();
        let max_model_len = resolve_max_model_len(args.max_model_len, &config)?;
        let kv_dtype = args.kv_cache_dtype.resolve(args.load.dtype);
        let cache =
            CacheEngine::with_budget(&config, args.block_size, args.kv_cache_memory, kv_dtype)?
                .with_swap_space(args.swap_space)?;
        // A new sequence is admitted only while 1% of blocks stay free (the watermark), so
        // a prompt of max_model_len must fit in the rest or it could never start.
        let watermark_blocks = (cache.num_blocks() as f32 * WATERMARK).ceil() as usize;
        let capacity =
            (cache.num_blocks() - watermark_blocks.min(cache.num_blocks())) * args.block_size;
        if capacity < max_model_len {
            return Err(EngineError::Config(format!(
                "the KV cache holds {capacity} tokens, fewer than max_model_len {max_model_len}: \
                 raise --kv-cache-memory or lower --max-model-len"
            )));
        }
        // After the cache check, which refuses an absurd max_model_len with a clear message.
        model
            .set_max_model_len(max_model_len)
            .map_err(|e| EngineError::Config(e.to_string()))?;
        let sched_cfg = scheduler_config(args, max_model_len, cache.num_cpu_blocks())?;
        let block_manager = BlockManager::new(BlockManagerConfig {
            num_blocks: cache.num_blocks(),
            block_size: args.block_size,
            enable_prefix_caching: args.enable_prefix_caching,
            watermark: WATERMARK,
        });
        Ok(Self {
            runner: ModelRunner::new(model, cache),
            vocab_size: config.vocab_size,
            tokenizer: Arc::new(tokenizer),
            scheduler: Scheduler::new(sched_cfg, block_manager),
            sampler: Sampler::default(),
            max_model_len,
            max_num_seqs: args.max_num_seqs,
            requests: HashMap::new(),
            seqs: HashMap::new(),
            next_seq_id: 0,
            next_arrival: 0,
            input: InputMetadata::default(),
            step_logits: Vec::new(),
            sample_logits: Vec::new(),
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
        self.max_model_len
    }

    /// Most sequences one step runs (`--max-num-seqs`), and so the most a request may fork.
    pub fn max_num_seqs(&self) -> usize {
        self.max_num_seqs
    }

    pub fn has_unfinished_requests(&self) -> bool {
        !self.requests.is_empty()
    }

    pub fn num_unfinished_requests(&self) -> usize {
        self.requests.len()
    }

    /// Requests queued and not yet scheduled (preempted ones included).
    pub fn num_waiting_requests(&self) -> usize {
        self.scheduler.num_waiting()
    }

    /// The sequences that waiting requests will run once admitted: a request that forks
    /// into `n` (or `best_of`) sequences after its prompt counts that many, though it waits
    /// as one.
    pub fn num_waiting_sequences(&self) -> usize {
        self.scheduler
            .waiting()
            .iter()
            .filter_map(|id| self.seqs.get(id))
            .map(|seq| &seq.request)
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .filter_map(|r| self.requests.get(r))
            .map(|r| width(&r.params))
            .sum()
    }

    pub fn stats(&self) -> EngineStats {
        let bm = self.scheduler.block_manager();
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
        self.scheduler.block_manager().num_free_blocks()
    }

    pub fn num_total_blocks(&self) -> usize {
        self.scheduler.block_manager().num_blocks()
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
        if self.requests.contains_key(&request_id) {
            return Err(EngineError::DuplicateRequest(request_id.0));
        }
        params.validate()?;
        check_width(&params, self.max_num_seqs)?;
        let (text, prompt_ids) = match prompt {
            PromptInput::Text(t) => {
                let ids = self.tokenizer.encode(&t, true)?;
                (Some(t), ids)
            }
            PromptInput::TokenIds(ids) => (None, ids),
        };
        self.check_prompt(&prompt_ids)?;
        let max_tokens = params
            .max_tokens
            .unwrap_or(usize::MAX)
            .min(self.max_model_len - prompt_ids.len());
        let seq_id = self.new_seq_id();
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.seqs.insert(
            seq_id,
            self.new_seq_state(
                &request_id,
                self.detokenizer(&prompt_ids, &params),
                &params,
                0,
            ),
        );
        let mut seq = Sequence::new(seq_id, prompt_ids.clone(), priority, arrival);
        // Cached prefix blocks have no logits to score, so such prompts are computed whole.
        seq.skip_prefix_cache = params.prompt_logprobs.is_some();
        self.scheduler.add_seq(seq);
        self.stats.num_prompt_tokens += prompt_ids.len() as u64;
        self.requests.insert(
            request_id,
            RequestState {
                prompt: text,
                // Position 0 has nothing before it to score it.
                prompt_logprobs: params.prompt_logprobs.map(|_| vec![None]),
                prompt_ids,
                params,
                seq_ids: vec![seq_id],
                max_tokens,
            },
        );
        Ok(())
    }

    fn check_prompt(&self, ids: &[TokenId]) -> Result<(), EngineError> {
        if ids.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if ids.len() > self.max_model_len {
            return Err(EngineError::PromptTooLong {
                len: ids.len(),
                max_model_len: self.max_model_len,
            });
        }
        if let Some(&token) = ids.iter().find(|&&t| t as usize >= self.vocab_size) {
            return Err(EngineError::TokenOutOfVocab {
                token,
                vocab_size: self.vocab_size,
            });
        }
        Ok(())
    }

    fn new_seq_id(&mut self) -> SeqId {
        self.next_seq_id += 1;
        SeqId(self.next_seq_id)
    }

    /// A request's first sequence's detokenizer (which builds its stop-string automaton).
    fn detokenizer(
        &self,
        prompt_ids: &[TokenId],
        params: &SamplingParams,
    ) -> IncrementalDetokenizer {
        let cfg = DetokenizerConfig {
            skip_special_tokens: params.skip_special_tokens,
            spaces_between_special_tokens: params.spaces_between_special_tokens,
            stop: params.stop.clone(),
            include_stop_str_in_output: params.include_stop_str_in_output,
        };
        IncrementalDetokenizer::new(&self.tokenizer, prompt_ids, cfg)
    }

    fn new_seq_state(
        &self,
        request: &RequestId,
        detok: IncrementalDetokenizer,
        params: &SamplingParams,
        index: usize,
    ) -> SeqState {
        SeqState {
            request: request.clone(),
            detok,
            sampling: SeqSamplingState::new(params.seed, index),
            cumulative_logprob: 0.0,
            logprobs: Vec::new(),
            output_ids: Vec::new(),
            finish: None,
        }
    }

    /// Drops a request and frees its blocks; unknown ids are ignored (it may have just finished).
    pub fn abort_request(&mut self, request_id: &str) {
        let Some(req) = self.requests.remove(&RequestId(request_id.to_string())) else {
            return;
        };
        for id in req.seq_ids {
            self.scheduler.finish_seq(id);
            self.seqs.remove(&id);
        }
        tracing::debug!(request_id, "aborted");
    }

    /// Runs one scheduled batch and returns the new state of every request it advanced.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let sched = self.scheduler.schedule();
        // In this order: a block swapped out may already be a swap-in's or a copy's
        // destination, and the sources of copies must hold their data before the model
        // writes. Swaps are done even in an empty step, since the scheduler's books
        // already say they happened.
        self.runner.swap_out(&sched.swap_out);
        self.runner.swap_in(&sched.swap_in);
        if sched.is_empty() {
            return Ok(Vec::new());
        }
        self.stats.num_steps += 1;
        self.stats.num_computed_tokens += sched.num_batched_tokens as u64;
        self.runner.copy_blocks(&sched.block_copies);
        let plans = self.prepare_inputs(&sched.scheduled);
        // Copied out so the runner's buffers are free and the rows can be read while the
        // engine's other state changes; it is only the rows that were asked for.
        let logits = self.runner.execute(&self.input)?;
        self.step_logits.clear();
        self.step_logits.extend_from_slice(logits);
        self.record_prompt_logprobs(&plans);
        let mut touched = Vec::with_capacity(plans.len());
        // K/V counts advance before sampling, so sequences forked while sampling start from
        // the parent's computed prompt.
        for plan in &plans {
            let id = plan.sched.id;
            self.scheduler
                .update_seq(id, plan.sched.num_new_tokens, None);
            push_unique(&mut touched, &self.seqs[&id].request);
        }
        let samples = self.sample(&plans);
        for (id, s) in samples {
            self.scheduler.update_seq(id, 0, Some(s.token_id));
            self.stats.num_generation_tokens += 1;
            self.after_sample(id, s)?;
            push_unique(&mut touched, &self.seqs[&id].request);
        }
        let outputs = touched.iter().filter_map(|r| self.make_output(r)).collect();
        if tracing::enabled!(tracing::Level::INFO) {
            let stats = self.stats();
            self.stats_logger.maybe_log(&stats);
        }
        Ok(outputs)
    }

    /// Fills the reused `InputMetadata` and notes which logits rows belong to whom.
    fn prepare_inputs(&mut self, scheduled: &[ScheduledSeq]) -> Vec<RowPlan> {
        let block_size = self.scheduler.block_manager().block_size();
        self.input.clear();
        let mut plans = Vec::with_capacity(scheduled.len());
        let mut table: Vec<u32> = Vec::new();
        for s in scheduled {
            let seq = self.scheduler.seq(s.id).expect("scheduled seq exists");
            let end = s.num_computed + s.num_new_tokens;
            table.clear();
            table.extend(
                self.scheduler
                    .block_manager()
                    .block_table(s.id)
                    .iter()
                    .map(|b| b.0),
            );
            let start_row = self.input.num_tokens();
            self.input.add_sequence(
                &seq.token_ids[s.num_computed..end],
                end,
                &table,
                block_size,
                false,
            );
            let mut plan = RowPlan {
                sched: *s,
                prompt_rows: Vec::new(),
                sample_row: None,
            };
            let req = &self.requests[&self.seqs[&s.id].request];
            // Entry e of prompt_logprobs scores prompt token e from the logits at e - 1; each
            // is recorded once, on the first pass (a recompute after preemption skips them).
            if let Some(recorded) = req.prompt_logprobs.as_ref().map(Vec::len) {
                for pos in s.num_computed.max(recorded - 1)..end.min(seq.prompt_len - 1) {
                    plan.prompt_rows
                        .push((self.input.logits_indices.len(), pos));
                    self.input
                        .logits_indices
                        .push(start_row + pos - s.num_computed);
                }
            }
            if end == seq.len() {
                plan.sample_row = Some(self.input.logits_indices.len());
                self.input
                    .logits_indices
                    .push(start_row + s.num_new_tokens - 1);
            }
            plans.push(plan);
        }
        plans
    }

    fn record_prompt_logprobs(&mut self, plans: &[RowPlan]) {
        let vocab = self.vocab_size;
        for plan in plans.iter().filter(|p| !p.prompt_rows.is_empty()) {
            let req = self
                .requests
                .get_mut(&self.seqs[&plan.sched.id].request)
                .expect("request exists");
            let k = req.params.prompt_logprobs.unwrap_or(0);
            let out = req.prompt_logprobs.as_mut().expect("asked for");
            for &(row, pos) in &plan.prompt_rows {
                let next = req.prompt_ids[pos + 1];
                let (lp, top) =
                    logprobs_for(&self.step_logits[row * vocab..(row + 1) * vocab], next, k);
                out.push(Some(with_chosen(next, lp, top)));
            }
        }
    }

    /// Samples every sequence that reached the end of its known tokens. A request's first
    /// sample forks it into `best_of` sequences, each drawing from the same logits row.
    fn sample(&mut self, plans: &[RowPlan]) -> Vec<(SeqId, SampledToken)> {
        let vocab = self.vocab_size;
        let mut order: Vec<(SeqId, usize)> = Vec::new();
        for plan in plans {
            let Some(row) = plan.sample_row else { continue };
            let id = plan.sched.id;
            order.push((id, row));
            let req_id = self.seqs[&id].request.clone();
            let req = &self.requests[&req_id];
            let first_sample = req.seq_ids.len() == 1 && self.seqs[&id].output_ids.is_empty();
            if first_sample {
                for _ in 1..req.params.best_of.unwrap_or(req.params.n).max(req.params.n) {
                    order.push((self.fork(id, &req_id), row));
                }
            }
        }
        self.sample_logits.clear();
        for &(_, row) in &order {
            self.sample_logits
                .extend_from_slice(&self.step_logits[row * vocab..(row + 1) * vocab]);
        }
        // The states leave the map while the sampler holds them mutably, next to borrows of
        // the requests and sequences they read.
        let mut states: Vec<SeqState> = order
            .iter()
            .map(|(id, _)| self.seqs.remove(id).expect("seq state"))
            .collect();
        let eos = self.tokenizer.eos_token_ids();
        let mut ctxs: Vec<SamplingContext<'_>> = order
            .iter()
            .zip(states.iter_mut())
            .map(|((id, _), st)| {
                let seq = self.scheduler.seq(*id).expect("sampled seq exists");
                SamplingContext {
                    options: self.requests[&st.request].params.sampling_options(),
                    prompt_ids: &seq.token_ids[..seq.prompt_len],
                    output_ids: &seq.token_ids[seq.prompt_len..],
                    eos_token_ids: eos,
                    state: &mut st.sampling,
                }
            })
            .collect();
        let results = self.sampler.sample(&mut self.sample_logits, &mut ctxs);
        drop(ctxs);
        for ((id, _), st) in order.iter().zip(states) {
            self.seqs.insert(*id, st);
        }
        order.into_iter().map(|(id, _)| id).zip(results).collect()
    }

    /// A new completion of `req_id` sharing `parent`'s blocks, before either has output.
    fn fork(&mut self, parent: SeqId, req_id: &RequestId) -> SeqId {
        let child = self.new_seq_id();
        let req = &self.requests[req_id];
        let index = req.seq_ids.len();
        // The parent has no output yet, so its detokenizer is the child's too, and cloning
        // it shares the stop-string automaton instead of building one per fork.
        let detok = self.seqs[&parent].detok.clone();
        let state = self.new_seq_state(req_id, detok, &req.params, index);
        let p = self.scheduler.seq(parent).expect("parent exists");
        let seq = Sequence::new(child, p.token_ids.clone(), p.priority, p.arrival);
        self.scheduler.fork_seq(parent, seq);
        self.seqs.insert(child, state);
        self.requests
            .get_mut(req_id)
            .expect("request")
            .seq_ids
            .push(child);
        child
    }

    /// Records a sampled token: logprobs, text, and whether the sequence is now finished.
    fn after_sample(&mut self, id: SeqId, s: SampledToken) -> Result<(), EngineError> {
        let st = self.seqs.get_mut(&id).expect("seq state");
        let req = &self.requests[&st.request];
        st.output_ids.push(s.token_id);
        st.cumulative_logprob += s.logprob as f64;
        if req.params.logprobs.is_some() {
            st.logprobs
                .push(with_chosen(s.token_id, s.logprob, s.top_logprobs));
        }
        let stop_str = st.detok.push(&self.tokenizer, s.token_id)?;
        let p = &req.params;
        let n_out = st.output_ids.len();
        let seq_len = req.prompt_ids.len() + n_out;
        let finish = if let Some(stop) = stop_str {
            Some((FinishReason::Stop, Some(stop)))
        } else if p.stop_token_ids.contains(&s.token_id) && n_out >= p.min_tokens {
            Some((FinishReason::Stop, Some(StopReason::Token(s.token_id))))
        } else if !p.ignore_eos
            && n_out >= p.min_tokens
            && self.tokenizer.eos_token_ids().contains(&s.token_id)
        {
            Some((FinishReason::Stop, None))
        } else if n_out >= req.max_tokens || seq_len >= self.max_model_len {
            Some((FinishReason::Length, None))
        } else {
            None
        };
        if let Some(f) = finish {
            st.detok.finish();
            st.finish = Some(f);
            self.scheduler.finish_seq(id);
        }
        Ok(())
    }

    /// The request's state as vLLM reports it; a finished request is dropped afterwards.
    fn make_output(&mut self, req_id: &RequestId) -> Option<RequestOutput> {
        let req = self.requests.get(req_id)?;
        let mut outputs: Vec<(f64, CompletionOutput)> = req
            .seq_ids
            .iter()
            .enumerate()
            .map(|(index, id)| {
                let st = &self.seqs[id];
                let finished = st.finish.is_some();
                let text = if finished {
                    st.detok.output_text()
                } else {
                    st.detok.visible_text()
                };
                let out = CompletionOutput {
                    index,
                    text: text.to_string(),
                    token_ids: st.output_ids.clone(),
                    cumulative_logprob: Some(st.cumulative_logprob),
                    logprobs: req.params.logprobs.map(|_| st.logprobs.clone()),
                    finish_reason: st.finish.as_ref().map(|f| f.0),
                    stop_reason: st.finish.as_ref().and_then(|f| f.1.clone()),
                };
                (st.cumulative_logprob, out)
            })
            .collect();
        let width = req.params.best_of.unwrap_or(req.params.n).max(req.params.n);
        let finished = outputs.len() == width && outputs.iter().all(|(_, o)| o.finished());
        if finished && width > req.params.n {
            // best_of: keep the n most likely completions, renumbered in that order.
            outputs.sort_by(|a, b| b.0.total_cmp(&a.0));
            outputs.truncate(req.params.n);
            for (i, (_, o)) in outputs.iter_mut().enumerate() {
                o.index = i;
            }
        }
        let out = RequestOutput {
            request_id: req_id.0.clone(),
            prompt: req.prompt.clone(),
            prompt_token_ids: req.prompt_ids.clone(),
            prompt_logprobs: req.prompt_logprobs.clone(),
            outputs: outputs.into_iter().map(|(_, o)| o).collect(),
            finished,
        };
        if finished {
            let req = self.requests.remove(req_id).expect("request exists");
            for id in req.seq_ids {
                self.seqs.remove(&id);
            }
        }
        Some(out)
    }
}

fn push_unique(v: &mut Vec<RequestId>, r: &RequestId) {
    if !v.contains(r) {
        v.push(r.clone());
    }
}

/// The chosen token's entry first, then the top-k without repeating it.
fn with_chosen(token: TokenId, logprob: f32, top: Vec<(TokenId, f32)>) -> TokenLogprobs {
    let mut v = Vec::with_capacity(top.len() + 1);
    v.push((token, logprob));
    v.extend(top.into_iter().filter(|(t, _)| *t != token));
    TokenLogprobs(v)
}
