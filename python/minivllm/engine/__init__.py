"""vLLM's ``vllm.engine`` modules that scripts import from."""
