//! The executor (vLLM v1's `Executor`): what the engine runs a step through. It holds the
//! driver's model runner and, with tensor parallelism, the group of the other ranks'
//! workers (`worker/worker_loop.rs`): each step's cache operations and laid-out batch are
//! broadcast to them before the driver runs its own part, so every rank makes the same
//! collective calls in the same order, and dropping the executor stops them.

use std::sync::Arc;

use crate::core::sched_output::SchedulerOutput;
use crate::distributed::Communicator;
use crate::model_executor::input_metadata::InputError;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::outputs::ModelRunnerOutput;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::model_runner::ModelRunner;
use crate::worker::step_message::{encode_cache_ops, encode_execute, encode_shutdown};

pub struct Executor {
    runner: ModelRunner,
    /// The group, when the driver has workers on other ranks.
    workers: Option<Arc<dyn Communicator>>,
    /// The step message for the workers, reused.
    message: Vec<u8>,
}

impl Executor {
    /// Runs steps on `runner`'s rank, the driver (rank 0), and on every other rank of its
    /// model's group, whose workers are waiting for the driver's messages.
    pub fn new(runner: ModelRunner) -> Self {
        let comm = runner.model().communicator();
        let workers = (comm.rank() == 0 && comm.world_size() > 1).then(|| Arc::clone(comm));
        Self {
            runner,
            workers,
            message: Vec::new(),
        }
    }

    /// Runs the step `sched` describes on every rank and samples on the driver: the
    /// persistent batch takes in the step's changes, the blocks move to and from the swap
    /// pool, and the scheduled sequences run as one batch. An empty step only does the first
    /// two.
    pub fn execute(&mut self, sched: &SchedulerOutput) -> Result<ModelRunnerOutput, InputError> {
        self.runner.update_batch(sched);
        let (swap_out, swap_in) = (&sched.swap_out, &sched.swap_in);
        if !swap_out.is_empty() || !swap_in.is_empty() {
            if let Some(workers) = &self.workers {
                encode_cache_ops(&mut self.message, swap_out, swap_in);
                workers.broadcast_bytes(0, &mut self.message)?;
            }
            self.runner.apply_cache_ops(swap_out, swap_in);
        }
        if sched.is_empty() {
            return Ok(ModelRunnerOutput::default());
        }
        self.runner.prepare(sched);
        if let Some(workers) = &self.workers {
            encode_execute(&mut self.message, self.runner.input());
            workers.broadcast_bytes(0, &mut self.message)?;
        }
        self.runner.run(sched)
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        self.runner.model()
    }

    pub fn cache(&self) -> &CacheEngine {
        self.runner.cache()
    }

    /// Has `proposer` guess draft tokens after each token sampled.
    pub fn set_draft_proposer(&mut self, proposer: Box<dyn DraftProposer>) {
        self.runner.set_draft_proposer(proposer);
    }

    /// Frees what an idle engine need not hold; see `ModelRunner::release_idle_memory`.
    pub fn release_idle_memory(&mut self, finished: &[crate::ids::SeqId]) {
        self.runner.release_idle_memory(finished);
    }

    /// Sequences in the driver's persistent batch.
    pub fn num_cached_seqs(&self) -> usize {
        self.runner.num_cached_seqs()
    }
}

/// The driver's last word to its workers: they leave their loops (and MPI is finalised once
/// every rank drops its group).
impl Drop for Executor {
    fn drop(&mut self) {
        if let Some(workers) = &self.workers {
            encode_shutdown(&mut self.message);
            if let Err(e) = workers.broadcast_bytes(0, &mut self.message) {
                tracing::warn!("could not tell the tensor-parallel workers to stop: {e}");
            }
        }
    }
}
