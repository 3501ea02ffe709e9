//! `minivllm._core`: the native half of the Python package `minivllm`.
//!
//! The Python half (python/minivllm) holds vLLM's API: argument handling, output classes,
//! progress bars. This half holds what must not hold the GIL: the engine thread, the waits
//! for its outputs, the tokenizer, and the command line.

mod convert;
mod engine;
mod tokenizer;

use std::sync::OnceLock;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use minivllm::sampling_params::{GenerationDefaults, SamplingParams};

/// Clears pyo3-log's cache of Python loggers and their levels, so that a change of
/// `logging`'s configuration after the first message is seen.
static LOG_CACHE: OnceLock<pyo3_log::ResetHandle> = OnceLock::new();

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Python's `logging` decides what is shown; the engine's own events pass down to debug,
    // its dependencies' from warnings up.
    let logger = pyo3_log::Logger::new(m.py(), pyo3_log::Caching::LoggersAndLevels)?
        .filter(log::LevelFilter::Warn)
        .filter_target("minivllm".to_owned(), log::LevelFilter::Debug);
    if let Ok(handle) = logger.install() {
        let _ = LOG_CACHE.set(handle);
    }
    m.add_class::<engine::Engine>()?;
    m.add_class::<engine::Batch>()?;
    m.add_class::<tokenizer::Tokenizer>()?;
    m.add_function(wrap_pyfunction!(check_sampling_params, m)?)?;
    m.add_function(wrap_pyfunction!(generation_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(reset_log_cache, m)?)?;
    m.add_function(wrap_pyfunction!(run_cli, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

/// Parses sampling parameters (JSON with vLLM's field names) and checks them as vLLM does,
/// raising `ValueError` with vLLM's message.
#[pyfunction]
fn check_sampling_params(json: &str) -> PyResult<()> {
    let params: SamplingParams = serde_json::from_str(json).map_err(value_error)?;
    params.validate().map_err(value_error)
}

/// The sampling defaults `model`'s `generation_config.json` sets (none for a GGUF file), as
/// JSON with `SamplingParams`' names, read as the server reads them: a file that does not
/// parse raises `ValueError` naming it.
#[pyfunction]
fn generation_defaults(model: &str) -> PyResult<String> {
    let defaults =
        GenerationDefaults::from_model(std::path::Path::new(model)).map_err(value_error)?;
    Ok(serde_json::Value::Object(defaults.from_file_json()).to_string())
}

#[pyfunction]
fn reset_log_cache() {
    if let Some(handle) = LOG_CACHE.get() {
        handle.reset();
    }
}

/// Runs the `minivllm` command line with `argv` (program name first) and returns its exit
/// status. The GIL is released: the command may run for as long as a server does.
#[pyfunction]
fn run_cli(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| minivllm_cli::main_with_args(argv))
}

/// `ValueError` for what the caller got wrong.
fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}
