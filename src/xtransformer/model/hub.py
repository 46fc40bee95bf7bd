"""Model folders on the Hugging Face Hub: ``hf://owner/name[@revision][/subfolder]`` and pushes.

A repository holds a model folder as it is on disk: one method folder at its root, or a run's
``model/`` folder (``models.json`` and a folder per method), so that a combination's members
(``../xrlinear``) come with it; the Hub adds ``.gitattributes`` and the card, ``README.md``.

Loading (:func:`local_folder`, called by ``XMCModel.load``) downloads the repository's snapshot
with ``huggingface_hub.snapshot_download`` into the Hub's cache (``HF_HUB_CACHE`` / ``HF_HOME``)
and hands its folder to the same checks as any local folder (``folder.read_manifest``: the sha256
of every file). Offline (``HF_HUB_OFFLINE=1``, or no network) a cached snapshot loads; a missing
one is one line saying how to get it.

Pushing (:func:`push_folder`, ``XMCModel.push_to_hub``, ``python -m xtransformer push``) stages the
files (hard links where it can), verifies them, writes the card (``card.py``) and makes one commit
with :func:`upload`, the one call that reaches the Hub; everything before it needs no network.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from xtransformer.model.card import CARD, model_card
from xtransformer.model.folder import (
    HUB_ROOT_FILES,
    INDEX,
    MANIFEST,
    ModelError,
    index_folder,
    load_record,
    read_manifest,
)
from xtransformer.utils.io import save_json

SCHEME = "hf://"
METRICS = "metrics.json"  # in a run folder, beside model/ (pipeline/run.py)
ADDRESS = "hf://owner/name[@revision][/subfolder]"


class HubError(ModelError):
    """The Hub cannot give or take a model; the message says why and what to do, in one line."""


# ---------------------------------------------------------------------------------------------- load
def local_folder(path: str | os.PathLike) -> Path:
    """``path`` as a local folder: itself, or for ``hf://...`` the folder of its snapshot in the
    Hugging Face cache (downloaded when it is not there)."""
    text = os.fspath(path)
    if not (isinstance(text, str) and text.startswith(SCHEME)):
        return Path(path)
    uri = parse(text)
    root = snapshot(uri, text)
    if not uri.path_in_repo:
        return root
    sub = root / uri.path_in_repo
    if not sub.is_dir():
        raise HubError(f"{text}: no folder {uri.path_in_repo!r} in the repository (snapshot {root.name[:12]})")
    return sub


def parse(address: str) -> Any:
    """``hf://[models/]owner/name[@revision][/subfolder]`` as huggingface_hub parses Hub URIs."""
    from huggingface_hub import parse_hf_uri
    from huggingface_hub.errors import HfUriError

    try:
        uri = parse_hf_uri(address)
    except HfUriError as e:
        raise HubError(f"{address}: not a Hub model address ({e.msg.strip()}); write {ADDRESS}") from None
    if uri.is_bucket or ".." in PurePosixPath(uri.path_in_repo).parts:
        raise HubError(f"{address}: not a Hub model address (a repository and a folder inside it); write {ADDRESS}")
    return uri


def snapshot(uri: Any, address: str) -> Path:
    """The local folder of the repository's snapshot at ``uri.revision``, downloaded when needed;
    every way the Hub can fail as one line (:class:`HubError`)."""
    import httpx2
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from xtransformer import __version__

    try:
        folder = snapshot_download(
            uri.id, repo_type=uri.type, revision=uri.revision, library_name="xtransformer", library_version=__version__
        )
    except LocalEntryNotFoundError as e:
        raise HubError(_unreachable(uri, address, e)) from None
    except GatedRepoError:
        raise HubError(f"{address}: a gated repository; accept its conditions on the Hub and log in") from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{address}: no such repository on the Hub, or a private one this machine's token cannot read "
            "(hf auth login, or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"{address}: the repository has no revision {uri.revision!r}") from None
    except (OSError, ValueError, httpx2.HTTPError) as e:
        raise HubError(f"{address}: the Hub did not give it ({_first_line(e)})") from None
    return Path(folder)


def _unreachable(uri: Any, address: str, error: Exception) -> str:
    """A snapshot the cache lacks (or holds only in part) while the Hub cannot be reached."""
    from huggingface_hub import constants, is_offline_mode
    from huggingface_hub.errors import IncompleteSnapshotError

    why = "HF_HUB_OFFLINE=1" if is_offline_mode() else "no network"
    what = "only part of it is in" if isinstance(error, IncompleteSnapshotError) else "not in"
    revision = f" --revision {uri.revision}" if uri.revision else ""
    return (
        f"{address}: {what} the Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub cannot be reached "
        f"({why}); run `hf download {uri.id}{revision}` on a machine with network and copy its cache here "
        "(HF_HUB_CACHE), or point --model at a local model folder"
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


# ---------------------------------------------------------------------------------------------- push
@dataclass(frozen=True)
class PushOptions:
    """How a push commits: ``private`` (a repository created by the push; None: the Hub's default),
    the branch (``revision``, created when missing; None: main), the commit message (None: one naming
    the model), the token (None: ``HF_TOKEN`` or ``hf auth login``'s) and the card's license."""

    private: bool | None = None
    revision: str | None = None
    commit_message: str | None = None
    token: str | None = None
    license: str | None = None


@dataclass(frozen=True)
class Staged:
    """What a push uploads: ``root`` holds the card and the model's files (``files``, sorted); ``main``
    is the model ``XMCModel.load`` reads first."""

    root: Path
    main: str
    files: list[str]

    @property
    def card(self) -> str:
        return (self.root / CARD).read_text(encoding="utf-8")


def push_model(model: Any, repo_id: str, options: PushOptions) -> str:
    """``XMCModel.push_to_hub``: the model's own folder when it is what that folder holds, else the
    model saved whole (a combination's members inside its folder) to a temporary one."""
    if model.folder is not None and (Path(model.folder) / MANIFEST).is_file():
        return push_folder(model.folder, repo_id, options)
    with tempfile.TemporaryDirectory(prefix="xmc-push-") as tmp:
        return push_folder(_detached(model).save(Path(tmp) / model.method), repo_id, options)


def _detached(model: Any) -> Any:
    """A copy of ``model`` without a folder (``derived``), its members too: saved, it holds them all."""
    out = model.derived()
    if getattr(out, "members", None) is not None:
        out.members = [_detached(m) for m in out.members]
    return out


def push_folder(folder: str | os.PathLike, repo_id: str, options: PushOptions | None = None) -> str:
    """Upload ``folder`` (a method folder, a run's ``model/`` folder or a run folder) to the Hub
    repository ``repo_id`` (``owner/name``, created when missing) as one commit with a generated card,
    removing what an earlier push left that this one does not hold; returns the commit's URL."""
    options = options or PushOptions()
    with staged(folder, repo_id, options) as stage:
        message = options.commit_message or f"{stage.main} model ({len(stage.files)} files), pushed by xtransformer"
        return upload(stage.root, repo_id, options, message)


def upload(root: Path, repo_id: str, options: PushOptions, message: str) -> str:
    """The one call that reaches the Hub: the repository (and branch) made when missing, then
    ``root`` committed as the repository's whole content; its failures as one line."""
    import httpx2
    from huggingface_hub import HfApi, is_offline_mode

    from xtransformer import __version__

    if is_offline_mode():
        raise HubError(f"{repo_id}: pushing needs the Hub, and HF_HUB_OFFLINE=1 is set")
    api = HfApi(token=options.token, library_name="xtransformer", library_version=__version__)
    try:
        api.create_repo(repo_id, private=options.private, exist_ok=True)
        if options.revision and not options.revision.startswith("refs/"):
            api.create_branch(repo_id, branch=options.revision, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=root, revision=options.revision, commit_message=message, delete_patterns="*"
        )
    except (OSError, ValueError, httpx2.HTTPError) as e:  # HfHubHTTPError and a missing token are OSErrors
        status = getattr(getattr(e, "response", None), "status_code", None)
        login = "; log in with hf auth login or set HF_TOKEN (a token that can write)" if status in (401, 403) else ""
        raise HubError(f"{repo_id}: the push failed ({_first_line(e)}){login}") from None
    return str(info.commit_url)


@contextlib.contextmanager
def staged(folder: str | os.PathLike, repo_id: str, options: PushOptions) -> Iterator[Staged]:
    """The files a push of ``folder`` uploads, in a temporary folder: the model's folders (a run's
    ``models.json`` written for them), checked as a load checks them, then the card."""
    address = _repo_address(repo_id) + (f"@{options.revision}" if options.revision else "")
    source, index = _layout(Path(folder))
    with tempfile.TemporaryDirectory(prefix="xmc-stage-") as tmp:
        root = Path(tmp) / "repo"
        if index is None:
            _place(source, root)
            read_manifest(root, verify=True)
        else:
            root.mkdir()
            for name in _needed(source, index["methods"]):
                _place(source / name, root / name)
            save_json(index, root / INDEX)
            for name in index["methods"]:
                read_manifest(root / name, verify=True)
        card = model_card(root, address, options.license, _run_metrics(source))
        (root / CARD).write_text(card, encoding="utf-8")
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        yield Staged(root, index["main"] if index else load_record(root, MANIFEST)["method"], files)


def _repo_address(repo_id: str) -> str:
    """``repo_id`` checked as a Hub repository's ``owner/name`` before any work."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise HubError(f"repository {repo_id!r}: a Hub model repository is owner/name")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise HubError(f"repository {repo_id!r}: {_first_line(e)}") from None
    return repo_id


def _layout(folder: Path) -> tuple[Path, dict[str, Any] | None]:
    """Where the files come from, and the ``models.json`` the repository gets (None: the method
    folder is the repository's root). A combination whose members are its siblings
    (``../xrlinear``) goes up as a run's ``model/`` folder of itself and its members."""
    models = index_folder(folder)
    if models is not None:
        index = load_record(models, INDEX)
        if not isinstance(index, dict) or index.get("main") not in index.get("methods", []):
            raise HubError(f"{models / INDEX}: corrupt (its main model is not among its methods)")
        return models, index
    if not (folder / MANIFEST).is_file():
        raise HubError(f"{folder}: not a model folder (no {MANIFEST}), a run's model/ folder or a run folder")
    components = read_manifest(folder, verify=False)["components"]
    inside = folder.resolve()
    members = [(folder / rel).resolve() for rel in components.get("members", [])]
    if all(m.is_relative_to(inside) for m in members):
        return folder, None
    names = _needed(folder.parent, [folder.name])
    return folder.parent, {"main": folder.name, "methods": [n for n in names if n != folder.name] + [folder.name]}


def _needed(source: Path, names: list[str]) -> list[str]:
    """The folders of ``source`` that the models ``names`` need: each, and those its members are in."""
    out: list[str] = []
    todo, top = list(names), source.resolve()
    while todo:
        name = todo.pop(0)
        first = PurePosixPath(name).parts[0]
        if first in out:
            continue
        out.append(first)
        components = read_manifest(source / name, verify=False)["components"]
        for rel in components.get("members", []):
            todo.append((source / name / rel).resolve().relative_to(top).as_posix())
    return out


def _place(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst`` as hard links where the file system allows (no second copy of the
    weights), the Hub's own files at the root of a downloaded snapshot left out."""
    ignore = lambda where, names: [n for n in names if n in HUB_ROOT_FILES] if Path(where) == src else []
    shutil.copytree(src, dst, copy_function=_link_or_copy, ignore=ignore)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)  # follows a symlink (a Hub cache snapshot's) to the file itself
    except OSError:
        shutil.copy2(src, dst)


def _run_metrics(source: Path) -> dict[str, Any] | None:
    """The ``metrics.json`` of the run whose ``model/`` folder is ``source`` or holds it, if any."""
    models = source if (source / INDEX).is_file() else source.parent
    path = models.parent / METRICS
    if not (models / INDEX).is_file() or not path.is_file():
        return None
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # a card without results rather than no push
    return run if isinstance(run, dict) else None


# ---------------------------------------------------------------------------------------------- command line
PUSH_HELP = (
    "Upload a model folder (or a run's model/ folder: every method and models.json) to a Hugging Face Hub "
    "repository, with a generated model card; the token is HF_TOKEN's or hf auth login's. "
    "XMCModel.load('hf://owner/name') and --model hf://owner/name read it back."
)


def push_parser() -> argparse.ArgumentParser:
    """``python -m xtransformer push``'s options."""
    p = argparse.ArgumentParser(prog="python -m xtransformer push", description=PUSH_HELP)
    p.add_argument("--model", required=True, help="a method folder, a run's model/ folder or a run folder")
    p.add_argument("--repo", required=True, help="the repository, owner/name (created when missing)")
    p.add_argument("--revision", default=None, help="the branch to push to (created when missing; default main)")
    p.add_argument("--private", action="store_const", const=True, default=None, help="create the repository private")
    p.add_argument("--license", default=None, help="the model's license on its card (a Hub license id: apache-2.0)")
    p.add_argument("--message", default=None, help="the commit message (default: one naming the model)")
    p.add_argument("--dry-run", action="store_true", help="print the files and the card a push would upload, only")
    return p


def push_command(args: argparse.Namespace) -> int:
    options = PushOptions(args.private, args.revision, args.message, None, args.license)
    if args.dry_run:
        with staged(args.model, args.repo, options) as stage:
            print("\n".join(stage.files) + "\n\n" + stage.card)
        return 0
    url = push_folder(args.model, args.repo, options)
    print(f"xmc push: {args.model} -> {url}", file=sys.stderr)
    return 0
