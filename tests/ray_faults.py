"""Fault injection inside Ray workers (tests only).

The Ray fixture in ``test_ray_executor.py`` runs :func:`install` in every worker process (Ray's
``worker_process_setup_hook``). A test arms a fault by creating a file in the folder named by
``QUANTIZE_TEST_FAULTS``; exactly one worker claims it (``os.unlink`` succeeds once) and fails:

- ``kill``: the worker writes half of one output tensor's bytes, then SIGKILLs itself (a worker
  or node lost mid-write); Ray retries its task.
- ``slow``: every shard sleeps a little before it is written (so a driver can be killed mid-run).
- ``private-dst`` holding a node name: on that node the probe writes into the node's own staging
  folder instead of DST's work folder, as if DST were a local disk of the same name there.

On the emulated nodes of tests/test_ray_cluster.py (each raylet started with ``QUANTIZE_TEST_NODE``
naming it and ``QUANTIZE_TEST_STAGING``, its own folder), every shard a node opens leaves an
``opened-<node>-<shard>`` file.

A file ``hub`` holding a folder path makes ``huggingface_hub.hf_hub_download`` in the workers
copy from that folder (a fake Hub, as tests/test_low_disk.py fakes it on the driver) into the
node's staging folder (or a shared one); each download leaves a ``downloaded-*`` file naming where
it went.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
import uuid

FAULTS_ENV = "QUANTIZE_TEST_FAULTS"
NODE_ENV = "QUANTIZE_TEST_NODE"
STAGING_ENV = "QUANTIZE_TEST_STAGING"


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
        if self.only is not None and folder and os.environ.get(NODE_ENV):
            with open(os.path.join(folder, f"opened-{os.environ[NODE_ENV]}-{min(self.only)}"), "w"):
                pass
        if self.only is not None and folder and os.path.exists(os.path.join(folder, "slow")):
            time.sleep(0.4)
        return real_open(self, fresh)

    writer.ShardWriter.write_bytes = write_bytes
    writer.ShardWriter.open = open_
    _private_dst()
    _fake_hub()


def _private_dst() -> None:
    from quantize_cli.run import ray_tasks

    real = ray_tasks.probe

    def probe(folder, token, source_files, worker=""):
        faults = os.environ.get(FAULTS_ENV) or ""
        try:
            with open(os.path.join(faults, "private-dst")) as f:
                private = f.read() == os.environ.get(NODE_ENV)
        except OSError:
            private = False
        if private:  # this node's "DST" is its own disk: same path name, other files
            folder = os.path.join(os.environ[STAGING_ENV], "private", os.path.basename(folder))
            os.makedirs(folder, exist_ok=True)
        return real(folder, token, source_files, worker)

    ray_tasks.probe = probe


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
        target = local_dir or os.path.join(os.environ.get(STAGING_ENV) or folder, "node-cache")
        os.makedirs(target, exist_ok=True)
        dst = os.path.join(target, filename)
        tmp = f"{dst}.{uuid.uuid4().hex}"
        shutil.copyfile(os.path.join(repo, filename), tmp)
        os.replace(tmp, dst)
        with open(os.path.join(folder, f"downloaded-{uuid.uuid4().hex}"), "w") as f:
            f.write(dst)
        return dst

    huggingface_hub.hf_hub_download = download
