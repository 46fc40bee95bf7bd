"""The files a GPU machine without network needs to run the neural rows of ``python -m benchmarks.run``.

Such a machine here took at most 64 MiB of files per command, had Python 3.12, PyTorch, Lightning,
transformers 5 and scikit-learn, and none of Hydra, OmegaConf, libpecos or PECOS's transformers 4.46.
This writes them into one folder (default ``.gpu/``, git-ignored), each xz-compressed:

- ``data.tar.xz``: the dataset's files (EURLEX57K: 185 MB of text in about 15 MB);
- ``enc.tar.xz``: the experiment's encoder in fp16, with the embedding rows of tokens that no text of
  the dataset reaches zeroed (``common.compact_encoder``; loaded back as fp32 by both libraries);
- ``pecos_site.tar.xz``: libpecos 1.2.8, transformers 4.46.3, tokenizers 0.20.3 and
  huggingface_hub 0.36.2 for the machine's Python, with two edits that let libpecos run on NumPy 2
  and SciPy >= 1.14 (``np.array(copy=False)`` -> ``copy=None``; scipy indexed with a NumPy array, not
  a torch tensor) and a ``sitecustomize`` that restores ``scipy.sparse.sputils``' old names. On this
  host both environments gave PECOS identical Reuters-21578 scores;
- ``whl/``: Hydra, OmegaConf and ANTLR wheels at this environment's versions;
- ``cpp.tar.xz``: the compiled loops' C++ sources (built there with the machine's compiler);
- ``job.sh`` / ``run.sh``: the job (setup, then the harness for ours, then for PECOS) and its driver.

    python -m experiments.gpu_peers.prepare                  # here, once (a few minutes)
    bash .gpu/run.sh start 540                               # there, with .gpu carried: start, wait, collect
    bash .gpu/run.sh wait 240                                # there again, while the machine is still held

``run.sh`` starts the job detached, so that it outlives one command's time limit while the machine is
held, and copies the harness's result tables and logs to ``$OUT``.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from ..common import ROOT, compact_encoder, compose_settings

HERE = Path(__file__).resolve().parent
LIMIT_MIB = 64  # what the machine took per command, the checkout included
PART_MIB = 56  # an encoder too large for one command travels in parts of this size, one a command
PECOS = ("libpecos==1.2.8", "transformers==4.46.3", "tokenizers==0.20.3", "huggingface_hub==0.36.2")
# what the machine's image lacked for ours: wheels from the registry, and ANTLR's (an sdist only) built here
WHEELS = ("hydra-core", "omegaconf")
BUILT = "antlr4-python3-runtime"
KERNELS = ("ranker/kernels", "indexing/kmeans_level", "indexing/sparse_sums")
WORDS = 400  # texts cut to 400 words before tokenizing: at least 512 tokens, beyond any encoder's reach here
# libpecos 1.2.8 on NumPy 2 / newer SciPy: (file, old, new, how many times old occurs there)
PECOS_EDITS = (
    ("pecos/utils/smat_util.py", "copy=copy, dtype=", "copy=(copy or None), dtype=", 3),
    (
        "pecos/xmc/xtransformer/matcher.py",
        'csr_codes_next[inputs["instance_number"].cpu()]',
        'csr_codes_next[inputs["instance_number"].cpu().numpy()]',
        1,
    ),
)
SCIPY_ALIASES = """# libpecos 1.2.8 on SciPy >= 1.14: scipy.sparse.sputils (a deprecated alias) lost these names
import scipy.sparse._sputils as _new
import scipy.sparse.sputils as _old

for _name in ("get_index_dtype", "upcast", "isshape", "isintlike", "check_shape"):
    if hasattr(_new, _name):
        setattr(_old, _name, getattr(_new, _name))
"""


def xz_tar(folder: Path, out: Path, arcname: str | None = None) -> None:
    """``folder``'s files as ``out`` (tar, xz -9e); ``arcname`` None: the files at the archive's top."""
    with tarfile.open(out, "w:xz", preset=9 | 0x80000000) as tar:  # 0x80000000: lzma.PRESET_EXTREME
        if arcname is None:
            for f in sorted(folder.iterdir()):
                tar.add(f, arcname=f.name)
        else:
            tar.add(folder, arcname=arcname)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"], check=True)


def pecos_site(out: Path, python: str, tmp: Path) -> None:
    site = tmp / "pxt"
    platforms = [f"--platform={p}" for p in ("manylinux_2_17_x86_64", "manylinux2014_x86_64")]
    pip("install", "--no-deps", "--no-compile", "--only-binary=:all:", f"--python-version={python}",
        "--implementation=cp", *platforms, "--target", str(site), *PECOS)  # fmt: skip
    for name, old, new, count in PECOS_EDITS:
        path = site / name
        text = path.read_text()
        if text.count(old) != count:
            sys.exit(f"prepare: {name}: expected '{old}' {count} time(s), found {text.count(old)} (another libpecos?)")
        path.write_text(text.replace(old, new))
    (site / "sitecustomize.py").write_text(SCIPY_ALIASES)
    xz_tar(site, out / "pecos_site.tar.xz", arcname="pxt")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="eurlex57k_xr_ensemble", help="its dataset and encoder are shipped")
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (libpecos and tokenizers wheels)")
    ap.add_argument("--reuse", action="store_true", help="keep data.tar.xz and enc.tar.xz already in --out")
    ap.add_argument(
        "--override", action="append", default=[], help="a setting over the experiment's, e.g. matcher=mpnet"
    )
    args = ap.parse_args()

    from xtransformer.api import resolve_dataset_dir, resolve_model

    s = compose_settings(args.override, args.experiment)
    data = resolve_dataset_dir(s.data)
    shutil.rmtree(args.out / "whl", ignore_errors=True)
    (args.out / "whl").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if not (args.reuse and (args.out / "data.tar.xz").is_file()):
            print(f"prepare: the dataset's files from {data} (xz -9e: minutes)", flush=True)
            xz_tar(data, args.out / "data.tar.xz")
        if not (args.reuse and (args.out / "enc.tar.xz").is_file()):
            texts = [p for p in sorted(data.glob("*.txt")) if p.name.endswith(("_texts.txt", "label_text.txt"))]
            src = Path(resolve_model(s.main.matcher.model_name_or_path))
            used, vocab = compact_encoder(src, tmp / "enc", _batches(texts))
            print(f"prepare: encoder in fp16, {used} of {vocab} tokens used", flush=True)
            xz_tar(tmp / "enc", args.out / "enc.tar.xz", arcname="enc")
        print(f"prepare: PECOS's site for Python {args.python}, the wheels, the kernels' sources", flush=True)
        pecos_site(args.out, args.python, tmp)
        pip("download", "--no-deps", "-d", str(args.out / "whl"), *(f"{n}=={md.version(n)}" for n in WHEELS))
        pip("wheel", "--no-deps", "-w", str(args.out / "whl"), f"{BUILT}=={md.version(BUILT)}")
        cpp = tmp / "cpp"
        for name in KERNELS:
            (cpp / name).parent.mkdir(parents=True, exist_ok=True)
            src = ROOT / "src" / "xtransformer" / f"{name}.pyx"
            subprocess.run(["cython", "-3", "--cplus", str(src), "-o", str(cpp / f"{name}.cpp")], check=True)
        xz_tar(cpp, args.out / "cpp.tar.xz")
    for script in ("job.sh", "run.sh"):
        shutil.copy(HERE / script, args.out / script)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    checkout = sum((ROOT / f.decode()).stat().st_size for f in tracked if f and (ROOT / f.decode()).is_file()) / 2**20
    parts = split_encoder(args.out, LIMIT_MIB - checkout)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file()) / 2**20
    verdict = "fits" if size + checkout < LIMIT_MIB else "does NOT fit"
    print(f"prepare: {args.out} {size:.1f} MiB + checkout {checkout:.1f} MiB {verdict} in {LIMIT_MIB} MiB")
    first = args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out
    if parts:  # the payload first (it holds run.sh), then a part a command
        print(f"prepare: on the machine, one command each: carry {first}, run `bash {first}/run.sh put`; then")
    for i, part in enumerate(parts, start=1):
        where = part.relative_to(ROOT) if part.is_relative_to(ROOT) else part
        print(f"prepare:   ({i}/{len(parts)}) carry {where}, run the same; then `bash {first}/run.sh start ...`")


def split_encoder(out: Path, room_mib: float) -> list[Path]:
    """Where ``out`` with its encoder exceeds ``room_mib``, the encoder archive cut into parts of
    ``PART_MIB`` in the sibling folder ``<out>-enc/`` (one command carries each; ``run.sh put`` keeps
    them on the machine, ``job.sh`` joins them); the parts' paths, none where it fits."""
    parts_dir = out.with_name(out.name + "-enc")
    shutil.rmtree(parts_dir, ignore_errors=True)
    enc = out / "enc.tar.xz"
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 2**20
    if size < room_mib:
        return []
    parts_dir.mkdir()
    blob, step = enc.read_bytes(), min(PART_MIB, int(room_mib) - 1) * 2**20  # a part and the checkout fit
    parts = []
    for i in range(0, len(blob), step):
        parts.append(parts_dir / f"part{i // step:02d}")
        parts[-1].write_bytes(blob[i : i + step])
    enc.unlink()
    return parts


def _batches(files: list[Path], size: int = 2000):
    """The lines of ``files`` (a text, or a label's id and names, a line) cut to ``WORDS`` words."""
    for path in files:
        batch: list[str] = []
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                batch.append(" ".join(line.split()[:WORDS]))
                if len(batch) == size:
                    yield batch
                    batch = []
        if batch:
            yield batch


if __name__ == "__main__":
    main()
