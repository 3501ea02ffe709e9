"""The native part of minivllm (crates/minivllm-py). Use the classes of ``minivllm``."""

from typing import Any, Dict, List, Optional, Tuple, Union

__version__: str

class Engine:
    """A loaded model and its engine thread."""

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "auto",
        quantization: Optional[str] = None,
        kv_cache_dtype: str = "auto",
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: Optional[int] = None,
        block_size: int = 16,
        kv_cache_memory: str = "1GiB",
        swap_space: str = "0",
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        scheduling_policy: str = "fcfs",
        threads: Optional[int] = None,
        tensor_parallel_size: int = 1,
        reasoning_parser: Optional[str] = None,
        speculative_config: Optional[str] = None,
        max_logprobs: int = 20,
        kv_events_config: Optional[str] = None,
    ) -> None: ...
    def submit(self, requests: List[Tuple[str, Union[str, List[int]], str, int]]) -> "Batch":
        """Queues ``(request_id, prompt, sampling_params_json, priority)`` requests."""
    def submit_pooling(self, requests: List[Tuple[str, Union[str, List[int]]]], pooling: str) -> "Batch":
        """Queues embedding requests ``(request_id, prompt)`` pooled as ``pooling`` (JSON)."""
    def get_tokenizer(self) -> "Tokenizer": ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def num_steps(self) -> int: ...

class Batch:
    """The requests of one ``submit``."""

    def wait(self, timeout: float) -> List[Dict[str, Any]]:
        """Outputs of requests that finished within ``timeout`` seconds (GIL released)."""
    @property
    def remaining(self) -> int: ...
    def abort(self) -> None: ...

class Tokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]: ...
    def decode(self, token_ids: List[int], skip_special_tokens: bool = False) -> str: ...
    def convert_ids_to_tokens(self, token_ids: List[int]) -> List[Optional[str]]: ...
    def convert_tokens_to_ids(self, tokens: List[str]) -> List[Optional[int]]: ...
    def render_chat(self, messages: str, tools: Optional[str], add_generation_prompt: bool) -> str: ...
    @property
    def chat_template(self) -> Optional[str]: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def eos_token_id(self) -> Optional[int]: ...
    @property
    def bos_token_id(self) -> Optional[int]: ...
    @property
    def eos_token(self) -> Optional[str]: ...
    @property
    def bos_token(self) -> Optional[str]: ...

def check_sampling_params(json: str) -> None:
    """Raises ``ValueError`` (vLLM's message) for invalid sampling parameters."""

def reset_log_cache() -> None: ...
def run_cli(argv: List[str]) -> int:
    """Runs the ``minivllm`` command line; returns its exit status."""
