//! Continuous batching: each step picks which sequences run and how many of their tokens,
//! within a token budget and a sequence budget, mixing decodes and prompt chunks.
//!
//! Like vLLM v1 there is no separate prefill phase: every sequence simply has tokens whose
//! K/V are not yet computed (a whole prompt, a prompt's remainder, one sampled token, or
//! everything after a preemption) and the scheduler hands out budget to close that gap.
//!
//! When blocks run out the lowest-priority running sequence is preempted: swapped out to the
//! CPU swap pool if one is configured and has room (its K/V survive and come back later),
//! otherwise recomputed from scratch (its blocks are simply freed).

use std::collections::HashMap;

use crate::core::kv_cache_manager::{ComputedBlocks, KvCacheManager};
use crate::core::kv_event_publisher::KvEventPublisher;
use crate::core::policy::Policy;
use crate::core::prefill_share::PrefillShare;
use crate::core::sched_output::{reaches_end, KvExport, KvImport};
pub use crate::core::sched_output::{ScheduledSeq, SchedulerOutput};
use crate::core::seq_queue::SeqQueue;
use crate::core::spec_decode_stats::SpecDecodingStats;
use crate::ids::RequestId;
use crate::outputs::{EngineCoreOutput, ModelRunnerOutput};
use crate::sequence::{FinishReason, SeqId, Sequence, Sequences};
use crate::spec_decode::draft_length::{DraftLength, DraftLimits};
use crate::structured_output::GrammarStats;

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most tokens fed to the model in one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Split long prompts across steps; without it a prompt waits until it fits whole.
    pub enable_chunked_prefill: bool,
    /// Most prompt tokens (prompt chunks and recomputes: whatever is not a decode) in one
    /// step (`--max-prefill-tokens`). Prompts take it first come, first served, so under a
    /// burst each request's prompt completes, and its first token goes out, as early as
    /// its turn allows, rather than all of them together after the whole burst's prefill.
    pub max_prefill_tokens: usize,
    /// Prompts with more tokens than this to prefill share the machine with the other
    /// requests (`--long-prefill-token-threshold`; 0: off): `core/prefill_share.rs`.
    pub long_prefill_token_threshold: usize,
    pub policy: Policy,
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    kv_cache_manager: KvCacheManager,
    seqs: Sequences,
    waiting: SeqQueue,
    running: SeqQueue,
    /// Swapped-out sequences, served before any waiting one is admitted.
    swapped: SeqQueue,
    /// Sequences the worker knows that finished since the last step, for it to forget.
    finished: Vec<SeqId>,
    /// Sequences finished whose records `seqs` still holds, until the engine takes them
    /// ([`take_ended`](Self::take_ended)) for the outputs that still show them.
    ended: Vec<SeqId>,
    /// Finished prefills whose KV a decode server is to pull, until the engine takes them.
    kv_exports: Vec<KvExport>,
    /// Prompt tokens admitted with KV pulled from a prefill server.
    num_external_kv_tokens: u64,
    num_preemptions: u64,
    num_swapped_out: u64,
    num_swapped_in: u64,
    grammar_stats: GrammarStats,
    spec_decode_stats: SpecDecodingStats,
    /// Speculative decoding's draft lengths; `None` without a proposer.
    draft_length: Option<DraftLength>,
    /// Which prompts are long, and how long they wait for the others.
    prefill_share: PrefillShare,
    /// Whether the step last scheduled runs a long prompt's chunk.
    runs_long_prefill: bool,
    /// Where the prefix cache's changes go after each step (`--kv-events-config`).
    kv_events: Option<KvEventPublisher>,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, kv_cache_manager: KvCacheManager) -> Self {
        Self {
            kv_cache_manager,
            seqs: HashMap::new(),
            waiting: SeqQueue::default(),
            running: SeqQueue::default(),
            swapped: SeqQueue::default(),
            finished: Vec::new(),
            ended: Vec::new(),
            kv_exports: Vec::new(),
            num_external_kv_tokens: 0,
            num_preemptions: 0,
            num_swapped_out: 0,
            num_swapped_in: 0,
            grammar_stats: GrammarStats::default(),
            spec_decode_stats: SpecDecodingStats::default(),
            draft_length: None,
            prefill_share: PrefillShare::new(cfg.long_prefill_token_threshold),
            runs_long_prefill: false,
            kv_events: None,
            cfg,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn kv_cache_manager(&self) -> &KvCacheManager {
        &self.kv_cache_manager
    }

    pub fn seq(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    /// Every unfinished sequence: what the executor and the output processor read.
    pub(crate) fn seqs(&self) -> &Sequences {
        &self.seqs
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_swapped(&self) -> usize {
        self.swapped.len()
    }

    /// Which queue holds `id`; `None` once it has finished (or was never added).
    #[cfg(test)]
    pub(crate) fn status(&self, id: SeqId) -> Option<crate::sequence::SequenceStatus> {
        use crate::sequence::SequenceStatus::{Running, Swapped, Waiting};
        let queued = |q: &SeqQueue| q.iter().any(|s| s == id);
        [
            (&self.running, Running),
            (&self.swapped, Swapped),
            (&self.waiting, Waiting),
        ]
        .into_iter()
        .find_map(|(q, status)| queued(q).then_some(status))
    }

    /// Preemptions of both kinds.
    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn num_swapped_out(&self) -> u64 {
        self.num_swapped_out
    }

    pub(crate) fn num_external_kv_tokens(&self) -> u64 {
        self.num_external_kv_tokens
    }

    pub fn num_swapped_in(&self) -> u64 {
        self.num_swapped_in
    }

    /// What structured output has cost so far.
    pub(crate) fn grammar_stats(&self) -> GrammarStats {
        self.grammar_stats
    }

    pub(crate) fn spec_decode_stats(&self) -> SpecDecodingStats {
        self.spec_decode_stats
    }

    /// Asks for draft tokens from now on, within `limits`, as many as each sequence's
    /// record and the batch make worth verifying (`spec_decode/draft_length.rs`).
    pub(crate) fn enable_speculation(&mut self, limits: DraftLimits) {
        self.draft_length = Some(DraftLength::new(limits));
    }

    pub(crate) fn draft_length(&self) -> Option<&DraftLength> {
        self.draft_length.as_ref()
    }

    /// Publishes the prefix cache's changes through `publisher` after every step
    /// (`--kv-events-config`).
    pub(crate) fn set_kv_event_publisher(&mut self, publisher: KvEventPublisher) {
        self.kv_cache_manager.enable_kv_events();
        self.kv_events = Some(publisher);
    }

    /// Where the KV cache events go: the PUB and replay addresses.
    pub fn kv_events_endpoints(&self) -> Option<(&str, Option<&str>)> {
        self.kv_events.as_ref().map(KvEventPublisher::endpoints)
    }

    /// Sends the step's changes to the prefix cache (vLLM v1's scheduler does at the end of
    /// `update_from_output`).
    fn publish_kv_events(&mut self) {
        if let Some(publisher) = &mut self.kv_events {
            publisher.publish(self.kv_cache_manager.take_kv_events());
        }
    }

    pub fn num_cpu_blocks(&self) -> usize {
        self.kv_cache_manager.num_cpu_blocks()
    }

    pub fn num_free_cpu_blocks(&self) -> usize {
        self.kv_cache_manager.num_free_cpu_blocks()
    }

    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty() || !self.swapped.is_empty()
    }

    /// Queues a new sequence.
    pub fn add_seq(&mut self, seq: Sequence) {
        self.waiting.insert(self.cfg.policy.key(&seq), seq.id);
        self.seqs.insert(seq.id, seq);
    }

    /// Takes in a step's results (vLLM v1's `update_from_output`): every scheduled sequence
    /// has its new tokens' K/V (less its rejected draft tokens'), each sampled token is
    /// appended (and followed by the sequence's grammar), and a sequence whose token ends it
    /// (on ids or length) is finished and freed. Returns one output per appended token, or
    /// one per scheduled sequence that sampled nothing, in the step's order.
    pub fn update_from_output(
        &mut self,
        sched: &SchedulerOutput,
        out: ModelRunnerOutput,
    ) -> Vec<EngineCoreOutput> {
        // Only decode steps say what a guess costs: prompt chunks run the kernels in
        // another regime (a large batch's per-token cost is far below a small one's).
        let decoding = |s: &ScheduledSeq| s.num_new_tokens == 1 + s.spec_token_ids.len();
        if let (Some(d), true) = (&mut self.draft_length, sched.scheduled.iter().all(decoding)) {
            let tokens = sched.scheduled.iter().map(|s| s.num_new_tokens).sum();
            d.observe_step(tokens, out.run_seconds, out.num_guesses, out.draft_seconds);
        }
        (self.prefill_share).observe_step(self.runs_long_prefill, out.run_seconds);
        let mut sampled = out.sampled.into_iter().peekable();
        let mut prompt_logprobs = out.prompt_logprobs.into_iter().peekable();
        let mut pooled = out.pooled.into_iter().peekable();
        let mut outputs = Vec::with_capacity(sched.scheduled.len());
        for s in &sched.scheduled {
            // The lists are in the step's order, each a subset of it.
            let mut prompt_lps = None;
            if prompt_logprobs.peek().is_some_and(|(id, _)| *id == s.id) {
                prompt_lps = prompt_logprobs.next().map(|(_, lps)| lps);
            }
            let Some(seq) = self.seqs.get_mut(&s.id) else {
                continue;
            };
            if let Some((_, vector)) = pooled.next_if(|(id, _)| *id == s.id) {
                // An embedding request ends with its prompt.
                seq.num_computed_tokens += s.num_new_tokens;
                outputs.push(EngineCoreOutput {
                    seq: s.id,
                    new_token: None,
                    prompt_logprobs: None,
                    finish: Some((FinishReason::Stop, None)),
                    stop_token: false,
                    pooled: Some(vector),
                    num_cached_tokens: seq.num_cached_tokens.unwrap_or(0),
                });
                self.finish_seq(s.id);
                continue;
            }
            let mut num_appended: usize = 0;
            let mut finish = None;
            while let Some((_, token)) = sampled.next_if(|(id, _)| *id == s.id) {
                // Tokens after one that ends the sequence are dropped.
                if finish.is_some() {
                    continue;
                }
                seq.token_ids.push(token.token_id);
                num_appended += 1;
                if let Some(grammar) = &mut seq.grammar {
                    let started = std::time::Instant::now();
                    grammar.accept_token(token.token_id);
                    self.grammar_stats.accept_seconds += started.elapsed().as_secs_f64();
                }
                finish = seq.check_stop();
                outputs.push(EngineCoreOutput {
                    seq: s.id,
                    new_token: Some(token),
                    prompt_logprobs: prompt_lps.take(),
                    finish: finish.clone(),
                    stop_token: finish.is_some() && seq.ends_on_stop_token(),
                    pooled: None,
                    num_cached_tokens: seq.num_cached_tokens.unwrap_or(0),
                });
            }
            // Drafts past the accepted ones were computed on a wrong guess: their K/V are
            // written over when the tokens really there are fed.
            let num_accepted = num_appended.saturating_sub(1);
            if !s.spec_token_ids.is_empty() {
                (self.spec_decode_stats).observe(s.spec_token_ids.len(), num_accepted);
            }
            if num_appended > 0 {
                (seq.draft_acceptance).observe(s.spec_token_ids.len(), num_accepted);
            }
            seq.num_computed_tokens +=
                s.num_new_tokens - s.spec_token_ids.len().saturating_sub(num_accepted);
            if num_appended == 0 {
                outputs.push(EngineCoreOutput {
                    seq: s.id,
                    new_token: None,
                    prompt_logprobs: prompt_lps,
                    finish: None,
                    stop_token: false,
                    pooled: None,
                    num_cached_tokens: seq.num_cached_tokens.unwrap_or(0),
                });
            }
            if finish.is_some() {
                self.finish_seq(s.id);
            }
        }
        for (id, drafts) in out.draft_token_ids {
            if let Some(seq) = self.seqs.get_mut(&id) {
                seq.spec_token_ids = drafts;
            }
        }
        self.publish_kv_events();
        outputs
    }

    /// The requests `sched` runs sequences of, each once.
    pub(crate) fn requests_in(&self, sched: &SchedulerOutput) -> Vec<RequestId> {
        let mut requests: Vec<RequestId> = Vec::new();
        for s in &sched.scheduled {
            if let Some(r) = self.seqs.get(&s.id).map(|seq| &seq.request) {
                if !requests.contains(r) {
                    requests.push(r.clone());
                }
            }
        }
        requests
    }

    /// After a step that failed: its blocks' registrations in the prefix cache are taken
    /// back (their K/V may never have been written). Finish the step's sequences first.
    pub(crate) fn forget_failed_step(&mut self) {
        self.kv_cache_manager.forget_step();
        self.publish_kv_events();
    }

    /// A step that runs nothing and only tells the worker which sequences finished since
    /// the last one: for an engine gone idle, so that the worker learns of them the one way
    /// it always does (`SchedulerOutput::finished`) without waiting for a next request.
    pub(crate) fn schedule_idle(&mut self) -> SchedulerOutput {
        SchedulerOutput {
            finished: std::mem::take(&mut self.finished),
            ..SchedulerOutput::default()
        }
    }

    /// Ends a sequence (finished or aborted): it leaves its queue and its blocks are freed;
    /// its record stays readable until [`take_ended`](Self::take_ended).
    pub fn finish_seq(&mut self, id: SeqId) {
        let queued = self.waiting.remove(id) || self.running.remove(id) || self.swapped.remove(id);
        // A prefill for a decode server: its prompt's blocks, while it still holds them.
        let prefilled = |s: &&Sequence| s.exports_kv() && s.num_computed_tokens >= s.prompt_len;
        if let Some(seq) = self.seqs.get(&id).filter(|_| queued).filter(prefilled) {
            let num_blocks = seq.prompt_len.div_ceil(self.kv_cache_manager.block_size());
            let table = self.kv_cache_manager.block_tables(id).first();
            if let Some(blocks) = table.and_then(|t| t.get(..num_blocks)) {
                self.kv_exports.push(KvExport {
                    seq: id,
                    blocks: blocks.to_vec(),
                });
            }
        }
        self.kv_cache_manager.free(id);
        // Not queued: it had ended already.
        let Some(seq) = self.seqs.get(&id).filter(|_| queued) else {
            return;
        };
        if seq.known_to_worker {
            self.finished.push(id);
        }
        self.ended.push(id);
    }

    /// The prefills finished since the last call whose KV is to be exported: their blocks
    /// are free again, so the caller reads them before the next step is scheduled.
    pub(crate) fn take_kv_exports(&mut self) -> Vec<KvExport> {
        std::mem::take(&mut self.kv_exports)
    }

    /// The records of the sequences ended since the last call, given up.
    /// Exports not taken by now are of sequences that ended otherwise (aborted): dropped.
    pub(crate) fn take_ended(&mut self) -> impl Iterator<Item = Sequence> + '_ {
        self.kv_exports.clear();
        let seqs = &mut self.seqs;
        self.ended.drain(..).filter_map(|id| seqs.remove(&id))
    }

    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput {
            finished: std::mem::take(&mut self.finished),
            ..SchedulerOutput::default()
        };
        let mut budget = self.cfg.max_num_batched_tokens;
        let mut prefill = self.cfg.max_prefill_tokens;
        self.kv_cache_manager.start_step();
        self.runs_long_prefill = false;
        let long_wait = self.prefill_share.long_prompts_wait() && self.has_short_request();
        self.schedule_running(&mut out, &mut budget, &mut prefill, long_wait);
        // As vLLM: a step that had to preempt admits nobody new, or the newcomer would
        // take the blocks just freed and the preempted sequence would starve. Swapped-out
        // sequences likewise come back before anyone new starts. That also keeps swap-outs
        // and swap-ins in different steps, so no CPU block is both written and read in one.
        if out.preempted.is_empty() {
            self.schedule_swapped(&mut out, &mut budget);
            if self.swapped.is_empty() {
                self.schedule_waiting(&mut out, &mut budget, &mut prefill, long_wait);
            }
        }
        // Long prompts wait only for others' work: with none, they run.
        if long_wait && out.scheduled.is_empty() && out.preempted.is_empty() {
            self.schedule_running(&mut out, &mut budget, &mut prefill, false);
            if self.swapped.is_empty() {
                self.schedule_waiting(&mut out, &mut budget, &mut prefill, false);
            }
        }
        out.num_batched_tokens = self.cfg.max_num_batched_tokens - budget;
        self.describe_for_worker(&mut out);
        out
    }

    /// Adds what the worker needs beyond the token counts: the block tables and state slot
    /// (the tables final only once the whole step is scheduled: a sliding window frees
    /// blocks as it allocates), and which sequences it has not seen.
    fn describe_for_worker(&mut self, out: &mut SchedulerOutput) {
        for s in &mut out.scheduled {
            let start = out.block_ids.len();
            let tables = self.kv_cache_manager.block_tables(s.id);
            out.block_ids.extend(tables.iter().flatten().map(|b| b.0));
            s.block_ids = start..out.block_ids.len();
            s.state = self.kv_cache_manager.state_step(s.id);
            let seq = self.seqs.get_mut(&s.id).expect("scheduled seq exists");
            s.samples = seq.params.pooling.is_none()
                && reaches_end(s.num_computed, s.num_new_tokens, seq.len());
            if let Some(grammar) = seq.grammar.as_mut().filter(|_| s.samples) {
                let started = std::time::Instant::now();
                out.token_masks.push((s.id, grammar.token_mask()));
                self.grammar_stats.mask_seconds += started.elapsed().as_secs_f64();
                self.grammar_stats.num_token_masks += 1;
            }
            if !seq.known_to_worker {
                seq.known_to_worker = true;
                out.new_seqs.push(s.id);
            }
        }
    }

    /// Whether `seq`, prefilling, is a long prompt: by the tokens its prefill computes
    /// (those the prefix cache did not have when it started).
    fn is_long_prefill(&self, seq: &Sequence) -> bool {
        let to_prefill = seq.len() - seq.num_cached_tokens.unwrap_or(0);
        seq.num_uncomputed() > 1 && self.prefill_share.is_long(to_prefill)
    }

    /// Whether a request with a short prompt is waiting or running: the interactive work
    /// long prompts make room for. Requests with long prompts of their own decode beside
    /// the next long chunk, as without sharing: holding a queue of long prompts back for
    /// their decodes would only move their wait from the tokens to the first one (a burst
    /// of 1,024-token prompts: median TTFT 2.4 s -> 13.6 s, TPOT 204 -> 12 ms).
    fn has_short_request(&self) -> bool {
        let short = |id: SeqId| {
            let seq = &self.seqs[&id];
            let to_prefill = seq
                .prompt_len
                .saturating_sub(seq.num_cached_tokens.unwrap_or(0));
            !self.prefill_share.is_long(to_prefill)
        };
        self.running.iter().any(short)
            || self.waiting.iter().any(short)
            || self.swapped.iter().any(short)
    }

    /// `long_wait`: long prompts' chunks sit this step out.
    fn schedule_running(
        &mut self,
        out: &mut SchedulerOutput,
        budget: &mut usize,
        prefill: &mut usize,
        long_wait: bool,
    ) {
        let mut i = 0;
        while let (Some(id), true) = (self.running.get(i), *budget > 0) {
            let seq = &self.seqs[&id];
            let uncomputed = seq.num_uncomputed();
            let long = self.is_long_prefill(seq);
            if long && long_wait {
                i += 1;
                continue;
            }
            // A decode always runs, with its draft tokens when the budget has room for all
            // of them; a prompt's remainder waits for prefill budget.
            let num_drafts = match seq.num_spec_tokens() {
                k if uncomputed == 1 && k < *budget => k,
                _ => 0,
            };
            let num_new = match uncomputed {
                1 => 1 + num_drafts,
                n => n.min(*budget).min(*prefill),
            };
            if num_new == 0 {
                i += 1;
                continue;
            }
            let computed = seq.num_computed_tokens;
            loop {
                let seq = &self.seqs[&id];
                let alloc =
                    self.kv_cache_manager
                        .allocate_slots(id, &seq.token_ids, computed, num_new);
                if alloc.is_some() {
                    let num_lookahead = self.lookahead(id);
                    let seq = self.seqs.get_mut(&id).expect("running seq exists");
                    let mut spec_token_ids = std::mem::take(&mut seq.spec_token_ids);
                    spec_token_ids.truncate(num_drafts);
                    out.scheduled.push(ScheduledSeq {
                        id,
                        num_computed: computed,
                        num_new_tokens: num_new,
                        block_ids: 0..0,
                        state: None,
                        spec_token_ids,
                        num_lookahead,
                        samples: false,
                    });
                    *budget -= num_new;
                    if uncomputed > 1 {
                        *prefill -= num_new;
                    }
                    self.runs_long_prefill |= long;
                    i += 1;
                    break;
                }
                // Out of blocks: the lowest-priority running sequence gives its blocks up.
                // Those after `i` are not scheduled yet, so taking the last is always safe.
                let victim = self.running.last().expect("id is running");
                self.preempt(victim, out);
                if victim == id {
                    break;
                }
            }
        }
    }

    /// Swaps sequences back in, in policy order, while their blocks fit, and schedules them in
    /// this same step: they were running when swapped out, so they are owed the turn.
    fn schedule_swapped(&mut self, out: &mut SchedulerOutput, budget: &mut usize) {
        while let Some(id) = self.swapped.first() {
            if self.running.len() >= self.cfg.max_num_seqs {
                break;
            }
            let seq = &self.seqs[&id];
            let computed = seq.num_computed_tokens;
            let num_new = seq.num_uncomputed().min(*budget);
            // Fresh blocks for the computed tokens and this step's new ones at once: all or
            // nothing, so a sequence never comes back without room to run.
            let Some(copies) =
                (self.kv_cache_manager).swap_in(id, &seq.token_ids, computed + num_new)
            else {
                break;
            };
            out.swap_in.extend(copies);
            let seq = self.seqs.get_mut(&id).expect("swapped seq exists");
            let key = self.cfg.policy.key(seq);
            self.swapped.pop_first();
            self.running.insert(key, id);
            self.num_swapped_in += 1;
            tracing::debug!(%id, "swapped in");
            if num_new > 0 {
                out.scheduled.push(ScheduledSeq {
                    id,
                    num_computed: computed,
                    num_new_tokens: num_new,
                    block_ids: 0..0,
                    state: None,
                    spec_token_ids: Vec::new(),
                    num_lookahead: 0,
                    samples: false,
                });
                *budget -= num_new;
            }
        }
    }

    /// How many tokens to guess after the token `id` samples next (none under a grammar:
    /// its mask is for one token).
    fn lookahead(&self, id: SeqId) -> usize {
        let seq = &self.seqs[&id];
        match &self.draft_length {
            Some(d) if seq.grammar.is_none() => {
                d.lookahead(&seq.draft_acceptance, self.running.len())
            }
            _ => 0,
        }
    }

    /// Admits waiting sequences in policy order while they fit; with `long_wait`, long
    /// prompts stay waiting and the shorter ones behind them may start.
    fn schedule_waiting(
        &mut self,
        out: &mut SchedulerOutput,
        budget: &mut usize,
        prefill: &mut usize,
        long_wait: bool,
    ) {
        let mut i = 0;
        while let Some(id) = self.waiting.get(i) {
            if *budget == 0 || self.running.len() >= self.cfg.max_num_seqs {
                break;
            }
            let seq = &self.seqs[&id];
            if self.waits_for_sibling(seq) {
                i += 1;
                continue;
            }
            let computed = if seq.skip_prefix_cache {
                ComputedBlocks::default()
            } else {
                let found = self.kv_cache_manager.get_computed_blocks(&seq.token_ids);
                // A sequence preempted and recomputed finds its own blocks: vLLM leaves
                // that out of the hit rate.
                found.counted(seq.num_cached_tokens.is_none())
            };
            let cached = computed.num_tokens();
            // KV pulled from a prefill server covers the prompt past the prefix cache's hits
            // but for its last token, whose logits give the first sample (vLLM's rule too).
            let imported = match &seq.kv_import {
                Some(p) if !seq.skip_prefix_cache => p.token_ids.len().min(seq.len() - 1),
                _ => 0,
            };
            let start = cached.max(imported);
            let remaining = seq.len() - start;
            let long = self.prefill_share.is_long(remaining);
            if long && long_wait {
                i += 1;
                continue;
            }
            // Only the prefill budget's first prompt may overrun it: one that must run
            // whole (no chunked prefill) would otherwise never start.
            let fresh_step = *prefill == self.cfg.max_prefill_tokens;
            let room = if !self.cfg.enable_chunked_prefill && fresh_step {
                *budget
            } else {
                (*budget).min(*prefill)
            };
            if room == 0 || (remaining > room && !self.cfg.enable_chunked_prefill) {
                break;
            }
            let num_new = remaining.min(room);
            if (self.kv_cache_manager)
                .allocate_new_slots(id, &seq.token_ids, computed, start - cached + num_new)
                .is_none()
            {
                break;
            }
            let seq = self.seqs.get_mut(&id).expect("waiting seq exists");
            seq.num_computed_tokens = start;
            seq.num_cached_tokens.get_or_insert(start);
            // Taken either way: a preempted sequence recomputes its prompt.
            if let Some(payload) = seq.kv_import.take().filter(|_| start > cached) {
                let bs = self.kv_cache_manager.block_size();
                let blocks = cached / bs..start.div_ceil(bs);
                out.kv_imports.push(KvImport {
                    seq: id,
                    payload,
                    blocks,
                });
                self.num_external_kv_tokens += (start - cached) as u64;
            }
            let key = self.cfg.policy.key(seq);
            self.waiting.remove(id);
            self.running.insert(key, id);
            self.runs_long_prefill |= long;
            out.scheduled.push(ScheduledSeq {
                id,
                num_computed: start,
                num_new_tokens: num_new,
                block_ids: 0..0,
                state: None,
                spec_token_ids: Vec::new(),
                num_lookahead: self.lookahead(id),
                samples: false,
            });
            *budget -= num_new;
            *prefill = prefill.saturating_sub(num_new);
        }
    }

    /// With linear-attention states kept for prefix caching, a later completion of an
    /// `n > 1` request waits while an earlier one computes their shared prompt: it then
    /// starts from the state kept at the prompt's last block boundary (the state copied at
    /// the fork) and computes only the tokens after it, instead of the whole prompt.
    fn waits_for_sibling(&self, seq: &Sequence) -> bool {
        // The state it would resume from is the one at the prompt's last block boundary
        // short of its end (a prefix hit leaves the last token to compute): a prompt of
        // whole blocks keeps its state at its end only, which no hit can use.
        let bs = self.kv_cache_manager.block_size();
        let shares_a_block = seq.prompt_len > bs && !seq.prompt_len.is_multiple_of(bs);
        seq.index > 0
            && shares_a_block
            && !seq.skip_prefix_cache
            && self.kv_cache_manager.keeps_states()
            && self.running.iter().any(|id| {
                let s = &self.seqs[&id];
                s.request == seq.request && s.num_computed_tokens < s.prompt_len
            })
    }

    /// Swaps `id` out if the swap pool has room for its computed blocks, else preempts it
    /// by recompute: the blocks go back to the pool (full ones stay in the prefix cache, so
    /// the recompute is often cheap) and the sequence waits again.
    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        self.running.remove(id);
        self.num_preemptions += 1;
        out.preempted.push(id);
        let seq = self.seqs.get_mut(&id).expect("preempted seq exists");
        let key = self.cfg.policy.key(seq);
        if let Some(copies) = self.kv_cache_manager.swap_out(id, seq.num_computed_tokens) {
            tracing::debug!(%id, blocks = copies.len(), "preempted (swapped out)");
            out.swap_out.extend(copies);
            self.swapped.insert(key, id);
            self.num_swapped_out += 1;
            return;
        }
        self.kv_cache_manager.free(id);
        seq.num_computed_tokens = 0;
        self.waiting.insert(key, id);
        tracing::debug!(%id, "preempted (recompute)");
    }
}

#[cfg(test)]
mod tests;
