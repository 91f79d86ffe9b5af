#!/usr/bin/env python3
"""Chapter 10's layer against PyTorch's module, on the very same tensors (the GPU suite runs this).

For each model and token count, tools/pytorch_baselines.py's grouped module (_ch10_grouped: topk,
argsort, index_select, torch._grouped_mm, SiLU · up, the routing weight, index_add) computes y from
its layer tensors; the C++ layer's `before` and `after` (through tools/ch10_capi.cpp, loaded with
ctypes) compute y from the same tensors. The routing is compared first: both routers round their
logits to bf16, but a sum in another order can land on the other side of a near-tie, so at least
MIN_AGREEMENT of the tokens must pick the same experts. Then y, over the tokens that agree, within
TOLERANCE (relative Frobenius norm: a few bf16 roundings apart).

    python3 tools/ch10_check_pytorch.py --lib build/gpu-suite/lib/libkc_ch10_capi.so

Exits 1 when a comparison fails, 2 when PyTorch or a GPU is missing.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from typing import Any, List, Sequence, Tuple

import pytorch_baselines as pb

MIN_AGREEMENT = 0.9
TOLERANCE = 2e-2
DEFAULT_TOKENS = (1, 64, 512)


def verdict(label: str, agreement: float, rel_error: float, min_agreement: float = MIN_AGREEMENT,
            tolerance: float = TOLERANCE) -> Tuple[bool, str]:
    """Whether one comparison passes, and its log line: routing agreement at least ``min_agreement``
    and the relative error of the agreeing tokens' outputs at most ``tolerance`` (a NaN error fails)."""
    ok = agreement >= min_agreement and rel_error <= tolerance
    line = "%s: %s; %.1f%% of tokens routed alike (at least %.0f%%), relative error %.3g (at most %.3g)" % (
        label, "ok" if ok else "FAILED", 100.0 * agreement, 100.0 * min_agreement, rel_error, tolerance)
    return ok, line


def load_library(path: str) -> Any:
    """The C interface, with its argument types declared."""
    lib = ctypes.CDLL(path)
    lib.kc_ch10_workspace_bytes.restype = ctypes.c_longlong
    lib.kc_ch10_workspace_bytes.argtypes = [ctypes.c_char_p, ctypes.c_longlong, ctypes.c_char_p, ctypes.c_int]
    lib.kc_ch10_layer.restype = ctypes.c_int
    lib.kc_ch10_layer.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_longlong] + [ctypes.c_void_p] * 7 + [
        ctypes.c_longlong, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    return lib


def run_layer(lib: Any, torch: Any, model: str, variant: str, config: dict, layer: dict) -> Tuple[Any, Any]:
    """The C++ layer's y [T, H] and routing ids [T, k] on ``layer``'s tensors."""
    x = layer["x"]
    tokens = x.shape[0]
    error = ctypes.create_string_buffer(1024)
    need = lib.kc_ch10_workspace_bytes(model.encode(), tokens, error, len(error))
    if need < 0:
        raise RuntimeError(error.value.decode())
    workspace = torch.empty(max(need, 1), dtype=torch.uint8, device=x.device)
    y = torch.empty_like(x)
    ids = torch.empty((tokens, config["k"]), dtype=torch.int32, device=x.device)
    bias = layer["bias"].data_ptr() if config["routing"] == "dsv3" else None
    torch.cuda.synchronize()  # PyTorch's writes of the inputs are done before the layer reads them
    rc = lib.kc_ch10_layer(model.encode(), variant.encode(), tokens, x.data_ptr(), layer["router"].data_ptr(), bias,
                           layer["up"].data_ptr(), layer["down"].data_ptr(), y.data_ptr(), workspace.data_ptr(), need,
                           ids.data_ptr(), error, len(error))
    if rc != 0:
        raise RuntimeError("%s %s: %s" % (model, variant, error.value.decode()))
    return y, ids


def compare(torch: Any, ours: Tuple[Any, Any], theirs: Tuple[Any, Any]) -> Tuple[float, float]:
    """(share of tokens whose expert sets agree, relative error of y over those tokens)."""
    (y_a, ids_a), (y_b, ids_b) = ours, theirs
    same = (ids_a.long().sort(dim=1).values == ids_b.long().sort(dim=1).values).all(dim=1)
    agreement = same.float().mean().item()
    if not bool(same.any()):
        return agreement, float("nan")
    a, b = y_a[same].float(), y_b[same].float()
    return agreement, ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lib", required=True, help="path of libkc_ch10_capi.so")
    parser.add_argument("--models", nargs="+", default=list(pb.CH10_CONFIGS), choices=list(pb.CH10_CONFIGS))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(DEFAULT_TOKENS))
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("ch10_check_pytorch: PyTorch is not installed")
        return 2
    if not torch.cuda.is_available():
        print("ch10_check_pytorch: no GPU")
        return 2
    lib = load_library(args.lib)
    env = pb.Env(torch=torch, device=torch.device("cuda"), l2_bytes=0, repetitions=1, seed=args.seed)
    generator = torch.Generator(device=env.device)
    generator.manual_seed(args.seed)
    failures: List[str] = []
    for model in args.models:
        config = pb.CH10_CONFIGS[model]
        for tokens in args.tokens:
            layer = pb._ch10_layer(env, config, tokens, generator)
            theirs = (pb._ch10_grouped(torch, config, layer), pb._ch10_route(torch, config, layer)[1])
            for variant in ("before", "after"):
                agreement, rel_error = compare(torch, run_layer(lib, torch, model, variant, config, layer), theirs)
                ok, line = verdict("%s T=%d %s vs pytorch" % (model, tokens, variant), agreement, rel_error)
                print(line, flush=True)
                if not ok:
                    failures.append(line)
            del layer, theirs
            torch.cuda.empty_cache()
    print("%d comparisons failed" % len(failures) if failures else "every comparison passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
