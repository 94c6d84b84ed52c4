"""From a calibration's channel statistics to the weights of one plan's scale search.

With calibration data (``--calib-data``, or ``--act-scales`` of version 2), ``--scale-search mse``
minimizes each group's activation-weighted error: the weights of module m are ``E[x_j^2]`` of its
inputs (``schemes/weighted.py`` says why). :func:`for_plan` resolves them for the quantized modules:

* members of a fused group (q/k/v, gate/up, an expert's w1/w3) read the same input and share one
  vector (the same tensor object: a plan pickled for Ray workers carries it once);
* an expert no calibration token reached takes the token-weighted mean of the same projection of
  its layer's experts that were reached (as input scales take their max, ``apply.py``);
* a vector whose length is not the module's in-features, or a module without statistics, is a
  plan error naming the module and the fix.

Without calibration data the search is data-free: a warning says that it can lose accuracy on
decoder LLMs and how to weight it (docs/accuracy.md, "Without data").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..modules.classify import expert_container

if TYPE_CHECKING:
    import torch

DATA_FREE = ("--scale-search mse without calibration data minimizes each weight's own squared error, which can make a "
             "decoder LLM worse than round-to-nearest: an input channel with massive activations amplifies its column's "
             "error thousands of times (SmolLM2-135M: perplexity +{nvfp4} NVFP4, +{w4a16} W4A16_NVFP4); add --calib-data "
             "default (or --act-scales SCALES.json) to weight the search by the activations (docs/accuracy.md)")
DATA_FREE_LOSS = {"nvfp4": "5%", "w4a16": "7%"}  # issue 28's measurement, repeated in docs/accuracy.md


@dataclass
class SearchWeights:
    """Per quantized module: fp32 CPU ``[K]`` ``E[x_j^2]`` (fused members share one tensor)."""

    energy: dict[str, torch.Tensor] = field(default_factory=dict)
    no_tokens: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def of(self, module: str) -> torch.Tensor | None:
        return self.energy.get(module)

    def digest(self) -> str:
        """sha256 over every module's vector: what the searched bytes depend on (resume fingerprint)."""
        import hashlib

        h = hashlib.sha256()
        for name in sorted(self.energy):
            h.update(name.encode() + b"\0" + self.energy[name].numpy().tobytes())
        return h.hexdigest()


def resolve(doc, quantized: dict[str, int], groups: dict[str, list[str]]) -> tuple[SearchWeights, list[str]]:
    """(the weights, problems) for `quantized` (module -> in-features), sharing within `groups`."""
    import torch

    res = SearchWeights(meta={"source": doc.source, "data": doc.data, "file": doc.path})
    problems, tokens, by_slot = [], {}, {}
    where = f"the scales file {doc.path}" if doc.path else "the calibration run"
    for name, k in quantized.items():
        e, t = doc.channel_energy(name), int((doc.modules.get(name) or {}).get("tokens", 0))
        if e is None or t == 0:
            continue
        if e.numel() != k:
            problems.append(f"{name}: {where} records {e.numel()} input channels but the weight has {k} in-features; "
                            "calibrate this source again")
            continue
        res.energy[name], tokens[name] = e, t
        if expert_container(name):
            by_slot.setdefault(_slot(name), []).append(name)
    for name in quantized:
        if name in res.energy or any(name in p for p in problems):
            continue
        peers = by_slot.get(_slot(name)) if expert_container(name) else None
        if peers and res.energy[peers[0]].numel() == quantized[name]:
            res.energy[name] = _mean([res.energy[p] for p in peers], [tokens[p] for p in peers], torch)
            tokens[name] = 0
            res.no_tokens.append(name)
        else:
            problems.append(f"{name}: --scale-search mse weights the search by the calibration inputs but {where} has no "
                            f"channel statistics for it; calibrate this source again, or --exclude {name!r}")
    for members in groups.values():
        got = [m for m in members if m in res.energy]
        if len(got) == len(members) > 1:
            vs = [res.energy[m] for m in members]
            shared = vs[0] if all(torch.equal(vs[0], v) for v in vs[1:]) else _mean(vs, [max(1, tokens[m]) for m in members], torch)
            for m in members:
                res.energy[m] = shared
    return res, problems


def _mean(vectors, weights, torch):
    """Token-weighted mean of fp32 vectors (fp64 sums)."""
    total = sum(weights) or len(vectors)
    acc = sum(v.double() * (w or 1) for v, w in zip(vectors, weights))
    return (acc / total).float()


def _slot(name: str) -> tuple[str, str]:
    return expert_container(name) or "", name.rpartition(".")[2]


def for_plan(doc, mods: dict, groups: dict, scheme, findings: list) -> SearchWeights | None:
    """The plan's search weights (None: not a weighted search); problems and notices become
    `findings` (extended in place)."""
    from ..problems import ERROR, WARNING, Finding

    if getattr(scheme, "scale_search", "none") == "none":
        return None
    if doc is None:
        findings.append(Finding(WARNING, "search-data-free", scheme.algo, DATA_FREE.format(**DATA_FREE_LOSS)))
        return None
    if getattr(doc, "planned", False):  # a dry run with --calib-data: the real run weights the search
        return None
    if not doc.has_channels:
        findings.append(Finding(WARNING, "search-data-free", scheme.algo, f"--act-scales {doc.path}: no per-channel statistics (a "
                                "version-1 scales file, or its .channels.safetensors is not beside it), so --scale-search mse is data-free (it can make a decoder LLM "
                                "worse); make the file again with `quantize calibrate` to weight the search"))
        return None
    quantized = {m.name: m.weight.shape[-1] for m in mods.values() if m.quantize and m.weight is not None}
    shared = {k: [m.name for m in v] for k, v in groups.items() if all(m.quantize for m in v)}
    res, problems = resolve(doc, quantized, shared)
    findings.extend(Finding(ERROR, "search-weights", p.split(":")[0], p) for p in problems)
    if res.no_tokens:
        findings.append(Finding(WARNING, "search-experts-no-tokens", "experts", f"{len(res.no_tokens)} expert Linear(s) received "
                                f"no calibration token (e.g. {res.no_tokens[0]}); their search is weighted by their layer's experts' mean"))
    return res


__all__ = ["SearchWeights", "resolve", "for_plan", "DATA_FREE"]
