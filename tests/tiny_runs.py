"""The smallest real run of each measuring command that saves a results.json, for tests that damage, stop or
resume such runs."""

from __future__ import annotations

TINY = ["--model", "tiny-llama", "--device", "cpu"]
TINY_RUNS = {
    "throughput": ["throughput", *TINY, "--ctx", "300", "--steps", "4", "--repeats", "1", "--methods", "full_kv,sfi",
                   "--k-head", "64"],
    "profile": ["profile", *TINY, "--ctx", "300", "--steps", "2"],
    "stability": ["stability", *TINY, "--steps", "8", "--prefix", "300"],
}
