"""Text shown to a reader leaves out a chat model's control tokens: generate's streamed text and its --json
`generated_text` never show `<|im_end|>`, while the token ids keep every token the model chose."""

from __future__ import annotations


def test_readable_text_leaves_out_control_tokens_and_keeps_the_words(smollm2_fmt):
    tokenizer = smollm2_fmt.tokenizer
    ids = tokenizer.encode("The answer is 4.") + tokenizer.encode("<|im_end|>")
    assert "<|im_end|>" in tokenizer.decode(ids)  # the ids hold it: the model chose it
    assert tokenizer.readable(ids) == "The answer is 4."
    chat = tokenizer.encode("What is 2+2?", chat=True)
    shown = tokenizer.readable(chat)
    assert "What is 2+2?" in shown and "<|im_start|>" not in shown and "<|im_end|>" not in shown
