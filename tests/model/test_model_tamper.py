"""Tamper-proof loading: a model folder that was changed after it was written is refused with one
line naming what is wrong, before any weights are read (``read_manifest``, called by
``XMCModel.load`` first), and ``xmc-serve`` reports it as that one line, without a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from model_helpers import save_toy_xrlinear

from xtransformer.methods.combination import Combination
from xtransformer.model import XMCModel
from xtransformer.model.folder import FORMAT_VERSION, MANIFEST, ModelError, read_manifest


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A run's model/ folder: two XR-Linear members and their combination."""
    root = tmp_path_factory.mktemp("clean") / "model"
    save_toy_xrlinear(root / "xrlinear")
    shutil.copytree(root / "xrlinear", root / "other")
    members = [XMCModel.load(root / "xrlinear"), XMCModel.load(root / "other")]
    Combination(members, method="average", topk=5, name="ensemble").save(root / "ensemble")
    XMCModel.load(root / "ensemble")  # the untouched folders load
    return root


@pytest.fixture()
def run(clean, tmp_path):
    copy = tmp_path / "run" / "model"
    shutil.copytree(clean, copy, symlinks=True)
    return copy


def _edit_manifest(folder: Path, edit) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    edit(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def _flip_byte(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 0xFF]))


def _outside_copy(path: Path, tmp: Path) -> Path:
    out = tmp / "elsewhere" / path.name
    out.parent.mkdir(exist_ok=True)
    shutil.copy(path, out)
    return out


def tamper_checksum(m: Path, tmp: Path) -> str:
    _flip_byte(m / "xrlinear" / "ranker" / "level_0" / "W.npz")
    return "ranker/level_0/W.npz: checksum mismatch"


def tamper_dotdot(m: Path, tmp: Path) -> str:
    _outside_copy(m / "xrlinear" / "labels.json", m)  # model/elsewhere/labels.json, beside the folder
    _edit_manifest(m / "xrlinear", lambda man: man["files"].__setitem__("../elsewhere/labels.json", "0" * 64))
    return "lists '../elsewhere/labels.json', which leaves the model folder ('..')"


def tamper_absolute(m: Path, tmp: Path) -> str:
    _edit_manifest(m / "xrlinear", lambda man: man["files"].__setitem__("/etc/hostname", "0" * 64))
    return "lists '/etc/hostname', an absolute path"


def tamper_symlinked_file(m: Path, tmp: Path) -> str:
    w = m / "xrlinear" / "ranker" / "level_1" / "W.npz"
    target = _outside_copy(w, tmp)  # the same bytes: the checksum alone would pass
    w.unlink()
    w.symlink_to(target)
    return "ranker/level_1/W.npz: a symlink leading outside the model folder"


def tamper_symlinked_folder(m: Path, tmp: Path) -> str:
    tfidf = m / "xrlinear" / "tfidf"
    shutil.move(tfidf, tmp / "tfidf-outside")
    tfidf.symlink_to(tmp / "tfidf-outside", target_is_directory=True)
    return "a symlink leading outside the model folder"


def tamper_unlisted_symlink(m: Path, tmp: Path) -> str:
    (m / "xrlinear" / "notes").symlink_to("/etc")
    return "xrlinear/notes: a symlink leading outside the model folder (to /etc)"


def tamper_unlisted_file(m: Path, tmp: Path) -> str:
    shutil.copy(m / "xrlinear" / "ranker" / "level_1" / "W.npz", m / "xrlinear" / "ranker" / "level_1" / "W2.npz")
    return "ranker/level_1/W2.npz: not listed in manifest.json"


def tamper_unlisted_checksum(m: Path, tmp: Path) -> str:  # the file changed and its entry removed
    _flip_byte(m / "xrlinear" / "ranker" / "level_0" / "W.npz")
    _edit_manifest(m / "xrlinear", lambda man: man["files"].pop("ranker/level_0/W.npz"))
    return "ranker/level_0/W.npz: not listed in manifest.json"


def tamper_future_version(m: Path, tmp: Path) -> str:
    _edit_manifest(m / "xrlinear", lambda man: man.__setitem__("format_version", FORMAT_VERSION + 1))
    return f"model format version {FORMAT_VERSION + 1} is newer than this xtransformer reads"


def tamper_member_missing(m: Path, tmp: Path) -> str:
    shutil.rmtree(m / "other")
    return "member '../other' of the combination is missing"


def tamper_member_not_a_model(m: Path, tmp: Path) -> str:
    (m / "other" / MANIFEST).unlink()
    return "member '../other' of the combination is not a model folder"


def tamper_member_escapes(m: Path, tmp: Path) -> str:
    _edit_manifest(m / "ensemble", lambda man: man["components"].__setitem__("members", ["../xrlinear", "../../x"]))
    return "member '../../x' is not a sibling model folder"


def tamper_member_absolute(m: Path, tmp: Path) -> str:
    _edit_manifest(
        m / "ensemble", lambda man: man["components"].__setitem__("members", ["../xrlinear", str(m / "other")])
    )
    return "is an absolute path; members are sibling folders"


def tamper_member_cycle(m: Path, tmp: Path) -> str:
    _edit_manifest(m / "ensemble", lambda man: man["components"].__setitem__("members", ["../xrlinear", "../ensemble"]))
    return "member '../ensemble' is not a sibling model folder"


def tamper_member_checksum(m: Path, tmp: Path) -> str:  # the second member: refused before the first is read
    _flip_byte(m / "other" / "tfidf" / "idf.npz")
    return "other/tfidf/idf.npz: checksum mismatch"


def tamper_member_version(m: Path, tmp: Path) -> str:
    _edit_manifest(m / "other", lambda man: man.__setitem__("format_version", FORMAT_VERSION + 5))
    return "newer than this xtransformer reads"


CASES = {  # name: (what to tamper, which folder to load)
    "checksum": (tamper_checksum, "xrlinear"),
    "dotdot": (tamper_dotdot, "xrlinear"),
    "absolute": (tamper_absolute, "xrlinear"),
    "symlinked_file": (tamper_symlinked_file, "xrlinear"),
    "symlinked_folder": (tamper_symlinked_folder, "xrlinear"),
    "unlisted_symlink": (tamper_unlisted_symlink, "xrlinear"),
    "unlisted_file": (tamper_unlisted_file, "xrlinear"),
    "unlisted_checksum": (tamper_unlisted_checksum, "xrlinear"),
    "future_version": (tamper_future_version, "xrlinear"),
    "member_missing": (tamper_member_missing, "ensemble"),
    "member_not_a_model": (tamper_member_not_a_model, "ensemble"),
    "member_escapes": (tamper_member_escapes, "ensemble"),
    "member_absolute": (tamper_member_absolute, "ensemble"),
    "member_cycle": (tamper_member_cycle, "ensemble"),
    "member_checksum": (tamper_member_checksum, "ensemble"),
    "member_version": (tamper_member_version, "ensemble"),
}


@pytest.fixture()
def no_weights_read(monkeypatch):
    """Fail the test if anything loads an array or a model component."""
    import numpy as np
    import scipy.sparse as sp

    from xtransformer import methods

    def refuse(*args, **kwargs):
        raise AssertionError(f"weights read before the folder was refused: {args[:1]}")

    monkeypatch.setattr(np, "load", refuse)
    monkeypatch.setattr(sp, "load_npz", refuse)
    monkeypatch.setattr(methods, "method_class", refuse)  # the dispatch to a class's components


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampered_folder_refused_with_one_line_before_weights(case, run, tmp_path, no_weights_read):
    tamper, which = CASES[case]
    words = tamper(run, tmp_path)
    with pytest.raises(ModelError) as err:
        XMCModel.load(run / which)
    line = str(err.value)
    assert words in line and "\n" not in line, line


def test_unverified_load_still_refuses_paths_that_leave_the_folder(run, tmp_path, no_weights_read):
    tamper_symlinked_file(run, tmp_path)
    with pytest.raises(ModelError, match="symlink leading outside"):
        read_manifest(run / "xrlinear", verify=False)


def test_symlinks_inside_the_folder_are_fine(run):
    ranker = run / "xrlinear" / "ranker" / "level_0"
    shutil.move(ranker / "C.npz", ranker / "C-real.npz")
    (ranker / "C.npz").symlink_to("C-real.npz")
    _edit_manifest(
        run / "xrlinear",
        lambda man: man["files"].__setitem__("ranker/level_0/C-real.npz", man["files"]["ranker/level_0/C.npz"]),
    )
    assert XMCModel.load(run / "xrlinear").predict(["a text"], k=2)[0]["labels"]


def test_xmc_serve_prints_the_one_line_and_exits_2(run, tmp_path):
    tamper_member_missing(run, tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "xtransformer", "serve", "--model", str(run / "ensemble"), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines() == [res.stderr.strip()], res.stderr
    assert (
        res.stderr.startswith("xmc-serve: error: ") and "member '../other' of the combination is missing" in res.stderr
    )
