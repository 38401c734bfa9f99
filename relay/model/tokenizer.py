"""A minimal byte-level BPE tokenizer from the vocabulary and merges a GGUF carries (GPT-2
style, as SmolLM2 uses), for demos and sanity checks.

Limits: the pre-tokenizer approximates the model's regex with Python's `re` (letters are
`[^\\W\\d_]`, digits are split one by one as SmolLM2 does), which matches for ASCII text but may
split other scripts differently from the reference tokenizer; control tokens such as
<|im_start|> are recognized only when written literally; no normalization. For exact IDs,
give token IDs from a file.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
from typing import Any

_PRETOKEN = re.compile(
    r"""\d|'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?[^\s\w]+|\s+(?!\S)|\s+""")


@functools.lru_cache(maxsize=1)
def _byte_map() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


class Tokenizer:
    def __init__(self, tokens: list[str], merges: list[str], control: list[str]) -> None:
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.control = sorted(control, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, self.control)) + ")") \
            if self.control else None
        self._unbyte = {c: b for b, c in _byte_map().items()}

    @classmethod
    def from_gguf(cls, path: str | os.PathLike[str]) -> Tokenizer:
        import gguf

        r: Any = gguf.GGUFReader(os.fspath(path))
        tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
        merges = list(r.fields["tokenizer.ggml.merges"].contents())
        types = list(r.fields["tokenizer.ggml.token_type"].contents())
        control = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]  # CONTROL
        return cls(tokens, merges, control)

    def _bpe(self, word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            pairs = [(self.ranks.get((a, b), 1 << 60), i)
                     for i, (a, b) in enumerate(itertools.pairwise(parts))]
            rank, i = min(pairs)
            if rank == 1 << 60:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.ids[p] for p in parts]

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        pieces = self._split.split(text) if self._split else [text]
        bmap = _byte_map()
        for piece in pieces:
            if piece in self.ids and piece in self.control:
                out.append(self.ids[piece])
                continue
            for word in _PRETOKEN.findall(piece):
                out += self._bpe("".join(bmap[b] for b in word.encode("utf-8")))
        return out

    def decode(self, ids: list[int]) -> str:
        text = "".join(self.tokens[i] for i in ids)
        data = bytes(self._unbyte.get(ch, 0x3F) for ch in text if ch in self._unbyte)
        return data.decode("utf-8", errors="replace")
