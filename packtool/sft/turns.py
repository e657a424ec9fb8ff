"""Assistant spans for templates without `{% generation %}` blocks: turn by turn, in linear time.

transformers returns no assistant mask for such a template. The usual definition (the one a
reference computes with prefix renders) is: the assistant turn `k` of a conversation `msgs`
renders as the text that `render(msgs[:k + 1])` adds after `render(msgs[:k],
add_generation_prompt=True)`, and that text is where it is in `render(msgs)` when both prefix
renders are prefixes of the whole render (the template is *incremental* for that turn). Rendering
every prefix costs O(turns^2) per conversation; this module gets the same spans from two renders
of the whole conversation (with and without the generation prompt), O(turns):

The two renders run with `messages` replaced by a watched list (`_Messages`) that records, with
the length of the output yielded so far, every way the template observes it: an element fetched
by a loop (and whether a `loop.last` peek fetched it), an index read, the length, truthiness, a
slice (a watched view when it runs to the end). A render of the prefix `msgs[:m]` executes exactly
like the whole render until the first observation that can tell the two apart (an element at
index >= m, or the length). When that first observation is the message loop asking for element
`m` (the loop ends there in the prefix render), the prefix render's output is the whole render's
output up to that point followed by what the template writes after that loop, *provided* what
it writes after the loop does not depend on the loop: no observation of `messages` after the
loop ends, and every `namespace` attribute it reads, and the state of every `cycler` and `joiner`
(`pos`, `used`; these three are the only ways state leaves a jinja2 loop in the immutable
sandbox: its lists and dicts cannot be changed), has the value it had when element `m` was asked
for. Everything else
(a peek, a length read, an index beyond, a namespace value that moved, a render of the prefix
that would not be a prefix of the whole render) leaves the turn undetermined: the conversation is
reported as `template_not_incremental` (a counted skip), never given a guessed mask.

Output positions come from what the template yields, so a template that touches `messages` inside
a buffered construct (a macro, `{% call %}`, `{% filter %}`, a `{% set %}` block) is refused for
turn masks at load time (`check_turn_template`); no real template in TRL's collection does.
"""

from __future__ import annotations

import bisect
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from packtool.sft.template import ChatTemplate, TemplateFailure, failure_message, namespace_class

_LOOP_CALLERS = ("_to_iterator",)
"""jinja2's `LoopContext` takes its iterator here; a plain `for` takes it in template code."""
_TEMPLATE_FILE = "<template>"


class NotIncremental(Exception):
    """The turn boundaries of this conversation cannot be found without guessing."""


@dataclass(slots=True)
class _Event:
    seq: int
    pos: int
    """Characters the template had yielded when it made this observation."""
    reach: int
    """It tells `msgs[:m]` from `msgs` for every m <= reach."""
    fetch: int = -1
    """The element index a loop asked for (len(msgs) when the loop found the end), or -1."""
    loop: int = -1
    """The id of the loop's iterator, or -1 for any other observation."""
    peek: bool = False


@dataclass
class _Watch:
    """Everything one render observed."""

    n: int
    length: int = 0
    """Characters yielded so far."""
    seq: int = 0
    events: list[_Event] = field(default_factory=list)
    ends: dict[int, _Event] = field(default_factory=dict)
    """Per loop iterator, its last end-of-list fetch that was not a peek."""
    writes: dict[tuple[int, str], list[tuple[int, Any]]] = field(default_factory=dict)
    """Namespace writes per (namespace, attribute): (seq, value), in order."""
    write_seqs: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    read_seqs: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    read_values: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    alive: list[Any] = field(default_factory=list)
    first: dict[int, list[_Event | None]] = field(default_factory=dict)
    """`_first_telling`'s answers, by the event they start after."""

    def tick(self) -> int:
        self.seq += 1
        return self.seq

    def observe(self, reach: int) -> None:
        self.events.append(_Event(self.tick(), self.length, min(reach, self.n - 1)))

    def fetched(self, index: int, loop: int, peek: bool) -> None:
        """A loop asked for element `index` (<= n; n: the end of the list)."""
        n = self.n
        self.seq += 1
        ev = _Event(self.seq, self.length, index if index < n else n - 1, index, loop, peek)
        self.events.append(ev)
        if index == n and loop >= 0 and not peek:
            self.ends[loop] = ev

    # the `namespace` watcher protocol (packtool/sft/template.py, `namespace_class`)
    def _key(self, ns: Any, name: str) -> tuple[int, str]:
        self.alive.append(ns)  # held, so that no other namespace takes its id in this render
        return id(ns), name

    def wrote(self, ns: Any, name: str, value: Any) -> None:
        key, seq = self._key(ns, name), self.tick()
        self.writes.setdefault(key, []).append((seq, value))
        self.write_seqs.setdefault(key, []).append(seq)

    def read(self, ns: Any, name: str, value: Any) -> None:
        key = self._key(ns, name)
        self.read_seqs.setdefault(key, []).append(self.tick())
        self.read_values.setdefault(key, []).append(value)


class _Iterator:
    def __init__(self, view: _Messages, loop: bool) -> None:
        self.view = view
        self.i = 0
        self.loop = view._watch.tick() if loop else -1  # a serial: ids of dead objects recur

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        v = self.view
        index = v._start + self.i
        n = v._watch.n
        peek = sys._getframe(1).f_code.co_name == "_peek_next"
        v._watch.fetched(index if index < n else n, self.loop, peek)
        if index >= n:
            raise StopIteration
        self.i += 1
        return v._all[index]


class _Messages(list):
    """`messages` (or a slice of it running to the end) that reports how it is observed."""

    def __init__(self, items: list[Any], watch: _Watch, start: int = 0) -> None:
        super().__init__(items[start:])
        self._all = items
        self._watch = watch
        self._start = start

    def _everything(self) -> None:
        self._watch.observe(self._watch.n)

    def __iter__(self) -> Iterator[Any]:
        caller = sys._getframe(1).f_code
        loop = caller.co_filename == _TEMPLATE_FILE or caller.co_name in _LOOP_CALLERS
        return _Iterator(self, loop)

    def __len__(self) -> int:
        self._everything()
        return super().__len__()

    def __bool__(self) -> bool:
        self._watch.observe(self._start)  # non-empty iff an element at _start exists
        return super().__len__() > 0

    def __getitem__(self, key: Any) -> Any:
        size = list.__len__(self)
        if isinstance(key, slice):
            start, stop, step = key.start, key.stop, key.step
            if (step in (None, 1)) and stop is None and (start is None or start >= 0):
                return _Messages(self._all, self._watch, self._start + min(start or 0, size))
            self._everything()
            return list.__getitem__(self, key)
        if isinstance(key, int) and key >= 0:
            self._watch.observe(self._start + key)
        else:
            self._everything()
        return list.__getitem__(self, key)

    def __packtool_plain__(self) -> list[Any]:
        self._everything()
        return list(list.__iter__(self))

    def _all_then(name: str) -> Any:  # noqa: N805 - builds methods below
        method = getattr(list, name)

        def observed(self: _Messages, *args: Any, **kwargs: Any) -> Any:
            self._everything()
            return method(self, *args, **kwargs)

        return observed

    for _name in (
        "__contains__",
        "__reversed__",
        "__repr__",
        "__str__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__add__",
        "__radd__",
        "__mul__",
        "__rmul__",
        "index",
        "count",
        "copy",
    ):
        if hasattr(list, _name):
            locals()[_name] = _all_then(_name)
    del _name, _all_then
    __hash__ = None  # type: ignore[assignment]


_LAZY_FILTERS = frozenset(
    {"reverse", "select", "reject", "selectattr", "rejectattr", "map", "batch"}
)


def _list_valued(expr: Any, names: set[str]) -> bool:
    """Whether `expr` may evaluate to the watched list, a view of it, or a lazy pass over it."""
    from jinja2 import nodes

    if isinstance(expr, nodes.Name):
        return expr.name in names
    if isinstance(expr, nodes.Getitem) and isinstance(expr.arg, nodes.Slice):
        return _list_valued(expr.node, names)
    if isinstance(expr, nodes.Filter):
        return expr.name in _LAZY_FILTERS and _list_valued(expr.node, names)
    if isinstance(expr, nodes.CondExpr):
        return _list_valued(expr.expr1, names) or _list_valued(expr.expr2, names)
    return False


def check_turn_template(template: ChatTemplate) -> str | None:
    """Why turn masks cannot be found for `template` (None: they can).

    Turn boundaries are the output positions where a loop over the messages asks for its next
    element, read from what the template has yielded so far; inside a construct that buffers its
    output (a macro, `{% call %}`, `{% filter %}`, a `{% set %}` block) that position is not known,
    so no such loop may run there. (Other reads of the messages may: they only ever make a turn
    undetermined, wherever they happen.)
    """
    from jinja2 import nodes

    ast = template.environment.parse(template.source)
    names = {"messages"}
    while True:  # names bound to the list or to a view of it
        more = {
            a.target.name
            for a in ast.find_all(nodes.Assign)
            if isinstance(a.target, nodes.Name) and _list_valued(a.node, names)
        }
        if more <= names:
            break
        names |= more
    buffered = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock)
    for node in ast.find_all(buffered):
        for loop in node.find_all(nodes.For):
            if _list_valued(loop.iter, names):
                what = type(node).__name__.replace("Block", " block").lower()
                return f"it loops over the messages inside a {what}, whose output is buffered"
    macros = {m.name for m in ast.find_all(nodes.Macro)}
    for call in ast.find_all(nodes.Call):
        if isinstance(call.node, nodes.Name) and call.node.name in macros:
            args = [*call.args, *(k.value for k in call.kwargs)]
            if any(_list_valued(arg, names) for arg in args):
                return f"it passes the messages to macro {call.node.name!r}"
    return None


def _render(template: ChatTemplate, messages: list[Any], agp: bool) -> tuple[str, _Watch]:
    watch = _Watch(n=len(messages))
    ns = namespace_class(watched=True)
    token = ns.watch.set(watch)
    blocks: list[str] = []
    try:
        variables = template.variables(_Messages(messages, watch), agp)
        for block in template.blocks(template.watched, variables):
            blocks.append(block)
            watch.length += len(block)
    except Exception as exc:  # the template is user code
        raise TemplateFailure(failure_message(exc)) from None
    finally:
        ns.watch.reset(token)
    return "".join(blocks), watch


MAX_LOOPS = 8
"""Loops over `messages` a prefix render may leave early before a turn is left undetermined
(each costs a pass over the observations; real templates have one or two)."""


def _first_telling(watch: _Watch, after: int) -> list[_Event | None]:
    """For each prefix length m < n, the first observation after event `after` that tells
    `msgs[:m]` from `msgs` (None: none does)."""
    cached = watch.first.get(after)
    if cached is not None:
        return cached
    first: list[_Event | None] = [None] * watch.n
    hi = -1
    i = bisect.bisect_right(watch.events, after, key=lambda e: e.seq)
    for ev in watch.events[i:]:
        if ev.reach > hi:
            for m in range(hi + 1, ev.reach + 1):
                first[m] = ev
            hi = ev.reach
            if hi == watch.n - 1:
                break
    watch.first[after] = first
    return first


def _prefix(watch: _Watch, m: int) -> list[tuple[int, int]]:
    """`render(msgs[:m])` as spans of the whole render: the text is their concatenation.

    The prefix render follows the whole render, except that each loop over the messages ends
    when it asks for element m: the output from there to the loop's end is left out.

    Raises:
        NotIncremental: it cannot be told without rendering the prefix.
    """
    segments: list[tuple[int, int]] = []
    skipped: list[tuple[int, int]] = []  # (seq of the fetch of element m, seq of the loop end)
    cur, after = 0, 0
    while True:
        ev = _first_telling(watch, after)[m]
        if ev is None:
            segments.append((cur, watch.length))
            break
        if ev.fetch != m or ev.loop < 0 or ev.peek:
            raise NotIncremental(
                "the template looks ahead of the turn (loop.last, length, an index)"
            )
        end = watch.ends.get(ev.loop)
        if end is None:
            raise NotIncremental("a loop over the messages does not run to the end of the list")
        if len(skipped) == MAX_LOOPS:
            raise NotIncremental(f"more than {MAX_LOOPS} loops over the messages")
        if segments and segments[-1][1] == cur:
            segments[-1] = (segments[-1][0], ev.pos)
        else:
            segments.append((cur, ev.pos))
        skipped.append((ev.seq, end.seq))
        cur, after = end.pos, end.seq
    _check_namespace(watch, skipped)
    return segments


def _check_namespace(watch: _Watch, skipped: list[tuple[int, int]]) -> None:
    """Raise unless every namespace value the prefix render reads is the whole render's (a
    `cycler`'s position and a `joiner`'s use are reported as namespace values).

    A value differs only when the last write before a read lies in a skipped stretch; then the
    first read after that stretch (before the attribute is written again) tells it.
    """

    def inside(seq: int) -> bool:
        return any(a < seq <= b for a, b in skipped)

    for a, b in skipped:
        for key, seqs in watch.write_seqs.items():
            i = bisect.bisect_right(seqs, a)
            if i == len(seqs) or seqs[i] > b:
                continue  # not written in the skipped stretch
            reads = watch.read_seqs.get(key, [])
            j = bisect.bisect_right(reads, b)
            if j == len(reads):
                continue
            r = reads[j]
            k = bisect.bisect_right(seqs, b)
            if k < len(seqs) and seqs[k] < r:
                continue  # written again before it is read
            w = bisect.bisect_left(seqs, r) - 1
            while w >= 0 and inside(seqs[w]):
                w -= 1
            writes = watch.writes[key]
            read_value = watch.read_values[key][j]
            if w < 0 or (writes[w][1] is not read_value and writes[w][1] != read_value):
                raise NotIncremental(
                    f"the template carries a value across turns ({key[1]!r} of a namespace, "
                    "cycler or joiner)"
                )


def _joined(
    text: str, segments: list[tuple[int, int]], into: str, limit: int, common: int
) -> int | None:
    """Length of the concatenated `segments` of `text` if it is a prefix of `into[:limit]`.

    `common`: `text[:common] == into[:common]` is known. None when it is not a prefix.
    """
    offset = 0
    for a, b in segments:
        if offset + b - a > limit:
            return None
        if (
            b > a
            and not (a == offset and b <= common)
            and text[a:b] != into[offset : offset + b - a]
        ):
            return None
        offset += b - a
    return offset


def turn_spans(
    template: ChatTemplate, messages: list[Any], turns: Sequence[int]
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each turn in `turns`.

    Two renders of the whole conversation (with and without the generation prompt); linear in
    the number of turns.

    Args:
        template: a template without `{% generation %}` blocks (any template works, though).
        messages: the normalised conversation (`chat_template.normalize_messages`).
        turns: indices of the messages to find (assistant turns), increasing.

    Raises:
        TemplateFailure: the template failed on the conversation.
        NotIncremental: a turn's boundaries cannot be determined (see the module docstring).
    """
    text, watch = _render(template, messages, False)
    if not turns:
        return text, []
    gen_text, gen_watch = _render(template, messages, True)
    common = common_prefix(text, gen_text)
    n = len(messages)
    spans = []
    for k in turns:
        whole = len(text)
        q = whole if k + 1 == n else _joined(text, _prefix(watch, k + 1), text, whole, whole)
        if q is None:
            raise NotIncremental(f"the render up to turn {k} is not a prefix of the whole render")
        p = _joined(gen_text, _prefix(gen_watch, k), text, q, common)
        if p is None:
            raise NotIncremental(f"the generation prompt before turn {k} is not what the turn has")
        spans.append((p, q))
    return text, spans


def common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix (slice comparisons: C speed, no per-char Python)."""
    n = min(len(a), len(b))
    lo, step = 0, 4096
    while lo < n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    hi = min(lo + step, n)
    while lo < hi:  # the first difference lies in [lo, hi)
        mid = (lo + hi) // 2
        if a[lo : mid + 1] == b[lo : mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return min(lo, n)
