"""Hugging Face ids: a cached snapshot resolves without the network; one not cached is downloaded
(config, tokenizer, one kind of PyTorch weights); offline or with the Hub unreachable, resolving it
fails in one line that says how to provide it. No test here reaches the Internet: the Hub is a
closed port, a server that never answers, or a local server that knows no model."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.utils import filter_repo_objects
from tiny_models import build_tiny

from xtransformer.encoders import ModelNotFoundError, check_model_available, load_encoder, lookup, resolve_model

SRC = Path(__file__).resolve().parents[2] / "src"
MODEL = "xt-no-such-org/xt-model"


# --------------------------------------------------------------------------- offline, unreachable
class _NoModels(http.server.BaseHTTPRequestHandler):
    """A Hub that knows no model: 404 with the error code the Hub sends for a missing repository."""

    def do_GET(self) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hub(request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, str], str]]:
    """The environment variables of a Hub that is ``request.param``, and the words its line says."""
    kind = request.param
    if kind == "offline":
        yield {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE=1"
    elif kind == "refused":
        with socket.socket() as s:  # a port nothing listens on once closed
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield {"HF_ENDPOINT": f"http://127.0.0.1:{port}"}, f"cannot reach http://127.0.0.1:{port}"
    elif kind == "silent":  # connects, never answers: the probe's bounded wait
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen(8)
            port = s.getsockname()[1]
            env = {"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_ETAG_TIMEOUT": "1"}
            yield env, "timed out"
    else:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoModels)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}"}, "no model on http://127.0.0.1"
        server.shutdown()


_RESOLVE = """
import sys
from xtransformer.encoders import ModelNotFoundError, check_model_available, resolve_model
for call in (check_model_available, resolve_model):
    try:
        call(sys.argv[1])
    except ModelNotFoundError as err:
        print(err)
"""


@pytest.mark.parametrize("hub", ["offline", "refused", "silent", "unknown"], indirect=True)
def test_a_model_not_cached_and_not_downloadable_fails_in_one_line(hub, tmp_path: Path) -> None:
    env_hub, words = hub
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}  # the Hub as the test sets it
    env |= {"PYTHONPATH": os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]), "HF_HUB_CACHE": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _RESOLVE, MODEL], env=env | env_hub, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2, out.stdout  # one line from each call
    for line in lines:
        assert repr(MODEL) in line and words in line, line
        if words != "no model on http://127.0.0.1":  # a model that is there but cannot be fetched now
            assert f"`hf download {MODEL}`" in line and str(tmp_path) in line
        assert "matcher.model_name_or_path=<local folder>" in line
    assert not any(tmp_path.iterdir())  # nothing was downloaded


# --------------------------------------------------------------------------- cached, downloaded
def _snapshot(cache: Path, repo_id: str) -> Path:
    """A tiny model laid out as a snapshot of the Hugging Face cache ``cache``."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return build_tiny("bert", repo / "snapshots" / commit)


@pytest.fixture
def online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Downloads allowed, into an empty Hugging Face cache (returned)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf"))  # read when huggingface_hub loaded
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hf"


def test_a_cached_snapshot_resolves_without_the_network(online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _snapshot(online, MODEL)

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the network was asked")

    monkeypatch.setattr(lookup, "_hub_files", no_network)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    assert resolve_model(MODEL) == folder
    check_model_available(MODEL)
    model, _ = load_encoder(MODEL)
    assert model.config.model_type == "bert"


BERT_REPO = [".gitattributes", "README.md", "config.json", "flax_model.msgpack", "model.safetensors"]
BERT_REPO += ["pytorch_model.bin", "rust_model.ot", "tf_model.h5", "tokenizer.json", "tokenizer_config.json"]
BERT_REPO += ["vocab.txt"]
XLNET_REPO = ["config.json", "pytorch_model.bin", "spiece.model", "tf_model.h5", "tokenizer.json"]
SBERT_FETCHED = {"1_Pooling/config.json", "config.json", "config_sentence_transformers.json", "modules.json"}
SBERT_FETCHED |= {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}
SBERT_FETCHED |= {"model.safetensors.index.json"}
SBERT_FETCHED |= {"sentence_bert_config.json", "special_tokens_map.json", "tokenizer.json", "vocab.txt"}
SBERT_REPO = [*sorted(SBERT_FETCHED), "onnx/model.onnx", "onnx/model.safetensors", "openvino/openvino_model.bin"]
SBERT_REPO += ["pytorch_model.bin", "train_script.py"]


@pytest.mark.parametrize(
    "files, fetched",
    [
        (BERT_REPO, {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt"}),
        (XLNET_REPO, {"config.json", "pytorch_model.bin", "spiece.model", "tokenizer.json"}),
        (SBERT_REPO, SBERT_FETCHED),
    ],
)
def test_a_model_not_cached_is_downloaded_config_tokenizer_and_one_kind_of_weights(
    online: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: list[str], fetched: set[str]
) -> None:
    calls = []

    def snapshot_download(repo_id: str, **kwargs: object) -> str:
        calls.append((repo_id, kwargs))
        return str(build_tiny("bert", tmp_path / "snapshot"))

    monkeypatch.setattr(lookup, "_hub_files", lambda repo_id, cache: files)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert resolve_model(MODEL) == tmp_path / "snapshot"
    ((repo_id, kwargs),) = calls
    assert repo_id == MODEL and kwargs["etag_timeout"] == constants.HF_HUB_ETAG_TIMEOUT
    assert set(filter_repo_objects(files, allow_patterns=kwargs["allow_patterns"])) == fetched


def test_a_hub_model_without_pytorch_weights_is_named(online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lookup, "_hub_files", lambda repo_id, cache: ["config.json", "tf_model.h5", "onnx/model.onnx"])
    with pytest.raises(ModelNotFoundError, match="no PyTorch weights"):
        check_model_available(MODEL)
