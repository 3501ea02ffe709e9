//! Tensor parallelism's collectives: what the ranks of a group do together.
//!
//! Layers see only the [`Communicator`] trait: one process ([`SingleProcess`]), threads of
//! one process standing in for ranks in tests ([`ThreadGroup`]), MPI across processes and
//! hosts (`mpi.rs`, cargo feature `mpi`), and NCCL for GPUs later.

mod communicator;
mod group;
#[cfg(feature = "mpi")]
pub mod mpi;
mod shards;
mod thread_group;

pub use communicator::{all_gather_u64, CommError, Communicator, SingleProcess};
pub use group::init_group;
pub use shards::{gather_columns, share, GatherBuffers};
pub use thread_group::ThreadGroup;
