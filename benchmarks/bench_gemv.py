"""Decode's weight products: cuBLAS (F.linear) against the Triton GEMV of gemv.py, per projection shape.

For each projection of a model shape (qkv, o, gate_up, down; the LM head) and each batch, `layers`
distinct random weight matrices (so no product is served from L2) are multiplied back to back in one
CUDA graph, cuBLAS against every Triton tile config of a small grid; the result is GB/s of weight
bytes, and the kernel the decoder picks (gemv.decode_config: a tuned tile, or cuBLAS). Then a layer's
small ops after two products, separate (cuBLAS, then the compiled op) against folded into the product
(gemv's epilogues).

    python benchmarks/bench_gemv.py --model qwen3-4b --batch 1,5 --out gemv.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from bench_fast_path import _time_ms  # benchmarks/ is on sys.path when a script here runs

from sfibench.metrics.floor import graph_replay
from sfibench.models import fused
from sfibench.models.presets import get_preset
from sfibench.optimized import gemv


def _replay_ms(fn, repeats: int = 7) -> list[float]:
    """Milliseconds of one CUDA-graph replay of `fn`, per repeat."""
    return _time_ms(graph_replay(fn), repeats=repeats, calls=1)


def projection_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(N, K) of each decode product of one layer, and of the LM head."""
    d = cfg.head_dim
    return {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * d, cfg.hidden_size),
            "o": (cfg.hidden_size, cfg.num_heads * d), "gate_up": (2 * cfg.intermediate_size, cfg.hidden_size),
            "down": (cfg.hidden_size, cfg.intermediate_size), "lm_head": (cfg.vocab_size, cfg.hidden_size)}


def sweep_shape(n_out: int, n_in: int, batch: int, copies: int, configs: list[dict]) -> dict:
    device, dtype = torch.device("cuda"), torch.bfloat16
    weights = [torch.randn(n_out, n_in, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    x = torch.randn(batch, n_in, device=device, dtype=dtype)
    gbytes = copies * n_out * n_in * 2 / 1e9
    rows = []

    def add(name, fn, config=None):
        try:
            ms = _replay_ms(fn)
        except Exception as error:  # noqa: BLE001  (a config that does not compile is a result, not a crash)
            rows.append({"kernel": name, "config": config, "error": f"{type(error).__name__}: {error}"[:300]})
            return
        rows.append({"kernel": name, "config": config, "ms": statistics.median(ms), "ms_range": [min(ms), max(ms)],
                     "gb_per_s": gbytes / (statistics.median(ms) / 1e3)})

    add("cublas", lambda: [F.linear(x, w) for w in weights])
    for config in configs:
        add("triton", lambda config=config: [gemv.linear(x, w, config=config) for w in weights], repr(config))
    best = min((r for r in rows if r["kernel"] == "triton" and "ms" in r), key=lambda r: r["ms"], default=None)
    cublas = rows[0].get("ms")
    default = gemv.decode_config(batch, n_out, n_in, device)  # None: the decoder uses cuBLAS here
    add("decoder's choice", lambda: [fused.ops["linear"](x, w) for w in weights], repr(default))
    return {"n_out": n_out, "n_in": n_in, "batch": batch, "copies": copies, "gbytes": gbytes, "rows": rows,
            "cublas_ms": cublas, "best_triton": best, "decoders_choice": rows[-1]}


def fused_vs_separate(cfg, batch: int, copies: int) -> dict:
    """One layer's o_proj + residual add + norm and gate_up + activation, `copies` layers in a graph:
    separate kernels (cuBLAS, then the compiled op) against gemv.py's products with the op as epilogue."""
    device, dtype = torch.device("cuda"), torch.bfloat16
    h, inter, heads = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads * cfg.head_dim
    o_proj = [torch.randn(h, heads, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    gate_up = [torch.randn(2 * inter, h, device=device, dtype=dtype) * 0.02 for _ in range(copies)]
    norm_w = torch.ones(h, device=device, dtype=dtype)
    attended = torch.randn(batch, heads, device=device, dtype=dtype)
    residual = torch.randn(batch, h, device=device, dtype=dtype)

    def separate():
        for wo, wg in zip(o_proj, gate_up):
            _, normed = fused.ops["add_rms_norm"](F.linear(attended, wo), residual, norm_w, 1e-6)
            fused.ops["silu_mul"](F.linear(normed, wg))

    def folded():
        for wo, wg in zip(o_proj, gate_up):
            _, normed = gemv.linear_add_rms_norm(attended, wo, residual, norm_w, 1e-6)
            gemv.gate_up_activation(normed, wg, "silu_mul")

    out = {}
    for name, fn in (("separate (cuBLAS + compiled op)", separate), ("folded (gemv epilogue)", folded)):
        ms = _replay_ms(fn)
        out[name] = {"ms": statistics.median(ms), "ms_range": [min(ms), max(ms)]}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen3-4b")
    parser.add_argument("--batch", default="1,5")
    parser.add_argument("--copies", type=int, default=36, help="distinct weights per shape (layers)")
    parser.add_argument("--no-sweep", action="store_true", help="only the folded-epilogue comparison")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemv needs a CUDA GPU", file=sys.stderr)
        return 2
    cfg = get_preset(args.model)
    fused.enable_fusion(True)
    configs = [gemv.GemvConfig(n, k, w, s) for n, k, w, s in itertools.product((16, 32, 64), (128, 256, 512), (4, 8),
                                                                                (3, 4))]
    result = {"device": torch.cuda.get_device_name(), "model": args.model, "dtype": "bfloat16",
              "torch": torch.__version__, "shapes": [], "fused_vs_separate": {}}
    for batch in [int(b) for b in args.batch.split(",")]:
        for name, (n_out, n_in) in ({} if args.no_sweep else projection_shapes(cfg)).items():
            copies = 2 if name == "lm_head" else args.copies
            row = {"projection": name, **sweep_shape(n_out, n_in, batch, copies, configs)}
            result["shapes"].append(row)
            best = row["best_triton"]
            chosen = row["decoders_choice"].get("ms", 0)
            print(f"B={batch} {name:8s} N={n_out} K={n_in}: cuBLAS {row['cublas_ms']:.3f} ms, best triton "
                  f"{best['ms']:.3f} ms {best['config']} ({best['gb_per_s']:.0f} GB/s), decoder's {chosen:.3f}",
                  flush=True)
            args.out.write_text(json.dumps(result, indent=1))
        result["fused_vs_separate"][batch] = fused_vs_separate(cfg, batch, args.copies)
        print(f"B={batch} norm+qkv, act+down x{args.copies}: {result['fused_vs_separate'][batch]}", flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
