//! Scheduling and KV-block bookkeeping.

pub mod block_pool;
pub mod kv_cache_manager;
pub mod policy;
pub mod prefill_share;
pub mod sched_output;
pub mod scheduler;
pub mod seq_queue;
pub mod spec_decode_stats;
