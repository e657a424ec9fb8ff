"""Rendered conversations -> token ids and the loss mask, as transformers computes it.

`apply_chat_template(..., tokenize=True, return_assistant_tokens_mask=True)` encodes the rendered
text with the tokenizer (`add_special_tokens=False`: the template writes BOS/EOS itself; special
tokens written in the text become their ids) and marks every token whose character offsets
overlap a `{% generation %}` span (for each token in order, the first span that ends after the
token's start is checked; the token is marked when it ends after that span starts). This module
does the same for a whole batch at once:

- the ids come from the tokenizer's batch encoder (all cores, no per-token Python);
- token offsets: for byte-level BPE (GPT-2, Llama 3, Qwen, ...: no normalizer, offsets not
  trimmed, no added token that strips spaces) each token's byte length (a table over the
  vocabulary) gives exact offsets by a cumulative sum, with any encoder; the overlap test on
  bytes is the same as on characters (a character belongs to every token holding one of its
  bytes). Otherwise the tokenizer's own character offsets are used (`tokenizers` computes them);
  a document whose token bytes do not add up to its text falls back to them too;
- the overlap rule is one `searchsorted` over the batch's spans (spans in order and disjoint,
  as templates produce them; other spans are handled token by token, exactly as transformers).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.dataset.masks import segment_sums
from packtool.errors import ConfigError


def _byte_level(tokenizer_json: dict[str, Any]) -> bool:
    """Whether token byte lengths give exact offsets (see the module docstring)."""

    def has_byte_level(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel":
            return not node.get("add_prefix_space", False)
        return any(has_byte_level(n) for n in node.get("pretokenizers") or ())

    def trims(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "ByteLevel" and node.get("trim_offsets", True):
            return True
        if node.get("type") in ("RobertaProcessing", "BertProcessing"):
            return bool(node.get("trim_offsets", True))
        return any(trims(n) for n in node.get("processors") or ())

    if tokenizer_json.get("normalizer") is not None:
        return False
    if not has_byte_level(tokenizer_json.get("pre_tokenizer")):
        return False
    if trims(tokenizer_json.get("post_processor")):
        return False
    return not any(
        t.get("lstrip") or t.get("rstrip") or t.get("single_word")
        for t in tokenizer_json.get("added_tokens") or ()
    )


class TextEncoder:
    """Encodes rendered texts with a packtool `Tokenizer`, with token offsets when asked.

    The ids come from the tokenizer's own engine (packtool/tokenizer/engines.py: the fastest
    library proven to give the reference library's ids), without BOS/EOS. For a tiktoken
    tokenizer with `specials`, special-token text must become the special ids, which the
    engines' ordinary encoding does not do: tiktoken itself encodes those texts
    (`allowed_special="all"`).

    Args:
        tokenizer: a `packtool.tokenizer.tokenizers.Tokenizer` (`byte`, a Hugging Face tokenizer.json, or
            tiktoken).
        specials: special-token text in the input becomes the special ids (chat templates); False
            encodes the text the way packtool encodes plain documents.
    """

    def __init__(self, tokenizer: Any, *, specials: bool) -> None:
        self.tokenizer = tokenizer
        self.kind = tokenizer.identity.kind
        self.specials = specials
        self.dtype = tokenizer.dtype
        self.byte_lengths: NDArray[np.int64] | None = None
        self._reference: Any = None
        self._tiktoken: Any = None
        self._json: dict[str, Any] | None = None
        self._prefixes: bool | None = None  # `prefixes_every_text`, once asked
        if self.kind == "byte":
            self.byte_lengths = np.ones(tokenizer.vocab_size, np.int64)
        elif self.kind == "hf":
            self._json = json.loads(tokenizer.source.json)
            if _byte_level(self._json):
                self.byte_lengths = _hf_byte_lengths(self._json, tokenizer.vocab_size)
        elif self.kind == "tiktoken":
            source = tokenizer.source
            table = np.zeros(tokenizer.vocab_size, np.int64)
            for token, i in (source.ranks or {}).items():
                table[i] = len(token)
            for token, i in (source.specials or {}).items():
                table[i] = len(token.encode("utf-8"))
            self.byte_lengths = table
        elif self.kind == "sentencepiece" and not specials:
            pass  # prompt + completion: each encoded apart by the engine, nothing more needed
        elif self.kind == "sentencepiece":
            # A chat template's special-token text ("<s>", "[INST]") is not matched by a .model
            # file's encoder, and its pieces give no character offsets here.
            raise ConfigError(
                "chat templates need a tokenizer.json (or byte / tiktoken); a SentencePiece "
                ".model file takes prompt-completion records and text only: pass the "
                "tokenizer.json of the same model (transformers writes it with save_pretrained)"
            )
        else:  # pragma: no cover - a tokenizer kind this module does not know yet
            raise ConfigError(f"fine-tuning records do not support tokenizer kind {self.kind!r}")

    def prefixes_every_text(self) -> bool:
        """Whether a text encodes otherwise alone than after other text: a SentencePiece model
        (or a Metaspace tokenizer.json) puts a dummy prefix `▁` before every text it encodes,
        so a completion encoded alone began with a space its record does not have ("4" + "2"
        read "4 2", the model taught to say it; packtool/sft/encode.py `in_context`). Probed
        once: `x\n` then `y`, against `x\ny` (a byte-level BPE encodes both alike). A tokenizer
        that cannot encode the probe (a word-level vocabulary without these characters and no
        unknown token) puts no prefix there either: False; a record's own text it cannot encode
        is the usual one-line error when that record is encoded."""
        if self._prefixes is None:
            try:
                flat, lengths = self.encode(["x\n", "y", "x\ny"])
            except ConfigError:
                self._prefixes = False
            else:
                split = int(lengths[0] + lengths[1])
                self._prefixes = flat[:split].tolist() != flat[split:].tolist()
        return self._prefixes

    def encode(self, texts: Sequence[str]) -> tuple[NDArray, NDArray[np.int64]]:
        """(flat ids, per-text lengths): no BOS/EOS added."""
        if not texts:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        if self.kind == "byte":
            encoded = [t.encode("utf-8") for t in texts]
            lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
            return np.frombuffer(b"".join(encoded), np.uint8).astype(self.dtype), lengths
        if self.kind == "tiktoken" and self.specials:
            from packtool.tokenizer.engines import encode_checked

            if self._tiktoken is None:
                self._tiktoken = _TiktokenSpecials(self.tokenizer.source)
            docs = encode_checked(self._tiktoken, texts, self.tokenizer.source, "tiktoken")
            flat, lengths = self._tiktoken.flat(docs)
            return flat.astype(self.dtype, copy=False), lengths
        # hf: added-token text becomes its id in every engine; a text the tokenizer cannot
        # encode is the same one line as for plain documents
        return self.tokenizer.encode_bare(texts)

    def token_text(self, i: int) -> str | None:
        """The text of id `i`: a Hugging Face tokenizer's added token, else the model's; a
        tiktoken ranks file's special token (`<|endoftext|>`); None for `byte` (its EOS 256 and
        BOS 257 are no text) or an id without one."""
        if self.kind == "tiktoken":
            specials = self.tokenizer.source.specials or {}
            return next((token for token, j in specials.items() if j == i), None)
        if self._json is None:
            return None
        for t in self._json.get("added_tokens") or ():
            if t.get("id") == i:
                return t.get("content")
        vocab = (self._json.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            return next((token for token, j in vocab.items() if j == i), None)
        if isinstance(vocab, list) and 0 <= i < len(vocab):  # Unigram: [token, score]
            return vocab[i][0]
        return None

    def char_offsets(self, text: str) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """(starts, ends) of each token of `text` in characters, from the tokenizer itself."""
        if self.kind != "hf":  # byte and tiktoken always have byte lengths
            raise AssertionError("char_offsets is only needed for Hugging Face tokenizers")
        if self._reference is None:  # the reference library: the engines give no offsets
            from tokenizers import Tokenizer as HFTok

            self._reference = HFTok.from_str(self.tokenizer.source.json)
        enc = self._reference.encode(text, add_special_tokens=False)
        off = np.asarray(enc.offsets, np.int64).reshape(-1, 2)
        return off[:, 0], off[:, 1]


class _TiktokenSpecials:
    """tiktoken's own encoder with special-token text as the special ids (`allowed_special`),
    as an engine `Encoder`, so that `engines.encode_checked` guards it like the others."""

    def __init__(self, source: Any) -> None:
        from packtool.tokenizer.engines import tiktoken_encoding

        self.enc = tiktoken_encoding(source)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.enc.encode_batch(list(texts), allowed_special="all")

    def flat(self, raw: Any) -> tuple[NDArray, NDArray[np.int64]]:
        return _flatten(raw, np.dtype(np.uint32))


def _hf_byte_lengths(tokenizer_json: dict[str, Any], size: int) -> NDArray[np.int64] | None:
    """Each id's length in bytes, for a byte-level BPE (None: a vocabulary of another shape)."""
    vocab = (tokenizer_json.get("model") or {}).get("vocab")
    if not isinstance(vocab, dict):
        return None
    table = np.zeros(size, np.int64)
    for token, i in vocab.items():
        if 0 <= i < size:
            table[i] = len(token)  # one character of the byte alphabet per byte
    for t in tokenizer_json.get("added_tokens") or ():
        i = t.get("id")
        if isinstance(i, int) and 0 <= i < size:
            table[i] = len(str(t.get("content", "")).encode("utf-8"))
    return table


def _flatten(docs: Sequence[Sequence[int]], dtype: np.dtype) -> tuple[NDArray, NDArray[np.int64]]:
    import array

    flat = array.array("I")
    lengths = array.array("q")
    for d in docs:
        lengths.append(len(d))
        flat.extend(d)
    return (
        np.frombuffer(flat, np.uint32).astype(dtype, copy=False),
        np.frombuffer(lengths, np.int64),
    )


def _char_to_byte(text: str, chars: NDArray[np.int64]) -> NDArray[np.int64]:
    """The byte offsets in `text` (UTF-8) of the character offsets `chars`.

    One encode of the text between consecutive offsets (C speed, nothing per character in Python
    or numpy): spans have few boundaries, texts many characters.
    """
    points = sorted(set(chars.tolist()))
    at: dict[int, int] = {}
    prev = nbytes = 0
    for c in points:
        nbytes += len(text[prev:c].encode("utf-8"))
        at[c] = nbytes
        prev = c
    return np.fromiter(map(at.__getitem__, chars.tolist()), np.int64, len(chars))


def overlap_mask(
    starts: NDArray[np.int64],
    ends: NDArray[np.int64],
    span_starts: NDArray[np.int64],
    span_ends: NDArray[np.int64],
) -> NDArray[np.uint8]:
    """transformers' rule: a token is marked when it overlaps the first span ending after its start.

    Vectorised for spans in order and disjoint and token starts in order (what templates and
    tokenizers produce; with token ends in order too, in time linear in the tokens plus
    log(tokens) per span); otherwise the loop transformers runs, token by token.
    """
    if not len(span_starts):
        return np.zeros(len(starts), np.uint8)
    ordered = (
        np.all(span_starts[1:] >= span_ends[:-1])
        and np.all(span_ends >= span_starts)
        and np.all(starts[1:] >= starts[:-1])
    )
    if ordered and np.all(ends[1:] >= ends[:-1]):
        # For such spans the rule marks exactly the tokens that overlap some span (start < its
        # end and end > its start): for each span a run of tokens, found by two binary searches
        # per span rather than one per token.
        lo = np.searchsorted(ends, span_starts, side="right")  # first token ending after it
        hi = np.searchsorted(starts, span_ends, side="left")  # first token starting at its end
        ok = hi > lo
        n = len(starts)
        runs = np.bincount(lo[ok], minlength=n + 1) - np.bincount(hi[ok], minlength=n + 1)
        return (np.cumsum(runs[:n]) > 0).astype(np.uint8)
    if ordered:
        i = np.searchsorted(span_ends, starts, side="right")
        inside = i < len(span_ends)
        mask = np.zeros(len(starts), bool)
        mask[inside] = ends[inside] > span_starts[i[inside]]
        return mask.astype(np.uint8)
    out = np.zeros(len(starts), np.uint8)
    k = 0
    for t in range(len(starts)):
        while k < len(span_ends) and starts[t] >= span_ends[k]:
            k += 1
        if k == len(span_ends):
            break
        if ends[t] > span_starts[k]:
            out[t] = 1
    return out


def masks_for(
    encoder: TextEncoder,
    texts: Sequence[str],
    span_counts: NDArray[np.int64],
    span_starts: NDArray[np.int64],
    span_ends: NDArray[np.int64],
    flat: NDArray,
    lengths: NDArray[np.int64],
) -> NDArray[np.uint8]:
    """The flat loss mask of encoded texts: 1 on every token that overlaps one of its spans.

    With byte lengths, the whole batch is one `overlap_mask` in batch byte coordinates (the
    texts end to end: a document's spans only ever meet its own tokens); documents whose token
    bytes do not add up to their text, and tokenizers without byte lengths, go one by one with
    the tokenizer's character offsets.

    Args:
        encoder: what encoded them.
        texts: the rendered texts.
        span_counts: (n,) spans per text.
        span_starts: (sum(span_counts),) span starts in characters of their text, in order.
        span_ends: the span ends, likewise.
        flat: the flat ids (`encoder.encode(texts)`).
        lengths: tokens per text.
    """
    n = len(texts)
    out = np.zeros(len(flat), np.uint8)
    doc_off = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=doc_off[1:])
    span_off = np.zeros(n + 1, np.int64)
    np.cumsum(span_counts, out=span_off[1:])
    span_doc = np.repeat(np.arange(n), span_counts)
    alone: Any = range(n)
    table = encoder.byte_lengths
    if table is not None:
        tok_bytes = table[flat.astype(np.int64, copy=False)]
        tok_end = np.cumsum(tok_bytes)
        ascii_ = np.fromiter(map(str.isascii, texts), bool, n)
        nbytes = np.fromiter(
            (len(t) if a else len(t.encode("utf-8")) for t, a in zip(texts, ascii_, strict=True)),
            np.int64,
            n,
        )
        doc_start = np.concatenate([[0], tok_end])[doc_off[:-1]]  # token bytes before each doc
        good = segment_sums(tok_bytes, doc_off) == nbytes  # its tokens add up to its text
        ss, se = span_starts.copy(), span_ends.copy()  # characters -> bytes of their text
        for d in np.flatnonzero(~ascii_ & good & (span_counts > 0)):
            a, b = span_off[d], span_off[d + 1]
            both = _char_to_byte(texts[d], np.concatenate([ss[a:b], se[a:b]]))
            ss[a:b], se[a:b] = both[: b - a], both[b - a :]
        keep = good[span_doc]
        ss = ss[keep] + doc_start[span_doc[keep]]
        se = se[keep] + doc_start[span_doc[keep]]
        tok_start = tok_end - tok_bytes
        if len(ss) and np.all(ss[1:] >= se[:-1]) and np.all(se >= ss):
            out[:] = overlap_mask(tok_start, tok_end, ss, se)
            alone = np.flatnonzero(~good)
        else:  # no spans, or spans out of order somewhere: every document by itself
            alone = range(n)
    for d in alone:
        if not span_counts[d]:
            continue
        a, b = int(doc_off[d]), int(doc_off[d + 1])
        ss = span_starts[span_off[d] : span_off[d + 1]]
        se = span_ends[span_off[d] : span_off[d + 1]]
        if table is not None:
            ends = tok_end[a:b] - (int(tok_end[a - 1]) if a else 0)
            starts_ = ends - tok_bytes[a:b]
            if (int(ends[-1]) if b > a else 0) == int(nbytes[d]):
                if not ascii_[d]:
                    both = _char_to_byte(texts[d], np.concatenate([ss, se]))
                    ss, se = both[: len(ss)], both[len(ss) :]
                out[a:b] = overlap_mask(starts_, ends, ss, se)
                continue
        starts_, ends = encoder.char_offsets(texts[d])  # offsets from the tokenizer (characters)
        if len(starts_) != b - a:  # pragma: no cover - the same tokenizer, the same text
            raise AssertionError("token offsets disagree with the ids")
        out[a:b] = overlap_mask(starts_, ends, ss, se)
    return out
