//! Where each process of a tensor-parallel group goes at start-up: rank 0 (the driver)
//! builds the engine and sends its arguments to the other ranks, which load their shards
//! and KV caches from them and run workers until the driver stops. One process alone is
//! its own driver.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::distributed::{all_gather_u64, init_group, CommError, Communicator};
use crate::engine::arg_utils::{kv_cache, resolve_max_model_len, EngineArgs};
use crate::engine::errors::EngineError;
use crate::model_executor::model_loader::load_model_shard;
use crate::model_executor::models::llama::LlamaForCausalLM;
use crate::worker::model_runner::ModelRunner;
use crate::worker::worker_loop::Worker;

/// Whether this process's driver has sent its workers their engine arguments: the workers
/// serve one engine, so there is at most one per process.
static ENGINE_STARTED: AtomicBool = AtomicBool::new(false);

/// What this process is in its group.
pub enum Role {
    /// Rank 0, or a process alone: build the engine (`LLMEngine::from_engine_args`,
    /// `LLM::new`) while holding this.
    Driver(Driver),
    /// A worker whose driver has shut the group down: the process has nothing left to do.
    WorkerDone,
}

/// Rank 0's hold on its group. The engine finds the group through it (dropping the last
/// handle to an MPI group ends MPI in the process). Dropped without an engine ever started
/// (a command that ended early), it releases the workers, which wait for one.
pub struct Driver {
    group: Arc<dyn Communicator>,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.group.world_size() > 1 && !ENGINE_STARTED.swap(true, Ordering::SeqCst) {
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
        return Ok(Role::Driver(Driver { group }));
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

/// The group of the engine's process, which must be its rank 0; the other ranks are sent
/// `args`.
pub(crate) fn driver_group(args: &EngineArgs) -> Result<Arc<dyn Communicator>, EngineError> {
    init_threads(args);
    let group = init_group(args.tensor_parallel_size)?;
    if group.rank() != 0 {
        return Err(EngineError::Config(format!(
            "this process is rank {} of a tensor-parallel group of {}: only rank 0 runs the \
             engine; the others run a worker (minivllm::engine::worker_process::start_rank)",
            group.rank(),
            group.world_size()
        )));
    }
    if group.world_size() > 1 {
        if ENGINE_STARTED.swap(true, Ordering::SeqCst) {
            return Err(EngineError::Config(
                "a tensor-parallel group runs one engine per process: its workers stopped \
                 with the first"
                    .into(),
            ));
        }
        let mut bytes = serde_json::to_vec(args).expect("engine arguments serialise");
        group.broadcast_bytes(0, &mut bytes)?;
    }
    Ok(group)
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
