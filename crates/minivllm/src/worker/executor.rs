//! The executor (vLLM v1's `Executor`): what the engine runs a step through. Started, it
//! sends the other ranks of a tensor-parallel group their configuration, loads the driver's
//! shard and sizes its KV cache as every worker does (`worker/worker_loop.rs`). It holds the
//! driver's model runner and the group of the other ranks' workers: each step's cache
//! operations and batch are broadcast to them before the driver runs its own part (the
//! batch as its new tokens and the blocks its tables gained, `step_message`), so every rank
//! makes the same collective calls in the same order, and dropping the executor stops them.

use std::sync::Arc;

use crate::core::sched_output::SchedulerOutput;
use crate::distributed::Communicator;
use crate::model_executor::input_metadata::InputError;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::outputs::ModelRunnerOutput;
use crate::sequence::Sequences;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::draft_proposer::DraftProposer;
use crate::worker::model_runner::ModelRunner;
use crate::worker::step_message::{encode_cache_ops, encode_execute, encode_shutdown, HeldTables};
use crate::worker::worker_config::{WorkerConfig, WorkerError};
use crate::worker::worker_loop::Worker;
use crate::worker::worker_process::{driver_group, Driver};

pub(crate) struct Executor {
    runner: ModelRunner,
    max_model_len: usize,
    /// The group, when the driver has workers on other ranks.
    workers: Option<Arc<dyn Communicator>>,
    /// The step message for the workers, reused.
    message: Vec<u8>,
    /// The block tables the workers hold, which each step sends the changes to.
    held: HeldTables,
}

impl Executor {
    /// Starts the model `config` names on the group `driver` holds (its other ranks load
    /// their shards from `config`), or on this process alone without a driver: loads the
    /// driver's shard and allocates its KV cache.
    pub fn start(driver: Option<Driver>, config: &WorkerConfig) -> Result<Self, WorkerError> {
        let group = driver_group(driver, config)?;
        // Dropping the group's last handle here on an error (a file that will not load)
        // releases the workers, which fail to load it too.
        let worker = Worker::load(config, group)?;
        let max_model_len = worker.max_model_len();
        let runner = worker.into_runner();
        let comm = runner.model().communicator();
        let workers = (comm.rank() == 0 && comm.world_size() > 1).then(|| Arc::clone(comm));
        Ok(Self {
            runner,
            max_model_len,
            workers,
            message: Vec::new(),
            held: HeldTables::default(),
        })
    }

    /// The longest sequence, prompt and output, the model runs (`--max-model-len`, or the
    /// model's context length).
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// Runs the step `sched` describes, on the sequences `seqs` (the scheduler's), on every
    /// rank and samples on the driver: the worker's per-sequence state takes in the step's
    /// changes, the blocks move to and from the swap pool, and the scheduled sequences run
    /// as one batch. An empty step only does the first two.
    pub(crate) fn execute(
        &mut self,
        sched: &SchedulerOutput,
        seqs: &Sequences,
    ) -> Result<ModelRunnerOutput, InputError> {
        self.runner.update_batch(sched, seqs);
        let (swap_out, swap_in) = (&sched.swap_out, &sched.swap_in);
        if !swap_out.is_empty() || !swap_in.is_empty() {
            if let Some(workers) = &self.workers {
                encode_cache_ops(&mut self.message, swap_out, swap_in);
                workers.broadcast_bytes(0, &mut self.message)?;
            }
            self.runner.apply_cache_ops(swap_out, swap_in);
        }
        // Prefill/decode disaggregation runs without tensor parallelism (the engine refuses
        // the pair), so the driver's cache is the whole cache.
        self.runner.import_kv(sched);
        if sched.is_empty() {
            return Ok(ModelRunnerOutput::default());
        }
        self.runner.prepare(sched, seqs);
        if let Some(workers) = &self.workers {
            let ids = sched.scheduled.iter().map(|s| s.id);
            encode_execute(&mut self.message, self.runner.input(), ids, &mut self.held);
            workers.broadcast_bytes(0, &mut self.message)?;
        }
        self.runner.run(sched, seqs)
    }

    pub fn model(&self) -> &LlamaForCausalLM {
        self.runner.model()
    }

    pub fn cache(&self) -> &CacheEngine {
        self.runner.cache()
    }

    /// Whether the model runs on several ranks.
    pub(crate) fn is_distributed(&self) -> bool {
        self.workers.is_some()
    }

    /// Has `proposer` guess draft tokens after each token sampled.
    pub fn set_draft_proposer(&mut self, proposer: Box<dyn DraftProposer>) {
        self.runner.set_draft_proposer(proposer);
    }

    /// Frees what an idle engine need not hold; see `ModelRunner::release_idle_memory`.
    pub fn release_idle_memory(&mut self) {
        self.runner.release_idle_memory();
    }

    /// Sequences the driver keeps state for.
    pub(crate) fn num_cached_seqs(&self) -> usize {
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
