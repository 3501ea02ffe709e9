//! The engine for Python: `LLMEngine` on its own thread (`AsyncEngine`), so that Python
//! threads submit batches to one engine that steps them together, and wait for their
//! outputs without the GIL.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PySystemExit, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tokio::sync::mpsc;

use minivllm::config::{KvEventsConfig, KvTransferConfig, SpeculativeConfig};
use minivllm::engine::async_engine::{AsyncEngine, NewRequest};
use minivllm::engine::llm_engine::{EngineArgs, LLMEngine, PromptInput};
use minivllm::model_executor::loader::weights::LoadOptions;
use minivllm::outputs::RequestOutput;
use minivllm::sampling_params::{logprob_count, PoolingParams, RequestOutputKind, SamplingParams};
use minivllm::utils::parse_byte_size;
use minivllm::worker::worker_process::{start_rank, Role};

use crate::convert::{async_engine_error, engine_error, request_output};
use crate::tokenizer::Tokenizer;
use crate::value_error;

/// A loaded model and its engine thread. The thread ends when the object is collected.
#[pyclass(frozen, module = "minivllm._core")]
pub struct Engine {
    /// `None` only while being dropped. With tensor parallelism it holds the group (its
    /// driver's hold was handed to it), which it stops when it ends.
    engine: Option<AsyncEngine>,
}

/// A prompt as text or as token ids.
#[derive(FromPyObject)]
pub enum Prompt {
    Text(String),
    TokenIds(Vec<u32>),
}

#[pymethods]
impl Engine {
    /// The engine's settings with vLLM's names; the strings as the command line takes them
    /// (`dtype="bfloat16"`, `kv_cache_memory="4GiB"`). Loading releases the GIL.
    #[new]
    #[pyo3(signature = (
        model, *, dtype = "auto", quantization = None, kv_cache_dtype = "auto",
        max_model_len = None, max_num_seqs = 256, max_num_batched_tokens = None,
        max_prefill_tokens = None, long_prefill_token_threshold = None, block_size = 16, kv_cache_memory = "1GiB", swap_space = "0",
        enable_prefix_caching = true, enable_chunked_prefill = true,
        scheduling_policy = "fcfs", threads = None, tensor_parallel_size = 1,
        reasoning_parser = None, speculative_config = None, max_logprobs = 20,
        kv_events_config = None, kv_transfer_config = None,
    ))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments
    fn new(
        py: Python<'_>,
        model: String,
        dtype: &str,
        quantization: Option<&str>,
        kv_cache_dtype: &str,
        max_model_len: Option<usize>,
        max_num_seqs: usize,
        max_num_batched_tokens: Option<usize>,
        max_prefill_tokens: Option<usize>,
        long_prefill_token_threshold: Option<usize>,
        block_size: usize,
        kv_cache_memory: &str,
        swap_space: &str,
        enable_prefix_caching: bool,
        enable_chunked_prefill: bool,
        scheduling_policy: &str,
        threads: Option<usize>,
        tensor_parallel_size: usize,
        reasoning_parser: Option<&str>,
        speculative_config: Option<&str>,
        max_logprobs: i64,
        kv_events_config: Option<&str>,
        kv_transfer_config: Option<&str>,
    ) -> PyResult<Self> {
        let named = |name: &str, e: String| value_error(format!("{name}: {e}"));
        let args = EngineArgs {
            model,
            max_model_len,
            max_num_seqs,
            max_num_batched_tokens,
            max_prefill_tokens,
            long_prefill_token_threshold,
            block_size,
            kv_cache_memory: parse_byte_size(kv_cache_memory)
                .map_err(|e| named("kv_cache_memory", e))?,
            kv_cache_dtype: kv_cache_dtype.parse().map_err(value_error)?,
            swap_space: parse_byte_size(swap_space).map_err(|e| named("swap_space", e))?,
            enable_prefix_caching,
            enable_chunked_prefill,
            scheduling_policy: scheduling_policy.parse().map_err(value_error)?,
            threads,
            load: LoadOptions {
                dtype: dtype.parse().map_err(value_error)?,
                quantization: quantization
                    .map(str::parse)
                    .transpose()
                    .map_err(value_error)?,
            },
            tensor_parallel_size,
            reasoning_parser: reasoning_parser
                .map(str::parse)
                .transpose()
                .map_err(value_error)?,
            chat_template: None,
            speculative_config: speculative_config
                .map(SpeculativeConfig::from_json)
                .transpose()
                .map_err(value_error)?,
            max_logprobs: logprob_count::parse(&max_logprobs.to_string())
                .map_err(|e| named("max_logprobs", e))?,
            kv_events_config: kv_events_config
                .map(KvEventsConfig::from_json)
                .transpose()
                .map_err(value_error)?,
            kv_transfer_config: kv_transfer_config
                .map(KvTransferConfig::from_json)
                .transpose()
                .map_err(value_error)?,
        };
        // Every process of an `mpirun` job makes this same call: rank 0 goes on to build the
        // engine, the others serve it as workers here, until it stops, and then exit.
        let driver = if tensor_parallel_size > 1 {
            match py.detach(|| start_rank(tensor_parallel_size)) {
                Ok(Role::Driver(driver)) => Some(driver),
                Ok(Role::WorkerDone) => return Err(PySystemExit::new_err(0)),
                Err(e) => return Err(engine_error(e.into())),
            }
        } else {
            None
        };
        let engine = py
            .detach(|| LLMEngine::from_engine_args_with_driver(&args, driver))
            .map_err(engine_error)?;
        Ok(Self {
            engine: Some(AsyncEngine::new(engine)),
        })
    }

    /// Queues `(request_id, prompt, sampling_params_json, priority)` requests and returns
    /// the batch to wait on. Raises `ValueError` for the first request whose parameters the
    /// engine refuses (before queueing any), or that it refuses on taking it (its prompt),
    /// and then aborts the others.
    fn submit(
        &self,
        py: Python<'_>,
        requests: Vec<(String, Prompt, String, i32)>,
    ) -> PyResult<Batch> {
        let mut new = Vec::with_capacity(requests.len());
        for (request_id, prompt, params, priority) in requests {
            let params: SamplingParams = serde_json::from_str(&params).map_err(value_error)?;
            let params = SamplingParams {
                // `generate` reads nothing but the final outputs: no step builds the others.
                output_kind: RequestOutputKind::FinalOnly,
                ..params
            };
            let prompt = match prompt {
                Prompt::Text(t) => PromptInput::Text(t),
                Prompt::TokenIds(ids) => PromptInput::TokenIds(ids),
            };
            // Every request is checked before any is queued; a batch's requests with the
            // same stop strings share one automaton, built here rather than on the engine's
            // thread.
            let params = self
                .engine()
                .check(params, priority)
                .map_err(engine_error)?;
            let params = params.with_stop_strings_of(new.last().map(|r: &NewRequest| &r.params));
            new.push(NewRequest {
                request_id,
                prompt,
                params,
            });
        }
        self.queue(py, new)
    }

    /// Queues embedding requests `(request_id, prompt)`, each pooled as `pooling` (vLLM's
    /// `--pooler-config` JSON: `pooling_type`, `normalize`), and returns the batch.
    fn submit_pooling(
        &self,
        py: Python<'_>,
        requests: Vec<(String, Prompt)>,
        pooling: String,
    ) -> PyResult<Batch> {
        let pooling = PoolingParams::from_json(&pooling).map_err(PyValueError::new_err)?;
        let params = SamplingParams {
            output_kind: RequestOutputKind::FinalOnly,
            pooling: Some(pooling),
            max_tokens: Some(1),
            ..SamplingParams::default()
        };
        let params = self.engine().check(params, 0).map_err(engine_error)?;
        let new = (requests.into_iter())
            .map(|(request_id, prompt)| NewRequest {
                request_id,
                prompt: match prompt {
                    Prompt::Text(t) => PromptInput::Text(t),
                    Prompt::TokenIds(ids) => PromptInput::TokenIds(ids),
                },
                params: params.clone(),
            })
            .collect();
        self.queue(py, new)
    }

    fn get_tokenizer(&self) -> Tokenizer {
        Tokenizer::new(self.engine().tokenizer().clone())
    }

    #[getter]
    fn max_model_len(&self) -> usize {
        self.engine().max_model_len()
    }

    #[getter]
    fn max_num_seqs(&self) -> usize {
        self.engine().max_num_seqs()
    }

    /// Steps the engine has run so far.
    #[getter]
    fn num_steps(&self) -> u64 {
        self.engine().stats().num_steps
    }
}

impl Engine {
    fn queue(&self, py: Python<'_>, new: Vec<NewRequest>) -> PyResult<Batch> {
        let remaining = new.len();
        let (tx, rx) = mpsc::unbounded_channel();
        // Without the GIL: the engine thread may log (through Python) while taking them.
        py.detach(|| self.engine().submit_blocking(new, &tx))
            .map_err(async_engine_error)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start a timer: {e}")))?;
        Ok(Batch {
            state: Mutex::new(BatchState {
                outputs: Some(rx),
                remaining,
                runtime,
            }),
        })
    }

    fn engine(&self) -> &AsyncEngine {
        self.engine
            .as_ref()
            .expect("the engine lives until the object is dropped")
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // The engine thread ends once the last handle is gone; wait for it, without the GIL
        // (it may log through Python), so that the engine is gone when the object is: its
        // memory freed, a tensor-parallel group's workers stopped before the group ends, and
        // no thread left to reach into an interpreter that is shutting down.
        let engine = self.engine.take();
        let thread = engine.as_ref().and_then(AsyncEngine::take_thread);
        drop(engine);
        if let Some(thread) = thread {
            Python::attach(|py| py.detach(|| thread.join()))
                .unwrap_or_else(|_| tracing::error!("the engine thread panicked"));
        }
    }
}

/// The requests of one `submit`, and their outputs as they finish.
#[pyclass(frozen, module = "minivllm._core")]
pub struct Batch {
    state: Mutex<BatchState>,
}

struct BatchState {
    /// `None` once aborted: dropping the receiver aborts what still runs. Each request sends
    /// one output, its final one (`submit` asks for `FinalOnly`).
    outputs: Option<mpsc::UnboundedReceiver<RequestOutput>>,
    remaining: usize,
    /// Times the wait for outputs (a current-thread runtime with a timer, nothing else).
    runtime: tokio::runtime::Runtime,
}

impl Batch {
    fn state(&self) -> MutexGuard<'_, BatchState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[pymethods]
impl Batch {
    /// Waits, without the GIL, up to `timeout` seconds for requests to finish, and returns
    /// those that did (as dicts of `RequestOutput`'s fields; maybe none). Returning at
    /// least every `timeout` lets Python run its signal handlers (Ctrl-C) in between.
    fn wait<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let timeout = Duration::try_from_secs_f64(timeout).map_err(value_error)?;
        let finished = py.detach(|| self.state().next_finished(timeout))?;
        finished
            .into_iter()
            .map(|o| request_output(py, o))
            .collect()
    }

    /// Requests not finished yet.
    #[getter]
    fn remaining(&self) -> usize {
        self.state().remaining
    }

    /// Aborts the requests still running; their outputs are never returned.
    fn abort(&self) {
        let mut state = self.state();
        state.outputs = None;
        state.remaining = 0;
    }
}

impl BatchState {
    fn next_finished(&mut self, timeout: Duration) -> PyResult<Vec<RequestOutput>> {
        let mut finished = Vec::new();
        let Some(rx) = self.outputs.as_mut() else {
            return Ok(finished);
        };
        if self.remaining == 0 {
            return Ok(finished);
        }
        let first = self
            .runtime
            .block_on(async { tokio::time::timeout(timeout, rx.recv()).await });
        let mut next = match first {
            Err(_elapsed) => return Ok(finished),
            Ok(next) => next,
        };
        loop {
            match next {
                Some(out) => {
                    debug_assert!(out.finished, "submit asks for final outputs only");
                    self.remaining -= 1;
                    finished.push(out);
                }
                None => {
                    return Err(PyRuntimeError::new_err(
                        "the engine stopped before the requests finished (its log says why)",
                    ))
                }
            }
            if self.remaining == 0 {
                break;
            }
            next = match self.outputs.as_mut().map(|rx| rx.try_recv()) {
                Some(Ok(out)) => Some(out),
                Some(Err(mpsc::error::TryRecvError::Disconnected)) => None,
                _ => break,
            };
        }
        Ok(finished)
    }
}
