"""Text <-> token ids, with one interface for Hugging Face tokenizers and the tiny models' bytes.

Tiny random presets have no checkpoint, so they use `ByteTokenizer`: ids 0..255 are raw UTF-8 bytes,
then BOS and EOS. Real models use the tokenizer stored with their weights (GGUF files included).
"""

from __future__ import annotations

from sfibench.core.errors import ModelFileError, UsageError


class ByteTokenizer:
    """Each byte of the UTF-8 text is one token; enough for tiny models and trigger tests."""

    bos_token_id = 256
    eos_token_id = 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([token_id]) if token_id < 256 else b""

    def decode(self, ids: list[int]) -> str:
        return b"".join(self.token_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = False) -> str:
        text = "".join(f"<{m['role']}>\n{m['content']}\n" for m in messages)
        return text + ("<assistant>\n" if add_generation_prompt else "")


class Tokenizer:
    """Wraps a Hugging Face tokenizer, or a byte-table one (ByteTokenizer, ReplayTokenizer: anything with
    `token_bytes`), behind encode/decode/eos."""

    def __init__(self, backend):
        self.backend = backend
        self.byte_table = hasattr(backend, "token_bytes")

    @property
    def has_chat_template(self) -> bool:
        """Whether a prompt can be wrapped in the model's chat template: a base model's GGUF may carry none
        (gemma3-270m's does not); the byte tokenizers have a plain one."""
        return getattr(self.backend, "chat_template", True) is not None

    def check_chat(self, chat: bool) -> None:
        """Refuse chat-wrapped prompts where the tokenizer has no template, in one line naming the fix."""
        if chat and not self.has_chat_template:
            raise UsageError("this model's tokenizer has no chat template, so its prompts cannot be wrapped "
                             "in one (--chat, quality's default); rerun with --no-chat")

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if chat:
            self.check_chat(chat)
            text = self.backend.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        if self.byte_table:
            return self.backend.encode(text)
        return self.backend(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        if self.byte_table:
            return self.backend.decode(ids)
        return self.backend.decode(ids, skip_special_tokens=False)

    def readable(self, ids: list[int]) -> str:
        """The text a reader is shown: control tokens such as a chat model's `<|im_end|>` left out (a byte
        table has none to leave out)."""
        if self.byte_table:
            return self.backend.decode(ids)
        return self.backend.decode(ids, skip_special_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.backend.eos_token_id

    def stop_ids(self) -> frozenset[int]:
        """The ids that end an answer: EOS and, for a chat model, the token that closes an assistant turn in
        its template (`<|im_end|>` for Qwen, `<end_of_turn>` for Gemma).

        EOS alone is not enough: a converter may set it to the base model's end of text (transformers 5.17
        gives a Qwen2.5 instruct GGUF `<|endoftext|>`), which the instruct model writes only after its end of
        turn and a newline, so the answer would run on past its end."""
        ids = {self.eos_token_id} - {None}
        if self.byte_table or not getattr(self.backend, "chat_template", None):
            return frozenset(ids)
        marker = "sfibench-answer-end"
        try:
            text = self.backend.apply_chat_template(
                [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], tokenize=False)
        except Exception:  # a template that refuses a finished assistant turn names no end of turn
            return frozenset(ids)
        after = text.rpartition(marker)[2]
        first = self.backend(after, add_special_tokens=False)["input_ids"][:1] if after else []
        control = set(self.backend.all_special_ids) | set(self.backend.get_added_vocab().values())
        # a turn closed by plain text (a newline) adds no stop: that text also occurs inside answers
        return frozenset(ids | {i for i in first if i in control})


class BrokenTokenizerError(ModelFileError):
    """A model file whose tokenizer converts wrongly: the model would read text it was never trained on."""


def check_round_trip(tokenizer: Tokenizer, vocab_size: int, source: str, samples: int = 400) -> None:
    """Refuse a tokenizer that does not encode its own vocabulary back to itself.

    A converter can build a tokenizer that decodes every id yet segments text wrongly: transformers 5.17
    turns Gemma-3's GGUF tokenizer into one that splits " The special magic number" into two-character
    pieces (" T", "he", " s", "pe", ...), so the model reads text it was never trained on and answers
    nonsense without any error (reports/diagnostics/gemma3-h200-mismatch). A correct tokenizer encodes the
    text of a whole-word vocabulary entry (" magic") as that one entry; this checks `samples` such entries
    spread over the vocabulary and raises when fewer than 80% come back as themselves."""
    if tokenizer.byte_table:
        return
    words = []
    for token_id in range(0, vocab_size, max(1, vocab_size // samples)):
        text = tokenizer.decode([token_id])
        if len(text) >= 4 and text[0] == " " and text[1:].isalpha() and text[1:].isascii():
            words.append((token_id, text))
    if len(words) < 20:  # too few plain words to judge (e.g. a tiny vocabulary): nothing to check
        return
    kept = sum(tokenizer.encode(text) == [token_id] for token_id, text in words)
    if kept < 0.8 * len(words):
        import transformers

        example_id, example = words[0]
        raise BrokenTokenizerError(
            f"the tokenizer built from {source} does not encode its own vocabulary: only {kept} of {len(words)} "
            f"whole-word entries come back as themselves (e.g. {example!r}, id {example_id}, encodes to "
            f"{tokenizer.encode(example)}). transformers {transformers.__version__} converted it wrongly; "
            "use a transformers release whose GGUF converter handles this model (5.23 does for Gemma-3), "
            "or pass a Hugging Face checkpoint directory with its own tokenizer as --model")
