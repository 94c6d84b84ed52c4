"""Fuzzing the parsers that read strangers' bytes: ``read_header`` and ``open_source``.

Every generated input must either parse (and then obey the invariants: every tensor inside the
file, no overlaps) or raise :class:`SourceError`; any other exception is a bug. Allocation is
bounded: the header parser's peak traced memory stays small whatever length the header claims.
Runs are derandomized (same inputs on every run, CI-stable) and sized to take seconds; the
counts actually tried are printed with ``-s`` and recorded in docs/robustness.md.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tracemalloc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save

from quantize_cli.checkpoint.safetensors_io import read_header
from quantize_cli.checkpoint.source import open_source
from quantize_cli.errors import SourceError

from .helpers import CFG, pack


def fuzz_settings(n: int):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )


HEADER_EXAMPLES = 1000  # per read_header target (5 targets)
SOURCE_EXAMPLES = 600  # open_source on generated folders
PEAK_LIMIT = 8 << 20  # bytes of Python allocation allowed while parsing one (small) file

TRIED: dict[str, int] = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module", autouse=True)
def print_counts():
    yield
    for name, n in TRIED.items():
        print(f"\nfuzz inputs tried: {name}: {n}")


def _valid_tensors():
    g = torch.Generator().manual_seed(0)
    return {
        "a.weight": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "b.bias": torch.arange(6, dtype=torch.int64),
        "c.scalar": torch.tensor(1.5, dtype=torch.float32),
        "d.empty": torch.zeros(0, 3, dtype=torch.float16),
    }


VALID_FILE = save(_valid_tensors(), metadata={"format": "pt"})
(_N,) = struct.unpack("<Q", VALID_FILE[:8])
VALID_HEADER = json.loads(VALID_FILE[8 : 8 + _N])
VALID_DATA = VALID_FILE[8 + _N :]


def check_header(path: str, content: bytes, trace: bool = True) -> None:
    """The fuzz oracle for one file: parse, or SourceError; bounded allocation; sound result.

    `trace` measures the parse's peak allocation (tracemalloc doubles the cost, so the targets
    whose length prefix is consistent by construction skip it).
    """
    with open(path, "wb") as f:
        f.write(content)
    if trace:
        tracemalloc.start()  # only around the parse: tracing hypothesis itself would be slow
    try:
        header = read_header(path)
    except SourceError as exc:
        assert "\n" not in exc.message
        return
    finally:
        if trace:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            assert peak < PEAK_LIMIT + 4 * len(content), f"peak {peak} bytes parsing a {len(content)}-byte file"
    spans = sorted((t.offset, t.offset + t.nbytes) for t in header.tensors.values())
    for begin, end in spans:
        assert header.data_start <= begin <= end <= header.file_size
    for (_, e0), (b1, _) in zip(spans, spans[1:]):
        assert b1 >= e0


def _run(name: str, strategy, n: int, fn) -> None:
    count = [0]

    @fuzz_settings(n)
    @given(strategy)
    def run(value):
        count[0] += 1
        fn(value)

    run()
    TRIED[name] = count[0]
    assert count[0] >= n // 2


# -- inputs built from a hypothesis-drawn seed (fast, still derandomized) --------------------------------
# Hypothesis' own recursive JSON strategies cost ~20 ms an example; a seeded generator costs
# microseconds, so thousands of inputs fit in seconds. Bytes and bit flips use hypothesis directly.
SEEDS = st.integers(min_value=0, max_value=2**64 - 1)
WORDS = ["BF16", "F32", "F16", "F8_E4M3", "I64", "BOOL", "Q4", "bf16", "", "__metadata__", "dtype", "shape",
         "data_offsets", "format", "pt", "a.weight", "\u0000", "\udc80", "\n", "é", "x" * 300]
NUMBERS = [0, 1, 2, 3, 7, 8, 32, 64, 128, -1, -(2**63), 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**40,
           1.5, float("nan"), float("inf"), True, False, None]


def random_json(rng, depth: int = 0):
    """A random JSON value: scalars from edge-case pools, lists and objects up to depth 4."""
    roll = rng.random()
    if depth >= 4 or roll < 0.55:
        kind = rng.randrange(4)
        if kind == 0:
            return rng.choice(NUMBERS)
        if kind == 1:
            return rng.choice(WORDS)
        if kind == 2:
            return rng.randrange(-(2**70), 2**70) if rng.random() < 0.3 else rng.randrange(0, 5000)
        return "".join(chr(rng.randrange(0x20, 0x2FF)) for _ in range(rng.randrange(8)))
    if roll < 0.8:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {str(random_json(rng, 4))[:16]: random_json(rng, depth + 1) for _ in range(rng.randrange(5))}


def random_entry(rng):
    """Something shaped like a tensor entry, each field sometimes wrong."""
    entry = {
        "dtype": rng.choice(WORDS[:9]) if rng.random() < 0.8 else random_json(rng, 3),
        "shape": [rng.choice([0, 1, 2, 3, 4, 8, 2**62, -1]) for _ in range(rng.randrange(4))] if rng.random() < 0.8 else random_json(rng, 3),
    }
    begin = rng.choice([0, 0, 2, 8, 16, 64, 2**63, -2])
    entry["data_offsets"] = [begin, begin + rng.choice([0, 1, 2, 4, 8, 16, 32, 64, 2**64])] if rng.random() < 0.8 else random_json(rng, 3)
    for key in list(entry):
        if rng.random() < 0.05:
            del entry[key]
    if rng.random() < 0.05:
        entry["extra"] = random_json(rng, 3)
    return entry


def random_header(seed: int) -> bytes:
    import random

    rng = random.Random(seed)
    doc = {}
    for _ in range(rng.randrange(6)):
        doc[rng.choice(WORDS) + str(rng.randrange(3))] = random_entry(rng) if rng.random() < 0.7 else random_json(rng, 1)
    if rng.random() < 0.3:
        doc["__metadata__"] = random_json(rng, 2) if rng.random() < 0.5 else {"format": "pt"}
    if rng.random() < 0.05:
        doc = random_json(rng)
    return pack(json.dumps(doc), bytes(rng.randrange(256) for _ in range(rng.randrange(128))))


def mutated_header(seed: int) -> bytes:
    """The valid file with 1-4 random edits of its header and data section."""
    import random

    rng = random.Random(seed)
    header = json.loads(json.dumps(VALID_HEADER))
    names = [k for k in header if k != "__metadata__"]
    data = VALID_DATA
    dup = ""
    for _ in range(rng.randrange(1, 5)):
        name = rng.choice(names)
        entry = header.get(name)
        if not isinstance(entry, dict):
            entry = header[name] = {}
        op = rng.randrange(10)
        field = rng.choice(["dtype", "shape", "data_offsets", "extra"])
        if op == 0:
            entry[field] = random_json(rng, 2)
        elif op == 1:
            entry.pop(field, None)
        elif op == 2 and isinstance(entry.get("data_offsets"), list) and entry["data_offsets"]:
            offs = entry["data_offsets"]
            i = rng.randrange(len(offs))
            offs[i] = (offs[i] if isinstance(offs[i], int) else 0) + rng.choice([-64, -2, -1, 1, 2, 64, 2**40, 2**64])
        elif op == 3:
            entry["shape"] = [rng.choice([0, 1, 3, 4, 8, 6, 2**62]) for _ in range(rng.randrange(4))]
        elif op == 4:
            entry["dtype"] = rng.choice(WORDS[:9])
        elif op == 5:  # a second copy of the key, only expressible in the JSON text
            dup += "," + json.dumps(name) + ":" + json.dumps(entry)
        elif op == 6:
            header["__metadata__"] = random_json(rng, 2)
        elif op == 7:
            header[str(random_json(rng, 4))[:20]] = header.pop(name)
            names = [k for k in header if k != "__metadata__"] or names
        elif op == 8:
            data = data[: rng.randrange(len(data) + 1)]
        else:
            data = data + bytes(rng.randrange(64))
    text = json.dumps(header)
    if dup:
        text = text[:-1] + dup + "}"
    return pack(text, data)


def test_read_header_random_bytes(work):
    path = str(work / "random.safetensors")
    _run("read_header: random bytes", st.binary(max_size=2048), HEADER_EXAMPLES, lambda b: check_header(path, b))


def test_read_header_random_text_with_a_consistent_length(work):
    """The length prefix is right, so the JSON layer and the validator see the fuzz."""
    path = str(work / "text.safetensors")
    body = st.one_of(st.binary(max_size=512), st.text(max_size=256).map(lambda s: s.encode("utf-8", "surrogatepass")))
    _run("read_header: random header text", st.tuples(body, st.binary(max_size=64)), HEADER_EXAMPLES,
         lambda bd: check_header(path, pack(bd[0], bd[1])))


def test_read_header_random_json(work):
    path = str(work / "json.safetensors")
    _run("read_header: random JSON structures", SEEDS, HEADER_EXAMPLES, lambda seed: check_header(path, random_header(seed), trace=False))


def test_read_header_mutated_valid_headers(work):
    path = str(work / "mutated.safetensors")
    _run("read_header: mutated valid headers", SEEDS, HEADER_EXAMPLES, lambda seed: check_header(path, mutated_header(seed), trace=False))


def _flipped(bits) -> bytes:
    raw = bytearray(VALID_FILE)
    for bit in bits:
        raw[(bit // 8) % len(raw)] ^= 1 << (bit % 8)
    return bytes(raw)


def random_flips(seed: int) -> bytes:
    """1-8 bit flips, biased towards the length prefix and the header, where flips matter."""
    import random

    rng = random.Random(seed)
    span = 8 * (8 + _N) if rng.random() < 0.7 else 8 * len(VALID_FILE)
    return _flipped([rng.randrange(span) for _ in range(rng.randrange(1, 9))])


def test_read_header_bit_flips_of_a_valid_file(work):
    path = str(work / "flipped.safetensors")
    _run("read_header: bit flips of a valid file", SEEDS, HEADER_EXAMPLES, lambda seed: check_header(path, random_flips(seed)))


def test_valid_file_parses():
    """The fuzz seeds are valid to begin with (else the mutations prove little)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "ok.safetensors")
        open(p, "wb").write(VALID_FILE)
        h = read_header(p)
        assert sorted(h.tensors) == sorted(_valid_tensors())


# -- open_source on generated folders ------------------------------------------------------------------
SHARD_NAMES = ["model.safetensors", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
FILE_REFS = SHARD_NAMES + [
    "../outside.safetensors", "/etc/hosts.safetensors", "sub/../x.safetensors", "x\x00.safetensors", "\udc80.safetensors",
    "\ud800.safetensors", "", ".", "./model.safetensors", "config.json", "pytorch_model.bin", "link.safetensors",
    "dir.safetensors", "dangling.safetensors", "a\\..\\b.safetensors", "sub/model.safetensors", "fifo.safetensors",
]
TENSOR_NAMES = sorted(VALID_HEADER.keys() - {"__metadata__"})


def _shard_content(rng) -> bytes:
    roll = rng.random()
    if roll < 0.5:
        return VALID_FILE
    if roll < 0.65:
        return _flipped([rng.randrange(8 * (8 + _N)) for _ in range(rng.randrange(1, 4))])
    if roll < 0.8:
        return mutated_header(rng.randrange(2**64))
    if roll < 0.9:
        return VALID_FILE[: rng.randrange(len(VALID_FILE))]
    return bytes(rng.randrange(256) for _ in range(rng.randrange(64)))


def random_folder(seed: int) -> dict:
    """A checkpoint folder description: config, index, shards and hostile extras, each often wrong."""
    import random

    rng = random.Random(seed)
    roll = rng.random()
    if roll < 0.6:
        config = dict(CFG)
    elif roll < 0.75:
        config = {"model_type": random_json(rng, 3), "num_hidden_layers": random_json(rng, 3),
                  "quantization_config": random_json(rng, 2) if rng.random() < 0.3 else None, "text_config": random_json(rng, 2)}
    elif roll < 0.85:
        config = random_json(rng)
    elif roll < 0.95:
        config = bytes(rng.randrange(256) for _ in range(rng.randrange(32)))
    else:
        config = None  # missing
    shards = {name: _shard_content(rng) for name in SHARD_NAMES if rng.random() < 0.5}
    roll = rng.random()
    if roll < 0.4:
        index = None
    elif roll < 0.7:  # plausible: real tensor names into real shard names
        index = {"weight_map": {t: rng.choice(list(shards) or SHARD_NAMES) for t in TENSOR_NAMES if rng.random() < 0.9}}
    elif roll < 0.9:
        index = {"weight_map": {rng.choice(TENSOR_NAMES + ["", "x.weight_scale"]): rng.choice(FILE_REFS) if rng.random() < 0.8 else random_json(rng, 3)
                                for _ in range(rng.randrange(6))}}
    else:
        index = random_json(rng) if rng.random() < 0.5 else bytes(rng.randrange(256) for _ in range(rng.randrange(32)))
    extras = [e for e in ("outside-link", "dangling-link", "dir.safetensors", "sidecar-out", "sidecar-in", "bin", "fifo")
              if rng.random() < 0.15]
    return {"config": config, "index": index, "shards": shards, "extras": extras}


def _write_folder(root: str, outside: str, spec: dict) -> None:
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    for name, doc in (("config.json", spec["config"]), ("model.safetensors.index.json", spec["index"])):
        if doc is not None:
            open(os.path.join(root, name), "wb").write(doc if isinstance(doc, bytes) else json.dumps(doc).encode())
    for name, content in spec["shards"].items():
        open(os.path.join(root, name), "wb").write(content)
    for extra in spec["extras"]:
        if extra == "outside-link":
            os.symlink(os.path.join(outside, "outside.safetensors"), os.path.join(root, "link.safetensors"))
        elif extra == "dangling-link":
            os.symlink(os.path.join(root, "nowhere"), os.path.join(root, "dangling.safetensors"))
        elif extra == "dir.safetensors":
            os.mkdir(os.path.join(root, "dir.safetensors"))
        elif extra == "sidecar-out":
            os.symlink(os.path.join(outside, "secret.txt"), os.path.join(root, "tokenizer.json"))
        elif extra == "sidecar-in":
            open(os.path.join(root, "vocab.txt"), "w").write("a\nb\n")
            os.symlink("vocab.txt", os.path.join(root, "merges.txt"))
        elif extra == "bin":
            open(os.path.join(root, "pytorch_model.bin"), "wb").write(b"\x80\x04K\x01.")
        elif extra == "fifo":
            os.mkfifo(os.path.join(root, "fifo.safetensors"))


def test_open_source_generated_folders(work):
    root = str(work / "ckpt" / "src")
    outside = str(work / "outside")
    os.makedirs(outside, exist_ok=True)
    open(os.path.join(outside, "outside.safetensors"), "wb").write(VALID_FILE)
    open(os.path.join(outside, "secret.txt"), "w").write("secret")
    results = {"ok": 0, "refused": 0}

    def one(seed):
        _write_folder(root, outside, random_folder(seed))
        try:
            source = open_source(root)
        except SourceError as exc:
            assert "\n" not in exc.message
            results["refused"] += 1
            return
        results["ok"] += 1
        real_root = os.path.realpath(root)
        for info in source.tensors.values():  # everything read lies inside SRC and is safetensors
            assert os.path.commonpath([os.path.realpath(info.path), real_root]) == real_root
            assert info.path.endswith(".safetensors")
        for name in source.sidecars:  # everything copied is a regular file inside SRC, never weights
            real = os.path.realpath(os.path.join(root, name))
            assert os.path.commonpath([real, real_root]) == real_root and os.path.isfile(real)
            assert not name.endswith((".bin", ".safetensors"))

    _run("open_source: generated folders", SEEDS, SOURCE_EXAMPLES, one)
    TRIED["open_source: generated folders (accepted/refused)"] = f"{results['ok']}/{results['refused']}"
    assert results["ok"] > 30 and results["refused"] > 30, results
