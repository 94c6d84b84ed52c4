"""quantize eval on a GPU gives the CPU's figures (run on the GPU machine: pytest -m gpu tests/eval)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import convert
from quantize_cli import api
from quantize_cli.eval import run_eval
from tests.calibration import builders
from tests.eval.test_eval import jsonl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "NVFP4", "MXFP8", "W4A16_NVFP4"])
def test_gpu_equals_cpu(tmp_path, algo):
    src = builders.llama(str(tmp_path / "src"))
    dst = convert(src, str(tmp_path / "dst"), algo=algo, device="cpu", quiet=True, kv_cache_dtype="fp8",
                      calib_data=jsonl(tmp_path / "c.jsonl") if algo in ("FP8", "NVFP4") else None).dst
    data = jsonl(tmp_path / "d.jsonl")
    got = {}
    for dev in ("cpu", "cuda"):
        caught = []
        r = run_eval(dst, source=src, data=data, device=dev, observe=lambda d, s: caught.append(d.cpu()))
        got[dev] = (torch.cat(caught), r)
    (a, ra), (b, rb) = got["cpu"], got["cuda"]
    assert rb.run["device"].startswith("cuda") and rb.run["peak_blocks_materialized"] == 2
    # GPU fp32 GEMMs sum in another order: mostly 1e-6, but an activation on a rounding boundary may flip a code
    kl = torch.nn.functional.kl_div(torch.log_softmax(b, -1), torch.log_softmax(a, -1), log_target=True, reduction="batchmean")
    # (a random tiny model has near-ties: FP8_PER_CHANNEL_PER_TOKEN flipped 1 of 33 on an H100). The top-1
    # must agree wherever the CPU's two best logits are apart by more than that position's logits moved.
    top2 = a.topk(2, -1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * (a - b).abs().amax(-1)
    assert kl < 1e-4, ((a - b).abs().max(), kl)
    assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear]), clear.float().mean()
    assert ra.metrics["positions"] == rb.metrics["positions"]
    assert abs(ra.metrics["perplexity"] - rb.metrics["perplexity"]) < 1e-3 * ra.metrics["perplexity"]
