"""--executor ray: the same bytes as --executor local, on a local 2-CPU Ray instance; faults.

One Ray session serves the module (starting Ray and its workers costs seconds). Workers run
tests/ray_faults.install at start-up, so a test can make one of them die mid-write.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import output_files

import ray  # noqa: E402  the ray extra is part of the test install (tests/conftest.py checks): a missing Ray fails

from quantize_cli.api import prepare
from tests.hostile.helpers import kill_once_journaled
from tests.conftest import convert  # noqa: E402
from quantize_cli.errors import NumericsError, UsageError  # noqa: E402
from quantize_cli.checkpoint.example_weights import deepseek_config, deepseek_tensors, llama_config, llama_tensors  # noqa: E402
from quantize_cli.checkpoint.example_weights import qwen3_moe_config, qwen3_moe_tensors  # noqa: E402
from quantize_cli.run import ray_tasks  # noqa: E402
from quantize_cli.run.partition import partition  # noqa: E402
from quantize_cli.run.ray_executor import check_device  # noqa: E402

from .ray_faults import FAULTS_ENV  # noqa: E402
from .test_low_disk import fake_hub  # noqa: E402,F401 - the driver-side fake Hub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO", "NVFP4", "W4A16_NVFP4", "INT8")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local Ray instance with 2 CPUs for the whole module; yields the fault folder."""
    faults = tmp_path_factory.mktemp("faults")
    path = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    # address="local": never join a stale /tmp/ray/ray_current_cluster (see tests/matrix/support.py)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": "tests.ray_faults.install",
                          "env_vars": {"PYTHONPATH": path, FAULTS_ENV: str(faults)}})
    yield faults
    ray.shutdown()


def files(folder) -> dict[str, bytes]:
    assert os.path.isfile(os.path.join(folder, "README.md"))  # the card is there (it names DST, so it is not compared)
    return output_files(folder)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Dense Llama (k x0.25, up x4 so fused scales differ), per-expert Qwen3-MoE, fused-expert
    Qwen3-MoE and DeepSeek-V3-style MLA + MoE, each in 2 source shards."""
    from quantize_cli.checkpoint.example_weights import write_checkpoint

    root = tmp_path_factory.mktemp("sources")
    cfg = llama_config()
    t = llama_tensors(cfg, seed=1)
    t["model.layers.0.self_attn.k_proj.weight"] *= 0.25
    t["model.layers.1.mlp.up_proj.weight"] *= 4
    out = {"dense": write_checkpoint(str(root / "dense"), t, cfg, shards=2)}
    q = qwen3_moe_config()
    out["moe"] = write_checkpoint(str(root / "moe"), qwen3_moe_tensors(q, seed=3), q, shards=2)
    out["moe_fused"] = write_checkpoint(str(root / "moe_fused"), qwen3_moe_tensors(q, seed=3, fused_experts=True), q, shards=2)
    d = deepseek_config()
    out["deepseek"] = write_checkpoint(str(root / "deepseek"), deepseek_tensors(d), d, shards=2)
    return out


# Small output shards, so that fused groups (and even one module's tensors) straddle shard
# boundaries and several Ray tasks run at once.
SHARD = "200KB"
CASES = [("dense", a, "plain") for a in ALGOS if a != "INT4_ASYM"] + [  # INT4_ASYM: compressed-tensors only (below)
    ("moe", "NVFP4", "plain"), ("moe", "FP8", "plain"), ("moe", "INT8", "plain"), ("moe", "INT4", "plain"),
    ("dense", "INT4", "marlin"),
    ("deepseek", "NVFP4", "plain"), ("deepseek", "FP8", "plain"),
    ("dense", "NVFP4", "marlin"), ("dense", "FP8_PB_WO", "marlin"),
    ("moe_fused", "NVFP4", "flashinfer"), ("moe_fused", "FP8", "cutlass"),
]


@pytest.mark.parametrize("family,algo,layout", CASES)
def test_ray_writes_the_same_bytes_as_local(cluster, sources, tmp_path, family, algo, layout):
    src = sources[family]
    opts = dict(algo=algo, layout=layout, quiet=True, max_shard_size=SHARD, memory_budget="8MB")
    convert(src, str(tmp_path / "local"), **opts)
    res = convert(src, str(tmp_path / "ray"), executor="ray", **opts)
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    shards = res.report["ray"]["shards"]
    assert len(shards) == len(res.plan.shard_names) > 2 and all(s["host"] and not s["skipped"] for s in shards)
    assert not (tmp_path / ".ray.partial").exists()


@pytest.mark.parametrize("family,algo", [("dense", "INT4_ASYM"), ("moe", "INT4")])
def test_ray_compressed_tensors_int4_same_bytes(cluster, sources, tmp_path, family, algo):
    """pack-quantized INT4: weight_shape (written once per tensor) and the 8-row zero points land
    where local puts them, whichever shard task writes them."""
    opts = dict(algo=algo, format="compressed-tensors", quiet=True, max_shard_size=SHARD, memory_budget="8MB")
    convert(sources[family], str(tmp_path / "local"), **opts)
    convert(sources[family], str(tmp_path / "ray"), executor="ray", **opts)
    assert files(tmp_path / "ray") == files(tmp_path / "local")


@pytest.mark.parametrize("family,algo", [("dense", "NVFP4"), ("moe", "W4A16_NVFP4")])
def test_ray_weighted_search_writes_the_same_bytes_as_local(cluster, sources, tmp_path, family, algo):
    """--scale-search mse with per-channel statistics: the workers get each module's weights from the plan."""
    from .test_search_weighted_convert import synthetic_scales

    src = sources[family]
    scales = synthetic_scales(src, str(tmp_path / "s.json"))
    opts = dict(algo=algo, quiet=True, max_shard_size=SHARD, memory_budget="8MB", scale_search="mse", act_scales=scales)
    local = convert(src, str(tmp_path / "local"), **opts)
    convert(src, str(tmp_path / "ray"), executor="ray", **opts)
    assert local.plan.search_weights is not None
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    convert(src, str(tmp_path / "free"), **{**opts, "act_scales": None})
    assert files(tmp_path / "free") != files(tmp_path / "local")


def test_partition_writes_every_output_once_and_splits_groups(sources):
    """Each output tensor belongs to exactly one unit; fused groups cut by a shard boundary get
    their amax from the driver (the dense case above exercises it)."""
    plan = prepare(sources["dense"], "NVFP4", max_shard_size=SHARD)
    units = partition(plan)
    written = [n for u in units for _, t in u.tasks for n in t.outputs]
    assert sorted(written) == sorted(plan.outputs) and len(written) == len(set(written))
    assert all(plan.outputs[n].shard == u.shard for u in units for _, t in u.tasks for n in t.outputs)
    split = {i for u in units for i in u.needs_amax}
    assert split and all(len(plan.tasks[i].members) > 1 for i in split)
    assert not any(u.needs_amax for u in partition(prepare(sources["dense"], "FP8_PB_WO", max_shard_size=SHARD)))


def test_a_split_group_reads_every_member_for_its_amax_and_quantizes_its_own(sources):
    """A fused group cut by a shard boundary: each unit's steps take the amax of every member (the
    local executor's steps, so the same value), and quantize only the members with outputs in its
    shard; members written by the other shard are read for their amax only."""
    from quantize_cli.run.schedule import Amax, Hold, Quantize, Schedule, Share
    from quantize_cli.run.shard_stream import unit_steps

    plan = prepare(sources["dense"], "NVFP4", max_shard_size=SHARD)
    schedule = Schedule(plan)
    seen = 0
    for u in partition(plan):
        for i, sub in u.tasks:
            if i not in u.needs_amax:
                continue
            task, steps = unit_steps(schedule, plan, i, sub)
            whole = plan.tasks[i]
            mine = {m.module for m in sub.members}
            assert 0 < len(mine) < len(whole.members) and task.outputs == sub.outputs
            amaxed = {whole.members[s.slot].module for s in steps if isinstance(s, (Amax, Hold))}
            assert amaxed == {m.module for m in whole.members}  # every member's amax
            assert {s.member.module for s in steps if isinstance(s, Quantize)} == mine  # only its own members quantized
            assert [s.slots for s in steps if isinstance(s, Share)] == [tuple(range(len(whole.members)))]
            seen += 1
    assert seen >= 2  # both sides of at least one boundary


def test_worker_killed_mid_write_is_retried_to_the_same_bytes(cluster, sources, tmp_path):
    (cluster / "kill").touch()
    opts = dict(algo="NVFP4", quiet=True, max_shard_size=SHARD)
    res = convert(sources["dense"], str(tmp_path / "ray"), executor="ray", **opts)
    assert not (cluster / "kill").exists() and any(f.startswith("kill.claimed-by-") for f in os.listdir(cluster))
    convert(sources["dense"], str(tmp_path / "local"), **opts)
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    assert len(res.report["ray"]["shards"]) == len(res.plan.shard_names)


DRIVER = """
import sys, time
import quantize_cli.output.journal as r
real = r.Journal.append
def slow(self, index, crc):  # a slow driver: each journaled task takes a moment
    real(self, index, crc)
    time.sleep(0.3)
r.Journal.append = slow
from quantize_cli.cli import main
sys.argv = ["quantize"] + sys.argv[1:]
main()
"""


def test_driver_killed_mid_run_resumes_to_the_same_bytes(cluster, sources, tmp_path):
    src, out = sources["moe"], tmp_path / "out"
    address = ray.get_runtime_context().gcs_address
    args = [src, "-o", str(out), "--algo", "NVFP4", "--max-shard-size", SHARD, "--executor", "ray", "--ray-address", address, "-q"]
    tasks = len(prepare(src, "NVFP4", max_shard_size=SHARD).tasks)
    lines = kill_once_journaled(DRIVER, ["convert", *args], tmp_path / ".out.partial" / ".quantize-journal", tasks // 3, REPO)
    assert not out.exists() and (tmp_path / ".out.partial").is_dir()
    claimed = {line.split()[0] for line in lines if len(line.split()) == 2}
    res = convert(src, str(out), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray", resume=True)
    convert(src, str(tmp_path / "local"), algo="NVFP4", quiet=True, max_shard_size=SHARD)
    assert files(out) == files(tmp_path / "local")
    # Journaled tasks were checked and kept (in whole shards skipped, or inside shards redone around them), the rest redone.
    shards = res.report["ray"]["shards"]
    kept = sum(s["kept"] for s in shards)
    assert tasks // 3 <= len(claimed) < tasks and len(claimed) <= kept < sum(len(u.tasks) for u in partition(res.plan))


def test_nan_stops_the_run_with_the_tensor_named(cluster, make_checkpoint, tmp_path):
    cfg = llama_config()
    t = llama_tensors(cfg, seed=2)
    t["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    src = make_checkpoint(t, cfg, shards=2)
    with pytest.raises(NumericsError, match=r"model\.layers\.1\.mlp\.down_proj\.weight .*NaN or Inf \(first at \[3, 5\]\)"):
        convert(src, str(tmp_path / "out"), algo="FP8_PB_WO", quiet=True, max_shard_size=SHARD, executor="ray")
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()


def test_nan_in_a_member_written_by_another_shard_is_named(cluster, sources, make_checkpoint, tmp_path):
    plan = prepare(sources["dense"], "NVFP4", max_shard_size=SHARD)
    member = next(plan.tasks[i] for u in partition(plan) for i in u.needs_amax).members[-1]
    cfg = llama_config()
    t = llama_tensors(cfg, seed=1)
    t["model.layers.0.self_attn.k_proj.weight"] *= 0.25
    t["model.layers.1.mlp.up_proj.weight"] *= 4
    t[member.source.name][0, 1] = float("inf")
    src = make_checkpoint(t, cfg, shards=2)
    with pytest.raises(NumericsError, match=member.source.name.replace(".", r"\.") + r" .*\(first at \[0, 1\]\)"):
        convert(src, str(tmp_path / "out"), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray")


def test_probe_refuses_a_work_folder_or_source_a_node_cannot_see(tmp_path):
    from quantize_cli.errors import DestinationError, SourceError

    with pytest.raises(DestinationError, match="storage every Ray node can reach"):
        ray_tasks.probe(str(tmp_path / "missing"), "t", [])
    with pytest.raises(SourceError, match="storage every Ray node can read"):
        ray_tasks.probe(str(tmp_path), "t", [str(tmp_path / "gone.safetensors")])
    ray_tasks.probe(str(tmp_path), "tok", [])
    assert [p.read_text() for p in tmp_path.glob(".ray-probe-tok-*")] == ["tok"]


def test_several_workers_of_one_node_each_pass_the_probe(sources, tmp_path):
    """The workers of one node probe at once (a 4-GPU head runs four); the driver checks and
    removes each worker's probe as it becomes ready. One probe name per node made the second worker
    'not visible here' whenever its probe was written before the first was checked (issue 34:
    a 70B run on a joined 4-GPU head failed 3 of 3 tries)."""
    from quantize_cli.run.ray_executor import _check_probe

    plan = prepare(sources["dense"], "FP8_PB_WO", max_shard_size=SHARD)
    folder = str(tmp_path)
    workers = [ray_tasks.ShardWorker("cpu") for _ in range(3)]  # the actor class, as Ray runs it in each worker process
    try:
        found = [w.prepare(folder, "tok", [], plan, ray_tasks.UnitContext(folder, 64 << 20)) for w in workers]  # all probe first
        for where in found:  # then the driver checks each, as each becomes ready
            _check_probe(folder, "tok", where)
        assert len({w["probe"] for w in found}) == 3 and len({w["node_id"] for w in found}) == 1
        assert not list(tmp_path.glob(".ray-probe-*"))  # every probe removed
    finally:
        for w in workers:
            if w.stream is not None:
                w.stream.abort()


def test_usage_errors():
    assert check_device("cuda:3") == "cuda" and check_device("AUTO") == "auto"
    with pytest.raises(UsageError, match="--device"):
        check_device("tpu")
    with pytest.raises(UsageError, match="--executor 'dask'"):
        convert("example:tiny-llama", "/nonexistent/x", algo="FP8", executor="dask")


def test_unreachable_cluster_is_one_line_and_exit_1(tmp_path):
    """A driver that cannot reach the cluster says so in one line (no traceback) and exits 1."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", str(tmp_path / "o"),
                           "--algo", "FP8", "--executor", "ray", "--ray-address", "127.0.0.1:1", "-q"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --executor ray: cannot connect to 127.0.0.1:1") and "--ray-address" in last
    assert not (tmp_path / "o").exists()


def test_without_an_address_a_stale_current_cluster_file_is_not_joined(tmp_path):
    """No --ray-address, no RAY_ADDRESS: a new local instance, as the help says, even where
    ``ray_current_cluster`` names a cluster that is gone (a killed `ray start` or test run leaves it;
    ray.init() alone tries to join it and the run failed with "cannot connect to a local instance")."""
    ray_tmp = tempfile.mkdtemp(prefix="r", dir="/tmp")  # short: Ray's socket paths live under it
    try:
        os.makedirs(os.path.join(ray_tmp, "ray"))
        with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
            f.write("127.0.0.1:1")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": ray_tmp}
        proc = subprocess.run([sys.executable, "-m", "quantize_cli", "convert", "example:tiny-llama", "-o", str(tmp_path / "o"),
                               "--algo", "FP8", "--executor", "ray"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    assert "ray: started a local instance" in proc.stderr + proc.stdout
    assert os.path.isfile(tmp_path / "o" / "hf_quant_config.json")


@pytest.mark.parametrize("low_disk", [False, True])
def test_hub_source_each_task_fetches_its_shards(cluster, fake_hub, tmp_path, low_disk):
    """A Hub repo id: the driver plans from the remote headers (downloads no weights); each task
    fetches the shards it reads into its node's cache, or with --low-disk into a scratch folder
    that is gone afterwards. Same bytes as a local conversion."""
    local, state = fake_hub
    (cluster / "hub").write_text(local)
    try:
        for f in cluster.glob("downloaded-*"):
            f.unlink()
        convert("someone/tiny-llama", str(tmp_path / "ray"), algo="NVFP4", quiet=True, max_shard_size="1MB",
                executor="ray", low_disk=low_disk)
        fetched = [f.read_text() for f in cluster.glob("downloaded-*")]
    finally:
        (cluster / "hub").unlink()
    convert(local, str(tmp_path / "local"), algo="NVFP4", quiet=True, max_shard_size="1MB")
    assert files(tmp_path / "ray") == files(tmp_path / "local")
    assert state["weights_downloaded"] == 0  # the driver fetched no weights
    assert {os.path.basename(p) for p in fetched} == {f for f in os.listdir(local) if f.endswith(".safetensors")}
    if low_disk:
        assert not any(os.path.exists(p) for p in fetched) and all("quantize-src-" in p for p in fetched)


@pytest.mark.gpu
def test_gpu_tasks_write_the_same_bytes_as_local_cpu(tmp_path, sources):
    """GPU machine: each Ray task asks for a GPU and quantizes with the Triton kernels; same bytes
    as the CPU torch reference run locally (run with -m gpu; starts its own Ray instance)."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for algo in ("NVFP4", "FP8", "FP8_PB_WO"):
        opts = dict(algo=algo, quiet=True, max_shard_size=SHARD)
        convert(sources["dense"], str(tmp_path / f"cpu-{algo}"), device="cpu", **opts)
        res = convert(sources["dense"], str(tmp_path / f"gpu-{algo}"), device="cuda", executor="ray", **opts)
        assert res.report["ray"]["device"] == "cuda"
        assert files(tmp_path / f"gpu-{algo}") == files(tmp_path / f"cpu-{algo}")


def test_task_warnings_and_memory_reach_the_report(cluster, make_checkpoint, tmp_path, capsys):
    """What a task finds (a drowned fused member) is printed by the driver as with --executor local,
    and each task counts its own process memory against --memory-budget (bytes.baseline_rss: the
    largest task's, not null)."""
    cfg = llama_config()
    t = llama_tensors(cfg, seed=3)
    t["model.layers.0.mlp.up_proj.weight"].fill_(1e-30)
    src = make_checkpoint(t, cfg, shards=2)
    capsys.readouterr()
    res = convert(src, str(tmp_path / "out"), algo="FP8", quiet=True, max_shard_size=SHARD, executor="ray", report=str(tmp_path / "r.json"))
    err = capsys.readouterr().err
    assert "model.layers.0.mlp.up_proj.weight: its largest value" in err and "(almost) all zero" in err, err
    assert res.report["bytes"]["baseline_rss"] > 100 << 20  # a task process with torch loaded


def test_a_local_run_killed_midway_resumes_with_ray(cluster, sources, tmp_path):
    """One journal for every executor: a local run's journaled tasks are kept by a Ray --resume."""
    src, out = sources["dense"], tmp_path / "out"
    tasks = len(prepare(src, "NVFP4", max_shard_size=SHARD).tasks)
    claimed = len(kill_once_journaled(DRIVER, ["convert", src, "-o", str(out), "--algo", "NVFP4", "--max-shard-size", SHARD,
                                              "--device", "cpu", "-q"],
                                      tmp_path / ".out.partial" / ".quantize-journal", tasks // 3, REPO))
    res = convert(src, str(out), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray", resume=True)
    convert(src, str(tmp_path / "local"), algo="NVFP4", quiet=True, max_shard_size=SHARD)
    assert files(out) == files(tmp_path / "local")
    assert sum(s["kept"] for s in res.report["ray"]["shards"]) >= claimed >= tasks // 3


TORCH_FREE_DRIVER = """
import sys
from quantize_cli.api import convert
from quantize_cli.plan.options import ConvertOptions
res = convert(ConvertOptions(src=sys.argv[1], dst=sys.argv[2], algo="NVFP4", executor="ray", max_shard_size="200KB",
                             quiet=True, report=sys.argv[3]))
print("torch imported" if "torch" in sys.modules else "no torch", res.report["ray"]["start_s"])
"""


def test_the_driver_imports_no_torch(sources, tmp_path):
    """The Ray driver plans, probes, dispatches and journals without torch (seconds saved before
    the first byte); the workers quantize. The report's errors come from the workers."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-c", TORCH_FREE_DRIVER, sources["dense"], str(tmp_path / "out"), str(tmp_path / "r.json")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("no torch"), proc.stdout
    with open(tmp_path / "r.json") as f:
        report = json.load(f)
    quantized = [t for t in report["tensors"] if "sqnr_db" in t]
    assert quantized and all(t["sqnr_db"] > 10 for t in quantized)
    assert report["ray"]["start_s"]["connect_s"] > 0 and report["ray"]["workers"][0]["warm_s"] > 0


def test_a_cluster_that_refuses_a_driver_without_its_token_names_the_fix(tmp_path, monkeypatch):
    """Ray >= 2.5x clusters use token authentication; a driver joining by address without
    RAY_AUTH_MODE=token is refused (InvalidAuthToken, then a ConnectionError): the error names that fix
    when a token is on this machine, and the usual one otherwise."""
    from quantize_cli.run import ray_start

    class RefusingRay:
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    monkeypatch.setattr(ray_start, "_reachable", lambda address: None)  # the port answers; the handshake fails
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    token = tmp_path / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    with pytest.raises(ray_start.RayRunError, match="start the cluster"):  # no token here: the usual fix
        ray_start.connect(RefusingRay(), "10.0.0.1:6379")
    token.write_text("x" * 64)
    with pytest.raises(ray_start.RayRunError, match="export RAY_AUTH_MODE=token") as err:
        ray_start.connect(RefusingRay(), "10.0.0.1:6379")
    assert "cannot connect to 10.0.0.1:6379" in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # already set: the token is not the problem
    with pytest.raises(ray_start.RayRunError, match="start the cluster"):
        ray_start.connect(RefusingRay(), "10.0.0.1:6379")
