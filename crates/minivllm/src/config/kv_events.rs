//! vLLM's `--kv-events-config`: whether the engine publishes its prefix cache's changes
//! (KV cache events) and where, with vLLM's names and defaults (`vllm/config/kv_events.py`).

use serde::{Deserialize, Serialize};

/// Where KV cache events go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvEventsPublisher {
    /// Nowhere.
    Null,
    /// A ZeroMQ PUB socket, with a ROUTER socket for replay when `replay_endpoint` is set.
    Zmq,
}

/// The JSON vLLM takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KvEventsConfig {
    pub enable_kv_cache_events: bool,
    /// Default: `zmq` when events are enabled, else `null` (vLLM's rule).
    pub publisher: Option<KvEventsPublisher>,
    /// The PUB socket's address, bound: `tcp://*:PORT` for every interface, or one host
    /// address (vLLM would connect to the latter; we always bind).
    pub endpoint: String,
    /// Where subscribers ask for batches they missed (`tcp://*:PORT`); none: no replay.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    pub buffer_steps: usize,
    /// ZeroMQ's high-water mark: accepted as vLLM's JSON has it, but not settable in the
    /// socket library we use (the `zeromq` crate), whose PUB socket likewise drops messages
    /// for a subscriber whose queue is full rather than wait for it.
    pub hwm: usize,
    /// Batches waiting to be sent; events with no room wait for the next step's batch
    /// (the engine never waits for the publisher).
    pub max_queue_size: usize,
    /// The first frame of every message, which subscribers filter on.
    pub topic: String,
}

/// The most batches a buffer may be asked to hold (vLLM's defaults are 10,000 and 100,000).
const MAX_BUFFER: usize = 100_000_000;

impl Default for KvEventsConfig {
    fn default() -> Self {
        Self {
            enable_kv_cache_events: false,
            publisher: None,
            endpoint: "tcp://*:5557".into(),
            replay_endpoint: None,
            buffer_steps: 10_000,
            hwm: 100_000,
            max_queue_size: 100_000,
            topic: String::new(),
        }
    }
}

impl KvEventsConfig {
    /// From `--kv-events-config`'s JSON text, checked.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let c: Self = serde_json::from_str(text).map_err(|e| format!("--kv-events-config: {e}"))?;
        c.check().map_err(|e| format!("--kv-events-config: {e}"))?;
        Ok(c)
    }

    /// Whether events are published at all.
    pub fn publishes(&self) -> bool {
        let publisher = self.publisher.unwrap_or(if self.enable_kv_cache_events {
            KvEventsPublisher::Zmq
        } else {
            KvEventsPublisher::Null
        });
        self.enable_kv_cache_events && publisher == KvEventsPublisher::Zmq
    }

    fn check(&self) -> Result<(), String> {
        for (name, e) in [
            ("endpoint", Some(&self.endpoint)),
            ("replay_endpoint", self.replay_endpoint.as_ref()),
        ] {
            if let Some(e) = e {
                if !e.starts_with("tcp://") || !e[6..].contains(':') {
                    return Err(format!(
                        "{name} {e:?} must be tcp://HOST:PORT (ipc and inproc are not supported)"
                    ));
                }
            }
        }
        // Port 0 (a free port) may be asked for twice.
        if self.replay_endpoint.as_ref() == Some(&self.endpoint) && !self.endpoint.ends_with(":0") {
            return Err("endpoint and replay_endpoint must differ".into());
        }
        for (name, n) in [
            ("buffer_steps", self.buffer_steps),
            ("hwm", self.hwm),
            ("max_queue_size", self.max_queue_size),
        ] {
            if n == 0 || n > MAX_BUFFER {
                return Err(format!("{name} must be between 1 and {MAX_BUFFER}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vllms_json_and_refuses_what_it_cannot_do() {
        let c = KvEventsConfig::from_json(
            r#"{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000",
                "replay_endpoint": "tcp://*:6001", "topic": "kv"}"#,
        )
        .unwrap();
        assert!(c.publishes());
        assert_eq!(c.buffer_steps, 10_000);
        assert!(!KvEventsConfig::from_json("{}").unwrap().publishes());
        let off = r#"{"enable_kv_cache_events": true, "publisher": "null"}"#;
        assert!(!KvEventsConfig::from_json(off).unwrap().publishes());
        for (bad, says) in [
            (r#"{"endpoint": "ipc:///tmp/x"}"#, "tcp://HOST:PORT"),
            (
                r#"{"endpoint": "tcp://*:1", "replay_endpoint": "tcp://*:1"}"#,
                "must differ",
            ),
            (r#"{"hwm": 0}"#, "hwm"),
            (
                r#"{"max_queue_size": 1000000000000}"#,
                "max_queue_size must be between",
            ),
            (r#"{"publisher": "kafka"}"#, "unknown variant"),
            (r#"{"enable_kv_events": true}"#, "unknown field"),
        ] {
            let e = KvEventsConfig::from_json(bad).unwrap_err();
            assert!(
                e.contains(says) && e.starts_with("--kv-events-config"),
                "{e}"
            );
        }
    }
}
