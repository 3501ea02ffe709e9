//! vLLM's `kv_transfer_params`, the request field and response field through which a
//! router pairs a prefill server with a decode server.

use serde::{Deserialize, Serialize};

/// A request's (or a finished prefill's) `kv_transfer_params`, with vLLM's NIXL connector's
/// field names, so that `vllm-router --vllm-pd-disaggregation` and vLLM's toy proxy pass
/// them between our servers unchanged. Fields other routers add are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KvTransferParams {
    /// Sent to a prefill server: keep this request's KV for a decode server to pull.
    pub do_remote_decode: bool,
    /// Sent to a decode server: the prompt's KV waits on the prefill server named below.
    pub do_remote_prefill: bool,
    pub remote_engine_id: Option<String>,
    /// The prefill server's blocks (informative: the pull names the request, not blocks).
    pub remote_block_ids: Option<Vec<u32>>,
    pub remote_host: Option<String>,
    pub remote_port: Option<u16>,
    /// The key the KV waits under on the prefill server: unguessable, as anyone who can
    /// reach its port could otherwise read other requests' prompts back.
    pub remote_request_id: Option<String>,
    pub tp_size: Option<usize>,
}

/// Where a decode server pulls a request's KV from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteKv {
    pub host: String,
    pub port: u16,
    pub key: String,
}

impl KvTransferParams {
    /// The pull these params ask for: `None` unless `do_remote_prefill` is set with a
    /// host, a port and a request id (vLLM likewise ignores incomplete params).
    pub fn remote(&self) -> Option<RemoteKv> {
        if !self.do_remote_prefill {
            return None;
        }
        Some(RemoteKv {
            host: self.remote_host.clone()?,
            port: self.remote_port?,
            key: self.remote_request_id.clone()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_vllm_router_sends_to_a_prefill_server() {
        let p: KvTransferParams = serde_json::from_str(
            r#"{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
                "remote_block_ids": null, "remote_host": null, "remote_port": null}"#,
        )
        .unwrap();
        assert!(p.do_remote_decode && p.remote().is_none());
    }

    #[test]
    fn a_pull_needs_host_port_and_request_id() {
        let full = KvTransferParams {
            do_remote_prefill: true,
            remote_host: Some("10.0.0.2".into()),
            remote_port: Some(14579),
            remote_request_id: Some("k".into()),
            ..Default::default()
        };
        assert_eq!(
            full.remote(),
            Some(RemoteKv {
                host: "10.0.0.2".into(),
                port: 14579,
                key: "k".into()
            })
        );
        let no_port = KvTransferParams {
            remote_port: None,
            ..full.clone()
        };
        assert_eq!(no_port.remote(), None);
        let not_asked = KvTransferParams {
            do_remote_prefill: false,
            ..full
        };
        assert_eq!(not_asked.remote(), None);
    }
}
