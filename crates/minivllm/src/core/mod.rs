//! Scheduling and KV-block bookkeeping.

pub mod block_manager;
pub mod block_pool;
