r"""The worker process behind :class:`course_utils.parallelism.Cluster` (lesson 09), started by torchrun::

    python -m torch.distributed.run --nproc-per-node 4 --master-port 29500 -m course_utils.parallelism_workers --dir D

Each rank joins the gloo process group, writes ``D/ready<rank>``, then runs jobs in order: it waits for
``D/job<k>.pkl`` (a cloudpickled ``(fn, args, kwargs)``), calls ``fn`` and writes ``("ok", result)`` or
``("error", traceback)`` to ``D/result<k>_<rank>.pkl``. A ``D/stop`` file ends the loop, and so does the
end of the notebook's process (``--owner-pid``), so that a killed kernel leaves no workers behind. Collectives time
out after a minute, so one rank's exception cannot hang the others forever.
"""
from __future__ import annotations

import argparse
import os
import pickle
import time
import traceback
import warnings
from datetime import timedelta
from pathlib import Path


def _write(path: Path, record) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(record, f)
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve_jobs(folder: Path, owner_pid: int | None = None) -> None:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    (folder / f"ready{rank}").write_text("ready")
    k = 0
    while True:
        job, pause, waited = folder / f"job{k}.pkl", 0.001, 0.0
        while not job.exists():
            orphaned = owner_pid is not None and waited > 1.0 and not _alive(owner_pid)
            if (folder / "stop").exists() or not folder.exists() or orphaned:
                dist.destroy_process_group()
                return
            time.sleep(pause)
            waited += pause
            pause = min(0.02, pause * 1.5)  # poll fast right after a job, gently when idle
        try:
            with open(job, "rb") as f:
                fn, args, kwargs = pickle.load(f)
            record = ("ok", fn(*args, **kwargs))
            pickle.dumps(record)
        except BaseException:  # report it to the notebook; the other ranks time out or finish
            record = ("error", traceback.format_exc()[-4000:])
        _write(folder / f"result{k}_{rank}.pkl", record)
        k += 1


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the folder the notebook writes jobs into")
    parser.add_argument("--owner-pid", type=int, default=None, help="exit when this process (the notebook) is gone")
    args = parser.parse_args()
    serve_jobs(Path(args.dir), args.owner_pid)


if __name__ == "__main__":
    _main()
