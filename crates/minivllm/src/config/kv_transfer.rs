//! vLLM's `--kv-transfer-config`: whether this engine hands its requests' KV to another
//! (prefill/decode disaggregation) and how, with vLLM 0.32's field names
//! (`vllm/config/kv_transfer.py`).

use serde::{Deserialize, Serialize};

/// The one connector this engine has (`distributed/kv_transfer`).
pub const TCP_CONNECTOR: &str = "TcpConnector";

/// What this engine does with KV: vLLM's `kv_role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvRole {
    /// Prefills requests marked `do_remote_decode` and keeps their KV for a decode server.
    KvProducer,
    /// Pulls the KV of requests marked `do_remote_prefill` instead of prefilling them.
    KvConsumer,
    KvBoth,
}

impl KvRole {
    pub fn produces(self) -> bool {
        self != KvRole::KvConsumer
    }

    pub fn consumes(self) -> bool {
        self != KvRole::KvProducer
    }
}

/// vLLM's `kv_load_failure_policy`: what a decode server does when a pull fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvLoadFailurePolicy {
    /// Prefill the prompt itself.
    Recompute,
    /// Fail the request (vLLM's default).
    #[default]
    Fail,
}

/// Our connector's settings, in `kv_connector_extra_config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpConnectorConfig {
    /// The address the export listener binds and that prefill answers tell decode servers
    /// to pull from: one they can reach.
    pub kv_ip: String,
    /// Bytes of finished prefills' KV kept for decode servers to pull; the oldest go first.
    pub kv_buffer_size: f64,
    /// Seconds a finished prefill's KV waits to be pulled (vLLM's
    /// `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`).
    pub abort_request_timeout: f64,
}

impl Default for TcpConnectorConfig {
    fn default() -> Self {
        Self {
            kv_ip: "127.0.0.1".into(),
            kv_buffer_size: 1e9,
            abort_request_timeout: 480.0,
        }
    }
}

/// The JSON vLLM takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvTransferConfig {
    pub kv_connector: Option<String>,
    /// Named in prefill answers (`remote_engine_id`); a random one when left out.
    pub engine_id: Option<String>,
    /// Where the connector buffers KV: `cpu`, the only device here.
    pub kv_buffer_device: String,
    pub kv_role: Option<KvRole>,
    /// The export listener's port (0: any free one).
    pub kv_port: u16,
    pub kv_connector_extra_config: TcpConnectorConfig,
    pub kv_connector_module_path: Option<String>,
    pub enable_permute_local_kv: bool,
    pub kv_load_failure_policy: KvLoadFailurePolicy,
}

impl Default for KvTransferConfig {
    fn default() -> Self {
        Self {
            kv_connector: None,
            engine_id: None,
            kv_buffer_device: "cpu".into(),
            kv_role: None,
            kv_port: 14579,
            kv_connector_extra_config: TcpConnectorConfig::default(),
            kv_connector_module_path: None,
            enable_permute_local_kv: false,
            kv_load_failure_policy: KvLoadFailurePolicy::Fail,
        }
    }
}

impl KvTransferConfig {
    /// From `--kv-transfer-config`'s JSON text, checked.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let c: Self =
            serde_json::from_str(text).map_err(|e| format!("--kv-transfer-config: {e}"))?;
        c.check()
            .map_err(|e| format!("--kv-transfer-config: {e}"))?;
        Ok(c)
    }

    /// The role, once [`check`](Self::check)ed (it requires one).
    pub fn role(&self) -> KvRole {
        self.kv_role.unwrap_or(KvRole::KvBoth)
    }

    pub fn check(&self) -> Result<(), String> {
        match self.kv_connector.as_deref() {
            Some(TCP_CONNECTOR) => {}
            Some(other) => {
                return Err(format!(
                    "kv_connector {other:?} is not available: this engine moves KV with its \
                     own {TCP_CONNECTOR:?} (vllm-router's default nixl mode drives it)"
                ))
            }
            None => return Err(format!("kv_connector is required ({TCP_CONNECTOR:?})")),
        }
        if self.kv_role.is_none() {
            return Err("kv_role is required (kv_producer, kv_consumer or kv_both)".into());
        }
        if self.kv_buffer_device != "cpu" {
            return Err(format!(
                "kv_buffer_device {:?}: only \"cpu\" is available",
                self.kv_buffer_device
            ));
        }
        if let Some(p) = &self.kv_connector_module_path {
            return Err(format!(
                "kv_connector_module_path {p:?}: connectors cannot be loaded from modules"
            ));
        }
        if self.enable_permute_local_kv {
            return Err("enable_permute_local_kv is not supported".into());
        }
        let extra = &self.kv_connector_extra_config;
        if let Ok(ip) = extra.kv_ip.parse::<std::net::IpAddr>() {
            if ip.is_unspecified() {
                return Err(format!(
                    "kv_connector_extra_config.kv_ip {:?}: decode servers are told to pull \
                     from this address, so it must be one they reach, not a wildcard",
                    extra.kv_ip
                ));
            }
        }
        if !(extra.kv_buffer_size >= 1.0 && extra.kv_buffer_size <= 1e15) {
            return Err(
                "kv_connector_extra_config.kv_buffer_size must be between 1 and 1e15 bytes".into(),
            );
        }
        if !(extra.abort_request_timeout > 0.0 && extra.abort_request_timeout <= 86_400.0) {
            return Err(
                "kv_connector_extra_config.abort_request_timeout must be between 0 and 86400 s"
                    .into(),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllms_json() {
        let c = KvTransferConfig::from_json(
            r#"{"kv_connector": "TcpConnector", "kv_role": "kv_producer", "kv_port": 0,
                "kv_connector_extra_config": {"kv_ip": "10.0.0.1"}}"#,
        )
        .unwrap();
        assert_eq!(c.role(), KvRole::KvProducer);
        assert!(c.role().produces() && !c.role().consumes());
        assert_eq!(c.kv_connector_extra_config.kv_ip, "10.0.0.1");
        assert_eq!(c.kv_connector_extra_config.abort_request_timeout, 480.0);
        assert_eq!(c.kv_load_failure_policy, KvLoadFailurePolicy::Fail);
    }

    #[test]
    fn refuses_what_it_cannot_do_naming_the_field() {
        for (json, says) in [
            (
                r#"{"kv_connector": "NixlConnector", "kv_role": "kv_both"}"#,
                "TcpConnector",
            ),
            (r#"{"kv_role": "kv_both"}"#, "kv_connector is required"),
            (r#"{"kv_connector": "TcpConnector"}"#, "kv_role is required"),
            (
                r#"{"kv_connector": "TcpConnector", "kv_role": "kv_both", "kv_buffer_device": "cuda"}"#,
                "kv_buffer_device",
            ),
            (
                r#"{"kv_connector": "TcpConnector", "kv_role": "both"}"#,
                "unknown variant",
            ),
            (
                r#"{"kv_connector": "TcpConnector", "kv_role": "kv_both", "kv_ip": "1.2.3.4"}"#,
                "unknown field",
            ),
            (
                r#"{"kv_connector": "TcpConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"kv_buffer_size": 0}}"#,
                "kv_buffer_size",
            ),
            (
                r#"{"kv_connector": "TcpConnector", "kv_role": "kv_both",
                 "kv_connector_extra_config": {"kv_ip": "0.0.0.0"}}"#,
                "wildcard",
            ),
        ] {
            let e = KvTransferConfig::from_json(json).unwrap_err();
            assert!(e.contains(says), "{json}: {e}");
        }
    }
}
