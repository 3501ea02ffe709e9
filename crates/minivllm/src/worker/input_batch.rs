//! The worker's persistent batch (vLLM v1's `InputBatch` and `CachedRequestState`): each
//! running sequence's tokens and sampling state, kept from step to step and changed only by
//! what a step says changed (sequences new to the worker, sequences finished) and by the
//! tokens the worker itself samples. A decode step therefore sends no tokens down.

use std::collections::HashMap;
use std::sync::Arc;

use crate::core::sched_output::{NewSeqData, SchedulerOutput};
use crate::ids::{SeqId, TokenId};
use crate::model_executor::layers::sampler::SeqSamplingState;
use crate::sampling_params::SamplingParams;

/// One sequence as the worker keeps it.
#[derive(Debug)]
pub(crate) struct CachedSeq {
    /// Prompt then sampled tokens: the scheduler's copy grows by the same tokens.
    pub token_ids: Vec<TokenId>,
    pub prompt_len: usize,
    pub params: Arc<SamplingParams>,
    pub eos_token_ids: Arc<[TokenId]>,
    /// Its RNG, which only its own draws advance, so its tokens do not depend on the batch.
    pub sampling: SeqSamplingState,
    /// For the sequence that scores its prompt: the first prompt position whose successor is
    /// still to be scored (a recompute after preemption does not score again).
    pub prompt_logprobs_from: Option<usize>,
    /// An embedding request's hidden states pooled so far (their sum, or the last one).
    pub pooled: Vec<f32>,
}

impl CachedSeq {
    fn new(s: NewSeqData) -> Self {
        Self {
            sampling: SeqSamplingState::new(s.params.seed, s.index),
            prompt_logprobs_from: s.scores_prompt.then_some(0),
            token_ids: s.token_ids,
            prompt_len: s.prompt_len,
            params: s.params,
            eos_token_ids: s.eos_token_ids,
            pooled: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct InputBatch {
    seqs: HashMap<SeqId, CachedSeq>,
}

impl InputBatch {
    /// Applies what the step changed: finished sequences are forgotten, new ones added.
    pub fn update(&mut self, sched: &SchedulerOutput) {
        self.remove(&sched.finished);
        for s in &sched.new_seqs {
            self.seqs.insert(s.id, CachedSeq::new(s.clone()));
        }
    }

    /// Forgets finished sequences.
    pub fn remove(&mut self, finished: &[SeqId]) {
        for id in finished {
            self.seqs.remove(id);
        }
    }

    /// A sequence the scheduler has scheduled: it always sent it first.
    pub fn get_mut(&mut self, id: SeqId) -> &mut CachedSeq {
        self.seqs
            .get_mut(&id)
            .unwrap_or_else(|| panic!("{id} was scheduled but never sent to the worker"))
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }
}
