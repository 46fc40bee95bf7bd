"""What the encoder's dropout costs a fine-tuning step on this CPU (``matcher.dropout``).

    python -m experiments.dropout.bench_dropout [--tag TAG] [--steps 12]

MiniLM in training mode, one step (forward, backward, fused AdamW) on 8 documents of 128 tokens
(EURLEX57K's fine-tuning batch) and on 32 of 64 (Reuters'), at the precision
``trainer.precision=auto`` picks here: with the model's own dropout (0.1 on hidden states and on
attention weights), with attention dropout off only, and with every dropout off
(``matcher.dropout=0``). The median of ``--steps`` steps after a warm-up, 2 threads, random token
ids (the cost does not depend on them). Attention dropout keeps PyTorch's scaled-dot-product
attention off its fused CPU kernel (the math path materialises every attention matrix) and draws a
random number per attention weight. Prints the table and writes
``<results>/dropout-<tag>.{json,md}`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import time

from ..common import results_option, save_table

SHAPES = ((8, 128), (32, 64))
# (row, hidden-state rate, attention rate); MiniLM's own rates are 0.1 / 0.1
SETTINGS = (("the model's (0.1 / 0.1)", 0.1, 0.1), ("attention dropout 0", 0.1, 0.0), ("matcher.dropout=0", 0.0, 0.0))


def main(argv: list[str] | None = None) -> None:
    import torch

    from xtransformer.api import autocast_context, pretrained_encoder, resolve_model, resolve_precision, set_dropout

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="cpu")
    ap.add_argument("--steps", type=int, default=12, help="timed steps per cell (the median is reported)")
    results_option(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    cpu = torch.device("cpu")
    precision = resolve_precision("auto", "cpu")
    model = pretrained_encoder(resolve_model("minilm")).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def configure(hidden: float, attention: float) -> None:
        set_dropout(model, hidden)
        for name, m in model.named_modules():  # BERT-family attention-probability dropout
            if isinstance(m, torch.nn.Dropout) and name.endswith("attention.self.dropout"):
                m.p = attention

    def median_step(batch: dict[str, torch.Tensor]) -> float:
        def step() -> None:
            with autocast_context(precision, cpu):
                loss = model(**batch).last_hidden_state.float().mean(1).square().sum()
            loss.backward()
            opt.step()
            opt.zero_grad()

        step()  # warm-up
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    rows = []
    for name, hidden, attention in SETTINGS:
        configure(hidden, attention)
        row = {"dropout": name}
        for n, length in SHAPES:
            ids = torch.randint(1000, 20000, (n, length))
            row[f"{n}x{length}"] = round(median_step({"input_ids": ids, "attention_mask": torch.ones_like(ids)}), 3)
        rows.append(row)
        print(row, flush=True)
    base = rows[0]
    cpu_name = torch.cpu.get_capabilities().get("cpu_name")
    lines = [
        f"`python -m experiments.dropout.bench_dropout --tag {args.tag} --steps {args.steps}` "
        f"(2 threads; {cpu_name}; "
        f"precision {precision}; median of {args.steps} steps)",
        "",
        "| MiniLM dropout while fine-tuning | step, 8 x 128 tokens s | x | step, 32 x 64 tokens s | x |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [f"{r[f'{n}x{m}']} | {base[f'{n}x{m}'] / r[f'{n}x{m}']:.2f}" for n, m in SHAPES]
        lines.append(f"| {r['dropout']} | " + " | ".join(cells) + " |")
    save_table(
        args.results, f"dropout-{args.tag}", {"precision": precision, "cpu": cpu_name, "rows": rows}, "\n".join(lines)
    )


if __name__ == "__main__":
    main()
