"""fp32 against bf16 autocast for MiniLM on this machine's processor: what ``trainer.precision=auto`` picks.

    python -m experiments.precision.bench_precision [--tag TAG]

A training step (forward, backward, fused AdamW) on 8 and on 32 documents of 128 tokens, and
encoding (inference) of 64 documents of 256 tokens in batches of 8, each at fp32 and under bf16
autocast: the best of 3 after a warm-up, on 2 threads, random token ids (the cost does not depend on
them). Prints the table with the processor's bf16 capabilities and the precision ``auto`` resolves
to, and writes ``<results>/precision-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse

from ..common import results_option, save_table, timed

PRECISIONS = ("32-true", "bf16-mixed")


def main(argv: list[str] | None = None) -> None:
    import torch

    from xtransformer.api import autocast_context, native_bf16, pretrained_encoder, resolve_model, resolve_precision

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="cpu")
    results_option(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    model = pretrained_encoder(resolve_model("minilm"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def batch(n: int, length: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1000, 20000, (n, length))
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

    def step(b: dict[str, torch.Tensor], precision: str) -> None:
        with autocast_context(precision, cpu):
            loss = model(**b).last_hidden_state.float().mean(1).square().sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    def encode(bs: list[dict[str, torch.Tensor]], precision: str) -> None:
        with torch.inference_mode(), autocast_context(precision, cpu):
            for b in bs:
                model(**b)

    rows = []
    encode_batches = [batch(8, 256) for _ in range(8)]
    for precision in PRECISIONS:
        row = {"precision": precision}
        for n in (8, 32):
            b = batch(n, 128)
            step(b, precision)  # warm-up
            row[f"step {n}x128 s"] = round(timed(lambda b=b, p=precision: step(b, p))[1], 3)
        encode(encode_batches[:1], precision)
        row["encode 256 tokens docs/s"] = round(64 / timed(lambda p=precision: encode(encode_batches, p))[1], 1)
        rows.append(row)
        print(row, flush=True)
    found = torch.cpu.get_capabilities()
    caps = {k: bool(v) for k, v in found.items() if k in ("avx2", "avx512_f", "avx512_bf16", "amx_bf16")}
    auto = resolve_precision("auto", "cpu")
    lines = [
        f"`python -m experiments.precision.bench_precision --tag {args.tag}` (2 threads; {found.get('cpu_name')}: "
        + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in caps.items())
        + f"; native bf16: {'yes' if native_bf16('cpu') else 'no'}, so `trainer.precision=auto` is {auto})",
        "",
        "| precision | train step, 8 x 128 tokens s | train step, 32 x 128 s | encode, 256 tokens docs/s |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['precision']} | {r['step 8x128 s']} | {r['step 32x128 s']} | {r['encode 256 tokens docs/s']} |"
        for r in rows
    ]
    save_table(
        args.results, f"precision-{args.tag}", {"capabilities": caps, "auto": auto, "rows": rows}, "\n".join(lines)
    )


if __name__ == "__main__":
    main()
