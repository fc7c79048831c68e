"""ServedEngine against a small OpenAI-compatible server on loopback (the standard library's http.server, answering
fixed JSON): retries, the 400 that rejects response_format, and the fall-back it triggers. The same engine against a
real model server is tested in tests/model/test_served_judge.py."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from offline_sumscore import SummarizationScorer
from offline_sumscore.core.schemas import max_json_chars
from offline_sumscore.engine.openai_compatible import PROMPT_MODE, SCHEMA_MODE, ServedEngine
from offline_sumscore.scorers.stages.claims import claims_list, claims_prompt
from offline_sumscore.scorers.stages.verdict import question_prompt, yes_no_verdict


class Server:
    def __init__(self, script, props=None):
        self.script, self.bodies, self.auth = list(script), [], []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # llama.cpp's server has a /props page; the others answer 404 there
                found = props is not None and self.path == "/props"
                self.send_response(200 if found else 404)
                self.end_headers()
                self.wfile.write(json.dumps(props).encode() if found else b"")

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                outer.auth.append(self.headers.get("Authorization"))
                status, content = outer.script.pop(0) if outer.script else (200, "Yes")
                payload = (
                    json.dumps(
                        {
                            "choices": [
                                content
                                if isinstance(content, dict)  # a whole choice (with logprobs)
                                else {"message": {"content": content}, "finish_reason": "stop"}
                            ],
                            "usage": {"prompt_tokens": 11, "completion_tokens": 5},
                        }
                    )
                    if status == 200
                    else content
                )
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.httpd.shutdown()


@pytest.fixture
def server():
    servers = []

    def start(script, props=None):
        servers.append(Server(script, props))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


CLAIMS = '{"claims": ["A library will be built."]}'


def test_schema_mode_sends_response_format_for_json_and_plain_text_for_verdicts(server):
    srv = server([(200, CLAIMS), (200, "Yes"), (200, "No, it does not say.")])
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    r = SummarizationScorer(engine=engine, include_reason=False, questions=["Q?"]).score("A source here.", "A sum.")
    assert r.alignment == 1 and r.coverage == 0 and engine.mode == SCHEMA_MODE
    assert srv.bodies[0]["response_format"]["type"] == "json_schema" and srv.bodies[0]["temperature"] == 0
    assert "response_format" not in srv.bodies[1] and "Answer Yes or No." in srv.bodies[1]["messages"][-1]["content"]
    assert r.coverage_verdicts[0]["reason"] == "it does not say."  # the rest of a served reply is kept as its reason
    assert r.stages["claims"]["tokens_in"] == 11 and r.judge["engine"]["structured_output"] == SCHEMA_MODE


def test_a_server_that_ignores_the_schema_triggers_the_prompt_fallback_and_says_so(server, capsys):
    srv = server([(200, "Sure! Here is my answer: yes"), (200, CLAIMS), (200, "yes."), (200, "Yes")])
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    r = SummarizationScorer(engine=engine, include_reason=False, questions=["Q?"]).score("A source here.", "A sum.")
    assert r.score == 1.0 and engine.mode == PROMPT_MODE
    assert "response_format" not in srv.bodies[1] and "JSON schema" in srv.bodies[1]["messages"][-1]["content"]
    assert "did not enforce response_format" in r.judge["engine"]["structured_output_why"]
    assert "did not enforce response_format" in capsys.readouterr().err


def test_a_verdict_that_is_not_yes_or_no_is_a_failed_stage_with_its_raw_text(server):
    srv = server([(200, "Perhaps.")])
    res = ServedEngine(srv.url, "judge").run(verdict_request())[0]
    assert not res.ok and res.error_kind == "schema" and res.raw_output == "Perhaps."


def test_likelihood_verdicts_fail_loudly_on_a_served_judge(server):
    from offline_sumscore.core import schemas
    from offline_sumscore.core.stages import StageRequest

    srv = server([])
    req = StageRequest("x", "support", ({"role": "user", "content": "text"},), schemas.Likelihood, continuation="c")
    res = ServedEngine(srv.url, "judge").run([req])[0]
    assert not res.ok and "no token likelihoods" in res.error and srv.bodies == []  # nothing was sent


def test_a_400_naming_response_format_also_falls_back(server):
    srv = server([(400, '{"error": "response_format is not supported"}'), (200, CLAIMS)])
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    res = engine.run(claims_request())[0]
    assert res.ok and engine.mode == PROMPT_MODE and "HTTP 400" in engine.mode_reason


def claims_request():
    from offline_sumscore.core.stages import StageRequest

    return [StageRequest("x", "claims", tuple(claims_prompt("A sum.")), claims_list(8, 100))]


def verdict_request():
    from offline_sumscore.core.stages import StageRequest

    return [
        StageRequest(
            "x", "coverage", tuple(question_prompt("A sum.", "Q?")), yes_no_verdict(None), verdict_choice=("Y", "N")
        )
    ]


def test_server_errors_are_retried_with_backoff_then_recorded(server, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    srv = server([(503, "busy"), (503, "busy"), (200, "Yes")])
    engine = ServedEngine(srv.url, "judge", retries=3)
    assert engine.run(verdict_request())[0].ok and len(srv.bodies) == 3
    srv2 = server([(500, "down")] * 5)
    res = ServedEngine(srv2.url, "judge", retries=2).run(verdict_request())[0]
    assert not res.ok and res.error_kind == "model" and "HTTP 500" in res.error and len(srv2.bodies) == 3


def test_an_unreachable_server_is_a_failed_stage_not_a_crash(monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: None)
    res = ServedEngine("http://127.0.0.1:9/v1", "judge", retries=1, timeout=2).run(verdict_request())[0]
    assert res.error_kind == "model" and "could not be reached after 2 tries" in res.error


def reply_with_logprobs(content: str, tokens: list[tuple[str, float, list[dict]]]) -> dict:
    """A chat choice whose tokens each carry their log-probability and the server's top list: (token, logprob, top)."""
    steps = [{"token": token, "logprob": logprob, "top_logprobs": top} for token, logprob, top in tokens]
    return {"message": {"content": content}, "finish_reason": "stop", "logprobs": {"content": steps}}


def score_with_verdict_reply(server, choice: dict, props=None):
    """(the server, the result) of one row scored on one given question, its claim's verdict answered by `choice`
    (the claims list first, the question's verdict "No" last), one request at a time."""
    srv = server([(200, CLAIMS), (200, choice), (200, "No")], props=props)
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    r = SummarizationScorer(engine=engine, include_reason=False, questions=["Q?"]).score("A source here.", "A sum.")
    return srv, r


def test_p_yes_is_read_from_the_servers_top_logprobs_under_the_answers_grammar(server):
    top = [{"token": "Yes", "logprob": -0.3}, {"token": "No", "logprob": -1.5}, {"token": "<x>", "logprob": -9999.0}]
    choice = reply_with_logprobs("Yes", [("Yes", -0.3, top)])
    srv, r = score_with_verdict_reply(server, choice)
    verdict = srv.bodies[1]
    assert verdict["logprobs"] is True and verdict["top_logprobs"] == 20
    assert verdict["structured_outputs"]["grammar"].startswith("start:")  # the Yes/No grammar, enforced by vLLM
    assert r.claims[0]["p_supported"] == pytest.approx(1 / (1 + 2.718281828459045**-1.2))
    assert r.coverage_verdicts[0]["p_answered"] is None  # no logprobs in that reply: P(yes) is not made up
    assert r.judge["engine"]["p_yes"] == "read from top_logprobs"


def test_a_server_that_refuses_the_grammar_field_is_asked_without_it_once_and_loudly(server, capsys):
    refusal = '{"error": {"message": "Unrecognized request argument supplied: structured_outputs"}}'
    srv = server([(200, CLAIMS), (400, refusal), (200, "Yes"), (200, "No")])
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    r = SummarizationScorer(engine=engine, include_reason=False, questions=["Q?"]).score("A source here.", "A sum.")
    assert r.alignment == 1 and r.coverage == 0
    assert "structured_outputs" in srv.bodies[1] and "structured_outputs" not in srv.bodies[2]
    assert "structured_outputs" not in srv.bodies[3]  # dropped for the rest of the run
    assert "structured_outputs" in r.judge["engine"]["refused_fields"]
    assert r.judge["engine"]["yes_no_grammar"] == "plain text, parsed here"
    assert capsys.readouterr().err.count("refused structured_outputs") == 1


def test_the_clis_api_key_reaches_the_server_as_a_bearer_token_and_no_file(tmp_path, server, monkeypatch):
    from click.testing import CliRunner

    from offline_sumscore.cli import main
    from tests.conftest import SOURCE, write_jsonl

    s = server([(200, "Yes")] * 40)
    src = write_jsonl(tmp_path / "in.jsonl", [{"id": "a", "source": SOURCE, "summary": "Lindford builds a library."}])
    out, page = tmp_path / "out.jsonl", tmp_path / "r.html"
    design = ["--claims", "sentences", "--coverage", "key_sentences", "--key-sentences", "1", "--no-reason"]
    args = ["score", str(src), "-o", str(out), "--judge-url", s.url, "--judge-model", "m", "--no-cache", "--quiet"]
    monkeypatch.setenv("OFFLINE_SUMSCORE_JUDGE_API_KEY", "sk-from-the-environment")
    result = CliRunner().invoke(main, [*args, *design], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert s.auth and set(s.auth) == {"Bearer sk-from-the-environment"}
    s.auth.clear()
    result = CliRunner().invoke(main, [*args, *design, "--judge-api-key", "sk-typed"], catch_exceptions=False)
    assert result.exit_code == 0 and set(s.auth) == {"Bearer sk-typed"}  # the flag wins over the environment
    CliRunner().invoke(main, ["report", str(out), "-o", str(page)], catch_exceptions=False)
    for written in (out, page):
        assert "sk-typed" not in written.read_text() and "sk-from-the" not in written.read_text()


def test_llama_cpp_gets_its_own_grammar_field_and_p_yes_is_read_before_its_grammar(server):
    # llama-server's top log-probabilities are taken before its grammar: other tokens keep theirs, and a "No" inside
    # the reason is no verdict.
    top = [{"token": "The", "logprob": -0.2}, {"token": "Yes", "logprob": -1.0}, {"token": "No", "logprob": -2.0}]
    later = [{"token": "No", "logprob": -0.1}, {"token": "Yes", "logprob": -3.0}]
    choice = reply_with_logprobs("Yes", [("Yes", -1.0, top), ("No", -0.1, later)])
    srv, r = score_with_verdict_reply(server, choice, props={"default_generation_settings": {}})
    verdict = srv.bodies[1]
    assert verdict["grammar"] == 'root ::= "Yes" | "No"' and "structured_outputs" not in verdict
    assert r.claims[0]["p_supported"] == pytest.approx(1 / (1 + 2.718281828459045**-1.0))
    assert r.judge["engine"]["server"] == "llama.cpp"
    assert "taken before the grammar" in r.judge["engine"]["p_yes"]


def test_the_same_reply_from_a_server_that_masks_nothing_gives_no_p_yes(server):
    # Without /props the server is not known to read its log-probabilities before the grammar: an unmasked top list
    # proves no closed choice, so P(yes) is left unread rather than guessed.
    top = [{"token": "The", "logprob": -0.2}, {"token": "Yes", "logprob": -1.0}, {"token": "No", "logprob": -2.0}]
    choice = reply_with_logprobs("Yes", [("Yes", -1.0, top)])
    srv, r = score_with_verdict_reply(server, choice)
    assert r.claims[0]["p_supported"] is None and r.judge["engine"]["server"] == "unknown"


@pytest.mark.parametrize("metric", ["two-axis", "summary-score"])
def test_a_likelihood_design_on_a_served_judge_is_refused_before_anything_is_sent(server, metric):
    from offline_sumscore import SummaryScore
    from offline_sumscore.core.errors import UsageError

    srv = server([])
    engine = ServedEngine(srv.url, "judge")
    scorer = (
        SummarizationScorer(engine=engine, verdicts="likelihood")
        if metric == "two-axis"
        else SummaryScore(engine=engine, answers="likelihood")
    )
    with pytest.raises(UsageError, match=f"the judge at {srv.url}/chat/completions cannot give likelihood verdicts"):
        scorer.score_many([("A source here.", "A sum.")])
    assert srv.bodies == []


def test_a_reply_cut_short_under_llama_cpps_grammar_is_a_cap_and_no_fallback(server):
    # The 135M judge writing digits (a token each) reached the old cap under llama-server's grammar, and that one cut
    # reply switched the whole run to the prompt fallback.
    cut = {"message": {"content": '{"claims": ["2014, 11:15am, 2014'}, "finish_reason": "length"}
    srv = server([(200, cut)], props={"default_generation_settings": {}})
    engine = ServedEngine(srv.url, "judge", concurrency=1)
    res = engine.run(claims_request())[0]
    assert res.error_kind == "cap" and engine.mode == SCHEMA_MODE and len(srv.bodies) == 1
    assert (
        srv.bodies[0]["grammar"].startswith('root ::= "{" "\\"claims\\": "') and "response_format" not in srv.bodies[0]
    )
    longest = max_json_chars(claims_list(8, 100).model_json_schema(), escapes=False)  # 848 characters
    assert srv.bodies[0]["max_tokens"] == longest + 16  # a token per character, where the others get one per two


@pytest.mark.parametrize(
    ("props", "given", "expected", "said"),
    [
        ({"default_generation_settings": {}, "total_slots": 2}, None, 2, "llama.cpp's slots (/props total_slots)"),
        ({"default_generation_settings": {}, "total_slots": 2}, 3, 3, "given"),
        (None, None, 4, "the default"),
    ],
)
def test_requests_at_once_default_to_llama_cpps_slots(server, props, given, expected, said):
    # More requests than slots wait at llama-server, each one's --judge-timeout running while it waits.
    srv = server([(200, "Yes")], props=props)
    engine = ServedEngine(srv.url, "judge", concurrency=given)
    assert engine.run(verdict_request())[0].error is None
    described = engine.describe()
    assert (engine.concurrency, described["concurrency"], described["concurrency_from"]) == (expected, expected, said)
