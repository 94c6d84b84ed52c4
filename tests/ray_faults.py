"""Fault injection inside Ray workers (tests only).

The Ray fixture in ``test_ray_executor.py`` runs :func:`install` in every worker process (Ray's
``worker_process_setup_hook``). A test arms a fault by creating a file in the folder named by
``QUANTIZE_TEST_FAULTS``; exactly one worker claims it (``os.unlink`` succeeds once) and fails:

- ``kill``: the worker writes half of one output tensor's bytes, then SIGKILLs itself (a worker
  or node lost mid-write); Ray retries its task.
- ``slow``: every shard task sleeps a little before writing (so a driver can be killed mid-run).

A file ``hub`` holding a folder path makes ``huggingface_hub.hf_hub_download`` in the workers
copy from that folder (a fake Hub, as tests/test_low_disk.py fakes it on the driver); each
download leaves a ``downloaded-*`` file naming where it went.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid

FAULTS_ENV = "QUANTIZE_TEST_FAULTS"


def _claim(name: str) -> bool:
    folder = os.environ.get(FAULTS_ENV)
    if not folder:
        return False
    try:
        os.unlink(os.path.join(folder, name))
    except FileNotFoundError:
        return False
    with open(os.path.join(folder, f"{name}.claimed-by-{os.getpid()}"), "w"):
        pass
    return True


def install() -> None:
    from quantize_cli.checkpoint import writer

    real = writer.ShardWriter.write_bytes

    def write_bytes(self, name, data, byte_offset=0):
        if self.only is not None and len(data) > 1 and _claim("kill"):
            real(self, name, data[: len(data) // 2], byte_offset)
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, name, data, byte_offset)

    real_open = writer.ShardWriter.open

    def open_(self, fresh=True):
        folder = os.environ.get(FAULTS_ENV)
        if self.only is not None and folder and os.path.exists(os.path.join(folder, "slow")):
            time.sleep(0.4)
        return real_open(self, fresh)

    writer.ShardWriter.write_bytes = write_bytes
    writer.ShardWriter.open = open_
    _fake_hub()


def _fake_hub() -> None:
    import huggingface_hub

    real = huggingface_hub.hf_hub_download

    def download(repo_id, filename, revision=None, local_dir=None, **kw):
        folder = os.environ.get(FAULTS_ENV) or ""
        marker = os.path.join(folder, "hub")
        if not os.path.exists(marker):
            return real(repo_id, filename, revision=revision, local_dir=local_dir, **kw)
        with open(marker) as f:
            repo = f.read()
        target = local_dir or os.path.join(folder, "node-cache")
        os.makedirs(target, exist_ok=True)
        dst = os.path.join(target, filename)
        tmp = f"{dst}.{uuid.uuid4().hex}"
        shutil.copyfile(os.path.join(repo, filename), tmp)
        os.replace(tmp, dst)
        with open(os.path.join(folder, f"downloaded-{uuid.uuid4().hex}"), "w") as f:
            f.write(dst)
        return dst

    huggingface_hub.hf_hub_download = download
