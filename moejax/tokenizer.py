"""Text <-> token ids: a checkpoint's own `tokenizer.json` (the `tokenizers` package), or the
byte-level vocabulary of the embedded model (ids 0..255 are the UTF-8 bytes)."""

from __future__ import annotations

import os
from typing import Protocol

from moejax.errors import ConfigError


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    def __init__(self, path: str):
        from tokenizers import Tokenizer as _Tokenizer

        self.name = path
        self._tok = _Tokenizer.from_file(path)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


class IdsOnly:
    """For checkpoints without a tokenizer and a vocabulary too small for bytes: prompts must
    be given as ids (`run.prompt_ids`) and output is shown as ids."""

    name = "none (ids only)"

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def encode(self, text: str) -> list[int]:
        raise ConfigError(
            f"the checkpoint has no tokenizer.json and its vocabulary ({self.vocab_size} ids) is "
            "too small for byte-level text: give the prompt as --config.run.prompt_ids='1,2,3' "
            "or convert a checkpoint directory that includes tokenizer.json")

    def decode(self, ids: list[int]) -> str:
        return " " + " ".join(str(i) for i in ids)


def load_tokenizer(tokenizer_dir: str | None, vocab_size: int) -> Tokenizer:
    """The checkpoint's tokenizer if it shipped one, else bytes when the vocabulary has room
    for them, else ids only."""
    if tokenizer_dir and os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
        return HFTokenizer(os.path.join(tokenizer_dir, "tokenizer.json"))
    if vocab_size >= 256:
        return ByteTokenizer()
    return IdsOnly(vocab_size)


def parse_ids(text: str, vocab_size: int, field: str = "run.prompt_ids") -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError as e:
        raise ConfigError(f"{field}={text!r} is not a comma-separated list of integers") from e
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ConfigError(f"{field} has ids {bad} outside the vocabulary 0..{vocab_size - 1}")
    return ids
