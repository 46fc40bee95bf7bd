"""The seed papers' recipes (``configs/experiment/{xt,xrt,xrlinear}_<set>.yaml``) and their ensemble
sweeps (``sweeps/{xt,xrt}_<set>.yaml``) compose into valid settings, name published rows of their
own set, and give XR-Transformer one step count per fine-tuned level of the published label counts.
They read the data entries ``data=<set>`` (``configs/data/<set>.yaml``)."""

from __future__ import annotations

import itertools

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from run_helpers import CONFIGS, ROOT

from xtransformer.configuration import compose
from xtransformer.indexing import ClusterChain
from xtransformer.indexing.kmeans import resolve_n_clusters
from xtransformer.pipeline.settings import run_settings
from xtransformer.suite.published import published_rows

METHODS = {"xt": "xtransformer", "xrt": "xrtransformer", "xrlinear": "xrlinear"}
SETS = ("eurlex-4k", "wiki10-31k", "amazoncat-13k", "wiki-500k", "amazon-670k", "amazon-3m")
RECIPES = sorted(
    p.stem
    for p in (CONFIGS / "experiment").glob("*.yaml")
    if p.stem.split("_")[0] in METHODS and "_shared" not in p.stem
)
SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml") if p.stem.split("_")[0] in ("xt", "xrt"))


def _dataset(name: str) -> str:
    return next(s for s in SETS if name.split("_", 1)[1].startswith(s))


def test_every_set_has_a_recipe_of_each_method_it_was_published_with():
    for dataset in SETS:
        assert {f"xrt_{dataset}", f"xrlinear_{dataset}"} <= set(RECIPES), dataset
    assert {f"xt_{s}" for s in SETS[:4]} <= set(RECIPES)  # X-Transformer's paper covers the first four


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_composes_into_valid_settings(name):
    s = run_settings(compose(["paths.output_dir=/tmp/x", f"experiment={name}"]))
    dataset = _dataset(name)
    assert s.method == METHODS[name.split("_")[0]] and list(s.methods) == [s.method]  # the method alone
    assert s.data.name == dataset
    assert all(published_rows()[r].dataset == dataset for r in s.published), s.published
    if s.method != "xrlinear":
        assert s.trainer.precision == "32-true"  # both papers train in float32


# the published label counts (X-Transformer's Table 2) fix the trees, so each level's steps can be checked
@pytest.mark.parametrize("dataset", SETS[:4])
def test_xr_transformer_steps_one_entry_per_fine_tuned_level(dataset):
    labels = {s: r["labels"] for s, r in _statistics().items()}[dataset]
    for name in (r for r in RECIPES if r.startswith(f"xrt_{dataset}")):
        m = run_settings(compose(["paths.output_dir=/tmp/x", f"experiment={name}"])).main
        k = resolve_n_clusters(labels, m.indexing.n_clusters, m.indexing.max_leaf_size)
        sizes = [2**d for d in range(k.bit_length())] + [labels]  # the binary tree's levels, then the labels
        kept = [sizes[i] for i in ClusterChain.subsampled_levels(sizes, m.xrtransformer.nr_splits)[1:]]
        tuned = [n for n in kept if n <= m.xrtransformer.max_match_clusters]
        assert len(m.matcher.level_schedule(len(tuned))) == len(tuned), (name, tuned)


def _statistics() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "src" / "xtransformer" / "suite" / "published.yaml").read_text())["statistics"]


def _members(sweep: str) -> list[list[str]]:
    """Every job of a sweep file: the product of its sweeper's comma lists."""
    params = OmegaConf.load(ROOT / "sweeps" / f"{sweep}.yaml").hydra.sweeper.params
    choices = [[f"{k}={v}" for v in str(values).split(",")] for k, values in params.items()]
    return [list(job) for job in itertools.product(*choices)]


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_member_of_an_ensemble_sweep_composes(sweep):
    dataset = _dataset(sweep)
    search = f"hydra.searchpath=[file://{CONFIGS}]"
    for job in _members(sweep):
        cfg = compose([search, "paths.output_dir=/tmp/x", *job], config_name=sweep, config_dir=str(ROOT / "sweeps"))
        s = run_settings(cfg)
        assert s.data.name == dataset and all(published_rows()[r].dataset == dataset for r in s.published)
    callbacks = OmegaConf.load(ROOT / "sweeps" / f"{sweep}.yaml").hydra.callbacks
    for node in callbacks.values():
        if "_target_" in node:  # the ensemble's own callback: its method and published rows checked now
            assert all(published_rows()[r].dataset == dataset for r in instantiate(node).published)
    assert len(_members(sweep)) >= 3, "an ensemble of at least three runs"


def test_a_bad_published_row_fails_before_any_work():
    from xtransformer.errors import UserError

    with pytest.raises(UserError, match=r"^published=\['x-transformer/eurlex-4k/parbel'\]: no published row"):
        run_settings(compose(["paths.output_dir=/tmp/x", "published=[x-transformer/eurlex-4k/parbel]"]))


def test_recipes_cite_their_sources():
    """A recipe's header names the text its values come from: PECOS's params.json, the paper, PECOS's code."""
    source = {"xt": "xt_shared", "xrt": "params.json", "xrlinear": "pecos/xmc/base.py"}
    for name in RECIPES:
        text = (CONFIGS / "experiment" / f"{name}.yaml").read_text()
        header = text.split("defaults:")[0]
        assert source[name.split("_")[0]] in text and header.count("\n#") >= 2, name
    shared = (CONFIGS / "experiment" / "xt_shared.yaml").read_text()
    assert "Chang et al., KDD 2020" in shared and "run_transformer_train.sh" in shared


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_reads_a_tfidf_its_method_can_predict_with(recipe):
    """XR-Linear reads the set's own TF-IDF rows; a neural method predicts from texts alone and
    computes its rankers' TF-IDF from them (it refuses tfidf=given at start), so its recipes use ours."""
    s = run_settings(compose([f"experiment={recipe}", "paths.output_dir=/tmp/x"]))
    assert s.main.tfidf.source == ("given" if s.method == "xrlinear" else "text"), recipe
