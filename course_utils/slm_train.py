"""Text that ships with Python, byte-level batches, and a short training loop (lessons 07a and 07b).

The corpus is the source of a fixed list of standard-library modules, read from the running
interpreter's own ``Lib/`` folder: no download, and every Python installation has it. Its exact bytes
differ a little between Python versions, so lessons print rounded losses and verdicts, not exact values.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from .bench import single_thread
from .progress import progress
from .slm import SLMConfig, TinyDecoder

# Plain, long-lived modules with many docstrings; all present in CPython 3.9 and later.
CORPUS_MODULES = ("textwrap.py", "heapq.py", "bisect.py", "functools.py", "fractions.py", "statistics.py",
                  "string.py", "calendar.py", "difflib.py", "shlex.py", "argparse.py", "random.py",
                  "json/encoder.py", "json/decoder.py", "csv.py", "dataclasses.py", "enum.py", "inspect.py")

# More modules, used only to train the committed checkpoint (never the lessons' held-out tail): about 2.6 MB.
EXTRA_MODULES = tuple("""collections/__init__.py typing.py pathlib.py subprocess.py tarfile.py zipfile.py pydoc.py
    doctest.py unittest/case.py logging/__init__.py email/message.py http/client.py urllib/parse.py configparser.py ast.py
    tokenize.py pickle.py threading.py shutil.py os.py datetime.py ipaddress.py optparse.py gettext.py locale.py copy.py
    contextlib.py traceback.py weakref.py queue.py selectors.py socket.py uuid.py base64.py mailbox.py smtplib.py
    ftplib.py imaplib.py plistlib.py pprint.py tempfile.py glob.py fnmatch.py platform.py trace.py pdb.py cmd.py
    codecs.py _pydecimal.py""".split())

# Made by benchmarks/train_slm_checkpoint.py (its .json twin records the run and the machine).
CHECKPOINT = Path(__file__).resolve().parent / "checkpoints" / "slm_bytes.pt"


def stdlib_text(modules=CORPUS_MODULES, max_bytes: int | None = None) -> bytes:
    """The concatenated sources of ``modules`` from this interpreter's standard library, as bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts = [(root / name).read_bytes() for name in modules if (root / name).exists()]
    data = b"\n\n".join(parts)
    return data[:max_bytes] if max_bytes else data


def split_tokens(data: bytes, held_out: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Byte tokens (int64), split into a training part and the last ``held_out`` fraction."""
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    cut = int(len(tokens) * (1 - held_out))
    return tokens[:cut], tokens[cut:]


def get_batch(tokens, batch: int, seq_len: int, generator: torch.Generator):
    """Random windows: inputs ``(B, T)`` and the next bytes ``(B, T)``."""
    starts = torch.randint(0, len(tokens) - seq_len - 1, (batch,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len)[None, :]                  # (B, T)
    return tokens[idx], tokens[idx + 1]


@dataclass(frozen=True)
class TrainConfig:
    """A training run. The CPU preset fits the lesson's budget (about 20 s on one core)."""

    steps: int = 200             # optimizer steps
    batch: int = 8               # sequences per step
    seq_len: int = 128           # bytes per sequence
    lr: float = 3e-3             # peak AdamW learning rate (a tiny model tolerates a large one)
    warmup: int = 30             # linear warm-up steps, then cosine decay to 10%
    weight_decay: float = 0.01
    seed: int = 0


CPU_PRESET = TrainConfig()


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress_ = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * progress_)))


def train_lm(model_config: SLMConfig, tokens, cfg: TrainConfig = CPU_PRESET, *, desc: str = "training"):
    """Train a :class:`TinyDecoder` on next-byte prediction; returns ``(model, per-step losses)``."""
    torch.manual_seed(cfg.seed)
    model = TinyDecoder(model_config)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    losses = np.zeros(cfg.steps)
    with single_thread():  # small matmuls: a second thread costs more than it saves
        _train_steps(model, opt, tokens, cfg, gen, losses, desc)
    return model.eval(), losses


def _train_steps(model, opt, tokens, cfg, gen, losses, desc):
    for step in progress(range(cfg.steps), desc=desc):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        x, y = get_batch(tokens, cfg.batch, cfg.seq_len, gen)
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses[step] = loss.item()


@torch.no_grad()
def eval_loss(model, tokens, *, batch: int = 16, seq_len: int = 128, n_batches: int = 4, seed: int = 123) -> float:
    """Mean next-byte cross-entropy (nats) on fixed random windows of ``tokens``."""
    windows = _eval_windows(tokens, batch=batch, seq_len=seq_len, n_batches=n_batches, seed=seed)
    return sum(F.cross_entropy(model(x).flatten(0, 1), y.flatten()).item() for x, y in windows) / n_batches


@torch.no_grad()
def window_losses(model, tokens, **windows) -> torch.Tensor:
    """Mean next-byte cross-entropy of each window :func:`eval_loss` uses: a ``(batch * n_batches,)`` float64 tensor."""
    out = []
    for x, y in _eval_windows(tokens, **windows):
        logits = model(x)                                                       # (B, T, V)
        out.append(F.cross_entropy(logits.transpose(1, 2), y, reduction="none").double().mean(1))
    return torch.cat(out)


def paired_difference(model, reference, tokens, **windows) -> tuple[float, float]:
    """Held-out loss of ``model`` minus ``reference`` on the same windows: (mean, standard error over the windows).

    The windows are shared, so most of the sampling noise cancels; a difference several standard errors from 0 is
    a real difference on this text, not an accident of which windows were drawn.
    """
    d = window_losses(model, tokens, **windows) - window_losses(reference, tokens, **windows)
    return d.mean().item(), (d.std() / len(d) ** 0.5).item()


def load_checkpoint(path: Path | None = None):
    """The committed byte-level model (``SLMConfig()`` shape, trained longer): returns ``(model in eval mode, record)``."""
    path = Path(path or CHECKPOINT)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python benchmarks/train_slm_checkpoint.py` to make it.")
    blob = torch.load(path, map_location="cpu", weights_only=True)
    config = SLMConfig(**{k: tuple(v) if k == "layers" else v for k, v in blob["record"]["config"].items()})
    model = TinyDecoder(config)
    model.load_state_dict(blob["state_dict"])
    return model.eval(), blob["record"]


def ngram_loss(train_tokens, held_out, order: int, *, alpha: float = 0.1, **windows) -> float:
    """Held-out cross-entropy (nats/byte) of an add-``alpha`` smoothed unigram (order 1) or bigram (order 2) model.

    Counted on ``train_tokens``, scored on exactly the windows :func:`eval_loss` uses (same ``windows`` keywords),
    so the numbers sit beside a model's loss on equal terms.
    """
    if order not in (1, 2):
        raise ValueError(f"order must be 1 (unigram) or 2 (bigram), got {order}")
    counts = torch.zeros(256, 256, dtype=torch.float64)
    counts.index_put_((train_tokens[:-1], train_tokens[1:]), torch.ones(len(train_tokens) - 1, dtype=torch.float64),
                      accumulate=True)                                       # (previous byte, next byte)
    if order == 1:
        counts = counts.sum(0, keepdim=True).expand(256, 256)
    log_p = ((counts + alpha) / (counts + alpha).sum(1, keepdim=True)).log()  # row: previous byte
    total, n = 0.0, 0
    for x, y in _eval_windows(held_out, **windows):
        total += -log_p[x, y].sum().item()
        n += y.numel()
    return total / n


def _eval_windows(tokens, *, batch: int = 16, seq_len: int = 128, n_batches: int = 4, seed: int = 123):
    gen = torch.Generator().manual_seed(seed)
    return [get_batch(tokens, batch, seq_len, gen) for _ in range(n_batches)]


def decode_bytes(tokens) -> str:
    """Byte tokens -> text, with undecodable bytes replaced."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")
