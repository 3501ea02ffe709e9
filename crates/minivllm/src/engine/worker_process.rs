//! Where each process of a tensor-parallel group goes at start-up: rank 0 (the driver)
//! builds the engine and sends its arguments to the other ranks, which load their shards
//! and KV caches from them and run workers until the driver stops. One process alone is
//! its own driver.
//!
//! The driver's hold on its group is a value, [`Driver`], that starting the engine takes:
//! so a group serves at most one engine, and a driver that never starts one releases its
//! workers when it is dropped, with no process-wide flag to say which happened.

use std::sync::Arc;

use crate::distributed::{all_gather_u64, init_group, CommError, Communicator};
use crate::engine::arg_utils::{kv_cache, resolve_max_model_len, EngineArgs};
use crate::engine::errors::EngineError;
use crate::model_executor::model_loader::load_model_shard;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::worker::model_runner::ModelRunner;
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
    /// Sends the workers the engine's arguments, from which they load their shards and KV
    /// caches, and hands the group over to the engine.
    fn start_engine(mut self, args: &EngineArgs) -> Result<Arc<dyn Communicator>, EngineError> {
        if self.group.world_size() != args.tensor_parallel_size {
            return Err(EngineError::Config(format!(
                "the engine asks for --tensor-parallel-size {} but its driver's group has {} \
                 ranks",
                args.tensor_parallel_size,
                self.group.world_size()
            )));
        }
        if self.group.world_size() > 1 {
            let mut bytes = serde_json::to_vec(args).expect("engine arguments serialise");
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
/// (with the driver's engine arguments) to the end.
pub fn start_rank(tensor_parallel_size: usize) -> Result<Role, EngineError> {
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
    let args: EngineArgs = serde_json::from_slice(&bytes).map_err(|e| {
        CommError::Broken(format!("the driver's engine arguments are unreadable: {e}"))
    })?;
    init_threads(&args);
    let loaded = load_model_shard(&args.model, &args.load, Arc::clone(&group))?;
    let (runner, _) = model_runner(loaded.model, &args)?;
    Worker::new(runner).run()?;
    Ok(Role::WorkerDone)
}

/// The group of the engine's process: the one `driver` holds (its workers are sent `args`),
/// or, without a driver, this process alone.
pub(crate) fn engine_group(
    driver: Option<Driver>,
    args: &EngineArgs,
) -> Result<Arc<dyn Communicator>, EngineError> {
    init_threads(args);
    if let Some(driver) = driver {
        return driver.start_engine(args);
    }
    if args.tensor_parallel_size > 1 {
        return Err(EngineError::Config(format!(
            "--tensor-parallel-size {} needs its ranks started first: every process calls \
             minivllm::engine::worker_process::start_rank, and rank 0 builds the engine with \
             the Driver it returns (LLMEngine::from_engine_args_with_driver)",
            args.tensor_parallel_size
        )));
    }
    Ok(init_group(1)?)
}

fn init_threads(args: &EngineArgs) {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    minivllm_kernels::threading::init_threads(threads.max(1));
}

/// The runner of `model` and its KV cache, and the resolved `max_model_len`. The cache is
/// sized by the rank's own KV heads: with N ranks a block holds 1/N of its tokens' K/V, and
/// every rank must have the same blocks (checked with the others).
pub(crate) fn model_runner(
    mut model: LlamaForCausalLM,
    args: &EngineArgs,
) -> Result<(ModelRunner, usize), EngineError> {
    let max_model_len = resolve_max_model_len(args.max_model_len, model.config())?;
    let cache = kv_cache(args, model.local_config(), max_model_len)?;
    model.set_max_model_len(max_model_len);
    let shape = [
        cache.num_blocks(),
        cache.num_cpu_blocks(),
        cache.block_size(),
        max_model_len,
    ];
    check_same_on_every_rank(&**model.communicator(), &shape)?;
    Ok((ModelRunner::new(model, cache), max_model_len))
}

/// Block ids name the same block on every rank only if every rank's cache has the same
/// shape; ranks on different hosts with different files or memory could disagree.
fn check_same_on_every_rank(comm: &dyn Communicator, shape: &[usize; 4]) -> Result<(), CommError> {
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
                "rank {rank}'s KV cache (blocks, CPU blocks, block size, max_model_len) {:?} \
                 differs from this rank's {shape:?}",
                all[rank]
            ),
        }),
    }
}
