//! A worker: a rank other than 0 of a tensor-parallel group. It holds its shard of the
//! model and its heads' KV cache, and runs what the driver broadcasts each step, so that
//! every rank makes the same collective calls in the same order.

use std::sync::Arc;

use crate::distributed::CommError;
use crate::model_executor::input_metadata::InputError;
use crate::worker::model_runner::ModelRunner;
use crate::worker::step_message::{decode, Received, StepBuffers};

pub struct Worker {
    runner: ModelRunner,
    received: StepBuffers,
    message: Vec<u8>,
}

impl Worker {
    pub fn new(runner: ModelRunner) -> Self {
        Self {
            runner,
            received: StepBuffers::default(),
            message: Vec::new(),
        }
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
