"""Rebuild the replayed token stream of speed runs (sfibench/workloads/data/replay_smollm2.json): the shipped
essays tokenized by the SmolLM2 tokenizer, with the raw bytes of every token that occurs (what SFI's trigger
rules read). Needs the smollm2-135m weights installed (README says how).

    python benchmarks/rebuild_replay.py
"""

from __future__ import annotations

import importlib.resources
import json

from sfibench.models.loading import load_model
from sfibench.sfi.triggers import token_byte_table
from sfibench.workloads.replay import REPLAY_FILE


def main() -> None:
    loaded = load_model("smollm2-135m")
    data = importlib.resources.files("sfibench.workloads") / "data"
    ids = loaded.tokenizer.encode((data / "essays_en.txt").read_text())
    table = token_byte_table(loaded.tokenizer.backend, loaded.config.vocab_size)
    pieces = {str(i): table[i].hex() for i in sorted(set(ids))}
    out = data / REPLAY_FILE
    with open(str(out), "w") as f:
        json.dump({"tokenizer": "smollm2-135m", "source": "essays_en.txt", "ids": ids, "pieces": pieces}, f)
    print(f"wrote {len(ids)} tokens, {len(pieces)} distinct, to {out}")


if __name__ == "__main__":
    main()
