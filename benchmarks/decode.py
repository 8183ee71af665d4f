"""Median decode / encode time per descriptor, hurray_schema beside pyhurray, same run.

    python benchmarks/decode.py [--repeat 15] [--number 2000]

For each typical descriptor (built with pyhurray, so both sides read the same bytes) it
prints the median time of one call of

* ``general`` -- the general structural decoder alone (``codec._parse_general``), which
  every first-seen header goes through;
* ``parse``   -- ``hurray_schema.codec.parse_descriptor``: the structural decode, through
  the decoder compiled for the header once it has been seen twice (``hurray_schema/signature/``).
  This is the work ``hurray.Descriptor.decode`` does: read the wire tables and apply the
  structural checks (magic, version, lengths, tags);
* ``decode``  -- ``hurray_schema.decode_descriptor``: the same plus the semantic rules of
  one descriptor (``rules/descriptor/``; ``rules`` is how many can apply to it), which
  pyhurray does not check (``spec-map.md`` DIV-LAYOUT, DIV-QUANT, DIV-BUFFER);
* ``encode``  -- ``hurray_schema.encode_descriptor`` (compiled per descriptor shape),

next to ``hurray.Descriptor.decode`` / ``Descriptor.encode`` and the ratio ours/theirs.
Each call decodes the same bytes (encodes the same object) again, as a stream of repeated
descriptors does: that is what the by-value tables serve (``signature.decode_known``, the
passed-descriptor table of the rules, the encoded-bytes table).  The ``cold`` columns time
the same calls with those tables off (``signature.use_value_tables(False)``): the cost of a
descriptor never seen before under a compiled header.  Times are process CPU time, the
functions interleaved in every round, so that other load on a shared machine skews the
ratios as little as possible.  Nothing here asserts: it only measures.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hurray  # noqa: E402

from hurray_schema import signature  # noqa: E402
from hurray_schema.codec import _parse_general, decode_descriptor, encode_descriptor, parse_descriptor  # noqa: E402
from hurray_schema.limits import DEFAULT_LIMITS  # noqa: E402
from hurray_schema.rules.descriptor import _rules_for  # noqa: E402
from hurray_schema.rules.engine import Mode  # noqa: E402


def typical() -> dict[str, bytes]:
    f32 = hurray.float32
    Q = lambda *v: struct.pack(f"<{len(v)}Q", *v)  # noqa: E731
    a = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 0]))
    b = hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]))
    stats = hurray.Statistics(nnz=30, sparsity_ratio=0.0625, value_min=-1.0, value_max=2.0, value_abs_max=2.0,
                              value_mean=0.5, value_stddev=0.25)
    objs = {
        "row-major f32 [3,4]": hurray.Tensor(bytes(48), f32, [3, 4]),
        "per-block int4 [128,128]": hurray.Tensor(
            bytes(8192), hurray.dtype.int4, [128, 128], aux_buffers=[bytes(256)],
            quantization=hurray.PerBlockAffine.symmetric(axis=1, block_size=128, scale_buffer_index=1,
                                                         scale_type=hurray.float16)),
        "CSR f32 [3,3] nnz=3": hurray.Tensor(struct.pack("<3f", 1, 2, 3), f32, [3, 3],
                                             aux_buffers=[Q(0, 1, 2), Q(0, 1, 2, 3)], layout=hurray.CsrLayout(nnz=3)),
        "composite head (partition)": hurray.Composite("partition", shape=[8, 8], dtype=f32, members=[a, b]),
        "f32 [8,4] shard + stats": hurray.Tensor(bytes(128), f32, [8, 4], shard=hurray.Shard([8, 8], [0, 4]),
                                                 statistics=stats),
    }
    return {name: obj.descriptor.encode() for name, obj in objs.items()}


def median_calls(fns: dict, repeat: int, number: int) -> dict:
    """Median over ``repeat`` rounds of the mean CPU time of one call, in microseconds.

    ``fns`` maps a name to a function, or to ``(function, setup)`` where ``setup`` runs
    before each round of that function.  The functions are timed in turn within each round
    (so a burst of load on a shared machine hits all of them alike), with the process CPU
    clock rather than wall time.
    """
    timers = {}
    for name, fn in fns.items():
        fn, setup = fn if isinstance(fn, tuple) else (fn, _tables_on)
        timers[name] = timeit.Timer(fn, setup=setup, timer=time.process_time)
    samples: dict = {name: [] for name in fns}
    for _ in range(repeat):
        for name, timer in timers.items():
            samples[name].append(timer.timeit(number) / number * 1e6)
    _tables_on()
    return {name: statistics.median(values) for name, values in samples.items()}


def _tables_on() -> None:
    signature.use_value_tables(True)


def _tables_off() -> None:
    signature.use_value_tables(False)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--number", type=int, default=2000)
    args = ap.parse_args(argv)
    r, n = args.repeat, args.number

    header = (f"{'descriptor':28} {'bytes':>5} {'rules':>5} | {'general':>7} {'parse':>6} {'decode':>7} "
              f"{'pyhurray':>8} {'parse':>6} {'decode':>6} | {'encode':>6} {'pyhurray':>8} {'ratio':>6} | "
              f"{'cold:':>5} {'decode':>6} {'ratio':>6} {'encode':>6} {'ratio':>6}")
    print(f"median CPU µs per call (repeat={r}, number={n}); ratios are ours / pyhurray")
    print(header)
    print("-" * len(header))
    ratios: dict = {key: [] for key in ("parse", "decode", "encode", "cold decode", "cold encode")}
    for name, wire in typical().items():
        ours = decode_descriptor(wire)
        theirs = hurray.Descriptor.decode(wire)
        assert encode_descriptor(ours) == wire == theirs.encode()  # same work on both sides
        view = memoryview(wire)
        t = median_calls({
            "general": lambda: _parse_general(view, Mode.STRICT, 0, DEFAULT_LIMITS),
            "parse": lambda: parse_descriptor(wire),
            "decode": lambda: decode_descriptor(wire),
            "pydecode": lambda: hurray.Descriptor.decode(wire),
            "encode": lambda: encode_descriptor(ours),
            "pyencode": theirs.encode,
            "cold decode": (lambda: decode_descriptor(wire), _tables_off),
            "cold encode": (lambda: encode_descriptor(ours), _tables_off),
        }, r, n)
        row = {"parse": t["parse"] / t["pydecode"], "decode": t["decode"] / t["pydecode"],
               "encode": t["encode"] / t["pyencode"], "cold decode": t["cold decode"] / t["pydecode"],
               "cold encode": t["cold encode"] / t["pyencode"]}
        for key, value in row.items():
            ratios[key].append(value)
        print(f"{name:28} {len(wire):5d} {len(_rules_for(ours)):5d} | {t['general']:7.2f} {t['parse']:6.2f} "
              f"{t['decode']:7.2f} {t['pydecode']:8.2f} {row['parse']:5.1f}x {row['decode']:5.1f}x | "
              f"{t['encode']:6.2f} {t['pyencode']:8.2f} {row['encode']:5.1f}x | {'':5} {t['cold decode']:6.2f} "
              f"{row['cold decode']:5.1f}x {t['cold encode']:6.2f} {row['cold encode']:5.1f}x")
    print("-" * len(header))
    means = ", ".join(f"{key} {statistics.geometric_mean(v):.1f}x" for key, v in ratios.items())
    print(f"geometric mean ratio: {means} (targets: decode and encode within 8x)")
    print("worst: " + ", ".join(f"{key} {max(v):.1f}x" for key, v in ratios.items()) + " (target: decode within 15x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
