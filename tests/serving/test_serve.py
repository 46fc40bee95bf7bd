"""xmc-serve: a real uvicorn server on 127.0.0.1 (only), a real HTTP client, bounded loops.

Predictions over HTTP equal XMCModel.predict; concurrent requests share forward passes; bad
requests get a 4xx with a one-line JSON message naming the field and the server keeps serving;
a full queue refuses at once (503 + Retry-After), a request never waits past the request timeout
(504); SIGTERM answers every queued request and exits 0; API keys; /health, /ready, /metrics."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from model_helpers import save_toy_xrlinear
from serve_helpers import HOST, start

from xtransformer.model import XMCModel
from xtransformer.serve import MicroBatcher, QueueFull, RequestTimeout, key_matches, read_api_keys


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    folder, texts = save_toy_xrlinear(tmp_path_factory.mktemp("serve") / "xrlinear")
    return {"folder": folder, "model": XMCModel.load(folder), "texts": texts["test"]}


@pytest.fixture(scope="module")
def server(toy):
    served = start(
        toy["folder"], "--max-texts", "8", "--max-text-chars", "2000", "--max-k", "10", "--max-body-bytes", "100000"
    )
    try:
        yield {"base": served.base, "model": toy["model"], "texts": toy["texts"], "served": served}
    finally:
        served.stop()


def test_predict_health_labels_docs(server):
    base, model, texts = server["base"], server["model"], server["texts"]
    r = httpx.post(f"{base}/predict", json={"texts": texts[:3], "k": 4}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["predictions"] == model.predict(texts[:3], k=4)
    assert httpx.post(f"{base}/predict", json={"texts": ["", texts[0]]}, timeout=30).json()["predictions"][0] == {
        "labels": [],
        "names": [],
        "scores": [],
    }
    health = httpx.get(f"{base}/health", timeout=10).json()
    assert health["status"] == "ok" and health["method"] == "xrlinear" and health["n_labels"] == model.n_labels
    assert health["limits"]["max_k"] == 10 and health["auth"] is False
    assert health["abilities"] == ["add_labels", "calibration", "feature_rows", "zero_shot"]
    labels = httpx.get(f"{base}/labels", params={"offset": 2, "limit": 3}, timeout=10).json()
    assert labels["ids"] == model.label_ids[2:5] and labels["names"] == model.label_names[2:5]
    assert "/predict" in httpx.get(f"{base}/openapi.json", timeout=10).json()["paths"]
    assert httpx.get(f"{base}/docs", timeout=10).status_code == 200


def test_starts_on_loopback_and_says_so(server):
    lines = "\n".join(server["served"].stderr)
    assert f"listening on http://{HOST}:" in lines and "this machine only (no --host given" in lines
    assert "no --api-key-file: requests are not authenticated" in lines


def test_concurrent_requests_answered_each_with_its_own_rows(server):
    base, model, texts = server["base"], server["model"], server["texts"]
    jobs = [(texts[i : i + 2], 1 + i % 5) for i in range(24)]
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda job: client.post(f"{base}/predict", json={"texts": job[0], "k": job[1]}), jobs))
    for (batch, k), reply in zip(jobs, replies):
        assert reply.status_code == 200 and reply.json()["predictions"] == model.predict(batch, k=k)


@pytest.mark.parametrize(
    "body, status, words, field",
    [
        ('{"texts": ["a", "b"', 400, "malformed JSON", "body"),
        ('{"texts": "not a list"}', 422, "texts", "texts"),
        ('{"texts": ["a", 3]}', 422, "texts[1]: Input should be a valid string", "texts[1]"),
        ('{"k": 3}', 422, "texts: Field required", "texts"),
        ('{"texts": ["a"], "beam_size": 3}', 422, "beam_size: Extra inputs are not permitted", "beam_size"),
        ("[1, 2]", 422, "body", "body"),
        (json.dumps({"texts": ["x"] * 9}), 413, "limit is 8", "texts"),
        (json.dumps({"texts": ["x" * 2001]}), 413, "texts[0] has 2001 characters", "texts[0]"),
        (json.dumps({"texts": ["x"], "k": 11}), 422, "k must be between 1 and 10", "k"),
        (json.dumps({"texts": ["x"], "k": 0}), 422, "k must be", "k"),
        (json.dumps({"texts": ["x"], "k": "five"}), 422, "k: Input should be a valid integer", "k"),
        (json.dumps({"texts": ["x" * 1000] * 8, "pad": "y" * 100000}), 413, "exceeds the limit of 100000", "body"),
    ],
)
def test_bad_requests_get_4xx_with_a_message_and_serving_goes_on(server, body, status, words, field):
    base = server["base"]
    r = httpx.post(f"{base}/predict", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert words in message and "\n" not in message and r.json()["field"] == field
    assert httpx.post(f"{base}/predict", json={"texts": ["still serving"]}, timeout=30).status_code == 200


def test_streamed_body_over_the_limit_and_wrong_content_type(server):
    base = server["base"]

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(30):
            yield b"x" * 10_000

    r = httpx.post(f"{base}/predict", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["field"] == "body" and "100000 bytes" in r.json()["error"]
    r = httpx.post(f"{base}/predict", content=b'{"texts": ["a"]}', headers={"content-type": "text/plain"}, timeout=30)
    assert r.status_code == 422 and "Content-Type: application/json" in r.json()["error"]
    assert httpx.get(f"{base}/nowhere", timeout=10).json() == {"error": "Not Found"}
    assert httpx.get(f"{base}/labels", params={"offset": -1}, timeout=10).json()["field"] == "offset"


def test_lone_surrogates_are_answered_not_crashed_on(server):
    r = httpx.post(
        f"{server['base']}/predict",
        content=b'{"texts": ["oil \\ud800 prices"]}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 200 and len(r.json()["predictions"]) == 1


METRIC_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"'
    r'(,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*")*\})? -?[0-9.e+-]+$|^.* (\+Inf|NaN)$'
)


def _metrics(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$", line), line
            continue
        assert METRIC_LINE.match(line), line
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def test_ready_and_prometheus_metrics(server):
    base = server["base"]
    ready = httpx.get(f"{base}/ready", timeout=10)
    assert ready.status_code == 200 and ready.json()["ready"] is True
    before = _metrics(base)
    for n in (1, 3):
        assert httpx.post(f"{base}/predict", json={"texts": ["a b c"] * n}, timeout=30).status_code == 200
    after = _metrics(base)
    key = 'xmc_http_requests_total{code="200",path="/predict"}'  # prometheus_client writes labels sorted by name
    assert after[key] - before.get(key, 0) == 2
    assert after["xmc_texts_total"] - before["xmc_texts_total"] == 4
    assert after["xmc_batch_texts_count"] - before["xmc_batch_texts_count"] == 2
    assert after['xmc_batch_texts_bucket{le="+Inf"}'] == after["xmc_batch_texts_count"]
    buckets = [
        v
        for k, v in after.items()
        if k.startswith("xmc_http_request_duration_seconds_bucket{") and 'path="/predict"' in k
    ]
    assert (
        buckets == sorted(buckets) and buckets[-1] == after['xmc_http_request_duration_seconds_count{path="/predict"}']
    )
    assert after["xmc_queue_texts"] == 0 and after["xmc_queue_limit_texts"] == 4096 and after["xmc_ready"] == 1
    assert after["process_resident_memory_bytes"] > 0
    assert httpx.get(f"{base}/metrics", timeout=10).headers["content-type"].startswith("text/plain; version=0.0.4")


def test_page_is_served_self_contained(server):
    r = httpx.get(f"{server['base']}/", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert 'fetch("predict"' in page and 'id="k"' in page
    assert not re.search(r'(src|href)="(https?:)?//', page)  # no external assets


# ---------------------------------------------------------------------------------------------- keys
@pytest.fixture(scope="module")
def keyed(toy, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# service keys\nfirst-key-0123456789\n\nsecond-key-abcdefghij\n")
    served = start(toy["folder"], "--api-key-file", str(keys))
    try:
        yield served
    finally:
        served.stop()


def test_api_keys_wrong_or_missing_401_right_200(keyed):
    base, body = keyed.base, {"texts": ["oil prices"], "k": 2}
    for headers in (
        {},
        {"Authorization": "Bearer wrong-key"},
        {"Authorization": "Bearer first-key-012345678"},
        {"Authorization": "first-key-0123456789"},
        {"Authorization": "Basic Zmlyc3Qta2V5"},
    ):
        r = httpx.post(f"{base}/predict", json=body, headers=headers, timeout=30)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (headers, r.text)
        assert r.json()["field"] == "Authorization" and "\n" not in r.json()["error"]
    for key in ("first-key-0123456789", "second-key-abcdefghij"):
        r = httpx.post(f"{base}/predict", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200 and len(r.json()["predictions"]) == 1
    assert httpx.get(f"{base}/labels", timeout=10).status_code == 401
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
    for public in ("/health", "/ready", "/", "/openapi.json"):
        assert httpx.get(f"{base}{public}", timeout=10).status_code == 200, public
    schema = httpx.get(f"{base}/openapi.json", timeout=10).json()
    assert schema["paths"]["/predict"]["post"]["security"] == [{"bearer": []}]
    assert "2 API key(s)" in "\n".join(keyed.stderr)


def test_key_comparison_and_key_file_errors(tmp_path):
    hashes = read_api_keys(_write(tmp_path / "k", "abc\n  def  \n# comment\n"))
    assert key_matches("Bearer abc", hashes) and key_matches("bearer  def", hashes)
    assert not key_matches("Bearer ab", hashes) and not key_matches("Bearer", hashes) and not key_matches(None, hashes)
    for text, words in (("\n# only a comment\n", "no keys"), ("a b\n", "whitespace")):
        with pytest.raises(ValueError, match=words):
            read_api_keys(_write(tmp_path / "bad", text))
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "xtransformer",
            "serve",
            "--model",
            str(tmp_path),
            "--api-key-file",
            str(tmp_path / "missing.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "--api-key-file" in res.stderr
    assert "Traceback" not in res.stderr


def _write(path, text):
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------------------- load
def _wait_until(condition, what: str, seconds: float = 60) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def test_full_queue_refused_at_once_and_sigterm_answers_every_queued_request(toy, tmp_path):
    """The model is held in its first pass (one text a pass): of 10 requests at once, one runs, six
    fill the queue (--max-queue 6 texts), three get 503 with Retry-After at once and /ready says
    503. SIGTERM then: no new connection is accepted; once the model goes on, every queued request
    gets its 200 and the process exits 0."""
    model, texts = toy["model"], toy["texts"]
    gate = tmp_path / "gate"
    served = start(toy["folder"], "--max-batch", "1", "--max-queue", "6", "--max-texts", "2", slow=0.0, gate=gate)
    base = served.base
    try:
        gate.touch()
        replies: dict[int, httpx.Response] = {}

        def ask(i: int) -> None:
            replies[i] = httpx.post(f"{base}/predict", json={"texts": [texts[i]], "k": 3}, timeout=120)

        with ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(ask, i) for i in range(10)]
            _wait_until(lambda: len(replies) == 3, "three refusals")
            assert all(r.status_code == 503 for r in replies.values())
            assert _metrics(base)["xmc_queue_texts"] == 6
            ready = httpx.get(f"{base}/ready", timeout=10)
            assert ready.status_code == 503 and "queue full (6 of 6 texts)" in ready.json()["error"]
            served.proc.send_signal(signal.SIGTERM)
            assert "answering 6 queued texts" in served.wait_for_line("not accepting connections")
            time.sleep(0.3)  # uvicorn closes its socket on its next tick (0.1 s)
            try:
                late = httpx.post(f"{base}/predict", json={"texts": ["late"]}, timeout=10)
                assert late.status_code == 503 and "shutting down" in late.json()["error"]
            except httpx.TransportError:
                pass  # connection refused: no longer accepting
            gate.unlink()
            for f in futures:
                f.result()
        assert served.proc.wait(timeout=60) == 0
    finally:
        gate.unlink(missing_ok=True)
        served.stop()
    ok = {i: r for i, r in replies.items() if r.status_code == 200}
    refused = [r for r in replies.values() if r.status_code == 503]
    assert len(ok) == 7 and len(refused) == 3, {i: r.status_code for i, r in replies.items()}
    for i, r in ok.items():
        assert r.json()["predictions"] == model.predict([texts[i]], k=3)
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1 and "queue is full" in r.json()["error"]
    _wait_until(lambda: served.stderr and served.stderr[-1] == "xmc-serve: stopped", "the last line", 10)


def test_no_request_waits_past_the_request_timeout(toy, tmp_path):
    """The model is held in a pass: every request gets 504 at the 1 s timeout, not when the pass
    ends; the queued ones leave the queue then and never reach the model."""
    gate = tmp_path / "gate"
    served = start(toy["folder"], "--max-batch", "1", "--request-timeout", "1", slow=0.0, gate=gate)
    try:
        before = _metrics(served.base)
        gate.touch()

        def ask(i: int) -> tuple[httpx.Response, float]:
            t = time.monotonic()
            r = httpx.post(f"{served.base}/predict", json={"texts": [f"text {i}"]}, timeout=60)
            return r, time.monotonic() - t

        with ThreadPoolExecutor(6) as pool:
            replies = list(pool.map(ask, range(6)))
        for r, seconds in replies:
            assert r.status_code == 504, r.text
            assert "request timeout of 1 s" in r.json()["error"] and "\n" not in r.json()["error"]
            assert seconds < 1 + 5  # answered at the timeout, not whenever the pass ends (generous slack)
        assert _metrics(served.base)["xmc_queue_texts"] == 0
        gate.unlink()
        assert httpx.post(f"{served.base}/predict", json={"texts": ["after"]}, timeout=60).status_code == 200
        after = _metrics(served.base)
        assert after['xmc_rejected_total{reason="timeout"}'] == 6
        assert after["xmc_texts_total"] - before["xmc_texts_total"] == 2  # the held text and "after"
    finally:
        gate.unlink(missing_ok=True)
        served.stop()


def test_micro_batcher_puts_queued_requests_into_one_forward_pass():
    class SlowModel:
        calls: list[int] = []

        def predict(self, texts, k):
            self.calls.append(len(texts))
            time.sleep(0.05)  # keeps the model busy while the other requests queue
            return [{"labels": [t] * k, "names": [t] * k, "scores": [1.0] * k} for t in texts]

    async def go():
        batcher = MicroBatcher(SlowModel())
        await batcher.start()
        try:
            out = await asyncio.gather(*(batcher.predict([f"t{i}", f"u{i}"], k=1 + i % 3) for i in range(10)))
        finally:
            await batcher.stop()
        return batcher, out

    batcher, out = asyncio.run(go())
    assert [row["labels"] for row in out[3]] == [["t3"], ["u3"]]  # each request its rows, its k
    assert batcher.stats["requests"] == 10 and batcher.stats["batches"] < 10
    assert sum(SlowModel.calls) == 20


def test_micro_batcher_bounds_the_queue_and_drops_timed_out_requests():
    class BlockingModel:
        def __init__(self):
            self.seen: list[str] = []

        def predict(self, texts, k):
            self.seen += texts
            time.sleep(0.2)
            return [{"labels": [t], "names": [t], "scores": [1.0]} for t in texts]

    async def go():
        model = BlockingModel()
        batcher = MicroBatcher(model, max_batch=2, max_queue=3, request_timeout=30)
        await batcher.start()
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(batcher.predict(["running"], 1))
        await asyncio.sleep(0.05)  # now in the forward pass
        waiting = asyncio.create_task(batcher.predict(["a", "b"], 1, deadline=loop.time() + 0.1))
        await asyncio.sleep(0)
        assert batcher.queued_texts == 2
        with pytest.raises(QueueFull, match="queue is full"):
            await batcher.predict(["c", "d"], 1)
        with pytest.raises(RequestTimeout):
            await waiting
        assert batcher.queued_texts == 0  # the timed-out texts left the queue at once
        later = await batcher.predict(["later"], 1)
        assert (await first)[0]["labels"] == ["running"] and later[0]["labels"] == ["later"]
        await batcher.stop()
        return model

    model = asyncio.run(go())
    assert model.seen == ["running", "later"]  # the timed-out request never reached the model


def test_micro_batcher_refuses_work_that_would_outlast_the_timeout():
    batcher = MicroBatcher(object(), max_queue=100, request_timeout=2.0)
    batcher.seconds_per_text = 0.5
    batcher.admit(50)  # an empty queue always admits (nothing to estimate from)
    batcher.queued_texts = 2
    batcher.admit(1)  # (2 + 1) x 0.5 s fits in 2 s
    with pytest.raises(QueueFull, match="more than the request timeout of 2 s") as err:
        batcher.admit(3)  # (2 + 3) x 0.5 s does not
    assert err.value.retry_after == 1
    batcher.queued_texts = 100
    with pytest.raises(QueueFull, match="queue is full") as err:
        batcher.admit(1)
    assert err.value.retry_after == 50


def test_worker_processes_answer_as_the_model_and_a_dead_worker_fails_health(toy):
    model, texts = toy["model"], toy["texts"]
    served = start(toy["folder"], "--workers", "2")
    try:
        jobs = [(texts[i : i + 3], 1 + i % 4) for i in range(16)]
        with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
            replies = list(
                pool.map(lambda job: client.post(f"{served.base}/predict", json={"texts": job[0], "k": job[1]}), jobs)
            )
        for (batch, k), reply in zip(jobs, replies):
            assert reply.status_code == 200 and reply.json()["predictions"] == model.predict(batch, k=k)
        assert _metrics(served.base)["xmc_workers"] == 2
        assert httpx.get(f"{served.base}/health", timeout=10).json()["workers"] == 2
        children = [
            int(c)
            for task in Path(f"/proc/{served.proc.pid}/task").iterdir()
            for c in (task / "children").read_text().split()
        ]
        assert len(children) == 2
        for pid in children:
            os.kill(pid, signal.SIGKILL)
        _wait_until(lambda: httpx.get(f"{served.base}/health", timeout=10).status_code == 503, "health 503")
        assert "worker died" in httpx.get(f"{served.base}/health", timeout=10).json()["error"]
        assert httpx.get(f"{served.base}/ready", timeout=10).status_code == 503
        r = httpx.post(f"{served.base}/predict", json={"texts": ["a"]}, timeout=30)
        assert r.status_code == 500 and "\n" not in r.json()["error"] and "Traceback" not in r.text
    finally:
        served.stop()
