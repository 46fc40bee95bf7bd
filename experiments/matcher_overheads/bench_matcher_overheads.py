"""Two costs around the encoder's own compute: tokenising long documents and the AdamW step.

    python -m experiments.matcher_overheads.bench_matcher_overheads [--docs 20000] [--tag eurlex57k]

Tokenisation of EURLEX57K training acts with MiniLM's tokenizer at 128 and 256 tokens: the whole
text, a cut at 16 characters a token (the rule before ``encoders/tokens.py``), and
``tokenize_texts`` (a cut at 8 checked by offsets, whole where needed), with a check that the ids
equal whole-text tokenisation (each the best of 3, after a warm-up call). Then one AdamW step over
MiniLM's parameters: per-tensor loop, foreach, fused (mean of 10 steps after one warm-up). Prints the table and writes
``<results>/matcher-overheads-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse

from ..common import results_option, save_table, timed


def main(argv: list[str] | None = None) -> None:
    import torch
    from transformers import AutoTokenizer

    from xtransformer.api import load_dataset, pretrained_encoder, resolve_model, tokenize_texts

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=20000, help="training acts tokenised")
    ap.add_argument("--tag", default="eurlex57k")
    results_option(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    path = resolve_model("minilm")
    tok = AutoTokenizer.from_pretrained(path)
    texts = load_dataset("eurlex57k").splits["train"].texts[: args.docs]
    tok(texts[:500], truncation=True, max_length=128)  # warm-up: the first call pays allocations
    rows = []
    for length in (128, 256):
        whole, dt_whole = timed(lambda n=length: tok(texts, truncation=True, max_length=n)["input_ids"])
        # the rule before: every text cut to 16 characters a token (as truncate_chars does it)
        cut16, dt_cut = timed(lambda n=length: tokenize_texts(tok, texts, n, truncate_chars=16 * n, progress=False))
        ours, dt_ours = timed(lambda n=length: tokenize_texts(tok, texts, n, progress=False))
        rows.append(
            {
                "what": f"tokenise {len(texts)} acts, {length} tokens",
                "whole text s": round(dt_whole, 2),
                "16 chars a token s": round(dt_cut, 2),
                "tokenize_texts s": round(dt_ours, 2),
                "16-char cut = whole": same_ids(cut16, whole),
                "tokenize_texts = whole": same_ids(ours, whole),
            }
        )
        print(rows[-1], flush=True)
    model = pretrained_encoder(path)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    steps = {}
    for name, kw in (("loop", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        opt = torch.optim.AdamW(params, lr=1e-4, **kw)
        opt.step()
        _, dt = timed(lambda o=opt: [o.step() for _ in range(10)], repeats=1)
        steps[name] = round(dt / 10 * 1000, 1)
    print({"AdamW step ms": steps}, flush=True)
    lines = [
        f"`python -m experiments.matcher_overheads.bench_matcher_overheads --docs {args.docs} --tag {args.tag}` "
        "(2 threads)",
        "",
        "| tokenisation | whole text s | 16 chars a token s | tokenize_texts s | ids equal whole text |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['what']} | {r['whole text s']} | {r['16 chars a token s']} | {r['tokenize_texts s']} | "
        f"16-char cut: {r['16-char cut = whole']}; tokenize_texts: {r['tokenize_texts = whole']} |"
        for r in rows
    ]
    lines += [
        "",
        f"| AdamW step over MiniLM ({sum(p.numel() for p in params) / 1e6:.1f}M parameters) | loop | foreach | fused |",
        "|---|---|---|---|",
        f"| ms | {steps['loop']} | {steps['foreach']} | {steps['fused']} |",
    ]
    save_table(
        args.results, f"matcher-overheads-{args.tag}", {"tokenise": rows, "adamw_step_ms": steps}, "\n".join(lines)
    )


def same_ids(tokens, ids: list[list[int]]) -> bool:
    """Whether ragged ``tokens`` hold exactly the rows ``ids``."""
    return all(tokens.ids[tokens.offsets[i] : tokens.offsets[i + 1]].tolist() == row for i, row in enumerate(ids))


if __name__ == "__main__":
    main()
