pub mod input_metadata;
pub mod layers;
pub mod loader;
pub mod model_loader;
pub mod models;
pub mod sampling_metadata;
