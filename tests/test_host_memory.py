"""--memory-budget counts the process's own memory: in flight = budget - baseline RSS, with a floor."""

import json
import os
import subprocess
import sys
import textwrap

import torch

from quantize_cli.run import host_memory
from quantize_cli.run.host_memory import MIN_INFLIGHT, inflight_limit, rss_bytes, warm_baseline


def test_the_baseline_comes_off_the_budget_down_to_a_floor():
    gb = 1 << 30
    assert inflight_limit(4 * gb, int(2.4 * gb)) == (4 * gb - int(2.4 * gb), None)
    limit, warning = inflight_limit(2 * gb, int(2.4 * gb), "2GB")
    assert limit == MIN_INFLIGHT and "--memory-budget 2GB" in warning and "give a budget above" in warning
    assert inflight_limit(1 << 20, 300 << 20)[0] == (1 << 20) // 4  # a tiny budget: a quarter of it, never more


def test_rss_is_measured():
    rss = rss_bytes()
    assert 50 << 20 < rss < 64 << 30  # torch is imported: tens of MB at least
    assert warm_baseline(torch.device("cpu")) > 0


def test_reads_granted_but_not_resident_never_make_the_baseline_negative(monkeypatch):
    """Session 12 on the GPU machine: RSS 2.0 GB once warm, 2.4 GB granted to reads of which little
    was allocated yet: the baseline read -0.36 to -1.0 GB and the in-flight limit exceeded the budget."""
    gb = 1 << 30
    monkeypatch.setattr(host_memory, "rss_bytes", lambda: 2 * gb)
    cpu = torch.device("cpu")
    assert warm_baseline(cpu, in_flight=int(2.4 * gb), floor=int(0.6 * gb)) == int(0.6 * gb)
    assert warm_baseline(cpu, in_flight=gb // 2, floor=int(0.6 * gb)) == int(1.5 * gb)
    assert warm_baseline(cpu) == 2 * gb


def test_on_cuda_what_reads_hold_is_the_pinned_pool(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(host_memory, "_pinned_pool_bytes", lambda: 3 << 29)
    assert host_memory.held_in_flight(SimpleNamespace(type="cuda"), granted=5 << 30) == 3 << 29
    assert host_memory.held_in_flight(torch.device("cpu"), granted=5 << 30) == 5 << 30


def _run(plan, folder, monkeypatch, baseline, **kw):
    import quantize_cli.run.execute as ex
    from quantize_cli.checkpoint.writer import ShardWriter

    monkeypatch.setattr(host_memory, "rss_bytes", lambda: baseline)  # a constant RSS: warm_baseline reads it
    monkeypatch.setattr(ex, "rss_bytes", lambda: baseline)  # the RSS before the first read
    monkeypatch.setattr(ex, "startup_baseline", lambda device: baseline)
    folder.mkdir()
    w = ShardWriter(str(folder), plan.outputs, plan.shard_names)
    w.open()
    stats = ex.Executor(plan, w, torch.device("cpu"), chunk_bytes=64 << 10, hold_bytes=64 << 10, **kw).run()
    w.close()
    return stats


def test_the_executor_keeps_budget_minus_baseline_in_flight(tiny_llama, tmp_path, monkeypatch):
    from quantize_cli.api import prepare
    from tests.conftest import output_files

    plan = prepare(tiny_llama, "NVFP4")
    mb = 1 << 20
    alone = _run(plan, tmp_path / "a", monkeypatch, 3 * mb, budget_bytes=4 * mb)  # the budget counts only what is in flight
    counted = _run(plan, tmp_path / "b", monkeypatch, 3 * mb, budget_bytes=4 * mb, process_budget=4 * mb)
    assert alone.peak_inflight > 2 * mb and not alone.warnings and alone.baseline_rss == 0
    # the RSS is a constant 3 MB here, before the first read too: the baseline is exactly that
    assert counted.baseline_rss == 3 * mb and not counted.warnings
    assert counted.peak_inflight <= 4 * mb - counted.baseline_rss + (256 << 10) < alone.peak_inflight
    over = _run(plan, tmp_path / "c", monkeypatch, 10 * mb, budget_bytes=4 * mb, process_budget=4 * mb)
    assert over.peak_inflight <= mb + (256 << 10) and "already holds" in over.warnings[0]  # the floor: a quarter
    assert output_files(tmp_path / "a") == output_files(tmp_path / "b") == output_files(tmp_path / "c")


def test_the_report_records_the_baseline(tiny_llama, tmp_path):
    from tests.conftest import convert

    convert(tiny_llama, str(tmp_path / "o"), algo="FP8", device="cpu", quiet=True, report=str(tmp_path / "r.json"))
    assert json.load(open(tmp_path / "r.json"))["bytes"]["baseline_rss"] > 50 << 20


def test_before_the_cuda_context_exists_its_size_is_counted(monkeypatch):
    """Reads start while the context is being created: they must not fill what the context takes."""
    import torch

    from quantize_cli.run import host_memory

    monkeypatch.setattr(host_memory, "rss_bytes", lambda: 700 << 20)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert host_memory.startup_baseline(torch.device("cuda")) == (700 << 20) + host_memory.CUDA_CONTEXT_ESTIMATE
    assert host_memory.startup_baseline(torch.device("cpu")) == 700 << 20
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # already in the RSS: not counted twice
    assert host_memory.startup_baseline(torch.device("cuda")) == 700 << 20


def test_the_pinned_pool_is_given_back_when_over_the_limit(monkeypatch):
    """Cached pinned blocks count in RSS: over the in-flight limit they go back to CUDA (torch frees only unused ones)."""
    import torch

    from quantize_cli.run import host_memory

    emptied = []
    monkeypatch.setattr(host_memory, "_empty_host_cache", lambda: lambda: emptied.append(1))
    stats = {"allocated_bytes.current": 5 << 30}
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: stats)
    pool = host_memory.PinnedPool(torch.device("cuda"), limit=3 << 30)
    pool.trim()
    assert emptied == [1] and pool.trims == 1
    stats["allocated_bytes.current"] = 2 << 30  # within the limit: kept for reuse (pinning again is slow)
    pool.trim()
    assert emptied == [1]
    cpu = host_memory.PinnedPool(torch.device("cpu"), limit=0)  # no pinned memory on the CPU path
    cpu.trim()
    assert emptied == [1] and cpu.trims == 0


def test_pinned_budgets_count_the_blocks_torch_allocates():
    from quantize_cli.run.pipeline import ByteBudget, pinned_block

    assert [pinned_block(n) for n in (0, 1, 3, 4, 5, 117 << 20)] == [0, 1, 4, 4, 8, 128 << 20]
    b = ByteBudget(256 << 20, pinned=True)
    b.acquire(117 << 20)  # a 4096 x 14336 bf16 row block: a 128 MB pinned block
    assert b.used == 128 << 20
    b.release(117 << 20)
    assert b.used == 0 and b.peak == 128 << 20
    plain = ByteBudget(256 << 20)
    plain.acquire(117 << 20)
    assert plain.used == 117 << 20


def test_pinned_allocator_settings_are_added_to_what_the_user_gave(monkeypatch):
    monkeypatch.setattr(host_memory.os, "cpu_count", lambda: 6)
    env = {}
    assert host_memory.configure_pinned_allocator(env) == "PYTORCH_CUDA_ALLOC_CONF"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:True,pinned_num_register_threads:4"}  # a power of two
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,pinned_num_register_threads:2"}
    host_memory.configure_pinned_allocator(env)  # the user's own value stays; only what is missing is added
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,pinned_num_register_threads:2,pinned_use_cuda_host_register:True"
    env = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}  # torch reads this one first: extended, the other left alone
    assert host_memory.configure_pinned_allocator(env) == "PYTORCH_ALLOC_CONF"
    assert env == {"PYTORCH_ALLOC_CONF": "expandable_segments:True,pinned_use_cuda_host_register:True,pinned_num_register_threads:4"}
    env = {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:False,pinned_num_register_threads:1"}
    assert host_memory.configure_pinned_allocator(env) is None
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "pinned_use_cuda_host_register:False,pinned_num_register_threads:1"}
    monkeypatch.setattr(host_memory.os, "cpu_count", lambda: 64)
    env = {}
    host_memory.configure_pinned_allocator(env)
    assert env["PYTORCH_CUDA_ALLOC_CONF"].endswith("pinned_num_register_threads:8")


def test_convert_sets_the_pinned_allocator_before_it_imports_torch(tmp_path):
    """The CLI process asks for the settings before torch is imported (it may read them then); the
    spy prints the variable as torch's import starts."""
    spy = textwrap.dedent(f"""
        import importlib.abc, os, sys
        class Spy(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch":
                    print("AT_TORCH_IMPORT", os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), file=sys.stderr)
                    sys.meta_path.remove(self)
                return None
        sys.meta_path.insert(0, Spy())
        from quantize_cli.cli import main
        sys.argv = ["quantize", "convert", "example:tiny-llama", "-o", {str(tmp_path / "out")!r}, "--algo", "FP8_PB_WO",
                    "--device", "cpu", "--quiet"]
        main()
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    p = subprocess.run([sys.executable, "-c", spy], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    line = next(ln for ln in p.stderr.splitlines() if ln.startswith("AT_TORCH_IMPORT"))
    assert "pinned_use_cuda_host_register:True" in line, line
