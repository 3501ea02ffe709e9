"""vLLM's offline API: ``LLM``."""

from __future__ import annotations

import atexit
import itertools
import json
import logging
import os
import random
import time
import weakref
from collections.abc import Sequence as SequenceABC
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from minivllm import _core
from minivllm.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PoolingOutput,
    PoolingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from minivllm.pooling_params import PoolingParams, pooler_config as _pooler_config
from minivllm.sampling_params import SamplingParams
from minivllm.tokenizer import Conversation, Tokenizer, conversation_json, kwargs_json, tools_json

logger = logging.getLogger(__name__)

PromptType = Union[str, List[int], Dict[str, Any]]

# How often a waiting `generate` returns to Python: Ctrl-C takes effect within this.
_WAIT_S = 0.1

# vLLM's arguments that are about GPUs or the Hugging Face hub: accepted, and ignored with a
# warning when set to anything but vLLM's default.
_IGNORED = {
    "tokenizer_mode": "auto",
    "skip_tokenizer_init": False,
    "trust_remote_code": False,
    "revision": None,
    "tokenizer_revision": None,
    "gpu_memory_utilization": 0.9,
    "cpu_offload_gb": 0,
    "enforce_eager": False,
    "max_seq_len_to_capture": 8192,
    "disable_custom_all_reduce": False,
    "disable_async_output_proc": False,
    "hf_token": None,
    "hf_overrides": None,
    "compilation_config": None,
    "disable_log_stats": True,
    "load_format": "auto",
    "download_dir": None,
    "task": "auto",
    "runner": "auto",
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "generation_config": "auto",
}


# Every live LLM, so that their engines stop while the interpreter is whole: at exit, a
# tensor-parallel engine waits for its thread to stop its workers, and that thread may log
# through Python, which it could not do once the interpreter is being torn down.
_live: "weakref.WeakSet[LLM]" = weakref.WeakSet()


@atexit.register
def _stop_engines() -> None:
    for llm in list(_live):
        llm._engine = None



def load_chat_template(chat_template: Optional[str]) -> Optional[str]:
    """vLLM's rule: a path to a template file, or the template itself; a string with no
    ``{``, ``}`` or newline that names no file is a path that failed to open."""
    if chat_template is None:
        return None
    try:
        with open(chat_template, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        if not any(c in chat_template for c in "{}\n"):
            raise ValueError(
                f"The supplied chat template ({chat_template}) looks like a file path, "
                f"but it failed to be opened. Reason: {e}"
            ) from e
        return chat_template

class LLM:
    """A model loaded for offline generation (vLLM's ``LLM``).

    Args:
        model: A GGUF file, a Hugging Face model folder (config.json, tokenizer.json and
            safetensors), or ``org/name`` in the local Hugging Face cache.
        tokenizer: Must be ``None`` or the model: the tokenizer comes with the model.
        tensor_parallel_size: Ranks to split each layer over. Start the script as
            ``mpirun -n N python script.py`` (a package built with the ``mpi`` feature): on
            rank 0, ``LLM()`` returns and runs the engine; on the others it serves rank 0 as
            a worker until rank 0's ``LLM`` is gone, then ends the process (``SystemExit``).
        dtype: ``"auto"`` keeps the file's weight format; ``"float32"``, ``"float16"``,
            ``"bfloat16"`` (and vLLM's aliases).
        quantization: Re-quantise float weights at load: ``"q8_0"``, ``"q4_0"``, ``"q4_1"``,
            ``"q5_0"``, ``"q5_1"``, ``"q4_k"``, ``"q5_k"`` or ``"q6_k"``.
        seed: Seeds the samples of requests whose ``SamplingParams`` have no seed, so that a
            script's run reproduces (as vLLM's).
        swap_space: GiB of CPU memory to swap preempted sequences' KV cache out to (vLLM's
            unit); 0 (the default here) recomputes them instead.
        kv_cache_memory_bytes: Bytes of KV cache (also ``kv_cache_memory``, which takes
            ``"4GiB"``-style strings); default 1 GiB.
        max_model_len: Longest sequence, prompt included (default: the model's context).
        max_num_seqs: Most sequences running at once.
        max_num_batched_tokens: Most tokens per step.
        max_prefill_tokens: Most prompt tokens per step, decodes not counted (default 256:
            a burst's requests get their first tokens in turn).
        long_prefill_token_threshold: A prompt with more tokens than this to prefill is
            long, and shares the machine's time with the other requests (default:
            ``max_prefill_tokens``; 0 turns it off).
        block_size: Tokens per KV-cache block.
        enable_prefix_caching: Reuse the KV cache of shared prompt prefixes.
        enable_chunked_prefill: Split long prompts across steps.
        kv_cache_dtype: ``"auto"``, ``"float32"``, ``"float16"`` or ``"bfloat16"``.
        scheduling_policy: ``"fcfs"`` or ``"priority"``.
        threads: Kernel threads (default: all cores).
        reasoning_parser: ``"deepseek_r1"`` or ``"qwen3"``: structured output constrains
            only the answer after the model's ``<think>...</think>``.
        speculative_config: vLLM's, e.g. ``{"method": "ngram", "num_speculative_tokens": 4,
            "prompt_lookup_max": 4}`` or ``{"method": "draft_model", "model": "small.gguf",
            "num_speculative_tokens": 4}``: the same outputs, several tokens a step where the
            guesses are right (see docs/speculative.md).
        pooler_config: How :meth:`embed` and :meth:`encode` pool a prompt, as vLLM's
            ``PoolerConfig`` (or a dict): ``pooling_type`` ``"LAST"`` (default) or
            ``"MEAN"``, ``normalize`` (default ``True``). The same ``LLM`` generates too.
        max_logprobs: Most ``logprobs`` / ``prompt_logprobs`` a request may ask for (vLLM's
            default 20); -1 allows the whole vocabulary, which a request asks for with -1.
        kv_events_config: vLLM's, as a dict, e.g. ``{"enable_kv_cache_events": True,
            "endpoint": "tcp://*:5557"}``: publish the prefix cache's changes as vLLM's KV
            cache events (see docs/distributed.md).
        kv_transfer_config: vLLM's, as a dict, e.g. ``{"kv_connector": "TcpConnector",
            "kv_role": "kv_both"}``: prefill/decode disaggregation. A request with
            ``SamplingParams(extra_args={"kv_transfer_params": {"do_remote_decode": True}})``
            keeps its KV for another engine, whose request then passes the output's
            ``kv_transfer_params`` the same way (see docs/distributed.md).
    """

    def __init__(
        self,
        model: str,
        *,
        tokenizer: Optional[str] = None,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        quantization: Optional[str] = None,
        seed: Optional[int] = 0,
        swap_space: float = 0,
        kv_cache_memory_bytes: Optional[int] = None,
        kv_cache_memory: Union[int, str, None] = None,
        max_model_len: Optional[int] = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: Optional[int] = None,
        max_prefill_tokens: Optional[int] = None,
        long_prefill_token_threshold: Optional[int] = None,
        block_size: int = 16,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        kv_cache_dtype: str = "auto",
        scheduling_policy: str = "fcfs",
        threads: Optional[int] = None,
        reasoning_parser: Optional[str] = None,
        speculative_config: Optional[Dict[str, Any]] = None,
        pooler_config: Any = None,
        max_logprobs: int = 20,
        kv_events_config: Optional[Dict[str, Any]] = None,
        kv_transfer_config: Optional[Dict[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        for name, value in kwargs.items():
            if name not in _IGNORED:
                raise TypeError(f"LLM() got an unexpected keyword argument {name!r}")
            if value != _IGNORED[name]:
                logger.warning("LLM(%s=%r) has no effect in minivllm", name, value)
        if tokenizer is not None and tokenizer != model:
            # vLLM's GGUF recipe names the base model's tokenizer; the GGUF file has its own.
            logger.warning("LLM(tokenizer=%r): using the model's own tokenizer", tokenizer)
        if kv_cache_memory_bytes is not None and kv_cache_memory is not None:
            raise ValueError("give kv_cache_memory_bytes or kv_cache_memory, not both")
        kv = kv_cache_memory_bytes if kv_cache_memory_bytes is not None else kv_cache_memory
        self._pooler = _pooler_config(pooler_config)
        _core.reset_log_cache()
        self._engine = _core.Engine(
            str(model),
            dtype=dtype,
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_prefill_tokens=max_prefill_tokens,
            long_prefill_token_threshold=long_prefill_token_threshold,
            block_size=block_size,
            kv_cache_memory=str(kv if kv is not None else "1GiB"),
            swap_space=str(int(swap_space * (1 << 30))),
            enable_prefix_caching=enable_prefix_caching,
            enable_chunked_prefill=enable_chunked_prefill,
            scheduling_policy=scheduling_policy,
            threads=threads,
            tensor_parallel_size=tensor_parallel_size,
            reasoning_parser=reasoning_parser or None,
            speculative_config=None if not speculative_config else json.dumps(speculative_config),
            max_logprobs=max_logprobs,
            kv_events_config=None if kv_events_config is None else json.dumps(kv_events_config),
            kv_transfer_config=(None if kv_transfer_config is None
                                else json.dumps(kv_transfer_config)),
        )
        self._tokenizer = Tokenizer(self._engine.get_tokenizer())
        self._request_counter = itertools.count()
        self._seeds = random.Random(seed) if seed is not None else None
        self._token_texts: Dict[int, str] = {}
        self._default_params = _generation_defaults(str(model))
        _live.add(self)

    def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """``SamplingParams()`` with the sampling values of the model's
        ``generation_config.json`` (a Hugging Face folder's), as vLLM's default
        ``generation_config="auto"``."""
        return SamplingParams(**self._default_params)

    def generate(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
        lora_request: None = None,
        priority: Optional[List[int]] = None,
    ) -> List[RequestOutput]:
        """Completes every prompt, batched together, and returns the outputs in the prompts'
        order.

        Args:
            prompts: A string, a list of token ids, a ``{"prompt": ...}`` or
                ``{"prompt_token_ids": [...]}`` dict, or a list of these.
            sampling_params: One for all prompts or one per prompt (default:
                ``SamplingParams()``).
            use_tqdm: Show a progress bar (when ``tqdm`` is installed), or a callable
                that makes one, as ``tqdm`` would be called.
            priority: Per prompt, with ``scheduling_policy="priority"``: lower runs first.

        Raises:
            ValueError: a prompt or a parameter is invalid (nothing runs then).
            KeyboardInterrupt: Ctrl-C; the call's requests are aborted.
        """
        if lora_request is not None:
            raise ValueError("LoRA adapters are not supported by minivllm")
        parsed = _parse_prompts(prompts)
        return self._run(parsed, sampling_params, use_tqdm, priority)

    def chat(
        self,
        messages: Union[Conversation, Sequence[Conversation]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
        use_tqdm: bool = True,
        lora_request: None = None,
        chat_template: Optional[str] = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Optional[List[Dict[str, Any]]] = None,
        chat_template_kwargs: Optional[Dict[str, Any]] = None,
        mm_processor_kwargs: Optional[Dict[str, Any]] = None,
        tokenization_kwargs: Optional[Dict[str, Any]] = None,
    ) -> List[RequestOutput]:
        """Replies to one conversation (a list of ``{"role", "content"}`` messages) or to
        each of a list of them, through the model's chat template; ``tools`` (OpenAI's tool
        objects) and ``chat_template_kwargs`` (``{"enable_thinking": True}``) go to the
        template, which is the model's unless ``chat_template`` gives one, as in vLLM (the
        reply is text: tool calls are read out of it by the server's
        ``--tool-call-parser``). What minivllm does not implement (continuing the last
        message, ...) raises ``ValueError`` rather than changing the prompt silently."""
        if lora_request is not None:
            raise ValueError("LoRA adapters are not supported by minivllm")
        for name, value in (
            ("mm_processor_kwargs", mm_processor_kwargs),
            ("tokenization_kwargs", tokenization_kwargs),
        ):
            if value:
                raise ValueError(f"chat: {name} is not supported by minivllm (the model's own template only)")
        if continue_final_message:
            raise ValueError("continue_final_message is not supported by minivllm")
        if isinstance(messages, dict):
            raise ValueError("messages must be a list of messages or a list of conversations")
        many = len(messages) > 0 and isinstance(messages[0], (list, tuple))
        conversations = list(messages) if many else [messages]
        tok = self._engine.get_tokenizer()
        prompts: List[Tuple[Optional[str], Union[str, List[int]]]] = []
        tools_text = tools_json(tools)
        kwargs_text = kwargs_json(chat_template_kwargs)
        chat_template = load_chat_template(chat_template)
        for conversation in conversations:
            text = tok.render_chat(
                conversation_json(conversation),
                tools_text,
                add_generation_prompt,
                kwargs_text,
                chat_template,
            )
            # The template writes the special tokens itself (BOS included).
            prompts.append((text, tok.encode(text, False)))
        return self._run(prompts, sampling_params, use_tqdm, None)

    def embed(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        pooling_params: Optional[PoolingParams] = None,
        *,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
        truncate_prompt_tokens: Optional[int] = None,
        lora_request: None = None,
    ) -> List[EmbeddingRequestOutput]:
        """Each prompt's embedding: the model's final hidden states pooled as the ``LLM``'s
        ``pooler_config`` says (``{"pooling_type": "LAST" | "MEAN", "normalize": bool}``;
        default the last token's, normalised), by a prefill-only pass, the prompts batched
        together; in the prompts' order."""
        pooled = self._pool(prompts, pooling_params, use_tqdm, truncate_prompt_tokens, lora_request)
        return [
            EmbeddingRequestOutput(
                request_id=r["request_id"],
                outputs=EmbeddingOutput(embedding=r["pooled"]),
                prompt_token_ids=r["prompt_token_ids"],
                finished=r["finished"],
            )
            for r in pooled
        ]

    def encode(
        self,
        prompts: Union[PromptType, Sequence[PromptType]],
        pooling_params: Optional[PoolingParams] = None,
        *,
        use_tqdm: Union[bool, Callable[..., Any]] = True,
        truncate_prompt_tokens: Optional[int] = None,
        lora_request: None = None,
        pooling_task: Optional[str] = None,
    ) -> List[PoolingRequestOutput]:
        """vLLM's ``LLM.encode``: as :meth:`embed`, each vector as ``outputs.data`` (a list
        of floats where vLLM gives a tensor). ``pooling_task`` may be ``"embed"`` only."""
        if pooling_task not in (None, "embed"):
            raise ValueError(f"pooling_task {pooling_task!r} is not supported (embed only)")
        embedded = self.embed(prompts, pooling_params, use_tqdm=use_tqdm,
                              truncate_prompt_tokens=truncate_prompt_tokens,
                              lora_request=lora_request)
        return [
            PoolingRequestOutput(
                request_id=e.request_id,
                outputs=PoolingOutput(data=e.outputs.embedding),
                prompt_token_ids=e.prompt_token_ids,
                finished=e.finished,
            )
            for e in embedded
        ]

    def _pool(self, prompts, pooling_params, use_tqdm, truncate_prompt_tokens, lora_request):
        if lora_request is not None:
            raise ValueError("LoRA adapters are not supported by minivllm")
        if pooling_params is None:
            pooling_params = PoolingParams()
        if not isinstance(pooling_params, PoolingParams):
            raise TypeError(
                f"pooling_params must be a PoolingParams, got {type(pooling_params).__name__}"
            )
        if truncate_prompt_tokens is not None:
            pooling_params = PoolingParams(pooling_params.normalize, pooling_params.dimensions,
                                           truncate_prompt_tokens)
        config = pooling_params._json(self._pooler)
        requests = [(str(next(self._request_counter)), prompt) for _, prompt in _parse_prompts(prompts)]
        if not requests:
            return []
        batch = self._engine.submit_pooling(requests, config)
        raw = self._wait(batch, len(requests), use_tqdm)
        return [raw[request_id] for request_id, _ in requests]

    def _run(
        self,
        prompts: List[Tuple[Optional[str], Union[str, List[int]]]],
        sampling_params: Union[SamplingParams, Sequence[SamplingParams], None],
        use_tqdm: bool,
        priority: Optional[List[int]],
    ) -> List[RequestOutput]:
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = _per_prompt(sampling_params, len(prompts))
        if priority is not None and len(priority) != len(prompts):
            raise ValueError("The lengths of prompts and priority must be the same.")
        requests = []
        for i, ((text, prompt), p) in enumerate(zip(prompts, params)):
            if p.seed is None and self._seeds is not None and p.temperature >= 1e-5:
                p = p._with_seed(self._seeds.getrandbits(63))
            request_id = str(next(self._request_counter))
            # Checked again: fields may have changed since the params were made.
            requests.append((request_id, prompt, p._checked_json(), priority[i] if priority else 0))
        if not requests:
            return []
        batch = self._engine.submit(requests)
        raw = self._wait(batch, len(requests), use_tqdm)
        outputs = []
        for (request_id, *_), (text, _), p in zip(requests, prompts, params):
            out = self._request_output(raw[request_id], p)
            if out.prompt is None:
                out.prompt = text
            outputs.append(out)
        return outputs

    def _wait(self, batch: "_core.Batch", n: int, use_tqdm: Any) -> Dict[str, dict]:
        bar = _progress_bar(n, use_tqdm if callable(use_tqdm) else None) if use_tqdm else None
        start = time.perf_counter()
        done: Dict[str, dict] = {}
        prompt_tokens = generated = 0
        try:
            while batch.remaining:
                finished = batch.wait(_WAIT_S)
                for out in finished:
                    done[out["request_id"]] = out
                    prompt_tokens += len(out["prompt_token_ids"])
                    generated += sum(len(c["token_ids"]) for c in out["outputs"])
                if bar is not None and finished:
                    secs = max(time.perf_counter() - start, 1e-9)
                    bar.postfix = (
                        f"est. speed input: {prompt_tokens / secs:.2f} toks/s, "
                        f"output: {generated / secs:.2f} toks/s"
                    )
                    bar.update(len(finished))
        except BaseException:
            # Ctrl-C, or an engine that stopped: nothing of this call keeps running.
            batch.abort()
            raise
        finally:
            if bar is not None:
                bar.close()
        return done

    def _request_output(self, raw: dict, params: SamplingParams) -> RequestOutput:
        prompt_logprobs = raw["prompt_logprobs"]
        if prompt_logprobs is not None:
            prompt_logprobs = [None if p is None else self._logprobs(p) for p in prompt_logprobs]
        completions = [
            CompletionOutput(
                index=c["index"],
                text=c["text"],
                token_ids=c["token_ids"],
                # As vLLM: only tracked when logprobs are asked for.
                cumulative_logprob=None if params.logprobs is None else c["cumulative_logprob"],
                logprobs=None if c["logprobs"] is None else [self._logprobs(p) for p in c["logprobs"]],
                finish_reason=c["finish_reason"],
                stop_reason=c["stop_reason"],
            )
            for c in raw["outputs"]
        ]
        return RequestOutput(
            request_id=raw["request_id"],
            prompt=raw["prompt"],
            prompt_token_ids=raw["prompt_token_ids"],
            prompt_logprobs=prompt_logprobs,
            outputs=completions,
            finished=raw["finished"],
            num_cached_tokens=raw["num_cached_tokens"],
            metrics=_metrics(raw["metrics"]),
            kv_transfer_params=(None if raw["kv_transfer_params"] is None
                                else json.loads(raw["kv_transfer_params"])),
        )

    def _logprobs(self, position: List[Tuple[int, float, int]]) -> Dict[int, Logprob]:
        """vLLM's ``{token_id: Logprob}`` of one position from the engine's ``(token_id,
        logprob, rank)`` triples, the chosen token first (the engine ranks them, for the
        server and for this alike)."""
        return {
            token: Logprob(logprob=lp, rank=rank, decoded_token=self._token_text(token))
            for token, lp, rank in position
        }

    def _token_text(self, token: int) -> str:
        text = self._token_texts.get(token)
        if text is None:
            text = self._tokenizer.decode([token])
            self._token_texts[token] = text
        return text


def _generation_defaults(model: str) -> Dict[str, Any]:
    """The sampling defaults in a Hugging Face folder's generation_config.json (none for a
    GGUF file, which has no such file), read by the engine's own reader, as the server reads
    them: a file that does not parse is a ValueError naming it."""
    defaults = json.loads(_core.generation_defaults(model))
    if defaults:
        logger.info("default sampling parameters from %s: %s", model, defaults)
    return defaults


def _parse_prompts(prompts: Any) -> List[Tuple[Optional[str], Union[str, List[int]]]]:
    """Each prompt as (its text or None, what the engine takes: text or token ids)."""
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    elif _is_token_ids(prompts) and len(prompts) > 0:
        prompts = [list(prompts)]
    if not isinstance(prompts, SequenceABC) or isinstance(prompts, (str, bytes)):
        raise ValueError(f"prompts must be a string, a dict, token ids or a list of these, got {type(prompts).__name__}")
    parsed = []
    for p in prompts:
        if isinstance(p, str):
            parsed.append((p, p))
        elif isinstance(p, dict):
            if "prompt_token_ids" in p:
                parsed.append((p.get("prompt"), _token_ids(p["prompt_token_ids"])))
            elif "prompt" in p:
                if not isinstance(p["prompt"], str):
                    raise ValueError("a prompt dict's 'prompt' must be a string")
                parsed.append((p["prompt"], p["prompt"]))
            else:
                raise ValueError("a prompt dict needs 'prompt' or 'prompt_token_ids'")
            unsupported = set(p) - {"prompt", "prompt_token_ids", "cache_salt"}
            if unsupported:
                raise ValueError(f"prompt fields not supported by minivllm: {sorted(unsupported)}")
        elif isinstance(p, SequenceABC) and not isinstance(p, (str, bytes)):
            parsed.append((None, _token_ids(p)))
        else:
            raise ValueError(f"a prompt must be a string, a dict or token ids, got {type(p).__name__}")
    return parsed


def _is_token_ids(ids: Any) -> bool:
    return (
        isinstance(ids, SequenceABC)
        and not isinstance(ids, (str, bytes))
        and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
    )


def _token_ids(ids: Any) -> List[int]:
    if not _is_token_ids(ids) or not all(0 <= t < 2**32 for t in ids):
        raise ValueError("prompt_token_ids must be a list of token ids (ints in [0, 2**32))")
    return list(ids)


def _metrics(raw: Optional[Tuple[Any, ...]]) -> Optional[RequestMetrics]:
    if raw is None:
        return None
    arrival, scheduled, first_token, last_token, finished, in_queue = raw
    return RequestMetrics(
        arrival_time=arrival, last_token_time=last_token, first_scheduled_time=scheduled,
        first_token_time=first_token, time_in_queue=in_queue, finished_time=finished)


def _per_prompt(
    sampling_params: Union[SamplingParams, Sequence[SamplingParams], None], n: int
) -> List[SamplingParams]:
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    if not isinstance(sampling_params, SequenceABC) or isinstance(sampling_params, (str, bytes)):
        raise TypeError(
            "sampling_params must be a SamplingParams or a list of them, got "
            f"{type(sampling_params).__name__}"
            + (": make it SamplingParams(**params)" if isinstance(sampling_params, dict) else ""))
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError("The lengths of prompts and sampling_params must be the same.")
    for p in params:
        if not isinstance(p, SamplingParams):
            raise TypeError(f"sampling_params must be SamplingParams, got {type(p).__name__}")
    return params


def _progress_bar(n: int, make: Optional[Callable[..., Any]]) -> Optional[Any]:
    if make is None:
        try:
            from tqdm.auto import tqdm as make
        except ImportError:
            logger.debug("no progress bar: tqdm is not installed (pip install tqdm)")
            return None
    return make(
        total=n,
        desc="Processed prompts",
        dynamic_ncols=True,
        postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s",
    )
