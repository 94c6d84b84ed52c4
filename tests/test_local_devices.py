"""One pipeline per device (``--device cpu,cpu`` stands in for ``cuda:0,cuda:1`` on the CPU) and the
shard stream under it: the same bytes and journal digests as the local executor, reads of the next
shard before the previous one is written, errors that stop every pipeline, resume across executors."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from quantize_cli.api import prepare
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, qwen3_moe_config, qwen3_moe_tensors
from quantize_cli.errors import NumericsError, UsageError
from quantize_cli.run.partition import partition
from tests.hostile.helpers import kill_once_journaled
from tests.conftest import convert, output_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = "200KB"


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    from quantize_cli.checkpoint.example_weights import write_checkpoint

    root = tmp_path_factory.mktemp("sources")
    cfg = llama_config()
    t = llama_tensors(cfg, seed=1)
    t["model.layers.1.mlp.up_proj.weight"] *= 4  # fused members with different scales
    q = qwen3_moe_config()
    return {"dense": write_checkpoint(str(root / "dense"), t, cfg, shards=2),
            "moe_fused": write_checkpoint(str(root / "moe_fused"), qwen3_moe_tensors(q, seed=3, fused_experts=True), q, shards=2)}


def checksums(folder) -> list[str]:
    with open(os.path.join(folder, ".quantize-checksums")) as f:
        return json.load(f)["tasks"]


@pytest.mark.parametrize("family,algo,layout", [("dense", "NVFP4", "plain"), ("dense", "FP8", "plain"), ("dense", "FP8_PB_WO", "plain"),
                                                ("dense", "INT8", "plain"), ("dense", "NVFP4", "marlin"),
                                                ("moe_fused", "NVFP4", "flashinfer")])
def test_two_pipelines_write_the_bytes_and_digests_of_one(sources, tmp_path, family, algo, layout):
    opts = dict(algo=algo, layout=layout, quiet=True, max_shard_size=SHARD, memory_budget="8MB")
    convert(sources[family], str(tmp_path / "one"), device="cpu", **opts)
    res = convert(sources[family], str(tmp_path / "two"), device="cpu,cpu", report=str(tmp_path / "r.json"), **opts)
    assert output_files(tmp_path / "two") == output_files(tmp_path / "one")
    assert checksums(tmp_path / "two") == checksums(tmp_path / "one")  # every task's journal digest
    shards = res.report["devices"]["shards"]
    assert len(shards) == len(res.plan.shard_names) > 4
    assert {s["pipeline"] for s in shards} == {0, 1}  # both pipelines wrote shards
    assert res.report["options"]["device"] == "cpu,cpu"


def test_the_next_shard_is_read_before_the_previous_one_is_written(sources, tmp_path, monkeypatch):
    """One stream, several units: the first read of unit 1 comes before unit 0's file is closed
    (the read stage streams across shard boundaries)."""
    import torch

    from quantize_cli.checkpoint import writer
    from quantize_cli.run import pipeline
    from quantize_cli.run.shard_stream import ShardStream

    plan = prepare(sources["dense"], "FP8_PB_WO", max_shard_size=SHARD)
    units = [u for u in partition(plan) if u.bytes_in][:3]
    events, real_load, real_close = [], pipeline.load, writer.ShardWriter.close

    def load(req, pin, reader):
        events.append(("read", req.info.name, time.perf_counter()))
        return real_load(req, pin, reader)

    def close(self, sync=True):
        events.append(("close", sorted(self.only)[0], time.perf_counter()))
        time.sleep(0.3)  # a slow disk: the next shard must not wait for it
        return real_close(self, sync)

    monkeypatch.setattr(pipeline, "load", load)
    monkeypatch.setattr(writer.ShardWriter, "close", close)
    os.makedirs(tmp_path / "w")
    stream = ShardStream(plan, str(tmp_path / "w"), torch.device("cpu"), 64 << 20)
    futures = [stream.submit(u) for u in units]
    results = [f.result(timeout=120) for f in futures]
    stream.close()
    assert [r["index"] for r in results] == [u.shard for u in units]
    first_close = next(t for kind, shard, t in events if kind == "close" and shard == units[0].shard)
    unit1 = {t.members[0].source.name if t.members else t.copy.name for _, t in units[1].tasks}
    first_read_of_next = min(t for kind, name, t in events if kind == "read" and name in unit1)
    assert first_read_of_next < first_close


def test_an_error_stops_every_pipeline_with_the_tensor_named(make_checkpoint, tmp_path):
    cfg = llama_config()
    t = llama_tensors(cfg, seed=2)
    t["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    src = make_checkpoint(t, cfg, shards=2)
    before = threading.active_count()
    with pytest.raises(NumericsError, match=r"model\.layers\.1\.mlp\.down_proj\.weight .*\(first at \[3, 5\]\)"):
        convert(src, str(tmp_path / "out"), algo="FP8_PB_WO", quiet=True, max_shard_size=SHARD, device="cpu,cpu")
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:  # no pipeline thread left running
        time.sleep(0.05)
    assert threading.active_count() <= before


def test_an_aborted_stream_fails_its_queued_units_and_stops(sources, tmp_path):
    import torch

    from quantize_cli.run.shard_stream import Cancelled, ShardStream

    plan = prepare(sources["dense"], "NVFP4", max_shard_size=SHARD)
    os.makedirs(tmp_path / "w")
    stream = ShardStream(plan, str(tmp_path / "w"), torch.device("cpu"), 64 << 20)
    stream.abort("stop")
    late = stream.submit(partition(plan)[0])
    with pytest.raises(Cancelled, match="stop"):
        late.result(timeout=10)
    assert not stream._thread.is_alive()


def test_device_lists_are_checked():
    from quantize_cli.devices import check_device_name, resolve_device, resolve_devices

    assert check_device_name("CUDA:0,cuda:1") == "cuda:0,cuda:1"
    with pytest.raises(UsageError, match="--device 'cpu,tpu' is not a device"):
        check_device_name("cpu,tpu")
    with pytest.raises(UsageError, match="one device here"):
        resolve_device("cpu,cpu")
    assert [str(d) for d in resolve_devices("cpu,cpu")] == ["cpu", "cpu"]
    with pytest.raises(UsageError, match="--device cuda:0,cuda:1 --executor ray: Ray gives every GPU"):
        convert("example:tiny-llama", "/nonexistent/x", algo="FP8", executor="ray", device="cuda:0,cuda:1")


SLOW_JOURNAL = """
import sys, time
import quantize_cli.output.journal as r
real = r.Journal.append
def slow(self, index, digest):  # a slow journal: each task takes a moment, so the run can be killed midway
    real(self, index, digest)
    time.sleep(0.2)
r.Journal.append = slow
from quantize_cli.cli import main
sys.argv = ["quantize"] + sys.argv[1:]
main()
"""


def test_a_run_on_two_pipelines_killed_midway_resumes_on_one(sources, tmp_path):
    """The journal is the same for every executor: a --resume may switch from two pipelines to one."""
    src, out = sources["dense"], tmp_path / "out"
    tasks = len(prepare(src, "NVFP4", max_shard_size=SHARD).tasks)
    claimed = len(kill_once_journaled(SLOW_JOURNAL, ["convert", src, "-o", str(out), "--algo", "NVFP4", "--max-shard-size", SHARD,
                                                    "--device", "cpu,cpu", "-q"],
                                      tmp_path / ".out.partial" / ".quantize-journal", tasks // 3, REPO))
    assert tasks // 3 <= claimed < tasks
    convert(src, str(out), algo="NVFP4", quiet=True, max_shard_size=SHARD, device="cpu", resume=True)
    convert(src, str(tmp_path / "one"), algo="NVFP4", quiet=True, max_shard_size=SHARD, device="cpu")
    assert output_files(out) == output_files(tmp_path / "one")


@pytest.mark.gpu
def test_gpu_pipelines_write_the_bytes_of_the_cpu_reference(sources, tmp_path):
    """GPU machine (-m gpu, no Ray needed): one pipeline per GPU (both GPUs where there are two, else
    two pipelines on one) with the Triton kernels, same bytes and journal digests as one CPU pipeline."""
    import torch

    if not torch.cuda.is_available():
        pytest.fail("-m gpu needs a CUDA GPU")
    devices = "cuda:0,cuda:1" if torch.cuda.device_count() >= 2 else "cuda:0,cuda:0"
    for algo in ("NVFP4", "FP8", "FP8_PB_WO"):
        opts = dict(algo=algo, quiet=True, max_shard_size=SHARD)
        convert(sources["dense"], str(tmp_path / f"cpu-{algo}"), device="cpu", **opts)
        res = convert(sources["dense"], str(tmp_path / f"gpu-{algo}"), device=devices, report=str(tmp_path / "r.json"), **opts)
        assert output_files(tmp_path / f"gpu-{algo}") == output_files(tmp_path / f"cpu-{algo}")
        assert checksums(tmp_path / f"gpu-{algo}") == checksums(tmp_path / f"cpu-{algo}")
        assert {s["pipeline"] for s in res.report["devices"]["shards"]} == {0, 1}


def test_the_pipelines_of_one_process_keep_one_pinned_pool_for_them_all(sources, tmp_path, monkeypatch):
    """torch's pinned pool is one per process: each of N streams trims it against all N streams'
    bytes in flight, not its own share (its own share emptied the pool the others were reusing,
    before every read: 2-4 GPUs ran slower than one, issue 34)."""
    import torch

    from quantize_cli.run import host_memory
    from quantize_cli.run.shard_stream import ShardStream

    limits = []
    real = host_memory.PinnedPool.__init__

    def record(self, device, limit):
        limits.append(limit)
        real(self, device, limit)

    monkeypatch.setattr(host_memory.PinnedPool, "__init__", record)
    plan = prepare(sources["dense"], "FP8_PB_WO", max_shard_size=SHARD)
    unit = next(u for u in partition(plan) if u.bytes_in)
    for share in (1, 3):  # a budget under this process's RSS: each stream gets the in-flight floor / share
        os.makedirs(tmp_path / str(share))
        stream = ShardStream(plan, str(tmp_path / str(share)), torch.device("cpu"), 64 << 20, share=share)
        stream.submit(unit).result(timeout=120)
        stream.close()
    one, three = limits
    assert three == 3 * (one // 3)  # three streams' bytes in flight together (was one stream's: one // 3)
