"""Models on the Hugging Face Hub, without a network: a push stages exactly the model's files and a
card (the upload, ``hub.upload``, replaced by writing the staged files into a Hugging Face cache in
the layout ``snapshot_download`` leaves), and ``XMCModel.load("hf://owner/name[@revision][/sub]")``
reads that cache offline, checks it as a local folder and predicts as the folder it came from."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from model_helpers import save_toy_xrlinear

from xtransformer.cli import main as cli_main
from xtransformer.cli import predict_main
from xtransformer.methods.combination import Combination
from xtransformer.model import ModelError, XMCModel, hub
from xtransformer.model.card import LOCAL_PATH

SRC = Path(__file__).resolve().parents[2] / "src"
FORMAT1_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "format1" / "xrtransformer-run"


def cache_repo(cache: Path, repo_id: str, files: Path, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """``files`` as a snapshot in a Hugging Face cache, laid out as huggingface_hub's cache guide
    describes: ``models--owner--name/blobs/<digest>``, ``snapshots/<commit>/<path>`` a relative link
    to its blob, ``refs/<branch or tag>`` holding the commit; the Hub's ``.gitattributes`` too."""
    store = cache / f"models--{repo_id.replace('/', '--')}"
    snap = store / "snapshots" / commit
    contents = {p.relative_to(files).as_posix(): p.read_bytes() for p in files.rglob("*") if p.is_file()}
    contents[".gitattributes"] = b"*.npz filter=lfs diff=lfs merge=lfs -text\n"
    for rel, data in contents.items():
        blob = store / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    for ref in refs:
        (store / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (store / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, offline. huggingface_hub reads its environment once, when it is
    first imported, so a process that imported it before this test also gets the two values set."""
    import huggingface_hub.constants as constants

    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


class Pushed:
    """``hub.upload`` replaced: each push's staged files land in the cache as a new commit."""

    def __init__(self, cache: Path, monkeypatch):
        self.cache, self.pushes = cache, []
        monkeypatch.setattr(hub, "upload", self.upload)

    def upload(self, root: Path, repo_id: str, options: hub.PushOptions, message: str) -> str:
        commit = f"{len(self.pushes):040d}"
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        card = (root / "README.md").read_text()
        self.pushes.append({"repo": repo_id, "files": files, "card": card, "message": message, "commit": commit})
        cache_repo(self.cache, repo_id, root, commit, ("main",) if options.revision is None else (options.revision,))
        return f"https://huggingface.co/{repo_id}/commit/{commit}"


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def _run_files(models: Path) -> list[str]:
    """What a push of a run's ``model/`` folder uploads: the card, models.json, every method's files."""
    methods = json.loads((models / "models.json").read_text())["methods"]
    return sorted(["README.md", "models.json", *(f"{m}/{f}" for m in methods for f in _files(models / m))])


def _one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


@pytest.fixture()
def run_dir(tmp_path):
    """A run folder: metrics.json and model/ with two XR-Linear models and their combination."""
    run = tmp_path / "run"
    models = run / "model"
    _, texts = save_toy_xrlinear(models / "xrlinear")
    shutil.copytree(models / "xrlinear", models / "other")
    members = [XMCModel.load(models / "xrlinear"), XMCModel.load(models / "other")]
    Combination(members, method="average", topk=5, name="ensemble").save(models / "ensemble")
    (models / "models.json").write_text(json.dumps({"main": "ensemble", "methods": ["xrlinear", "other", "ensemble"]}))
    metrics = {
        "method": "ensemble",
        "dataset": "toy",
        "eval_split": "test",
        "results": {"xrlinear": {"P@1": 0.75, "P@3": 0.5, "nDCG@5": 0.625}, "ensemble": {"P@1": 0.8125}},
        "config": {"paths": {"output_dir": str(run), "data_dir": str(tmp_path / "data")}},
    }
    (run / "metrics.json").write_text(json.dumps(metrics))
    return run, texts


def test_a_pushed_model_loads_offline_from_the_cache_and_predicts_as_its_folder(tmp_path, hf_cache, monkeypatch):
    folder, texts = save_toy_xrlinear(tmp_path / "xrlinear")
    pushed = Pushed(hf_cache, monkeypatch)
    url = XMCModel.load(folder).push_to_hub("owner/toy")
    assert url == f"https://huggingface.co/owner/toy/commit/{0:040d}"
    (push,) = pushed.pushes
    assert push["files"] == sorted([*_files(folder), "README.md"])  # the folder as it is, and the card
    assert push["message"].startswith("xrlinear model")
    loaded = XMCModel.load("hf://owner/toy")
    assert hf_cache in loaded.folder.parents and (loaded.folder / ".gitattributes").is_file()
    local = XMCModel.load(folder)
    assert (loaded.predict_csr(texts["test"]) != local.predict_csr(texts["test"])).nnz == 0
    assert loaded.predict(texts["test"][:3], k=3) == local.predict(texts["test"][:3], k=3)


def test_a_model_that_differs_from_its_folder_is_saved_whole_with_its_members(run_dir, hf_cache, monkeypatch):
    run, texts = run_dir
    members = [XMCModel.load(run / "model" / "xrlinear"), XMCModel.load(run / "model" / "other")]
    both = Combination(members, method="average", topk=5, name="both")  # in memory: no folder of its own
    pushed = Pushed(hf_cache, monkeypatch)
    both.push_to_hub("owner/both", license="apache-2.0")
    files = pushed.pushes[0]["files"]
    assert "models.json" not in files and {"members/xrlinear/manifest.json", "members/xrlinear-1/manifest.json"} <= set(
        files
    )
    assert both.folder is None and members[0].folder == run / "model" / "xrlinear"  # the pushed model is untouched
    loaded = XMCModel.load("hf://owner/both")
    assert loaded.method == "both" and (loaded.predict_csr(texts["test"]) != both.predict_csr(texts["test"])).nnz == 0
    assert 'license: "apache-2.0"' in pushed.pushes[0]["card"]


def test_a_run_goes_up_whole_and_loads_by_revision_commit_and_subfolder(run_dir, hf_cache, monkeypatch):
    run, texts = run_dir
    pushed = Pushed(hf_cache, monkeypatch)
    hub.push_folder(run / "model", "owner/run")  # main: every method, models.json
    hub.push_folder(run / "model" / "xrlinear", "owner/run", hub.PushOptions(revision="v2"))
    first, second = pushed.pushes
    models = run / "model"
    assert first["files"] == _run_files(models)
    assert second["files"] == sorted([*_files(models / "xrlinear"), "README.md"])
    assert type(XMCModel.load("hf://owner/run")).__name__ == "Combination"  # the run's main model
    assert XMCModel.load("hf://owner/run", method="other").folder.name == "other"
    local = XMCModel.load(models / "xrlinear").predict_csr(texts["test"])
    for address in ("hf://owner/run/xrlinear", "hf://owner/run@v2", f"hf://owner/run@{first['commit']}/other"):
        loaded = XMCModel.load(address)
        assert loaded.method == "xrlinear" and (loaded.predict_csr(texts["test"]) != local).nnz == 0, address
    assert XMCModel.load("hf://owner/run@v2").folder.name == second["commit"]
    with pytest.raises(ModelError) as e:
        XMCModel.load("hf://owner/run/nothing")
    assert "no folder 'nothing' in the repository" in _one_line(e)


def test_a_combination_pushed_alone_takes_its_sibling_members(run_dir, hf_cache, monkeypatch):
    run, texts = run_dir
    pushed = Pushed(hf_cache, monkeypatch)
    XMCModel.load(run / "model" / "ensemble").push_to_hub("owner/ensemble")
    files = pushed.pushes[0]["files"]
    assert {"models.json", "ensemble/manifest.json", "xrlinear/manifest.json", "other/manifest.json"} <= set(files)
    loaded = XMCModel.load("hf://owner/ensemble")
    local = XMCModel.load(run / "model" / "ensemble")
    assert (
        loaded.method == "ensemble" and (loaded.predict_csr(texts["test"]) != local.predict_csr(texts["test"])).nnz == 0
    )
    index = json.loads((loaded.folder.parent / "models.json").read_text())
    assert index == {"main": "ensemble", "methods": ["xrlinear", "other", "ensemble"]}


def test_the_card_names_the_model_its_data_settings_results_and_loading_and_no_local_path(run_dir, tmp_path):
    run, _ = run_dir
    options = hub.PushOptions(revision="v1", license="mit")
    with hub.staged(run / "model", "owner/run", options) as stage:
        card = stage.card
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "xtransformer" and meta["pipeline_tag"] == "text-classification"
    assert meta["license"] == "mit"
    assert {"extreme-multi-label-classification", "xmc", "xrlinear", "ensemble"} <= set(meta["tags"])
    assert "- **Labels:** " in body and "`ensemble`" in body and "`toy`" in body
    assert "| `xrlinear` | 0.7500 | 0.5000 | 0.6250 |" in body and "| `ensemble` | 0.8125 | - | - |" in body
    assert "On the `test` split of `toy`" in body
    assert 'XMCModel.load("hf://owner/run@v1")' in body and "pip install xtransformer" in body
    assert str(tmp_path) not in card
    # a run's settings that name this machine's encoder folder (format1's tiny BERT at /tmp/oldfmt)
    with hub.staged(FORMAT1_RUN / "model", "owner/old", hub.PushOptions()) as stage:
        card = stage.card
    assert "/tmp/oldfmt" not in card and f'"model_name_or_path": "{LOCAL_PATH}"' in card
    assert '"dataset": "reuters21578"' in card and "## Results" not in card  # no metrics.json beside it


def test_a_tampered_cached_file_is_refused(tmp_path, hf_cache, monkeypatch):
    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    Pushed(hf_cache, monkeypatch)
    hub.push_folder(folder, "owner/toy")
    weights = (hf_cache / "models--owner--toy" / "snapshots" / f"{0:040d}" / "ranker" / "level_0" / "W.npz").resolve()
    data = bytearray(weights.read_bytes())
    data[40] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelError) as e:
        XMCModel.load("hf://owner/toy")
    assert "W.npz: checksum mismatch" in _one_line(e)


def test_a_snapshot_link_out_of_its_repository_is_refused(tmp_path, hf_cache, monkeypatch):
    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    Pushed(hf_cache, monkeypatch)
    hub.push_folder(folder, "owner/toy")
    link = hf_cache / "models--owner--toy" / "snapshots" / f"{0:040d}" / "labels.json"
    elsewhere = tmp_path / "labels.json"
    shutil.copy(link, elsewhere)
    link.unlink()
    link.symlink_to(elsewhere)
    with pytest.raises(ModelError) as e:
        XMCModel.load("hf://owner/toy")
    assert "a symlink leading outside the model folder" in _one_line(e)


def test_a_repository_or_revision_missing_offline_is_one_line(hf_cache, tmp_path, monkeypatch):
    with pytest.raises(ModelError) as e:
        XMCModel.load("hf://nobody/nothing")
    line = _one_line(e)
    assert line.startswith("hf://nobody/nothing: not in the Hugging Face cache") and "HF_HUB_OFFLINE=1" in line
    assert "`hf download nobody/nothing`" in line and "local model folder" in line
    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    Pushed(hf_cache, monkeypatch)
    hub.push_folder(folder, "owner/toy")
    with pytest.raises(ModelError) as e:
        XMCModel.load("hf://owner/toy@v9")
    assert "`hf download owner/toy --revision v9`" in _one_line(e)


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("hf://", "Empty body"),
        ("hf://a", "'namespace/name'"),
        ("hf://a/b@", "Empty revision"),
        ("hf://a/b//c", "empty segments"),
        ("hf://a/b/../c", "a repository and a folder inside it"),
        ("hf://buckets/a/b", "a repository and a folder inside it"),
    ],
)
def test_a_bad_address_is_one_line(address, why, capsys):
    with pytest.raises(ModelError) as e:
        XMCModel.load(address)
    line = _one_line(e)
    assert line.startswith(f"{address}: not a Hub model address") and why in line
    assert "hf://owner/name[@revision][/subfolder]" in line
    assert predict_main(["--model", address, "--input", "-"]) == 2
    assert capsys.readouterr().err.strip() == f"xmc-predict: error: {line}"


def test_push_offline_fails_in_one_line_before_any_upload(tmp_path, hf_cache):
    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    with pytest.raises(ModelError) as e:
        hub.push_folder(folder, "owner/toy")
    assert _one_line(e) == "owner/toy: pushing needs the Hub, and HF_HUB_OFFLINE=1 is set"


def test_push_refuses_what_is_no_model_or_no_repository_in_one_line(tmp_path, capsys):
    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    assert cli_main(["push", "--model", str(tmp_path), "--repo", "owner/toy", "--dry-run"]) == 2
    assert "not a model folder (no manifest.json), a run's model/ folder or a run folder" in capsys.readouterr().err
    for repo in ("toy", "a/b/c", "owner/na--me"):
        assert cli_main(["push", "--model", str(folder), "--repo", repo, "--dry-run"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"xmc-push: error: repository '{repo}'") and "\n" not in err


def test_push_dry_run_prints_the_files_and_the_card(run_dir, capsys):
    run, _ = run_dir
    assert cli_main(["push", "--model", str(run), "--repo", "owner/run", "--dry-run"]) == 0
    out = capsys.readouterr().out
    files, card = out.split("\n\n", 1)
    assert files.splitlines() == _run_files(run / "model")
    assert card.startswith("---\nlibrary_name: xtransformer\n") and "| `ensemble` | 0.8125" in card


def test_xmc_predict_reads_hf_addresses_from_the_cache_and_names_a_missing_one(tmp_path, hf_cache, monkeypatch):
    folder, texts = save_toy_xrlinear(tmp_path / "xrlinear")
    Pushed(hf_cache, monkeypatch)
    hub.push_folder(folder, "owner/toy")
    (tmp_path / "texts.txt").write_text("\n".join(texts["test"][:5]) + "\n")
    env = {**os.environ, "PYTHONPATH": str(SRC), "HF_HUB_CACHE": str(hf_cache), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "xtransformer", "predict", "--input", str(tmp_path / "texts.txt"), "--no-progress"]
    res = subprocess.run([*cmd, "--model", "hf://owner/toy"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    local = subprocess.run([*cmd, "--model", str(folder)], capture_output=True, text=True, env=env, timeout=120)
    assert res.stdout == local.stdout and len(res.stdout.splitlines()) == 5
    # no network at all (the Hub's address refuses connections), offline mode not set: the cache still serves
    env |= {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}
    res = subprocess.run([*cmd, "--model", "hf://owner/toy"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout == local.stdout, res.stderr
    res = subprocess.run([*cmd, "--model", "hf://owner/gone"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("xmc-predict: error: hf://owner/gone: not in the Hugging Face cache")
    assert "(no network)" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    # a push without a reachable Hub: the real upload's failure, as one line
    push = [sys.executable, "-m", "xtransformer", "push", "--model", str(folder), "--repo", "owner/toy"]
    res = subprocess.run(push, capture_output=True, text=True, env=env | {"HF_HOME": str(tmp_path)}, timeout=120)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert res.stderr.startswith("xmc-push: error: owner/toy: the push failed (ConnectError: ")
