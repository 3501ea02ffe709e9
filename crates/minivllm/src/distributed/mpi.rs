//! The MPI group: ranks are processes started by `mpirun`, on one host or several (Open MPI
//! through the `mpi` crate; cargo feature `mpi`).

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::{Communicator as _, CommunicatorCollectives as _, Root as _};
use mpi::Threading;

use super::communicator::{check_gather, check_root, sum_in_rank_order, CommError, Communicator};

/// MPI's state for this process; dropping it finalises MPI.
struct Mpi {
    world: SimpleCommunicator,
    /// Every rank's values of an all-reduce, before they are summed.
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
    /// Nanoseconds spent in collectives (waiting for the other ranks included).
    busy: AtomicU64,
}

/// MPI, held for one collective, which is timed until the hold ends.
struct Held<'a> {
    mpi: MutexGuard<'a, Mpi>,
    since: Instant,
    busy: &'a AtomicU64,
}

impl Deref for Held<'_> {
    type Target = Mpi;
    fn deref(&self) -> &Mpi {
        &self.mpi
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Mpi {
        &mut self.mpi
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let nanos = self.since.elapsed().as_nanos() as u64;
        self.busy.fetch_add(nanos, Ordering::Relaxed);
    }
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
            busy: AtomicU64::new(0),
        })
    }

    fn mpi(&self) -> Held<'_> {
        Held {
            mpi: self.inner.lock().unwrap_or_else(|e| e.into_inner()),
            since: Instant::now(),
            busy: &self.busy,
        }
    }
}

impl Communicator for MpiCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    /// Gathers every rank's values and sums them in rank order, rather than MPI_Allreduce:
    /// Open MPI picks its reduction algorithm by message size, and each associates the same
    /// floats differently, so a sequence's logits would change with what else shares its
    /// batch (and greedy output with them: batch invariance is lost). Rank-order sums are
    /// the same for any batch, on every rank, and equal `ThreadGroup`'s bit for bit. The
    /// cost: each rank receives (N-1) copies instead of about 2(N-1)/N, the same at N = 2.
    fn all_reduce_sum(&self, buf: &mut [f32]) -> Result<(), CommError> {
        let mut mpi = self.mpi();
        let Mpi { world, scratch, .. } = &mut *mpi;
        scratch.resize(buf.len() * self.world_size, 0.0);
        world.all_gather_into(&*buf, &mut scratch[..]);
        sum_in_rank_order(scratch.chunks_exact(buf.len().max(1)), buf);
        Ok(())
    }

    fn all_gather(&self, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_gather(self.rank, self.world_size, local, out)?;
        self.mpi().world.all_gather_into(local, out);
        Ok(())
    }

    fn gather(&self, root: usize, local: &[f32], out: &mut [f32]) -> Result<(), CommError> {
        check_root(self.rank, self.world_size, root)?;
        let mpi = self.mpi();
        let root_process = mpi.world.process_at_rank(root as i32);
        if self.rank == root {
            check_gather(self.rank, self.world_size, local, out)?;
            root_process.gather_into_root(local, out);
        } else {
            root_process.gather_into(local);
        }
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

    fn time_in_collectives(&self) -> Option<Duration> {
        Some(Duration::from_nanos(self.busy.load(Ordering::Relaxed)))
    }
}
