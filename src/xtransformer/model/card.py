"""The model card (``README.md``) of a model on the Hugging Face Hub.

YAML front matter the Hub reads (library, tags, task, license when known), then what the model
is, its label count, the data it was trained on, its training settings (``train_settings.json``),
the metrics its training run recorded (``metrics.json``, when it came from a run) and how to load
it. The card is read from the folder as it will be uploaded, and no machine-local path reaches it:
the records are scrubbed as a folder's are (``folder.scrub``) and any value that is a local path
is replaced by ``<local path>``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from xtransformer.model.folder import INDEX, LABELS, MANIFEST, TRAIN_SETTINGS, load_record, scrub

CARD = "README.md"
TAGS = ("extreme-multi-label-classification", "xmc")
# the ranking metrics a card reports, in this order, where the run recorded them
RESULT_KEYS = ("P@1", "P@3", "P@5", "nDCG@3", "nDCG@5", "R@5", "PSP@5")
LOCAL_PATH = "<local path>"
# absolute, home-relative, ./ or ../ relative, Windows drive or UNC: a path of the machine that trained it
_LOCAL = re.compile(r"^(~|/|\.{1,2}[\\/]|[A-Za-z]:[\\/]|\\\\)")


def portable(obj: Any) -> Any:
    """A record for a card: scrubbed of machine-local keys, and every path-like value masked."""
    obj = scrub(obj)
    if isinstance(obj, dict):
        return {k: portable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [portable(v) for v in obj]
    if isinstance(obj, str) and _LOCAL.match(obj):
        return LOCAL_PATH
    return obj


def model_card(root: Path, address: str, license: str | None = None, run: dict[str, Any] | None = None) -> str:
    """The card of the repository whose files are ``root`` (a method folder, or a run's ``model/``
    folder with ``models.json``); ``address``: ``owner/name[@revision]``; ``run``: the training
    run's ``metrics.json``, or None."""
    index = load_record(root, INDEX) if (root / INDEX).is_file() else None
    main = root / index["main"] if index else root
    methods = list(index["methods"]) if index else []
    manifests = [load_record(root / m, MANIFEST) for m in methods] if index else [load_record(root, MANIFEST)]
    kinds = sorted({m["components"]["kind"] for m in manifests})
    manifest = load_record(main, MANIFEST)
    train = portable(load_record(main, TRAIN_SETTINGS))
    parts = [
        _front_matter(kinds, license),
        f"# {address.split('@')[0]}\n",
        _summary(manifest, len(load_record(main, LABELS)["ids"]), train, methods),
        _results(run, methods or [manifest["method"]]),
        _settings(train),
        _usage(address, manifest["method"], methods),
    ]
    return "\n".join(p for p in parts if p)


def _front_matter(kinds: list[str], license: str | None) -> str:
    lines = ["---", "library_name: xtransformer"]
    if license:
        lines.append(f"license: {json.dumps(license)}")
    lines += ["pipeline_tag: text-classification", "tags:", *(f"- {json.dumps(t)}" for t in (*TAGS, *kinds)), "---"]
    return "\n".join(lines) + "\n"


def _summary(manifest: dict[str, Any], n_labels: int, train: dict[str, Any], methods: list[str]) -> str:
    method = manifest["method"]
    lines = [
        f"An extreme multi-label text classification model ({method}) written by xtransformer "
        f"{manifest.get('library_version', '')} (model folder format {manifest.get('format_version')}).",
        "",
        f"- **Method:** `{method}`" + (f" ({kind})" if (kind := manifest["components"]["kind"]) != method else ""),
        f"- **Labels:** {n_labels:,}",
        f"- **Training data:** {_data_line(train)}",
    ]
    if methods:
        others = ", ".join(f"`{m}`" for m in methods)
        lines.append(f"- **Models in this repository:** {others} (a run's `model/` folder; `{method}` loads first)")
    return "\n".join(lines) + "\n"


def _data_line(train: dict[str, Any]) -> str:
    if "dataset" not in train:
        return "not recorded in the model folder (a model fitted through the Python API keeps its settings only)"
    return f"`{train['dataset']}`" + (" (its `data` settings below)" if "data" in train else "")


def _results(run: dict[str, Any] | None, methods: list[str]) -> str:
    """A table of the run's metrics for the models in the repository, when the run recorded them."""
    results = (run or {}).get("results") or {}
    rows = {m: results[m] for m in methods if isinstance(results.get(m), dict)}
    keys = [k for k in RESULT_KEYS if any(k in r for r in rows.values())]
    if not keys:
        return ""
    split, dataset = run.get("eval_split", "evaluation"), run.get("dataset", "the training data")
    lines = [
        "## Results",
        "",
        f"On the `{split}` split of `{dataset}`, as the training run measured them (its `metrics.json`):",
        "",
        "| model | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for m, r in rows.items():
        lines.append(f"| `{m}` | " + " | ".join(_number(r.get(k)) for k in keys) + " |")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _settings(train: dict[str, Any]) -> str:
    shown = {k: v for k, v in train.items() if k != "stages"}  # stage cache keys: meaningless elsewhere
    if not shown:
        return ""
    text = json.dumps(shown, indent=2, sort_keys=True)
    return f"## Training settings\n\nFrom the folder's `{TRAIN_SETTINGS}`:\n\n```json\n{text}\n```\n"


def _usage(address: str, method: str, methods: list[str]) -> str:
    lines = [
        "## Usage",
        "",
        "```bash",
        "pip install xtransformer",
        "```",
        "",
        "```python",
        "from xtransformer import XMCModel",
        "",
        f'model = XMCModel.load("hf://{address}")  # downloaded once into the Hugging Face cache, sha256-checked',
        'model.predict(["text of a document"], k=5)  # [{"labels": [...], "names": [...], "scores": [...]}]',
    ]
    other = next((m for m in methods if m != method), None)
    if other is not None:
        lines.append(f'other = XMCModel.load("hf://{address}/{other}")  # another model of the run')
    lines += [
        "```",
        "",
        "```bash",
        f"xmc-predict --model hf://{address} --input texts.txt   # one document a line",
        f"xmc-serve --model hf://{address}",
        "```",
        "",
        "Offline (`HF_HUB_OFFLINE=1`) a model already in the cache loads as it is.",
    ]
    return "\n".join(lines) + "\n"
