//! The worker's own state of each running sequence (what vLLM v1's `CachedRequestState`
//! holds beyond the request): its RNG, how far its prompt is scored, its pooling sums. The
//! sequence's tokens and settings are not here: the runner reads them from the scheduler's
//! record of it (`sequence::Sequences`), the one place each token is appended.

use std::collections::HashMap;

use crate::core::sched_output::SchedulerOutput;
use crate::ids::SeqId;
use crate::model_executor::layers::sampler::SeqSamplingState;
use crate::sequence::{Sequence, Sequences};

/// What the worker keeps of one sequence from step to step.
#[derive(Debug)]
pub(crate) struct CachedSeq {
    /// Its RNG, which only its own draws advance, so its tokens do not depend on the batch.
    pub sampling: SeqSamplingState,
    /// For the sequence that scores its prompt: the first prompt position whose successor is
    /// still to be scored (a recompute after preemption does not score again).
    pub prompt_logprobs_from: Option<usize>,
    /// An embedding request's hidden states pooled so far (their sum, or the last one).
    pub pooled: Vec<f32>,
}

impl CachedSeq {
    fn new(s: &Sequence) -> Self {
        Self {
            sampling: SeqSamplingState::new(s.params.seed, s.index),
            prompt_logprobs_from: s.scores_prompt().then_some(0),
            pooled: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct InputBatch {
    seqs: HashMap<SeqId, CachedSeq>,
}

impl InputBatch {
    /// Applies what the step changed: finished sequences are forgotten, new ones (read from
    /// `seqs`) added.
    pub fn update(&mut self, sched: &SchedulerOutput, seqs: &Sequences) {
        for id in &sched.finished {
            self.seqs.remove(id);
        }
        for id in &sched.new_seqs {
            self.seqs.insert(*id, CachedSeq::new(&seqs[id]));
        }
    }

    /// A sequence the scheduler has scheduled: it always said so first.
    pub fn get_mut(&mut self, id: SeqId) -> &mut CachedSeq {
        self.seqs
            .get_mut(&id)
            .unwrap_or_else(|| panic!("{id} was scheduled but never sent to the worker"))
    }

    pub fn len(&self) -> usize {
        self.seqs.len()
    }
}
