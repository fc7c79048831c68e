"""ServedEngine: answers stage requests with a judge that is already served on this machine through an
OpenAI-compatible chat-completions API (vLLM, llama.cpp's server, Ollama, `transformers serve`).

Each request is sent with `response_format: {"type": "json_schema", ...}` and its output validated against the
stage's schema. Servers differ: some enforce the schema, some reject the field, some silently ignore it. The first
response that fails validation (or a 400 that names response_format) switches this engine, loudly, to the
fallback: the schema is written into the prompt and every output is validated, so a bad output is a failed stage
with its raw text, never a score. `describe()` says which mode produced the verdicts, and every row stores it.

Requests run concurrently (`concurrency` worker threads: by default llama.cpp's slots, read from its /props page, else
DEFAULT_CONCURRENCY, since a request queued behind a busy slot spends its timeout there), each within its timeout,
retries included: connection errors and 5xx replies are retried with exponential backoff until then, and a server that
stops answering fails its rows, naming the timeout, instead of holding the run. The workers are daemon threads and the
caller waits for their answers in short slices, so Ctrl-C ends a run at once (a pool's shutdown used to wait out every
queued request, each up to its timeout times its tries: minutes). Yes/No verdicts (scorers/stages/verdict.py) are asked
as plain text, with the answer's grammar in vLLM's `structured_outputs` field (a server that does not know it ignores it
or refuses it: then it is dropped, loudly), and the reply's first word must be yes or no. Where a verdict is decided,
the request asks for `top_logprobs`, and P(yes) is read from them as our engine reads it (choice_logprobs.py); a server
that gives none leaves P(yes) unread. llama.cpp's server, told apart by its /props page before the first request, gets
the Yes/No grammar and each JSON schema in its own `grammar` field (GBNF; gbnf.py writes the schemas, in our layout, as
its own converter drops bounds), and its log-probabilities are read as taken before the grammar.
Likelihood verdicts need the log-probabilities of a given text, which a chat API does not give: gives_likelihoods()
says so, the scorer refuses such a design in one line before it asks anything (scorers/base.py), and a likelihood
request that reaches this engine anyway fails loudly. verdicts="yes-no" is the way to use a served judge.
"""

from __future__ import annotations

import json
import math
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence

from offline_sumscore.core.errors import Failure, UsageError, check_count
from offline_sumscore.core.schemas import TextOutput, max_json_chars
from offline_sumscore.core.stages import StageRequest, StageResult
from offline_sumscore.engine import Engine
from offline_sumscore.engine.choice_logprobs import CHOICE_LOGPROBS, choice_probs
from offline_sumscore.engine.gbnf import Unsupported, schema_gbnf
from offline_sumscore.engine.grammar import COMPACT_JSON

WAIT_SLICE = 0.2  # seconds the caller waits for an answer before it looks again (an interrupt lands between slices)
SCHEMA_MODE = "server json_schema (response_format)"
GRAMMAR_MODE = "server grammar (llama.cpp's grammar field: GBNF written here from each schema)"
DEFAULT_CONCURRENCY = 4  # requests at once where neither the caller nor the server says
TEXT_MODE = "plain text, parsed here"
PROMPT_MODE = "schema in the prompt, output validated here"
LLAMA_CPP = "llama.cpp"
_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_VERDICT_WORD = re.compile(r"\s*(yes|no)\b[.!,:;]?\s*", re.IGNORECASE)
NO_LIKELIHOODS = (
    "a served judge gives no token likelihoods, so it cannot give likelihood verdicts; score with "
    'verdicts="yes-no" (--verdicts yes-no)'
)


class ServerError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class ServedEngine(Engine):
    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        concurrency: int | None = None,
        timeout: float = 120.0,
        retries: int = 3,
        api_key: str | None = None,
        context_length: int | None = None,
    ):
        if not base_url.startswith(("http://", "https://")):
            raise UsageError(f"--judge-url must start with http:// or https://; given {base_url}")
        if concurrency is not None:
            check_count("concurrency", concurrency)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.timeout, self.retries = model, timeout, retries
        self.concurrency = concurrency or DEFAULT_CONCURRENCY
        self.concurrency_from = "given" if concurrency else "the default"
        self.api_key, self.context_length = api_key, context_length
        self.mode = SCHEMA_MODE
        self.mode_reason = "the server is asked for JSON-schema output; every reply is validated"
        self._lock = threading.Lock()
        self.requests_sent = 0
        # Fields only some servers know, asked for until the server refuses one: vLLM's grammar for Yes/No
        # answers, and the top log-probabilities that give P(yes).
        self.extensions = ["structured_outputs", "logprobs"]
        self.dropped: dict[str, str] = {}
        self.server: str | None = None  # LLAMA_CPP where its /props page says so (read before the first request)
        self._probed = False

    def describe(self) -> dict:
        self._probe()
        return {
            "engine": "openai-compatible server",
            "url": self.url,
            "concurrency": self.concurrency,
            "concurrency_from": self.concurrency_from,
            "timeout_s": self.timeout,
            "structured_output": GRAMMAR_MODE if self.mode == SCHEMA_MODE and self.server == LLAMA_CPP else self.mode,
            "structured_output_why": self.mode_reason,
            "server": self.server or "unknown",
            "json_grammar": "GBNF written from each schema, our layout (llama.cpp grammar field)"
            if self.server == LLAMA_CPP
            else "response_format",
            "yes_no_grammar": "server-enforced (llama.cpp grammar, GBNF)"
            if self.server == LLAMA_CPP
            else ("server-enforced (structured_outputs)" if "structured_outputs" in self.extensions else TEXT_MODE),
            "p_yes": "not read"
            if "logprobs" not in self.extensions
            else (
                "read from top_logprobs"
                + (" (taken before the grammar: yes over yes and no)" if self.server == LLAMA_CPP else "")
            ),
            "refused_fields": dict(self.dropped),
            "judge": {
                "name": self.model,
                "identity": f"served:{self.url}:{self.model}",
                "dtype": None,
                "device": "server",
            },
        }

    def spare_tokens(self, request: StageRequest) -> int | None:
        if self.context_length is None:
            return None  # unknown: the server says so if a prompt is too long
        words = sum(len(m["content"]) for m in request.messages) // 3  # no tokenizer here: ~3 characters a token
        return self.context_length - words - self._cap(request)

    @staticmethod
    def _cap(request: StageRequest) -> int:
        return request.max_new_tokens or (max_json_chars(json.loads(request.schema_json), escapes=False) // 2 + 16)

    def run(self, requests: Sequence[StageRequest]) -> list[StageResult]:
        """Each request answered by one of `concurrency` daemon workers; the caller waits in slices of WAIT_SLICE
        seconds, so an interrupt (Ctrl-C) reaches it within one, and the workers stop taking work."""
        if not requests:
            return []
        self._probe()
        work, answers, stop = queue.SimpleQueue(), queue.SimpleQueue(), threading.Event()
        for item in enumerate(requests):
            work.put(item)

        def worker() -> None:
            while not stop.is_set():
                try:
                    i, request = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    answers.put((i, self._one(request)))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller, which raises it
                    answers.put((i, exc))

        for _ in range(min(self.concurrency, len(requests))):
            threading.Thread(target=worker, daemon=True, name="offline_sumscore-served").start()
        results: list[StageResult | None] = [None] * len(requests)
        try:
            for _ in requests:
                while True:
                    try:
                        i, answer = answers.get(timeout=WAIT_SLICE)
                        break
                    except queue.Empty:
                        continue
                if isinstance(answer, BaseException):
                    raise answer
                results[i] = answer
        finally:
            stop.set()  # on an interrupt too: queued requests are never sent
        return results

    def gives_likelihoods(self) -> bool:
        return False

    def _probe(self) -> None:
        """Which server answers, once, before the first request: llama.cpp's serves /props (its build and settings)
        beside /v1. Any other answer, or none within 5 s, leaves it unknown, asked as any OpenAI-compatible server."""
        if self._probed:
            return
        self._probed = True
        root = self.url[: -len("/chat/completions")]
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        try:
            with urllib.request.urlopen(f"{root}/props", timeout=5) as resp:
                props = json.loads(resp.read().decode("utf-8"))
        except (OSError, ValueError):
            return
        if isinstance(props, dict) and "default_generation_settings" in props:
            self.server = LLAMA_CPP
            slots = props.get("total_slots")
            if self.concurrency_from == "the default" and isinstance(slots, int) and slots >= 1:
                # One request a slot: more would wait at the server, their timeouts running.
                self.concurrency, self.concurrency_from = slots, "llama.cpp's slots (/props total_slots)"

    # -- one request ------------------------------------------------------------------------------------------
    def _one(self, request: StageRequest) -> StageResult:
        started = time.perf_counter()
        if request.continuation is not None:
            return StageResult(
                request=request, value=None, raw_output="", error=NO_LIKELIHOODS, error_kind=Failure.MODEL
            )
        if issubclass(request.schema, TextOutput):
            result = self._ask(request, TEXT_MODE, started)
            if result.error_kind == Failure.REJECTED and self._drop("structured_outputs", result):
                result = self._ask(request, TEXT_MODE, started)
            return result
        mode = self.mode
        result = self._ask(request, mode, started)
        if mode == SCHEMA_MODE and result.error_kind in (Failure.SCHEMA, Failure.REJECTED):
            self._fall_back(result)
            result = self._ask(request, PROMPT_MODE, started)
        return result

    def _drop(self, field: str, result: StageResult, why: str | None = None) -> bool:
        """The server refused one of the fields only some servers know (vLLM's grammar field, logprobs): ask
        without it from now on, once and loudly. False where it was dropped already."""
        import sys

        with self._lock:
            if field not in self.extensions:
                return False
            self.extensions.remove(field)
            self.dropped[field] = why or result.error or ""
        print(
            f"offline_sumscore: {self.url} refused {field}; asking without it: {self.dropped[field]}", file=sys.stderr
        )
        return True

    def _fall_back(self, result: StageResult) -> None:
        with self._lock:
            if self.mode == SCHEMA_MODE:
                self.mode = PROMPT_MODE
                self.mode_reason = (
                    f"the server did not enforce response_format json_schema ({result.error}); "
                    f"fell back to the schema in the prompt, with every output validated"
                )
                import sys

                print(f"offline_sumscore: {self.url}: {self.mode_reason}", file=sys.stderr)

    def _ask(self, request: StageRequest, mode: str, started: float) -> StageResult:
        schema = json.loads(request.schema_json)
        messages = [dict(m) for m in request.messages]
        body = {"model": self.model, "messages": messages, "temperature": 0, "max_tokens": self._cap(request)}
        if request.verdict_choice and "logprobs" in self.extensions:
            body["logprobs"], body["top_logprobs"] = True, CHOICE_LOGPROBS  # P(yes), read as our engine reads it
        if issubclass(request.schema, TextOutput):
            # The prompt asks for the plain answer; vLLM's extension field enforces the answer's grammar, and any
            # reply is parsed below.
            if self.server == LLAMA_CPP:
                body["grammar"] = request.schema.gbnf()
            elif "structured_outputs" in self.extensions:
                body["structured_outputs"] = {"grammar": request.grammar[1]}
        elif mode == SCHEMA_MODE and self.server == LLAMA_CPP and (written := _llama_grammar(request.schema_json)):
            body["grammar"] = written  # every bound enforced, in our layout (engine/gbnf.py says why)
            # The grammar bounds the output, so the cap may allow a token per character: a judge writing digits
            # (a token each) to the bound hit the usual two-characters-a-token cap, cut its JSON short, and that
            # failed stage switched the whole run to the prompt fallback.
            body["max_tokens"] = max_json_chars(schema, escapes=False) + 16
        elif mode == SCHEMA_MODE:
            # "x-guidance" fixes the JSON layout as our engine's grammar does, where the server's grammar engine is
            # llguidance (vLLM's guidance backend); a JSON Schema keyword the others ignore (xgrammar does).
            laid_out = dict(schema, **{"x-guidance": COMPACT_JSON})
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.stage, "schema": laid_out, "strict": True},
            }
        else:
            messages[-1]["content"] += (
                "\n\nReply with one JSON object only, no other text, valid against this "
                f"JSON schema:\n{json.dumps(schema)}"
            )
        prompt = "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)
        result = StageResult(request=request, value=None, raw_output="", prompt=prompt, cap=body["max_tokens"])
        try:
            reply = self._post(body)
        except ServerError as exc:
            named = [f for f in ("response_format", *self.extensions) if f in str(exc)]
            rejected = exc.status == 400 and bool(named) and (mode == SCHEMA_MODE or named != ["response_format"])
            if rejected and "logprobs" in named and self._drop("logprobs", result, str(exc)):
                return self._ask(request, mode, started)
            result.error_kind, result.error = (Failure.REJECTED if rejected else Failure.MODEL), str(exc)
            result.seconds = time.perf_counter() - started
            return result
        choice = (reply.get("choices") or [{}])[0]
        text = ((choice.get("message") or {}).get("content") or "").strip()
        usage = reply.get("usage") or {}
        result.raw_output, result.seconds = text, time.perf_counter() - started
        result.tokens_in, result.tokens_out = usage.get("prompt_tokens", 0), usage.get("completion_tokens", 0)
        result.decoded_tokens = result.tokens_out
        if request.verdict_choice and (choice.get("logprobs") or {}).get("content"):
            result.choice_probs = choice_probs(
                _steps(choice["logprobs"]["content"]),
                request.verdict_choice,
                CHOICE_LOGPROBS,
                masked=self.server != LLAMA_CPP,
            )
        if issubclass(request.schema, TextOutput):  # a served verdict in its own words: "yes, because ..."
            word = _VERDICT_WORD.match(text)
            rest = text[word.end() :] if word else text
            parse = (
                f"{word.group(1).capitalize()}\nReason: {rest}"
                if word and rest
                else (word.group(1).capitalize() if word else text)
            )
        else:  # a JSON reply some servers fence as markdown
            parse = _FENCE.sub("", text)
        return result.read_reply(
            text,
            # a reply cut short under a grammar the server enforces is a cap, not a server ignoring the schema
            capped=choice.get("finish_reason") == "length" and (mode == PROMPT_MODE or "grammar" in body),
            parse=parse,
        )

    def _post(self, body: dict) -> dict:
        """The server's reply, within self.timeout seconds in all (every try and wait between them); ServerError
        past that, naming it."""
        data = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        delay, deadline = 1.0, time.monotonic() + self.timeout
        for attempt in range(self.retries + 1):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError("no time left")
                req = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(req, timeout=left) as resp:
                    reply = json.loads(resp.read().decode("utf-8"))
                with self._lock:
                    self.requests_sent += 1
                return reply
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300]
                if exc.code < 500 or attempt == self.retries:
                    raise ServerError(f"{self.url} answered HTTP {exc.code}: {detail}", exc.code) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                why = getattr(exc, "reason", exc)
                if attempt == self.retries:
                    raise ServerError(
                        f"{self.url} could not be reached after {self.retries + 1} tries: {why}"
                    ) from None
                if deadline - time.monotonic() <= delay:  # no time left for another try
                    raise ServerError(
                        f"{self.url} did not answer within the {self.timeout:g} s a request may take "
                        f"(--judge-timeout; {attempt + 1} tries): {why}"
                    ) from None
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay *= 2
        raise AssertionError("unreachable")


def _llama_grammar(schema_json: str) -> str | None:
    """The schema as GBNF for llama-server's grammar field; None where it is outside gbnf.py's subset (then
    response_format, which llama.cpp converts itself)."""
    try:
        return schema_gbnf(schema_json)
    except Unsupported:
        return None


def _steps(content: list[dict]) -> list[tuple[str, list[tuple[str, float]]]]:
    """A chat completion's logprobs.content as (picked token, its top (token, log-probability) pairs) per step."""
    return [
        (
            c.get("token", ""),
            [(t.get("token", ""), float(t.get("logprob", -math.inf))) for t in c.get("top_logprobs") or []],
        )
        for c in content
    ]
