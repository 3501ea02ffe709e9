//! This process's tensor-parallel group, from how it was started: alone, or as one of the
//! processes of an `mpirun` job.

use std::sync::Arc;
#[cfg(feature = "mpi")]
use std::sync::{Mutex, Weak};

use super::communicator::{CommError, Communicator, SingleProcess};

/// The live MPI group, so that every part of a process that asks gets the same one. Weak:
/// MPI is finalised when the last user drops its handle.
#[cfg(feature = "mpi")]
static GROUP: Mutex<Option<Weak<dyn Communicator>>> = Mutex::new(None);

/// The group of `tensor_parallel_size` ranks this process belongs to. One rank is this
/// process alone; more must have been started by a launcher with as many processes (MPI,
/// cargo feature `mpi`). Every call while a handle lives returns the same group; dropping
/// the last handle ends MPI for the process.
pub fn init_group(tensor_parallel_size: usize) -> Result<Arc<dyn Communicator>, CommError> {
    let launched = launcher_world_size();
    match (tensor_parallel_size, launched) {
        (0, _) => Err(setup("--tensor-parallel-size must be at least 1".into())),
        (1, None | Some(1)) => Ok(Arc::new(SingleProcess)),
        (n, None) => Err(setup(format!(
            "--tensor-parallel-size {n} needs {n} processes: start them with \
             `mpirun -n {n} minivllm ... --tensor-parallel-size {n}`"
        ))),
        (n, Some(w)) if w != n => Err(setup(format!(
            "the launcher started {w} processes but --tensor-parallel-size is {n}: the two \
             must match"
        ))),
        (n, Some(_)) => launcher_group(n),
    }
}

/// Processes in the launcher's job, from the environment it gives each (Open MPI's
/// `mpirun`, or MPICH's and Slurm's PMI).
fn launcher_world_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"]
        .iter()
        .find_map(|var| std::env::var(var).ok()?.parse().ok())
}

fn setup(what: String) -> CommError {
    CommError::Setup(what)
}

#[cfg(feature = "mpi")]
fn launcher_group(n: usize) -> Result<Arc<dyn Communicator>, CommError> {
    let mut live = GROUP.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(group) = live.as_ref().and_then(Weak::upgrade) {
        return Ok(group);
    }
    let group: Arc<dyn Communicator> = Arc::new(super::mpi::MpiCommunicator::init()?);
    if group.world_size() != n {
        return Err(setup(format!(
            "MPI's world has {} ranks but --tensor-parallel-size is {n}",
            group.world_size()
        )));
    }
    *live = Some(Arc::downgrade(&group));
    Ok(group)
}

#[cfg(not(feature = "mpi"))]
fn launcher_group(n: usize) -> Result<Arc<dyn Communicator>, CommError> {
    Err(setup(format!(
        "this build of minivllm has no MPI: rebuild it with `--features mpi` \
         (needs Open MPI and libclang) to run {n} tensor-parallel ranks"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_is_this_process_alone() {
        if launcher_world_size().is_some() {
            return; // the test binary itself runs under mpirun
        }
        let group = init_group(1).unwrap();
        assert_eq!((group.rank(), group.world_size()), (0, 1));
        let err = init_group(2).err().unwrap().to_string();
        assert!(err.contains("mpirun -n 2"), "{err}");
        assert!(init_group(0).is_err());
    }
}
