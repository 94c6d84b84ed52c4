"""The eval result: text for humans, JSON for CI (``--json``), and the gate.

Gates (each needs ``--source``). A causal LM: ``--max-ppl-increase PCT`` (perplexity increase over
the source, percent), ``--max-kl X`` (mean KL of the next-token distributions, nats),
``--min-top1 F`` (top-1 agreement, 0..1). An encoder: ``--min-cosine C`` (the mean over samples of
the cosine of the mean-pooled embeddings to the source's) and ``--min-sample-cosine C`` (the lowest
sample's). A gate of the other kind of model is refused. A failed gate makes ``quantize eval`` exit
1 with the figure that failed; the JSON is written either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import display

SCHEMA_VERSION = 1  # docs/ci.md: bumped when a key is removed or changes meaning

# gate name -> (metric key, direction, how the limit is said, the kind of model it measures)
GATES = {"max_ppl_increase": ("perplexity_increase_pct", "max", "--max-ppl-increase", "causal-lm"),
         "max_kl": ("kl_mean", "max", "--max-kl", "causal-lm"),
         "min_top1": ("top1_agreement", "min", "--min-top1", "causal-lm"),
         "min_cosine": ("embedding_cosine_mean", "min", "--min-cosine", "encoder"),
         "min_sample_cosine": ("embedding_cosine_min", "min", "--min-sample-cosine", "encoder")}
_SAID = {"max_ppl_increase": "perplexity increase (%)", "max_kl": "mean KL (nats)", "min_top1": "top-1 agreement",
         "min_cosine": "mean embedding cosine", "min_sample_cosine": "lowest sample's embedding cosine"}


@dataclass
class Gate:
    """One threshold and its outcome."""

    name: str
    option: str
    limit: float
    value: float
    ok: bool

    def to_json(self) -> dict:
        return {"name": self.name, "option": self.option, "limit": self.limit, "value": _num(self.value), "ok": self.ok}

    def text(self) -> str:
        """``top-1 agreement 0.84 is below --min-top1 0.9`` (failed) or ``... 0.95 >= 0.9: ok``."""
        what = _SAID[self.name]
        if self.ok:
            return f"{what} {_fmt(self.value)} {'<=' if self.name.startswith('max') else '>='} {self.option} {self.limit:g}: ok"
        return f"{what} {_fmt(self.value)} is {'above' if self.name.startswith('max') else 'below'} {self.option} {self.limit:g}"


@dataclass
class EvalResult:
    """What ``quantize eval`` measured (see docs/accuracy.md for every field)."""

    dst: str
    source: str | None
    kind: str  # "causal-lm" | "encoder"
    checkpoint: dict  # format, quant_algo, layout, quantized Linears by algorithm and activation rule, kv cache
    data: dict  # spec, sha256, samples, seq_len, tokens; calibration overlap
    metrics: dict
    layers: list[dict] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    run: dict = field(default_factory=dict)  # device, dtype, versions, seconds, peak blocks
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(g.ok for g in self.gates)

    @property
    def failed(self) -> list[Gate]:
        return [g for g in self.gates if not g.ok]

    def to_json(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "command": "eval", "path": self.dst, "source": self.source,
                "ok": self.passed, "kind": self.kind, "checkpoint": self.checkpoint, "data": self.data,
                "metrics": {k: _num(v) for k, v in self.metrics.items()},
                "layers": [{k: _num(v) for k, v in row.items()} for row in self.layers],
                "gates": [g.to_json() for g in self.gates], "run": self.run, "warnings": list(self.warnings)}

    def to_text(self) -> str:
        ck, d = self.checkpoint, self.data
        lines = [f"eval: {display(self.dst)} ({ck.get('format') or 'unquantized'} {ck.get('quant_algo') or ''}".rstrip()
                 + f", {ck.get('quantized_linears', 0)} quantized Linear(s)" + (f") vs {display(self.source)}" if self.source else ")")]
        for row in ck.get("served", []):
            lines.append(f"  {row['count']:>5} x {row['algo']:<26} activations: {row['activations']}")
        if ck.get("kv_cache"):
            lines.append(f"  KV cache FP8: {ck['kv_cache']}")
        lines.append(f"data: {display(str(d.get('spec')))}: {d.get('samples')} sample(s), {d.get('tokens')} tokens "
                     f"(<= {d.get('seq_len')} per sample); {d.get('overlap_text', '')}")
        if self.layers:
            lines.append("layer  hidden-state error  own error (vs the source, on the source's inputs)")
            lines += [f"{r['layer']:>5}  {_fmt(r['hidden_rel_error']):>18}  {_fmt(r['own_rel_error']):>9}" for r in self.layers]
        lines += [f"warning: {display(w)}" for w in self.warnings]
        lines += [f"gate {g.text()}" for g in self.gates]
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        """The last line: PASS / FAIL (or a plain summary without gates) and the key numbers."""
        m = self.metrics
        if self.kind == "encoder":
            figures = (f"embedding cosine mean {_fmt(m.get('embedding_cosine_mean'))}, min {_fmt(m.get('embedding_cosine_min'))}"
                       if "embedding_cosine_mean" in m else "no source: nothing to compare")
        elif "source_perplexity" in m:
            figures = (f"perplexity {_fmt(m['perplexity'])} vs {_fmt(m['source_perplexity'])} ({m['perplexity_increase_pct']:+.2f}%), "
                       f"KL {_fmt(m['kl_mean'])}, top-1 {_fmt(m['top1_agreement'])}, "
                       f"nll {m['nll_delta']:+.4f} +- {2 * m['nll_delta_se']:.4f}")
        else:
            figures = f"perplexity {_fmt(m.get('perplexity'))} over {m.get('positions')} positions"
        head = "eval: " if not self.gates else ("eval: PASS: " if self.passed else "eval: FAIL: ")
        return head + figures


def check_gates(metrics: dict, limits: dict) -> list[Gate]:
    """The gates asked for (`limits`: gate name -> limit or None) against `metrics`."""
    out = []
    for name, limit in limits.items():
        if limit is None:
            continue
        key, direction, option, _ = GATES[name]
        value = float(metrics[key])
        ok = value <= limit if direction == "max" else value >= limit
        out.append(Gate(name, option, float(limit), value, ok and not math.isnan(value)))
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.3e}"


def _num(v):
    """JSON has no inf/nan: they are written as strings."""
    return str(v) if isinstance(v, float) and not math.isfinite(v) else v


def refusal_json(dst: str, source: str | None, exc) -> dict:
    """``--json`` when eval refused (no figures): ``ok`` false, the one-line error and its exit code."""
    return {"schema_version": SCHEMA_VERSION, "command": "eval", "path": dst, "source": source, "ok": False,
            "error": exc.message, "exit_code": exc.exit_code}


def gate_failure(dst: str, result: "EvalResult") -> str:
    """The one-line refusal when `result`'s gates failed (``quantize eval`` and ``convert --eval``)."""
    failed = "; ".join(g.text() for g in result.failed)
    return (f"eval gate failed for {dst}: {failed}; the checkpoint loses more accuracy than allowed "
            "(calibrate with --calib-data, exclude the layers with the largest own error, or use a finer algorithm)")

