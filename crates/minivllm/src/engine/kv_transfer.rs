//! The engine's side of prefill/decode disaggregation (vLLM's KV connector, scheduler and
//! worker halves in one): a prefill server keeps each finished `do_remote_decode` request's
//! prompt KV for a decode server to pull, and answers with `kv_transfer_params` saying
//! where; a decode server checks what it pulled against its own prompt before the
//! scheduler admits the request with those tokens already computed.
//!
//! The pull itself runs before the request reaches the engine thread
//! ([`AsyncEngine`](crate::engine::async_engine::AsyncEngine)), so a slow prefill server
//! delays only its own request.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{KvLoadFailurePolicy, KvRole, KvTransferConfig};
use crate::core::sched_output::KvExport;
use crate::core::scheduler::Scheduler;
use crate::distributed::kv_transfer::{
    fetch, KvExportServer, KvLayoutTag, KvPayload, KvTransferParams, RemoteKv,
};
use crate::engine::arg_utils::EngineArgs;
use crate::engine::errors::EngineError;
use crate::outputs::RequestOutput;
use crate::sampling_params::SamplingParams;
use crate::sequence::FinishReason;
use crate::worker::cache_engine::CacheEngine;
use crate::worker::executor::Executor;

/// How long a decode server waits for one pull, connection to last byte.
const PULL_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct KvTransfer {
    role: KvRole,
    engine_id: String,
    /// The prefill side's listener (`kv_producer`, `kv_both`).
    server: Option<KvExportServer>,
    /// The host decode servers pull from.
    host: String,
    layout: KvLayoutTag,
    /// What a decode server does when a pull fails.
    on_failure: KvLoadFailurePolicy,
    /// The largest payload a decode server takes: its whole cache's worth.
    max_pull_bytes: u64,
}

/// What a decode server needs to pull and check KV off the engine thread: cloned into
/// every handle of the async engine.
#[derive(Debug, Clone)]
pub(crate) struct KvPuller {
    pub(crate) layout: KvLayoutTag,
    pub(crate) max_bytes: u64,
    pub(crate) on_failure: KvLoadFailurePolicy,
}

impl KvTransfer {
    /// Starts the connector `config` describes for an engine whose cache is `cache`:
    /// refused for layouts a payload cannot describe yet (several KV cache groups, linear
    /// attention) and under tensor parallelism (each rank holds a share of every block).
    pub(crate) fn start(
        config: &KvTransferConfig,
        cache: &CacheEngine,
        distributed: bool,
    ) -> Result<Self, EngineError> {
        let refuse = |why: &str| Err(EngineError::KvTransfer(why.to_string()));
        if distributed {
            return refuse("prefill/decode disaggregation runs without tensor parallelism");
        }
        if cache.layout().num_groups() > 1 || cache.num_state_slots() > 0 {
            return refuse(
                "prefill/decode disaggregation needs a model whose layers all use full \
                 attention (this one has sliding-window or linear-attention layers)",
            );
        }
        let extra = &config.kv_connector_extra_config;
        let server = match config.role().produces() {
            false => None,
            true => {
                let timeout = Duration::from_secs_f64(extra.abort_request_timeout);
                let capacity = extra.kv_buffer_size as u64;
                let s = KvExportServer::start(&extra.kv_ip, config.kv_port, capacity, timeout)
                    .map_err(|e| {
                        EngineError::KvTransfer(format!(
                            "cannot listen on {}:{}: {e}",
                            extra.kv_ip, config.kv_port
                        ))
                    })?;
                Some(s)
            }
        };
        let engine_id = (config.engine_id.clone())
            .unwrap_or_else(|| format!("minivllm-{:016x}", rand::random::<u64>()));
        let blocks = cache.num_blocks() as u64;
        let layout = cache.transfer_layout();
        Ok(Self {
            role: config.role(),
            engine_id,
            server,
            host: extra.kv_ip.clone(),
            layout,
            on_failure: config.kv_load_failure_policy,
            max_pull_bytes: 64
                + blocks * (layout.block_bytes() as u64 + 4 * layout.block_size as u64),
        })
    }

    /// The connector `--kv-transfer-config` asks for, if any.
    pub(crate) fn for_engine(args: &EngineArgs, e: &Executor) -> Result<Option<Self>, EngineError> {
        let config = args.kv_transfer_config.as_ref();
        config
            .map(|c| Self::start(c, e.cache(), e.is_distributed()))
            .transpose()
    }

    pub(crate) fn role(&self) -> KvRole {
        self.role
    }

    /// Where decode servers pull from, on a prefill server.
    pub(crate) fn endpoint(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(KvExportServer::local_addr)
    }

    pub(crate) fn puller(&self) -> Option<KvPuller> {
        self.role.consumes().then_some(KvPuller {
            layout: self.layout,
            max_bytes: self.max_pull_bytes,
            on_failure: self.on_failure,
        })
    }

    /// Keeps a finished prefill's KV for a decode server and says where it waits: `None`
    /// when there is no room (the decode server then prefills the prompt itself, or fails
    /// by its own `kv_load_failure_policy`).
    fn export(
        &self,
        e: &KvExport,
        prompt: &[u32],
        cache: &CacheEngine,
    ) -> Option<KvTransferParams> {
        let server = self.server.as_ref()?;
        let data_len = e.blocks.len() * self.layout.block_bytes();
        let mut bytes = KvPayload::encode_head(&self.layout, prompt, data_len);
        cache.export_blocks(&e.blocks, &mut bytes);
        let key = format!("{:032x}", rand::random::<u128>());
        if !server.stash(key.clone(), bytes) {
            tracing::warn!(seq = %e.seq, "KV too large for kv_buffer_size: not kept");
            return None;
        }
        Some(KvTransferParams {
            do_remote_decode: false,
            do_remote_prefill: true,
            remote_engine_id: Some(self.engine_id.clone()),
            remote_block_ids: Some(e.blocks.iter().map(|b| b.0).collect()),
            remote_host: Some(self.host.clone()),
            remote_port: Some(server.local_addr().port()),
            remote_request_id: Some(key),
            tp_size: Some(1),
        })
    }

    /// Gives the final output of each prefill in `exports` that stopped at its length (as
    /// the router asks: `max_tokens` 1) the `kv_transfer_params` of its kept KV. Prefills
    /// that stopped otherwise (their first token ended them) keep nothing, as in vLLM: the
    /// decode server then runs the prompt itself. Called in the step that finished them,
    /// before anything can reuse their blocks.
    pub(crate) fn attach_exports(
        &self,
        scheduler: &mut Scheduler,
        cache: &CacheEngine,
        outputs: &mut [RequestOutput],
    ) {
        for e in scheduler.take_kv_exports() {
            let Some(seq) = scheduler.seq(e.seq) else {
                continue;
            };
            let out = outputs
                .iter_mut()
                .find(|o| o.finished && o.request_id == seq.request.0);
            let Some(out) = out.filter(|o| {
                (o.outputs.first()).is_some_and(|c| c.finish_reason == Some(FinishReason::Length))
            }) else {
                continue;
            };
            let prompt = &seq.token_ids[..seq.prompt_len];
            out.kv_transfer_params = self.export(&e, prompt, cache);
        }
    }
}

impl KvPuller {
    /// The prompt KV a decode request names, pulled from its prefill server; `None` when
    /// it names none, or when the pull failed and `kv_load_failure_policy` is "recompute".
    pub(crate) async fn pull_for(
        &self,
        request_id: &str,
        params: &SamplingParams,
    ) -> Result<Option<Arc<KvPayload>>, EngineError> {
        let Some(kv) = params
            .kv_transfer_params
            .as_ref()
            .filter(|p| p.do_remote_prefill)
        else {
            return Ok(None);
        };
        let Some(remote) = kv.remote() else {
            // As vLLM: params that name no prefill server are ignored, with a warning.
            let why = "kv_transfer_params name no remote_host, remote_port and remote_request_id";
            tracing::warn!(request_id, "{why}: prefilling here");
            return Ok(None);
        };
        match self.pull(&remote).await {
            Ok(payload) => Ok(Some(payload)),
            Err(why) => self.failed(request_id, why).map(|()| None),
        }
    }

    /// [`pull_for`](Self::pull_for) for a caller outside async code, on a runtime of its
    /// own.
    pub(crate) fn pull_blocking(
        &self,
        request_id: &str,
        params: &SamplingParams,
    ) -> Result<Option<Arc<KvPayload>>, EngineError> {
        if !(params.kv_transfer_params.as_ref()).is_some_and(|p| p.do_remote_prefill) {
            return Ok(None);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        let rt = rt.map_err(|e| EngineError::KvTransfer(format!("no runtime to pull KV: {e}")))?;
        rt.block_on(self.pull_for(request_id, params))
    }

    /// The KV pulled for a request if it is of its `prompt`; a payload of another prompt
    /// is dropped (the engine prefills) or refuses the request, as
    /// `kv_load_failure_policy` says.
    pub(crate) fn checked(
        puller: Option<&Self>,
        payload: Option<Arc<KvPayload>>,
        prompt: &[u32],
    ) -> Result<Option<Arc<KvPayload>>, EngineError> {
        let (Some(payload), Some(puller)) = (payload, puller) else {
            return Ok(None);
        };
        match puller.check(&payload, prompt) {
            Ok(()) => Ok(Some(payload)),
            Err(why) => puller.failed("", why).map(|()| None),
        }
    }

    /// A pull that failed: logged and left to a prefill here, or the request's error.
    fn failed(&self, request_id: &str, why: String) -> Result<(), EngineError> {
        match self.on_failure {
            KvLoadFailurePolicy::Recompute => {
                tracing::warn!(request_id, "prefilling here: {why}");
                Ok(())
            }
            KvLoadFailurePolicy::Fail => Err(EngineError::KvTransfer(why)),
        }
    }

    /// Pulls the KV kept at `remote`: the payload (checked against the prompt later, on
    /// the engine thread, once the prompt is tokenized), or why it cannot be had.
    async fn pull(&self, remote: &RemoteKv) -> Result<Arc<KvPayload>, String> {
        let bytes = fetch(
            &remote.host,
            remote.port,
            &remote.key,
            self.max_bytes,
            PULL_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
        let payload = KvPayload::decode(bytes).map_err(|e| e.to_string())?;
        Ok(Arc::new(payload))
    }

    /// A payload is used only for the same cache layout and a prefix of the same prompt:
    /// servers whose tokenizers or chat templates differ would otherwise swap in another
    /// text's KV.
    pub(crate) fn check(&self, payload: &KvPayload, prompt: &[u32]) -> Result<(), String> {
        if payload.layout != self.layout {
            return Err(format!(
                "the prefill server's KV layout {:?} differs from this engine's {:?} \
                 (same model, --block-size and --kv-cache-dtype needed)",
                payload.layout, self.layout
            ));
        }
        let n = payload.token_ids.len();
        if n == 0 || n > prompt.len() || payload.token_ids[..] != prompt[..n] {
            return Err(
                "the prefill server's prompt tokens differ from this request's (another \
                 model, tokenizer or chat template?)"
                    .into(),
            );
        }
        Ok(())
    }
}
