"""xmc-serve: a real uvicorn server on 127.0.0.1 (only), a real HTTP client, bounded loops.

Predictions over HTTP equal XMCModel.predict; concurrent requests share forward passes; bad
requests get a 4xx with a one-line message and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from model_helpers import save_toy_xrlinear
from xtransformer.model import XMCModel
from xtransformer.serve import MicroBatcher

HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder, texts = save_toy_xrlinear(tmp_path_factory.mktemp("serve") / "xrlinear")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "xtransformer", "serve", "--model", str(folder), "--host", HOST,
                             "--port", str(port), "--max-texts", "8", "--max-text-chars", "2000", "--max-k", "10"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://{HOST}:{port}"
    try:
        for _ in range(300):  # up to ~60 s for the server to come up
            if proc.poll() is not None:
                raise RuntimeError(proc.stderr.read())
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        else:
            raise RuntimeError("server did not start")
        yield {"base": base, "model": XMCModel.load(folder), "texts": texts["test"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_predict_health_labels_docs(server):
    base, model, texts = server["base"], server["model"], server["texts"]
    r = httpx.post(f"{base}/predict", json={"texts": texts[:3], "k": 4}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["predictions"] == model.predict(texts[:3], k=4)
    assert httpx.post(f"{base}/predict", json={"texts": ["", texts[0]]}, timeout=30).json()["predictions"][0] == \
        {"labels": [], "names": [], "scores": []}
    health = httpx.get(f"{base}/health", timeout=10).json()
    assert health["status"] == "ok" and health["method"] == "xrlinear" and health["n_labels"] == model.n_labels
    labels = httpx.get(f"{base}/labels", params={"offset": 2, "limit": 3}, timeout=10).json()
    assert labels["ids"] == model.label_ids[2:5] and labels["names"] == model.label_names[2:5]
    assert "/predict" in httpx.get(f"{base}/openapi.json", timeout=10).json()["paths"]
    assert httpx.get(f"{base}/docs", timeout=10).status_code == 200


def test_concurrent_requests_answered_each_with_its_own_rows(server):
    base, model, texts = server["base"], server["model"], server["texts"]
    jobs = [(texts[i:i + 2], 1 + i % 5) for i in range(24)]
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(12) as pool:
        replies = list(pool.map(lambda job: client.post(f"{base}/predict", json={"texts": job[0], "k": job[1]}), jobs))
    for (batch, k), reply in zip(jobs, replies):
        assert reply.status_code == 200 and reply.json()["predictions"] == model.predict(batch, k=k)


@pytest.mark.parametrize("body, status, words", [
    ('{"texts": ["a", "b"', 400, "malformed JSON"),
    ('{"texts": "not a list"}', 422, "texts"),
    (json.dumps({"texts": ["x"] * 9}), 413, "limit is 8"),
    (json.dumps({"texts": ["x" * 2001]}), 413, "texts[0] has 2001 characters"),
    (json.dumps({"texts": ["x"], "k": 11}), 422, "k must be between 1 and 10"),
    (json.dumps({"texts": ["x"], "k": 0}), 422, "k must be"),
])
def test_bad_requests_get_4xx_with_a_message_and_serving_goes_on(server, body, status, words):
    base = server["base"]
    r = httpx.post(f"{base}/predict", content=body, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert words in message and "\n" not in message
    assert httpx.post(f"{base}/predict", json={"texts": ["still serving"]}, timeout=30).status_code == 200


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
