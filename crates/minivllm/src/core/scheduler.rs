//! Continuous batching: each step picks which sequences run and how many of their tokens,
//! within a token budget and a sequence budget, mixing decodes and prompt chunks.
//!
//! Like vLLM v1 there is no separate prefill phase: every sequence simply has tokens whose
//! K/V are not yet computed (a whole prompt, a prompt's remainder, one sampled token, or
//! everything after a preemption) and the scheduler hands out budget to close that gap.

use std::collections::HashMap;

use crate::core::block_manager::BlockManager;
use crate::core::block_pool::BlockId;
use crate::core::policy::Policy;
use crate::sequence::{SeqId, Sequence, SequenceStatus};

#[derive(Debug, Clone)]
pub struct SchedulerConfig {
    /// Most tokens fed to the model in one step (`--max-num-batched-tokens`).
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (`--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Split long prompts across steps; without it a prompt waits until it fits whole.
    pub enable_chunked_prefill: bool,
    pub policy: Policy,
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: SeqId,
    /// Tokens already in the cache; this step feeds `token_ids[num_computed..num_computed + num_new_tokens]`.
    pub num_computed: usize,
    pub num_new_tokens: usize,
}

#[derive(Debug, Default)]
pub struct SchedulerOutput {
    pub scheduled: Vec<ScheduledSeq>,
    /// KV blocks to copy before the model runs (copy-on-write of shared blocks).
    pub block_copies: Vec<(BlockId, BlockId)>,
    /// Sequences preempted this step (their blocks were freed; they will be recomputed).
    pub preempted: Vec<SeqId>,
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

pub struct Scheduler {
    cfg: SchedulerConfig,
    block_manager: BlockManager,
    seqs: HashMap<SeqId, Sequence>,
    waiting: Vec<SeqId>,
    running: Vec<SeqId>,
    num_preemptions: u64,
}

impl Scheduler {
    pub fn new(cfg: SchedulerConfig, block_manager: BlockManager) -> Self {
        Self {
            cfg,
            block_manager,
            seqs: HashMap::new(),
            waiting: Vec::new(),
            running: Vec::new(),
            num_preemptions: 0,
        }
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    pub fn block_manager(&self) -> &BlockManager {
        &self.block_manager
    }

    pub fn seq(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_preemptions(&self) -> u64 {
        self.num_preemptions
    }

    pub fn has_unfinished(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Queues a new sequence.
    pub fn add_seq(&mut self, seq: Sequence) {
        self.waiting.push(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    /// Starts `child` as a running copy of `parent` sharing all its KV blocks (n > 1).
    pub fn fork_seq(&mut self, parent: SeqId, mut child: Sequence) {
        let p = &self.seqs[&parent];
        child.num_computed_tokens = p.num_computed_tokens;
        child.status = SequenceStatus::Running;
        self.block_manager.fork(parent, child.id);
        self.running.push(child.id);
        self.seqs.insert(child.id, child);
    }

    /// Records a step's results for `id`: `num_new` more tokens have K/V, and `sampled`
    /// (if any) is appended. Newly completed blocks become reusable through the prefix cache.
    pub fn update_seq(&mut self, id: SeqId, num_new: usize, sampled: Option<u32>) {
        let Some(seq) = self.seqs.get_mut(&id) else {
            return;
        };
        seq.num_computed_tokens += num_new;
        if let Some(t) = sampled {
            seq.token_ids.push(t);
        }
        self.block_manager
            .cache_full_blocks(id, &seq.token_ids, seq.num_computed_tokens);
    }

    /// Removes a sequence (finished or aborted) and frees its blocks.
    pub fn finish_seq(&mut self, id: SeqId) -> Option<Sequence> {
        self.waiting.retain(|s| *s != id);
        self.running.retain(|s| *s != id);
        self.block_manager.free(id);
        self.seqs.remove(&id)
    }

    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;
        self.sort_by_policy();
        self.schedule_running(&mut out, &mut budget);
        // As vLLM: a step that had to preempt admits nobody new, or the newcomer would
        // take the blocks just freed and the preempted sequence would starve.
        if out.preempted.is_empty() {
            self.schedule_waiting(&mut out, &mut budget);
        }
        out.num_batched_tokens = self.cfg.max_num_batched_tokens - budget;
        out
    }

    fn sort_by_policy(&mut self) {
        let policy = self.cfg.policy;
        let seqs = &self.seqs;
        self.running.sort_by_key(|id| policy.key(&seqs[id]));
        self.waiting.sort_by_key(|id| policy.key(&seqs[id]));
    }

    fn schedule_running(&mut self, out: &mut SchedulerOutput, budget: &mut usize) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let num_new = seq.num_uncomputed().min(*budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            let computed = seq.num_computed_tokens;
            loop {
                let seq = &self.seqs[&id];
                let alloc =
                    self.block_manager
                        .allocate_slots(id, &seq.token_ids, computed, num_new);
                if let Some(copies) = alloc {
                    out.block_copies.extend(copies);
                    out.scheduled.push(ScheduledSeq {
                        id,
                        num_computed: computed,
                        num_new_tokens: num_new,
                    });
                    *budget -= num_new;
                    i += 1;
                    break;
                }
                // Out of blocks: the lowest-priority running sequence gives its blocks up.
                // Those after `i` are not scheduled yet, so taking the last is always safe.
                let victim = *self.running.last().expect("id is running");
                self.preempt(victim, out);
                if victim == id {
                    break;
                }
            }
        }
    }

    fn schedule_waiting(&mut self, out: &mut SchedulerOutput, budget: &mut usize) {
        while let Some(&id) = self.waiting.first() {
            if *budget == 0 || self.running.len() >= self.cfg.max_num_seqs {
                break;
            }
            let seq = &self.seqs[&id];
            let cached = if seq.skip_prefix_cache {
                0
            } else {
                self.block_manager.get_computed_tokens(&seq.token_ids)
            };
            let remaining = seq.len() - cached;
            if remaining > *budget && !self.cfg.enable_chunked_prefill {
                break;
            }
            let num_new = remaining.min(*budget);
            let Some(copies) =
                self.block_manager
                    .allocate_slots(id, &seq.token_ids, cached, num_new)
            else {
                break;
            };
            out.block_copies.extend(copies);
            let seq = self.seqs.get_mut(&id).expect("waiting seq exists");
            seq.num_computed_tokens = cached;
            seq.status = SequenceStatus::Running;
            self.waiting.remove(0);
            self.running.push(id);
            out.scheduled.push(ScheduledSeq {
                id,
                num_computed: cached,
                num_new_tokens: num_new,
            });
            *budget -= num_new;
        }
    }

    /// Preemption by recompute: the blocks go back to the pool (full ones stay in the
    /// prefix cache, so the recompute is often cheap) and the sequence waits again.
    fn preempt(&mut self, id: SeqId, out: &mut SchedulerOutput) {
        self.running.retain(|s| *s != id);
        self.block_manager.free(id);
        let seq = self.seqs.get_mut(&id).expect("preempted seq exists");
        seq.num_computed_tokens = 0;
        seq.status = SequenceStatus::Waiting;
        self.waiting.push(id);
        self.num_preemptions += 1;
        out.preempted.push(id);
        tracing::debug!(%id, "preempted (recompute)");
    }
}
