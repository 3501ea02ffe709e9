pub mod input_metadata;
pub mod layers;
pub mod loader;
pub mod models;
