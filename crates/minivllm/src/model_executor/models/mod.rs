pub mod llama;
