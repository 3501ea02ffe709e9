//! Where each process of a tensor-parallel group goes at start-up: rank 0 (the driver)
//! builds the engine, whose executor sends the workers' configuration to the other ranks,
//! which load their shards and KV caches from it and run workers until the driver stops.
//! One process alone is its own driver.
//!
//! The driver's hold on its group is a value, [`Driver`], that starting the engine takes:
//! so a group serves at most one engine, and a driver that never starts one releases its
//! workers when it is dropped, with no process-wide flag to say which happened.

use std::sync::Arc;

use crate::distributed::{init_group, CommError, Communicator};
use crate::worker::worker_config::{WorkerConfig, WorkerError};
use crate::worker::worker_loop::Worker;

/// What this process is in its group.
pub enum Role {
    /// Rank 0, or a process alone: build the engine with it
    /// (`LLMEngine::from_engine_args_with_driver`, `LLM::with_driver`).
    Driver(Driver),
    /// A worker whose driver has shut the group down: the process has nothing left to do.
    WorkerDone,
}

/// Rank 0's hold on its group, until an engine takes it over (dropping the last handle to
/// an MPI group ends MPI in the process). Dropped without starting an engine (a command that
/// ended early), it releases the workers, which wait for one.
pub struct Driver {
    group: Arc<dyn Communicator>,
    engine_started: bool,
}

impl Driver {
    /// Sends the workers their configuration, from which they load their shards and KV
    /// caches, and hands the group over to the executor.
    fn start(mut self, config: &WorkerConfig) -> Result<Arc<dyn Communicator>, WorkerError> {
        if self.group.world_size() != config.tensor_parallel_size {
            return Err(WorkerError::Config(format!(
                "the engine asks for --tensor-parallel-size {} but its driver's group has {} \
                 ranks",
                config.tensor_parallel_size,
                self.group.world_size()
            )));
        }
        if self.group.world_size() > 1 {
            let mut bytes = serde_json::to_vec(config).expect("worker configuration serialises");
            self.group.broadcast_bytes(0, &mut bytes)?;
        }
        self.engine_started = true;
        Ok(Arc::clone(&self.group))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.group.world_size() > 1 && !self.engine_started {
            if let Err(e) = self.group.broadcast_bytes(0, &mut Vec::new()) {
                tracing::warn!("could not release the tensor-parallel workers: {e}");
            }
        }
    }
}

/// Joins the group of `tensor_parallel_size` ranks; on a rank other than 0, runs its worker
/// (with the driver's configuration) to the end.
pub fn start_rank(tensor_parallel_size: usize) -> Result<Role, WorkerError> {
    let group = init_group(tensor_parallel_size)?;
    if group.rank() == 0 {
        return Ok(Role::Driver(Driver {
            group,
            engine_started: false,
        }));
    }
    let mut bytes = Vec::new();
    group.broadcast_bytes(0, &mut bytes)?;
    if bytes.is_empty() {
        tracing::info!(rank = group.rank(), "the driver ended without an engine");
        return Ok(Role::WorkerDone);
    }
    let config: WorkerConfig = serde_json::from_slice(&bytes).map_err(|e| {
        CommError::Broken(format!(
            "the driver's worker configuration is unreadable: {e}"
        ))
    })?;
    config.init_threads();
    Worker::load(&config, group)?.run()?;
    Ok(Role::WorkerDone)
}

/// The group the executor runs on: the one `driver` holds (its workers are sent `config`),
/// or, without a driver, this process alone.
pub(crate) fn driver_group(
    driver: Option<Driver>,
    config: &WorkerConfig,
) -> Result<Arc<dyn Communicator>, WorkerError> {
    config.init_threads();
    if let Some(driver) = driver {
        return driver.start(config);
    }
    if config.tensor_parallel_size > 1 {
        return Err(WorkerError::Config(format!(
            "--tensor-parallel-size {} needs its ranks started first: every process calls \
             minivllm::worker::worker_process::start_rank, and rank 0 builds the engine with \
             the Driver it returns (LLMEngine::from_engine_args_with_driver)",
            config.tensor_parallel_size
        )));
    }
    Ok(init_group(1)?)
}
