"""Model shapes by name: tiny random models for tests, the real smollm2-135m, gemma3-270m and
qwen2.5-coder-1.5b, and Qwen3 shapes for speed.

The Qwen3 shapes are the published config.json values of Qwen/Qwen3-* (layers, hidden, FFN, q/KV
heads, head_dim, vocabulary and embedding tying cross-checked against a public Megatron recipe for
each size on 2026-11-29; it leaves Qwen3-32B's tying ambiguous, kept untied here). Their native window is 32K
tokens; the published recipe for longer contexts is YaRN with factor 4 over 32768 positions, which
these presets apply so that 128K runs are within the model's limit.

Gemma-3 interleaves sliding-window layers (attend to the last `sliding_window` tokens only) with
global ones; `layer_is_global` says which is which, and every attention method selects on the global
layers only (engine/sliding.py). The gemma3-270m values are those of its GGUF, as transformers reads
them (tests/engine/test_gemma3.py holds the preset equal to the loaded config).

qwen2.5-coder-1.5b is Qwen2.5-Coder-1.5B-Instruct as its Q4_K_M GGUF gives it: every layer attends the whole
history, and the GGUF stores the LM head apart from the embedding (untied), as transformers reads it
(tests/engine/test_qwen25_coder.py holds the preset equal to the loaded config).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    name: str
    arch: str  # llama | qwen2 | qwen3 | gemma3
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_context: int
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, object], ...] | None = None  # sorted (key, value) pairs, hashable
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3, Gemma-3
    sliding_window: int = 0  # tokens a sliding layer attends to (its own included); 0: no sliding layers
    layer_is_global: tuple[bool, ...] = ()  # per layer: attends the whole history; empty: every layer does
    rope_local_theta: float = 0.0  # RoPE base of the sliding layers (Gemma-3; rope_theta is the global one)
    query_pre_attn_scalar: int = 0  # attention scale is its -0.5 power (Gemma-3); 0: head_dim
    final_logit_softcapping: float = 0.0  # logits = cap * tanh(logits / cap) (Gemma-2 style); 0: none
    source: str = "random"  # random | gguf | hf
    ranks: int = 1  # tensor-parallel ranks this shape is one share of (models/sharding.py): see rank_share

    def __post_init__(self):
        if self.layer_is_global and (len(self.layer_is_global) != self.num_layers or not self.sliding_window):
            raise ValueError(f"{self.name}: layer_is_global needs one entry per layer ({self.num_layers}) and a "
                             "sliding_window for the other layers")

    def is_global(self, layer: int) -> bool:
        """Whether `layer` attends the whole history (the layers an attention method selects on)."""
        return not self.layer_is_global or self.layer_is_global[layer]

    @property
    def global_layers(self) -> list[int]:
        return [layer for layer in range(self.num_layers) if self.is_global(layer)]

    @property
    def group_size(self) -> int:
        """Query heads per KV head (G)."""
        return self.num_heads // self.num_kv_heads

    def rank_share(self, ranks: int) -> ModelConfig:
        """One tensor-parallel rank's shape: its 1/ranks of the heads (so of the KV cache and every method's
        per-KV-head state) and of the MLP rows; what it allocates follows from it (num_params, the estimate)."""
        if ranks == 1:
            return self
        return replace(self, num_heads=self.num_heads // ranks, num_kv_heads=self.num_kv_heads // ranks,
                       intermediate_size=self.intermediate_size // ranks, ranks=ranks)

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V bytes one token occupies across all layers."""
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * dtype_bytes

    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.qkv_bias:
            attn += d * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * d
        norms = 4 * h if self.arch == "gemma3" else 2 * h  # Gemma-3 norms both sides of attention and MLP
        per_layer = attn + 3 * h * i + norms
        # the embedding is whole on every rank; an untied LM head is split by vocabulary (a tied one is a view)
        lm_head = 0 if self.tie_word_embeddings else -(-self.vocab_size // self.ranks) * h
        return self.num_layers * per_layer + self.vocab_size * h + lm_head + h

    def rope_scaling_dict(self) -> dict | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["rope_scaling"] = self.rope_scaling_dict()
        return out


def rope_scaling_tuple(scaling: dict | None) -> tuple | None:
    return tuple(sorted(scaling.items())) if scaling else None


_QWEN3_YARN = rope_scaling_tuple(
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
)


def _qwen3(name: str, hidden: int, inter: int, layers: int, heads: int, tie: bool) -> ModelConfig:
    return ModelConfig(
        name=name, arch="qwen3", vocab_size=151936, hidden_size=hidden, intermediate_size=inter,
        num_layers=layers, num_heads=heads, num_kv_heads=8, head_dim=128, max_context=131072,
        rope_theta=1e6, rope_scaling=_QWEN3_YARN, rms_norm_eps=1e-6, tie_word_embeddings=tie,
        qk_norm=True,
    )


_TINY = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
             num_kv_heads=2, head_dim=16, max_context=4096, rms_norm_eps=1e-6)

PRESETS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig(name="tiny-llama", arch="llama", rope_theta=10000.0,
                              tie_word_embeddings=True, **_TINY),
    "tiny-qwen2": ModelConfig(name="tiny-qwen2", arch="qwen2", rope_theta=1e6, qkv_bias=True,
                              **{**_TINY, "num_kv_heads": 1}),
    "tiny-qwen3": ModelConfig(name="tiny-qwen3", arch="qwen3", rope_theta=1e6, qk_norm=True,
                              **{**_TINY, "num_layers": 3, "num_kv_heads": 4}),
    "smollm2-135m": ModelConfig(
        name="smollm2-135m", arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
        num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, max_context=8192, rope_theta=1e5,
        rms_norm_eps=1e-5, tie_word_embeddings=True, source="gguf",
    ),
    "tiny-gemma3": ModelConfig(
        name="tiny-gemma3", arch="gemma3", rope_theta=1e6, rope_local_theta=1e4, qk_norm=True,
        tie_word_embeddings=True, sliding_window=16, layer_is_global=(False, True, False),
        query_pre_attn_scalar=24, final_logit_softcapping=30.0, **{**_TINY, "num_layers": 3},
    ),
    "gemma3-270m": ModelConfig(
        name="gemma3-270m", arch="gemma3", vocab_size=262144, hidden_size=640, intermediate_size=2048,
        num_layers=18, num_heads=4, num_kv_heads=1, head_dim=256, max_context=32768, rope_theta=1e6,
        rope_local_theta=1e4, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True, sliding_window=512,
        layer_is_global=tuple((layer + 1) % 6 == 0 for layer in range(18)), query_pre_attn_scalar=256,
        source="gguf",
    ),
    "qwen2.5-coder-1.5b": ModelConfig(
        name="qwen2.5-coder-1.5b", arch="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128, max_context=32768, rope_theta=1e6,
        rms_norm_eps=1e-6, tie_word_embeddings=False, qkv_bias=True, source="gguf",
    ),
    "qwen3-0.6b": _qwen3("qwen3-0.6b", 1024, 3072, 28, 16, tie=True),
    "qwen3-1.7b": _qwen3("qwen3-1.7b", 2048, 6144, 28, 16, tie=True),
    "qwen3-4b": _qwen3("qwen3-4b", 2560, 9728, 36, 32, tie=True),
    "qwen3-8b": _qwen3("qwen3-8b", 4096, 12288, 36, 32, tie=False),
    "qwen3-14b": _qwen3("qwen3-14b", 5120, 17408, 40, 40, tie=False),
    "qwen3-32b": _qwen3("qwen3-32b", 5120, 25600, 64, 64, tie=False),
}


class UnknownModelError(ValueError):
    pass


def get_preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise UnknownModelError(
            f"unknown model {name!r}; valid presets: {', '.join(PRESETS)} "
            "(or pass a Hugging Face checkpoint directory or a .gguf file path)"
        )
    return PRESETS[name]
