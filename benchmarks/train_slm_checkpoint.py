"""Train the byte-level checkpoint that lessons 07a-07c load (``course_utils/checkpoints/slm_bytes.pt``).

The same model (``slm.SLMConfig()``: width 64, 4 layers, 4 query / 2 KV heads, 0.22 M parameters) and the same
training loop (``slm_train.train_lm``) as lesson 07a's 200-step run, trained for longer on more text: the training
part of the lesson's corpus plus more standard-library modules (``slm_train.EXTRA_MODULES``), never the held-out
tail that the lessons evaluate on. One CPU thread; it took 29 minutes on the course's 2-core VM while other jobs kept it busy (load 9-14).
The weights are saved in float32 with the config, the training settings and a record of the machine; the lessons
re-measure the held-out loss themselves, so nothing here is trusted without a check.

Run from the repository root:  python benchmarks/train_slm_checkpoint.py
"""
from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from course_utils import slm
from course_utils import slm_train as st

RUN = st.TrainConfig(steps=3000, batch=16, seq_len=128, lr=3e-3, warmup=100, weight_decay=0.1, seed=0)


def main() -> None:
    train_tokens, held_out = st.split_tokens(st.stdlib_text())
    extra, _ = st.split_tokens(st.stdlib_text(st.EXTRA_MODULES), held_out=0.0)
    tokens = torch.cat([train_tokens, extra])
    config = slm.SLMConfig()
    start = time.perf_counter()
    model, losses = st.train_lm(config, tokens, RUN, desc="checkpoint")
    seconds = time.perf_counter() - start
    held = st.eval_loss(model, held_out)
    record = {"config": asdict(config), "train": asdict(RUN), "train_bytes": len(tokens),
              "held_out_loss": held, "final_train_loss_mean_100": float(losses[-100:].mean()),
              "seconds": seconds, "machine": f"{platform.machine()} {platform.processor() or ''} "
              f"{torch.get_num_threads()} torch threads available, trained on 1; python {platform.python_version()}, "
              f"torch {torch.__version__}", "date": time.strftime("%Y-%m-%d")}
    out = st.CHECKPOINT
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": model.state_dict(), "record": record}, out)
    Path(out.with_suffix(".json")).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
