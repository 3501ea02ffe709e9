//! The MPI group: ranks are processes started by `mpirun`, on one host or several (Open MPI
//! through the `mpi` crate; cargo feature `mpi`).

use std::sync::{Mutex, MutexGuard};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use mpi::Threading;

use super::communicator::{check_gather, check_root, CommError, Communicator};

/// MPI's state for this process; dropping it finalises MPI.
struct Mpi {
    world: SimpleCommunicator,
    /// The send side of an all-reduce (MPI wants it apart from the result).
    scratch: Vec<f32>,
    // Last: dropped after `world`.
    _universe: Universe,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED, which allows MPI calls from any
// thread provided no two run at once; `MpiCommunicator` only reaches `Mpi` through a mutex.
unsafe impl Send for Mpi {}

/// This process's rank in `MPI_COMM_WORLD`.
pub struct MpiCommunicator {
    rank: usize,
    world_size: usize,
    inner: Mutex<Mpi>,
}

impl MpiCommunicator {
    /// Initialises MPI for this process (once: a second call is an error). Collectives may
    /// then be called from any thread, one at a time (the forward pass runs on a pool thread).
    pub fn init() -> Result<Self, CommError> {
        let (universe, threading) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| CommError::Broken("MPI is already initialised".into()))?;
        if threading < Threading::Serialized {
            return Err(CommError::Broken(format!(
                "this MPI library offers thread support {threading:?}; serialized is needed"
            )));
        }
        let world = universe.world();
        Ok(Self {
            rank: world.rank() as usize,
            world_size: world.size() as usize,
            inner: Mutex::new(Mpi {
                world,
                scratch: Vec::new(),
                _universe: universe,
            }),
        })
    }

    fn mpi(&self) -> MutexGuard<'_, Mpi> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let mut mpi = self.mpi();
        let Mpi { world, scratch, .. } = &mut *mpi;
        scratch.clear();
        scratch.extend_from_slice(buf);
        world.all_reduce_into(&scratch[..], buf, SystemOperation::sum());
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_gather(self.rank, self.world_size, local, out)?;
        self.mpi().world.all_gather_into(local, out);
        Ok(())
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) -> Result<(), CommError> {
        check_root(self.rank, self.world_size, root)?;
        let mpi = self.mpi();
        let root = mpi.world.process_at_rank(root as i32);
        let mut len = buf.len() as u64;
        root.broadcast_into(&mut len);
        buf.resize(len as usize, 0);
        root.broadcast_into(&mut buf[..]);
        Ok(())
    }

    fn barrier(&self) -> Result<(), CommError> {
        self.mpi().world.barrier();
        Ok(())
    }
}
