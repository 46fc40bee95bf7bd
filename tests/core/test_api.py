"""``xtransformer.api``, the surface scripts and studies import: every name it lists resolves, the
module itself stays light, and the functions made public for the scripts do what they say."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
from tiny_models import toy_xmc

import xtransformer
from xtransformer import api
from xtransformer.model.folder import ModelError

IDS = [f"L{i}" for i in range(12)]


def test_every_name_resolves_and_the_package_names_are_among_them() -> None:
    assert api.__all__ == sorted(set(api.__all__)) and len(api.__all__) > 50
    missing = [name for name in api.__all__ if getattr(api, name, None) is None]
    assert not missing, missing
    assert set(xtransformer.__all__) <= set(api.__all__)  # one place for scripts: the top-level names too
    from xtransformer.pipeline.run import run

    assert api.run_pipeline is run  # the one name that differs from its home's
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        api.nonesuch  # noqa: B018


def test_importing_the_api_imports_neither_torch_nor_lightning() -> None:
    code = (
        "import json, sys; import xtransformer.api as api; api.__all__; "
        "print(json.dumps(sorted(m for m in ('torch', 'lightning', 'lightning.pytorch') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_compose_config_is_what_compose_settings_reads() -> None:
    from xtransformer.api import compose_config, compose_settings, run_settings

    cfg = compose_config("method=xrlinear", "seed=3", "paths.output_dir=.")
    assert cfg.method == "xrlinear" and cfg.xrlinear.nr_splits == 16 and cfg.seed == 3
    assert run_settings(cfg).main == compose_settings("method=xrlinear", "seed=3").main


def test_build_index_without_quality_builds_the_same_tree() -> None:
    from xtransformer.api import IndexingConfig, build_index

    rng = np.random.default_rng(0)
    X = sp.random(120, 60, density=0.1, format="csr", dtype=np.float32, random_state=1)
    Y = sp.csr_matrix((np.ones(120, np.float32), (np.arange(120), rng.integers(0, 24, 120))), shape=(120, 24))
    cfg = IndexingConfig(max_leaf_size=4, orphan_fallback="none")
    full, report = build_index(cfg, Y, X_train_tfidf=X)
    tree, bare = build_index(cfg, Y, X_train_tfidf=X, quality=False)
    assert "quality" in report and "quality" not in bare and bare["level_sizes"] == report["level_sizes"]
    assert all((a != b).nnz == 0 for a, b in zip(full, tree))


@pytest.fixture(scope="module")
def xrlinear():
    from xtransformer.api import XRLinear

    texts, Y, _ = toy_xmc()
    return XRLinear.fit(texts["train"], Y["train"], label_ids=IDS), texts, Y


def test_xrlinear_from_tree_model_predicts_as_the_model_it_came_from(xrlinear) -> None:
    from xtransformer.api import XRLinear

    model, texts, _ = xrlinear
    names = [f"label {i}" for i in range(12)]
    again = XRLinear.from_tree_model(model.model, model.tfidf, IDS, names)
    assert again.label_ids == IDS and again.label_names == names
    assert again.predict_settings == model.predict_settings
    a, b = model.predict_csr(texts["dev"]), again.predict_csr(texts["dev"])
    assert a.nnz > 0 and (a != b).nnz == 0
    assert XRLinear.from_tree_model(model.model, model.tfidf, IDS).label_names == IDS
    with pytest.raises(ModelError, match="11 label ids for a tree model of 12 labels"):
        XRLinear.from_tree_model(model.model, model.tfidf, IDS[:11])


def test_added_labels_solver_trains_the_added_labels_inside_its_block(xrlinear) -> None:
    from xtransformer.api import XRLinear, added_labels_solver, train_one_vs_all

    model, texts, Y = xrlinear
    reduced = XRLinear.fit(texts["train"], Y["train"][:, :11], label_ids=IDS[:11])
    calls = []

    def solve(X, Y_new, cfg):
        calls.append(Y_new.shape[1])
        level, info = train_one_vs_all(X, Y_new, cfg)
        return level, info | {"by": "the study's solver"}

    with added_labels_solver(solve):
        grown = reduced.add_labels(texts["train"], Y["train"], label_ids=IDS)
    assert calls == [1] and grown.training_run.report["added_labels"]["training"]["by"] == "the study's solver"
    plain = reduced.add_labels(texts["train"], Y["train"], label_ids=IDS)  # outside the block: the default
    assert calls == [1] and "by" not in plain.training_run.report["added_labels"]["training"]
    a, b = grown.predict_csr(texts["dev"]), plain.predict_csr(texts["dev"])
    assert (a != b).nnz == 0  # the same weights: the study's solver was the default one


@pytest.mark.slow
def test_xrtransformer_with_final_model_keeps_its_encoder_and_takes_the_labels(tmp_path) -> None:
    from run_helpers import TINY

    from xtransformer.api import StageCache, TrainContext, XRTransformer, compose_settings

    texts, Y, _ = toy_xmc()
    over = [o for o in TINY if not o.startswith("data.")] + ["indexing.n_clusters=4", "logger=none"]
    s = compose_settings("method=xrtransformer", *over, "matcher.level_steps=[4,4]").methods["xrtransformer"]
    with TrainContext(cache=StageCache(tmp_path / "cache")) as ctx:
        model = XRTransformer.fit(texts["train"], Y["train"], s, label_ids=IDS, context=ctx)
    names = [f"label {i}" for i in range(12)]
    again = model.with_final_model(model.final, IDS, names)
    assert again.label_names == names and again.chain is None and again.device == model.device
    assert again.matcher is model.matcher and again.predict_settings == model.predict_settings
    a, b = model.predict_csr(texts["dev"]), again.predict_csr(texts["dev"])
    assert a.nnz > 0 and np.allclose(a.toarray(), b.toarray())
    with pytest.raises(ModelError, match="11 label ids and 11 names for a final model of 12 labels"):
        model.with_final_model(model.final, IDS[:11], names[:11])


def test_scripts_import_only_the_public_names_and_never_edit_sys_path() -> None:
    """benchmarks/, experiments/ and examples/ reach the package through ``xtransformer`` and
    ``xtransformer.api`` alone, as a user's script would."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    scripts = [p for folder in ("benchmarks", "experiments", "examples") for p in (root / folder).rglob("*.py")]
    # the repository's own scripts, not the peers' environments (.venvs) nor the harness's work folder
    ours = [p for p in scripts if not any(part.startswith(".") or part == "work" for part in p.relative_to(root).parts)]
    for path in sorted(ours):
        text = path.read_text(encoding="utf-8")
        if "sys.path" in text:
            found.append(f"{path.relative_to(root)}: sys.path")
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [
                f"{path.relative_to(root)}:{node.lineno} {n}"
                for n in names
                if n.startswith("xtransformer.") and n != "xtransformer.api"
            ]
    assert not found, found


def test_push_folder_hands_the_staged_folder_and_its_options_to_the_one_upload(tmp_path, monkeypatch) -> None:
    from model_helpers import save_toy_xrlinear

    from xtransformer.model import hub

    folder, _ = save_toy_xrlinear(tmp_path / "xrlinear")
    seen = {}

    def upload(root, repo_id, options, message):
        seen.update(repo=repo_id, options=options, card=(root / "README.md").is_file(), model=(root / "manifest.json"))
        return "https://huggingface.co/owner/toy/commit/1"

    monkeypatch.setattr(hub, "upload", upload)
    options = api.PushOptions(private=True, license="mit")
    assert api.push_folder(folder, "owner/toy", options) == "https://huggingface.co/owner/toy/commit/1"
    assert seen["repo"] == "owner/toy" and seen["options"] is options and seen["card"]
    assert not seen["model"].exists()  # the staged copy is gone once the push is done; the folder stays
    assert (folder / "manifest.json").is_file() and not (folder / "README.md").exists()


def test_write_xmc_base_and_read_folder_give_back_the_files_own_splits(tmp_path) -> None:
    from xtransformer.api import DataConfig, read_folder, write_xmc_base

    texts, Y, _ = toy_xmc()
    rows = {s: sp.random(len(texts[s]), 5, density=0.4, format="csr", random_state=0) for s in ("train", "test")}
    folder = write_xmc_base(tmp_path / "set", {s: texts[s] for s in rows}, {s: Y[s] for s in rows}, IDS, rows)
    got = read_folder(folder, DataConfig(name="set", path=str(folder)))  # no dev carved: the files' own splits
    assert sorted(got.splits) == ["test", "train"] and got.label_text == IDS
    assert got.splits["train"].texts == texts["train"] and (Y["test"] != got.splits["test"].Y).nnz == 0
    assert got.docs == {"train": (folder / "X.trn.txt", 96), "test": (folder / "X.tst.txt", 32)}
    with_rows = read_folder(folder, DataConfig(name="set", path=str(folder)), given_tfidf=True)
    assert with_rows.splits["test"].X.shape == (32, 5)
