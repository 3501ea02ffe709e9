//! Tensor parallelism's collectives: what the ranks of a group do together.
//!
//! Layers see only the [`Communicator`] trait: one process ([`SingleProcess`]), threads of
//! one process standing in for ranks in tests ([`ThreadGroup`]), MPI across processes and
//! hosts (`mpi.rs`, cargo feature `mpi`), and NCCL for GPUs later.
//!
//! Beside them, [`kv_transfer`]: one engine's KV cache carried to another (prefill/decode
//! disaggregation), as bytes and sockets that know nothing of the engine.

mod communicator;
mod group;
pub mod kv_transfer;
#[cfg(feature = "mpi")]
pub mod mpi;
mod shards;
mod thread_group;

pub use communicator::{all_gather_u64, CommError, Communicator, SingleProcess};
pub use group::init_group;
pub use shards::{gather_columns, share, GatherBuffers};
pub use thread_group::ThreadGroup;
