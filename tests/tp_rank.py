"""One rank of a tensor-parallel decode, as tests/engine/test_tp.py starts it: a process of its own, its
place in the group from the environment as torchrun sets it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python tests/tp_rank.py MODEL METHODS OUT [FAIL_RANK]

decodes the shared prompt with each method (comma-separated, NAME or NAME/PATH, the reference path by
default, the matrix's small settings) and saves each method's tokens, logits and step kinds to
OUT/rank{R}.pt; the rank FAIL_RANK raises instead, once its share of the model is loaded.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import replace

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])  # method_matrix beside this file

from method_matrix import small_spec  # noqa: E402

from sfibench.commands.ranks import leave_rank  # noqa: E402
from sfibench.core import parallel  # noqa: E402
from sfibench.engine.session import Session  # noqa: E402
from sfibench.registry import create_method  # noqa: E402

STEPS = 12
TEXT = ("The keeper climbed the stairs. He lit the lamp! Was the sea calm? It was not. "
        "Ships passed in the night and the light turned slowly above them. ") * 2


def decode_all(session: Session, methods: list[str], cross_head: bool = True) -> dict:
    """Per method: (tokens [B, N], logits [N, B, V], per step the rows' kinds). `cross_head` off: SFI
    without its cross-head exclusivity stage, which runs over one rank's KV heads and is skipped where a
    rank has 2 or fewer (SPEC), so that is the one-process decode such ranks must equal."""
    ids = session.loaded.tokenizer.encode(TEXT)
    prompts = [ids, ids[:-17]]
    results = {}
    for entry in methods:  # a method's name, or name/path (default: the reference path)
        name, _, path = entry.partition("/")
        path = path or "reference"
        prefilled = session.prefill(prompts, STEPS)
        spec = small_spec(name, path)
        if name == "sfi" and not cross_head:
            spec = small_spec(name, path, selector=replace(spec.config.selector, use_cross_head=False))
        method = create_method(spec, session.loaded.config, session.loaded.tokenizer)
        trace, _ = session.decode(method, prefilled, STEPS, keep_logits=True)
        results[entry] = (trace.tokens, torch.stack(trace.logits), [step.kinds for step in trace.steps])
    return results


def main(model: str, methods: str, out: str, fail_rank: int = -1) -> None:
    torch.set_num_threads(1)
    tp = parallel.join(torch.device("cpu"), timeout_s=30)
    try:
        session = Session.open(model, "cpu", "float32", parallel=tp)
        if tp.rank == fail_rank:
            raise RuntimeError(f"rank {tp.rank} fails on purpose")
        torch.save(decode_all(session, methods.split(",")), f"{out}/rank{tp.rank}.pt")
    finally:
        parallel.leave()


if __name__ == "__main__":
    # A rank ends as sfibench's own ranks do (commands/ranks.leave_rank: its status, without the interpreter's
    # teardown, where gloo's objects destroyed can abort a finished rank)
    try:
        main(*sys.argv[1:4], *map(int, sys.argv[4:]))
        status = 0
    except BaseException:  # noqa: BLE001 (reported as the traceback a normal exit would print)
        traceback.print_exc()
        status = 1
    leave_rank(status)
