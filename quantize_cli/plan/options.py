"""``convert``'s options as one frozen value, built alike by the CLI and the library.

Every field is the library keyword of the same name (and the CLI flag with dashes): the CLI builds
``ConvertOptions(src=..., dst=..., **flags)``, ``api.convert(src, dst, algo=..., ...)`` builds it
from its keywords, and ``api.run(options)`` checks it once (usage errors first, before anything is
read) and runs it. Torch-free, so building options costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ConvertOptions:
    """What ``quantize convert`` was asked to do (see docs/cli.md for each option)."""

    src: str
    dst: str | None = None
    algo: str = "FP8_PB_WO"
    exclude: tuple[str, ...] = ()
    recipe: str | None = None
    layout: str = "plain"
    device: str = "auto"
    kv_cache_dtype: str | None = None
    max_shard_size: str | int = "5GB"
    memory_budget: str | int = "4GB"
    resume: bool = False
    dry_run: bool = False
    overwrite: bool = False
    report: str | None = None
    revision: str | None = None
    quiet: bool = False
    verify: bool = False
    low_disk: bool = False
    scale_search: str = "none"
    calib_data: str | None = None
    calib_samples: int | None = None
    calib_seq_len: int | None = None
    act_scales: str | None = None
    push_to_hub: str | None = None
    private: bool = False
    revision_out: str | None = None
    executor: str = "local"
    ray_address: str | None = None
    format: str = "modelopt"
    algo_for: tuple[str, ...] = ()
    kernels: str = "auto"
    base_model: str | None = None
    strict: bool = False  # warnings known before the first byte are errors (plan/preflight.py)
    allow: tuple[str, ...] = ()  # with strict: warning codes accepted (--allow int8-vllm), as check --allow
    eval: bool = False  # `quantize eval` of the finished work folder against SRC, before it becomes DST (eval/)
    max_ppl_increase: float | None = None  # --eval's gates (eval/report.py): the run fails and DST is not written
    max_kl: float | None = None
    min_top1: float | None = None
    min_cosine: float | None = None  # an encoder's gates: the mean and the lowest sample's embedding cosine
    min_sample_cosine: float | None = None
    eval_data: str | None = None  # --eval's text and size (eval's defaults: the held-out `default`, 64 x 512)
    eval_samples: int | None = None
    eval_seq_len: int | None = None
    rounding: str = "nearest"  # gptq: GPTQ in the calibration forward (calibration/weights_entry.py)
    smooth: str = "none"  # awq | smoothquant: scales folded into the weights (calibration/smooth.py)

    def __post_init__(self):
        # Lists from library callers become tuples: the value stays immutable (and hashable).
        for name in ("exclude", "algo_for"):
            object.__setattr__(self, name, tuple(getattr(self, name) or ()))
        object.__setattr__(self, "src", str(self.src))
        if self.dst is not None:
            object.__setattr__(self, "dst", str(self.dst))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The keyword names, in ``api.convert``'s order."""
        return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class Checked:
    """What checking the options resolved (``convert``'s first step): budget (--memory-budget in
    bytes), format (the output format object, formats/), on_hub (SRC is a Hub repo id)."""

    budget: int
    format: object
    on_hub: bool


__all__ = ["ConvertOptions", "Checked"]
