//! Prefill/decode disaggregation (vLLM's `vllm/distributed/kv_transfer`): a request's KV
//! cache computed by one engine (the prefill server, `kv_producer`) and carried over TCP to
//! another (the decode server, `kv_consumer`), which then skips the prompt's prefill.
//!
//! The protocol is vLLM's NIXL connector's as routers see it: the prefill server answers
//! with `kv_transfer_params` naming where the blocks wait (`remote_host`, `remote_port`,
//! `remote_request_id`), the router hands them to the decode server, which pulls them. The
//! pull itself is our own framing (`tcp_connector.rs`), since NIXL's RDMA transports have no
//! CPU-only form; `docs/distributed.md` describes it.

mod params;
mod payload;
mod tcp_connector;

pub use params::{KvTransferParams, RemoteKv};
pub use payload::{KvLayoutTag, KvPayload, PayloadError};
pub use tcp_connector::{fetch, KvExportServer, KvTransferError};
