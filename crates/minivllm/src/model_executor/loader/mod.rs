//! Weight and configuration loading: GGUF files and Hugging Face folders.

use std::path::PathBuf;

pub mod fused;
pub mod gguf;
pub mod gguf_quantize;
pub mod gguf_weights;
pub mod gguf_writer;

pub(crate) mod hf;
pub(crate) mod safetensors;
pub mod sharded;
pub mod weights;

/// Reads and parses a JSON file, naming the file in any error.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| LoadError::Config(format!("{}: invalid JSON: {e}", path.display())))
}

/// Why a model could not be loaded. Every message names the file or the item at fault.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model path {path} does not exist")]
    NotFound { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a GGUF file (magic bytes {found:?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: [u8; 4] },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedGgufVersion { path: PathBuf, version: u32 },
    #[error("{path}: malformed GGUF: {reason}")]
    BadGguf { path: PathBuf, reason: String },
    #[error("tensor {tensor}: unsupported tensor type {type_name}")]
    UnsupportedTensorType { tensor: String, type_name: String },
    #[error("unsupported model architecture {0:?} (supported: {supported})", supported = crate::config::supported_architectures())]
    UnsupportedArchitecture(String),
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("tensor {tensor}: shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("bad model config: {0}")]
    Config(String),
    /// A size the configuration gives that the weights it comes with contradict.
    #[error("{origin}: {field} {value} does not match the tensor {tensor} {shape:?}")]
    ConfigMismatch {
        /// The configuration's file, or `model config` where it came from elsewhere.
        origin: String,
        field: &'static str,
        value: usize,
        tensor: String,
        shape: Vec<usize>,
    },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

impl From<crate::config::ConfigError> for LoadError {
    fn from(e: crate::config::ConfigError) -> Self {
        match e {
            crate::config::ConfigError::Invalid(m) => LoadError::Config(m),
            crate::config::ConfigError::UnsupportedArchitecture(a) => {
                LoadError::UnsupportedArchitecture(a)
            }
        }
    }
}
