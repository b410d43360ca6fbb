"""A model's shape before it loads, and the contexts it can hold: what commands check before loading and
runners check again once a checkpoint or GGUF file has said its own limit."""

from __future__ import annotations

from pathlib import Path

from sfibench.core.errors import UsageError

# Cache positions `sfibench profile` holds beyond its profiled steps (two warm-ups and slack): its context
# limit and memory are checked with them, before loading and after
PROFILE_MARGIN = 8


def config_before_loading(model: str):
    """The model's shape without loading it: a preset's, or a checkpoint directory's config.json (a damaged
    one is refused in one line now); None for a .gguf file, whose shape is known only once transformers reads
    it, and for a directory without config.json, which the loader refuses."""
    from sfibench.models.presets import PRESETS

    if model in PRESETS:
        return PRESETS[model]
    config_file = Path(model) / "config.json"
    if config_file.is_file():
        from sfibench.models.loading import checkpoint_config  # torch: only for a checkpoint directory

        return checkpoint_config(config_file)
    return None


def check_context_limit(config, contexts: list[int], decode: int) -> None:
    """Each context plus `decode` tokens must fit the model. Called with the preset's config before
    loading, and with the loaded config after (checkpoint directories and GGUF files say their limit
    only then); None skips the check."""
    if config is None:
        return
    if contexts and decode >= config.max_context:
        raise UsageError(f"{decode:,} decode tokens leave no room for a prompt in {config.name}'s limit of "
                         f"{config.max_context:,} tokens; lower --steps")
    for context in contexts:
        if context + decode > config.max_context:
            raise UsageError(f"--ctx {context:,} plus {decode} decode tokens exceeds {config.name}'s limit "
                             f"of {config.max_context:,} tokens; the longest --ctx that fits with this "
                             f"--steps is {config.max_context - decode:,}")
