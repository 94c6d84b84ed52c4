"""What every output format provides: the one interface the plan, the executors, the output
lifecycle and the readers (verify, inspect, unpack, eval, the card) ask of a format.

A format is one object (``formats/modelopt.py``, ``formats/compressed_tensors.py``); the rest of
the tool never tests which format it holds, it asks the object. A third format is one new module
implementing this class and one line in ``formats/__init__.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from ..modules.classify import Module
    from ..problems import Problem
    from ..schemes import Scheme


@dataclass(frozen=True)
class Served:
    """Which stock engines load one algorithm in one format (from their loaders' source; docs/formats.md).

    vllm / vllm_moe: vLLM 0.33 serves its Linears / its MoE experts when the checkpoint holds this one
    algorithm; mixed / mixed_moe: the same inside a checkpoint holding several algorithms;
    trtllm, sglang: TensorRT-LLM and SGLang load it.
    """

    vllm: bool = False
    vllm_moe: bool = False
    mixed: bool = False
    mixed_moe: bool = False
    trtllm: bool = False
    sglang: bool = False


class Format:
    """One output format. Subclasses fill the tables and implement the methods."""

    name: str = ""
    config_method: str = ""  # config.json quantization_config.quant_method of its checkpoints
    transformers_loads: bool = False  # transformers quantizes/dequantizes it on load (as opposed to skipping it)
    reference_math_only: bool = False  # its weights are computed by the torch references on every device
    # its documents record what decides the bytes beyond the shapes (calibration, GPTQ/smoothing, search,
    # recipe): a finished output without its seal can be compared through them (output/workfolder.py)
    documents_record_run: bool = False
    served: Mapping[str, Served] = {}
    hub_tags: tuple[str, ...] = ()  # the model card's extra Hub tags for this format

    # --- the model card ---------------------------------------------------------------------

    def card_how(self) -> str:
        """The card's words for the format an output is written in."""
        return f"the {self.name} format (`quant_method: {self.config_method}`)"

    def card_where(self, quant_algo: str | None) -> str:
        """The card's words for where the quantization is recorded (`quant_algo`: the output's)."""
        return "`quantization_config` in config.json"

    # --- planning ---------------------------------------------------------------------------

    def scheme(self, algo: str) -> Scheme:
        """The scheme writing `algo` in this format; a UsageError when the format has none."""
        raise NotImplementedError

    def written_as(self, scheme: Scheme) -> str:
        """How this format's documents name `scheme` (the --dry-run plan line): ModelOpt's quant_algo."""
        return f"quant_algo {scheme.quant_algo!r}"

    def layout_problem(self, layout: str | None) -> str | None:
        """Why ``--layout`` `layout` cannot be written in this format (None: it can)."""
        return None

    def scale_search_problem(self, method: str, algo: str | None = None) -> str | None:
        """Why ``--scale-search`` `method` (for ``--algo`` `algo`) cannot be written in this format (None: it can)."""
        return None

    def exclusion_list(self, mods: Mapping[str, Module], packed: Mapping[str, Iterable[str]]) -> list[str]:
        """The list of unquantized modules the format writes (``exclude_modules`` / ``ignore``)."""
        raise NotImplementedError

    def misread(self, mods: Mapping[str, Module], entries: list[str], packed: Mapping[str, Iterable[str]]) -> list[Problem]:
        """Where vLLM would read `entries` otherwise than planned (rule ``exclude-misread``)."""
        raise NotImplementedError

    def shape_problems(self, mods, groups, scheme, recipe, config: dict, tp: int, schemes=None) -> list[Problem]:
        """Shape rules of this format beyond the scheme's own (none by default)."""
        return []

    def mixed_where(self) -> str:
        """How a checkpoint with several algorithms is written, for messages."""
        raise NotImplementedError

    def vllm_decisions(self, plan) -> dict[str, str]:
        """vLLM module prefix -> the method vLLM picks, where this tool replays it (else empty)."""
        return {}

    # --- writing ----------------------------------------------------------------------------

    def documents(self, plan) -> dict[str, bytes]:
        """File name -> the bytes of each metadata document a plan's output carries (pure function)."""
        raise NotImplementedError

    # --- reading back -----------------------------------------------------------------------

    def detect(self, config: dict | None, folder: str) -> bool:
        """True when the checkpoint folder (its config.json `config`) is written in this format."""
        return isinstance(config, dict) and (config.get("quantization_config") or {}).get("quant_method") == self.config_method

    def verify(self, path: str, config: dict, res, source: str | None, method: dict | None = None) -> None:
        """Fill `res` (formats.readback.VerifyResult) with this format's findings for `path`; `method`:
        how the weights were made (``--rounding`` / ``--smooth``) when the caller knows it, else the
        output's own record is read (a format whose documents hold it reads them either way)."""
        raise NotImplementedError

    def output_facts(self, folder: str) -> dict:
        """What a finished output of this format holds, read back from its documents:
        ``{"algos": {ALGO: modules}, "kv_cache_dtype": "fp8" | None, "layout": name}``."""
        raise NotImplementedError

    def describe(self, folder: str) -> str:
        """One line for ``quantize inspect``."""
        raise NotImplementedError

    # --- serving (the card) -----------------------------------------------------------------

    def engines(self, algos: Iterable[str]) -> list[str]:
        """The engines that serve an output holding `algos` in this format (the card's prose and serve lines).

        One algorithm: each engine whose column says so; several: vLLM only, where its mixed path
        serves each (TensorRT-LLM's and SGLang's mixed paths were not checked)."""
        algos = set(algos)
        rows = [self.served.get(a, Served()) for a in algos]
        single = len(rows) == 1
        out = []
        if rows and all(r.vllm if single else r.mixed for r in rows):
            out.append("vLLM")
        if rows and single and rows[0].trtllm:
            out.append("TensorRT-LLM")
        if rows and single and rows[0].sglang:
            out.append("SGLang")
        if self.transformers_loads:
            out.append("transformers")
        return out

    def serve_lines(self, algos: Iterable[str], kv_cache_dtype: str | None, repo: str) -> list[str]:
        """Shell lines that serve an output holding `algos`, one per engine of :meth:`engines`."""
        kv = " --kv-cache-dtype fp8" if kv_cache_dtype else ""
        commands = {
            "vLLM": f"vllm serve {repo}{kv}   # vLLM reads the quantization from config.json",
            "TensorRT-LLM": f"trtllm-serve {repo}   # TensorRT-LLM reads hf_quant_config.json",
            "SGLang": f"python -m sglang.launch_server --model-path {repo}",
            "transformers": (f'python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained(\'{repo}\')"'
                             "   # transformers decompresses it on load (pip install compressed-tensors)"),
        }
        return [commands[e] for e in self.engines(algos)]

    def mixed_served(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(algorithms vLLM serves per Linear, per MoE layer) inside a mixed checkpoint."""
        return (tuple(a for a, s in self.served.items() if s.mixed), tuple(a for a, s in self.served.items() if s.mixed_moe))

    def moe_unserved(self, algo: str) -> bool:
        """vLLM serves `algo`'s dense Linears in this format but not its MoE experts (a single-algorithm
        checkpoint): the experts must be excluded or another algorithm chosen. An algorithm vLLM does not
        serve at all is said once, for the whole checkpoint (plan/validate.py's ``*-vllm`` warning)."""
        s = self.served.get(algo, Served())
        return s.vllm and not s.vllm_moe


__all__ = ["Format", "Served"]
