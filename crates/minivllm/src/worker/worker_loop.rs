//! A worker (vLLM's `Worker`): one rank's part of the model and its KV cache. Every rank
//! loads one ([`Worker::load`]); the driver's becomes the executor's model runner, and
//! every other rank runs what the driver broadcasts each step ([`Worker::run`]), so that
//! every rank makes the same collective calls in the same order.

use std::sync::Arc;

use crate::distributed::{all_gather_u64, CommError, Communicator};
use crate::model_executor::input_metadata::InputError;
use crate::model_executor::model_loader::load_model_shard;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::model_runner::ModelRunner;
use crate::worker::step_message::{decode, Received, StepBuffers};
use crate::worker::worker_config::{resolve_max_model_len, WorkerConfig, WorkerError};

pub struct Worker {
    runner: ModelRunner,
    max_model_len: usize,
    received: StepBuffers,
    message: Vec<u8>,
}

impl Worker {
    /// Loads this rank's shard of `config.model` over `group` and allocates its KV cache,
    /// sized by the rank's own KV heads: with N ranks a block holds 1/N of its tokens' K/V,
    /// and every rank must have the same blocks (checked with the others).
    pub fn load(config: &WorkerConfig, group: Arc<dyn Communicator>) -> Result<Self, WorkerError> {
        let mut model = load_model_shard(&config.model, &config.load, group)?.model;
        let max_model_len = resolve_max_model_len(config.max_model_len, model.config())?;
        let c = &config.cache;
        let kv_dtype = c.kv_cache_dtype.resolve(config.load.dtype);
        let local = model.local_config();
        let cache = CacheEngine::with_budget(
            local,
            c.block_size,
            c.kv_cache_memory,
            kv_dtype,
            c.max_state_slots(),
        )?
        .with_swap_space(c.swap_space)?;
        model.set_max_model_len(max_model_len);
        let shape = [
            cache.num_blocks(),
            cache.num_state_slots(),
            cache.num_cpu_blocks(),
            cache.block_size(),
            max_model_len,
        ];
        check_same_on_every_rank(&**model.communicator(), &shape)?;
        Ok(Self {
            runner: ModelRunner::new(model, cache),
            max_model_len,
            received: StepBuffers::default(),
            message: Vec::new(),
        })
    }

    /// The longest sequence, prompt and output, the model runs.
    pub fn max_model_len(&self) -> usize {
        self.max_model_len
    }

    /// The driver's part: its runner, which the executor runs each step itself.
    pub(crate) fn into_runner(self) -> ModelRunner {
        self.runner
    }

    /// Runs the driver's steps until it shuts the group down. A batch the model refuses is
    /// refused on the driver too, before any collective, so the worker goes on; a broken
    /// collective ends the loop with its error.
    pub fn run(&mut self) -> Result<(), CommError> {
        let comm = Arc::clone(self.runner.model().communicator());
        let block_size = self.runner.cache().block_size();
        let mut steps = 0u64;
        loop {
            comm.broadcast_bytes(0, &mut self.message)?;
            match decode(&self.message, block_size, &mut self.received)? {
                Received::CacheOps => {
                    let ops = &self.received.ops;
                    self.runner.apply_cache_ops(&ops.swap_out, &ops.swap_in);
                }
                Received::Execute => {
                    steps += 1;
                    match self.runner.forward(Some(&self.received.input)) {
                        Ok(_) => {}
                        Err(InputError::Collective(e)) => return Err(e),
                        Err(e) => tracing::warn!("step {steps}: the batch was refused: {e}"),
                    }
                }
                Received::Shutdown => {
                    tracing::info!(rank = comm.rank(), steps, "the driver stopped");
                    return Ok(());
                }
            }
        }
    }
}

/// Block ids name the same block on every rank only if every rank's cache has the same
/// shape; ranks on different hosts with different files or memory could disagree.
fn check_same_on_every_rank(comm: &dyn Communicator, shape: &[usize; 5]) -> Result<(), CommError> {
    if comm.world_size() == 1 {
        return Ok(());
    }
    let local: Vec<u64> = shape.iter().map(|&v| v as u64).collect();
    let all = all_gather_u64(comm, &local)?;
    match all.iter().position(|other| *other != local) {
        None => Ok(()),
        Some(rank) => Err(CommError::Mismatch {
            rank: comm.rank(),
            what: format!(
                "rank {rank}'s KV cache (blocks, state slots, CPU blocks, block size, \
                 max_model_len) {:?} \
                 differs from this rank's {shape:?}",
                all[rank]
            ),
        }),
    }
}
