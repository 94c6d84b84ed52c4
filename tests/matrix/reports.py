"""The ``--report`` JSON against the bytes and the options (matrix checks; problems are appended, not raised)."""

from __future__ import annotations

from .cells import calibrated
from .describe import CT, Output, algos_in_bytes, close, input_scales, kv_scales


def check_report(doc: dict, out: Output, o: dict, fmt: str, status: str, problems: list) -> None:
    """Status, recorded options, per-tensor scheme, calibration (yes/no, scale values, KV), verify, publish.

    `o`: the cell's option values (cells.FACTORS names).
    """
    if doc.get("status") != status:
        problems.append(f"report: status {doc.get('status')!r}, want {status!r}")
    opts = doc.get("options") or {}
    want = {"algo": o["algo"], "format": fmt, "layout": o["layout"], "kv_cache_dtype": "fp8" if o["kv"] == "fp8" else None,
            "scale_search": o["scale_search"], "calibrated": o["calibration"] != "none", "mixed": o["algo_for"] == "mixed",
            "calibrated_effect": calibrated(o)}
    got = {"algo": opts.get("algo"), "format": opts.get("format", "modelopt"), "layout": opts.get("layout"),
           "kv_cache_dtype": opts.get("kv_cache_dtype"), "scale_search": opts.get("scale_search"),
           "calibrated": bool(opts.get("calibration")), "mixed": bool(opts.get("algo_for"))}
    if o["calibration"] != "none" and not want["calibrated_effect"]:
        del got["calibrated"], want["calibrated"]  # ignored scales (a warning says so) may be recorded or not
    want.pop("calibrated_effect")
    if got != want:
        problems.append(f"report: options {({k: got[k] for k in got if got[k] != want[k]})}, the run used {({k: want[k] for k in got if got[k] != want[k]})}")
    schemes = {t["name"].rpartition(".")[0]: t.get("scheme") for t in doc.get("tensors", []) if t.get("action") == "quantize"}
    in_bytes = algos_in_bytes(out)
    if schemes != in_bytes:
        diff = sorted(m for m in set(schemes) | set(in_bytes) if schemes.get(m) != in_bytes.get(m))
        problems.append(f"report: per-tensor scheme differs from the bytes on {len(diff)} module(s), e.g. {diff[:1]} "
                        f"report {schemes.get(diff[0]) if diff else None}, bytes {in_bytes.get(diff[0]) if diff else None}")
    _check_calibration(doc.get("calibration"), out, fmt, calibrated(o), o["kv"] == "fp8", problems)
    if (o["verify"] == "on") != isinstance(doc.get("verify"), dict) or (o["verify"] == "on" and doc["verify"].get("errors") != 0):
        problems.append(f"report: verify entry {doc.get('verify')!r} with --verify {o['verify']}")
    pub = doc.get("publish")
    if (o["push"] == "on") != (isinstance(pub, dict) and pub.get("status") == "ok"):
        problems.append(f"report: publish entry {pub!r} with --push-to-hub {o['push']}")


def _check_calibration(cal, out: Output, fmt: str, calibrated: bool, kv: bool, problems: list) -> None:
    static = input_scales(out, fmt)
    if not static and not calibrated:
        if cal not in (None, {}) and cal.get("calibrated"):
            problems.append(f"report: calibration {cal!r} but nothing is calibrated")
        return
    if not isinstance(cal, dict) or bool(cal.get("calibrated")) != calibrated:
        problems.append(f"report: calibration {str(cal)[:120]!r}, want calibrated={calibrated} "
                        f"(bytes: {len(static)} static input scale(s))")
        return
    if not calibrated:
        value = cal.get("input_scale")
        # the report's constant is a Python float (1/6), the bytes' an fp32 (or bf16 for compressed-tensors)
        tol = 2 ** -7 if fmt == CT else 1e-6
        if not isinstance(value, (int, float)):  # several algorithms: the value of each module's own
            value = {m: (cal.get("per_module") or {}).get(m, {}).get("input_scale") for m in static}
        want = value if isinstance(value, dict) else dict.fromkeys(static, value)
        wrong = sorted(m for m, v in static.items() if not isinstance(want.get(m), (int, float)) or abs(v - want[m]) > tol * v)
        if wrong:
            problems.append(f"report: says every input_scale is {value}, but {wrong[0]} holds {static[wrong[0]]:.6g} ({len(wrong)} module(s))")
        return
    per = cal.get("per_module") or {}
    wrong = [m for m, v in static.items() if not isinstance((per.get(m) or {}).get("input_scale"), (int, float))
             or not close(v, per[m]["input_scale"], fmt)]
    if wrong:
        m = wrong[0]
        problems.append(f"report: per-module input_scale of {m} is {(per.get(m) or {}).get('input_scale')}, the bytes hold "
                        f"{static[m]:.6g} ({len(wrong)} module(s) differ)")
    kvs = kv_scales(out)
    said = {}
    for attn, e in (cal.get("kv") or {}).items():
        said[f"{attn}.k_proj.k_scale"], said[f"{attn}.v_proj.v_scale"] = e.get("k_scale"), e.get("v_scale")
    if kv and any(said.get(n) is None or abs(said[n] - v) > 1e-6 * v for n, v in kvs.items()):
        problems.append(f"report: KV scales {dict(list(said.items())[:2])}, the bytes hold {dict(list(kvs.items())[:2])}")


__all__ = ["check_report", "CT"]
