//! Between the engine's Rust values and Python's: sampling parameters in, outputs out,
//! errors as the exceptions vLLM raises.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use minivllm::engine::async_engine::AsyncEngineError;
use minivllm::engine::errors::EngineError;
use minivllm::outputs::{CompletionOutput, RequestOutput, TokenLogprobs};
use minivllm::sequence::StopReason;
use minivllm::worker::worker_config::WorkerError;

/// A refused request is the caller's fault (`ValueError`, as vLLM raises for a prompt too
/// long or a bad parameter); a model that cannot load or an engine that broke is not.
pub fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Config(_)
        | EngineError::Worker(WorkerError::Config(_))
        | EngineError::Grammar(_)
        | EngineError::Validation(_)
        | EngineError::EmptyPrompt
        | EngineError::PromptTooLong { .. }
        | EngineError::TokenOutOfVocab { .. }
        | EngineError::DuplicateRequest(_)
        | EngineError::TooManySequences { .. }
        | EngineError::Tokenizer(_) => PyValueError::new_err(e.to_string()),
        // An address in use, or a thread that cannot start.
        EngineError::Load(_)
        | EngineError::Worker(_)
        | EngineError::Input(_)
        | EngineError::KvEvents(_)
        | EngineError::KvTransfer(_) => PyRuntimeError::new_err(e.to_string()),
    }
}

pub fn async_engine_error(e: AsyncEngineError) -> PyErr {
    match e {
        AsyncEngineError::Engine(e) => engine_error(e),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// A finished request as a dict of vLLM's `RequestOutput` fields; each position's logprobs
/// as [`TokenLogprobs::chosen_first`] gives them (the Python side makes `Logprob`s).
pub fn request_output<'py>(py: Python<'py>, out: RequestOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("request_id", out.request_id)?;
    d.set_item("prompt", out.prompt.as_deref())?;
    d.set_item("prompt_token_ids", &out.prompt_token_ids[..])?;
    let prompt_logprobs = out.prompt_logprobs.map(|positions| {
        positions
            .into_iter()
            .map(|p| p.as_ref().map(TokenLogprobs::chosen_first))
            .collect::<Vec<_>>()
    });
    d.set_item("prompt_logprobs", prompt_logprobs)?;
    let outputs = PyList::empty(py);
    for c in out.outputs {
        outputs.append(completion_output(py, c)?)?;
    }
    d.set_item("outputs", outputs)?;
    d.set_item("finished", out.finished)?;
    d.set_item("pooled", out.pooled)?;
    d.set_item("num_cached_tokens", out.num_cached_tokens)?;
    let kv = out
        .kv_transfer_params
        .map(|p| serde_json::to_string(&p))
        .transpose();
    d.set_item(
        "kv_transfer_params",
        kv.map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
    )?;
    let metrics = out.metrics.map(|m| {
        (
            m.arrival_time,
            m.first_scheduled_time,
            m.first_token_time,
            m.last_token_time,
            m.finished_time,
            m.time_in_queue,
        )
    });
    d.set_item("metrics", metrics)?;
    Ok(d)
}

fn completion_output<'py>(py: Python<'py>, c: CompletionOutput) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("index", c.index)?;
    d.set_item("text", c.text)?;
    d.set_item("token_ids", c.token_ids)?;
    d.set_item("cumulative_logprob", c.cumulative_logprob)?;
    let logprobs = c.logprobs.map(|l| {
        l.iter()
            .map(TokenLogprobs::chosen_first)
            .collect::<Vec<_>>()
    });
    d.set_item("logprobs", logprobs)?;
    d.set_item("finish_reason", c.finish_reason.map(|r| r.as_str()))?;
    match c.stop_reason {
        None => d.set_item("stop_reason", py.None())?,
        Some(StopReason::Token(t)) => d.set_item("stop_reason", t)?,
        Some(StopReason::String(s)) => d.set_item("stop_reason", s)?,
    }
    Ok(d)
}
