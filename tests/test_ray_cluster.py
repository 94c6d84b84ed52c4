"""Several Ray nodes on one machine (``ray.cluster_utils.Cluster``): what a real cluster does, on the CPU.

A head with no CPU (only the driver: no worker may land there) and two worker nodes ``a`` and
``b`` with one CPU each; each node's raylet (hence its workers) gets ``QUANTIZE_TEST_NODE`` and its
own staging folder (``QUANTIZE_TEST_STAGING``: its Hugging Face cache for a Hub source, its private
disk where a test makes DST unshared). Faults come from tests/ray_faults.py. Checked: shards are
placed on both nodes with the bytes of a local run, each node's worker probes DST, a Hub source is
fetched by each node into its own cache, a DST one node does not share is refused before any shard
is written, a driver killed mid-run resumes, and a node removed mid-run has its shards redone by the
other (that test changes the cluster, so it runs last).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import ray
from ray.cluster_utils import Cluster

from quantize_cli.api import prepare
from quantize_cli.checkpoint.example_weights import llama_config, llama_tensors, write_checkpoint
from quantize_cli.errors import DestinationError
from tests.hostile.helpers import kill_once_journaled
from tests.conftest import convert, output_files

from .ray_faults import FAULTS_ENV, NODE_ENV, STAGING_ENV
from .test_low_disk import fake_hub  # noqa: F401 - the driver-side fake Hub

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD = "200KB"


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """``{"cluster", "a", "b", "faults", "staging": {name: folder}}`` for the module."""
    faults = tmp_path_factory.mktemp("faults")
    staging = {n: str(tmp_path_factory.mktemp(f"node-{n}")) for n in "ab"}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    added = {n: cluster.add_node(num_cpus=1, env_vars={NODE_ENV: n, STAGING_ENV: staging[n]}) for n in "ab"}
    path = os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": "tests.ray_faults.install", "env_vars": {"PYTHONPATH": path, FAULTS_ENV: str(faults)}})
    yield {"cluster": cluster, **added, "faults": faults, "staging": staging}
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    cfg = llama_config()
    t = llama_tensors(cfg, seed=1)
    t["model.layers.1.mlp.up_proj.weight"] *= 4
    return write_checkpoint(str(tmp_path_factory.mktemp("dense") / "src"), t, cfg, shards=2)


@pytest.fixture(scope="module")
def local_ref(dense, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "local"
    convert(dense, str(out), algo="NVFP4", quiet=True, max_shard_size=SHARD)
    return output_files(out)


def node_names(nodes) -> dict:
    return {nodes[n].node_id: n for n in "ab"}


def test_shards_are_placed_on_every_node_with_the_bytes_of_a_local_run(nodes, dense, local_ref, tmp_path):
    res = convert(dense, str(tmp_path / "out"), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray")
    assert output_files(tmp_path / "out") == local_ref
    names = node_names(nodes)
    ray_report = res.report["ray"]
    assert sorted(names.get(w["node_id"]) for w in ray_report["workers"]) == ["a", "b"]  # one worker per node, each probed
    assert {names.get(s["node_id"]) for s in ray_report["shards"]} == {"a", "b"}  # both wrote shards
    assert all(s["node_id"] != nodes["cluster"].head_node.node_id for s in ray_report["shards"])


def test_a_hub_source_is_fetched_by_each_node_into_its_own_cache(nodes, fake_hub, tmp_path):
    local, state = fake_hub
    faults = nodes["faults"]
    (faults / "hub").write_text(local)
    try:
        for f in faults.glob("downloaded-*"):
            f.unlink()
        convert("someone/tiny-llama", str(tmp_path / "ray"), algo="NVFP4", quiet=True, max_shard_size="1MB", executor="ray")
        fetched = [f.read_text() for f in faults.glob("downloaded-*")]
    finally:
        (faults / "hub").unlink()
    convert(local, str(tmp_path / "local"), algo="NVFP4", quiet=True, max_shard_size="1MB")
    assert output_files(tmp_path / "ray") == output_files(tmp_path / "local")
    assert state["weights_downloaded"] == 0  # the driver fetched no weights
    caches = {n for n, folder in nodes["staging"].items() for p in fetched if p.startswith(folder + os.sep)}
    assert caches == {"a", "b"} and len(fetched) >= 2  # each node into its own cache


def test_a_dst_one_node_does_not_share_is_refused_before_any_shard(nodes, dense, tmp_path):
    for f in nodes["faults"].glob("opened-*"):
        f.unlink()
    (nodes["faults"] / "private-dst").write_text("b")
    try:
        with pytest.raises(DestinationError, match=r"written there by node .* is not visible here; DST must be on storage every Ray node"):
            convert(dense, str(tmp_path / "out"), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray")
    finally:
        (nodes["faults"] / "private-dst").unlink()
    assert not (tmp_path / "out").exists()
    partial = tmp_path / ".out.partial"
    assert not partial.exists() or not list(partial.glob("*.safetensors"))  # nothing written
    assert not list(nodes["faults"].glob("opened-*"))  # no node opened a shard


DRIVER = """
import sys, time
import quantize_cli.output.journal as r
real = r.Journal.append
def slow(self, index, digest):
    real(self, index, digest)
    time.sleep(0.2)
r.Journal.append = slow
from quantize_cli.cli import main
sys.argv = ["quantize"] + sys.argv[1:]
main()
"""


def test_a_driver_killed_mid_run_resumes_on_the_cluster(nodes, dense, local_ref, tmp_path):
    out = tmp_path / "out"
    tasks = len(prepare(dense, "NVFP4", max_shard_size=SHARD).tasks)
    claimed = len(kill_once_journaled(DRIVER, ["convert", dense, "-o", str(out), "--algo", "NVFP4", "--max-shard-size", SHARD,
                                              "--executor", "ray", "--ray-address", nodes["cluster"].address, "-q"],
                                      tmp_path / ".out.partial" / ".quantize-journal", tasks // 3, REPO, timeout=240))
    res = convert(dense, str(out), algo="NVFP4", quiet=True, max_shard_size=SHARD, executor="ray", resume=True)
    assert output_files(out) == local_ref
    assert sum(s["kept"] for s in res.report["ray"]["shards"]) >= claimed >= tasks // 3


def test_a_node_removed_mid_run_has_its_shards_redone_by_the_other(nodes, dense, local_ref, tmp_path, capsys):
    """Node b goes away while it writes: its worker's shards go back to the queue and node a writes
    them (a replacement for b finds no room and is given up); the bytes are a local run's."""
    faults = nodes["faults"]
    for f in faults.glob("opened-*"):
        f.unlink()
    (faults / "slow").touch()
    result: dict = {}

    def run():
        try:
            result["res"] = convert(dense, str(tmp_path / "out"), algo="NVFP4", max_shard_size=SHARD, executor="ray")
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            result["error"] = exc

    driver = threading.Thread(target=run)
    driver.start()
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.is_alive() and not list(faults.glob("opened-b-*")):
            time.sleep(0.05)
        assert driver.is_alive() and list(faults.glob("opened-b-*")), result
        nodes["cluster"].remove_node(nodes["b"], allow_graceful=False)
        driver.join(timeout=400)
    finally:
        (faults / "slow").unlink()
    assert not driver.is_alive()
    assert "error" not in result, result.get("error")
    assert output_files(tmp_path / "out") == local_ref
    err = capsys.readouterr().err
    assert "a worker was lost" in err and "shard(s) go back to the queue" in err, err
    names = node_names(nodes)
    written = {s["shard"]: names.get(s["node_id"]) for s in result["res"].report["ray"]["shards"]}
    assert "a" in written.values()
