//! Scheduling and KV-block bookkeeping.

pub(crate) mod block_pool;
pub mod kv_cache_manager;
pub(crate) mod kv_event_publisher;
pub(crate) mod kv_events;
pub mod policy;
pub(crate) mod prefill_share;
pub(crate) mod sched_output;
pub mod scheduler;
pub(crate) mod seq_queue;
pub(crate) mod spec_decode_stats;
