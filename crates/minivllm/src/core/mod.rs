//! Scheduling and KV-block bookkeeping.

pub mod block_manager;
pub mod block_pool;
pub mod policy;
pub mod scheduler;
