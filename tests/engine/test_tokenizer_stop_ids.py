"""An answer ends at the chat template's end of turn, whatever token the converter named EOS.

transformers 5.17 gives a Qwen2.5 instruct GGUF `<|endoftext|>` as EOS; the model writes `<|im_end|>`, a
newline and only then that token, so with EOS alone every answer ran two tokens past its end.
"""

from __future__ import annotations

from tokenizers import Tokenizer as RawTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import PreTrainedTokenizerFast

from sfibench.models.tokenizer import ByteTokenizer, Tokenizer

CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def hf_tokenizer(eos: str, template: str | None) -> PreTrainedTokenizerFast:
    words = ["q", "user", "assistant", "sfibench-answer-end", "\n", ":"]
    raw = RawTokenizer(WordLevel({w: i for i, w in enumerate(words + ["[UNK]"])}, unk_token="[UNK]"))
    raw.pre_tokenizer = WhitespaceSplit()
    backend = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token=eos, unk_token="[UNK]")
    backend.add_special_tokens({"additional_special_tokens": [t for t in CONTROL if t != eos]})
    backend.chat_template = template
    return backend


def ids(backend, *tokens: str) -> frozenset[int]:
    return frozenset(backend.convert_tokens_to_ids(list(tokens)))


def test_a_base_eos_gains_the_templates_end_of_turn():
    backend = hf_tokenizer("<|endoftext|>", CHATML)
    assert Tokenizer(backend).stop_ids() == ids(backend, "<|endoftext|>", "<|im_end|>")


def test_an_end_of_turn_eos_is_the_one_stop():
    backend = hf_tokenizer("<|im_end|>", CHATML)
    assert Tokenizer(backend).stop_ids() == ids(backend, "<|im_end|>")


def test_a_turn_closed_by_plain_text_adds_nothing():
    backend = hf_tokenizer("<|endoftext|>", PLAIN)
    assert Tokenizer(backend).stop_ids() == ids(backend, "<|endoftext|>")


def test_no_chat_template_and_byte_tables_stop_at_eos_only():
    backend = hf_tokenizer("<|endoftext|>", None)
    assert Tokenizer(backend).stop_ids() == ids(backend, "<|endoftext|>")
    assert Tokenizer(ByteTokenizer()).stop_ids() == frozenset({ByteTokenizer.eos_token_id})
