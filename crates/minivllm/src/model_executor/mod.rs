//! The model side of the worker: loaders, layers, the model families and the sampler's
//! view of each sequence; it never sees a request.

pub mod input_metadata;
pub(crate) mod layers;
pub mod loader;
pub mod model_loader;
pub mod models;
pub(crate) mod sampling_metadata;
