"""The ``search`` tool: BM25 (Okapi, via ``rank-bm25``) over a local JSON Lines corpus.

A corpus file holds one passage per line, either ``{"id", "title", "text"}`` or the
Pyserini form ``{"id", "contents"}`` (``"docid"`` / ``"_id"`` are read as the id too;
a missing id is the line number). Passages are indexed as their title and text,
lower-cased and split into word characters (``\\w+``).

Bind a corpus in one of two ways:

* ``make_search_tool("wiki.jsonl")`` returns a :class:`~rlkit.tools.base.Tool` (named
  ``search`` unless told otherwise) bound to that file's index; pass it to
  ``Toolbox([...])`` / ``run_tool_calls(..., tools=[...])``.
* The registered ``search`` tool reads the path from the ``RLKIT_SEARCH_CORPUS``
  environment variable (indexed once per path and modification time); without it,
  a call returns an error for the policy.

The result is the ``top_k`` best passages that share a term with the query, numbered::

    [1] Paris
    Paris is the capital and most populous city of France.

    [2] ...

rank-bm25 scores in Python, over the passages containing a query term only (an
inverted index picks them), and holds the corpus in memory: fine for up to about a
million passages; use a dedicated retriever (Pyserini, a dense index) beyond that.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlkit.registry import TOOLS
from rlkit.tools.base import Tool, ToolError

#: Environment variable holding the registered ``search`` tool's corpus path.
CORPUS_ENV = "RLKIT_SEARCH_CORPUS"
#: Most passages one call returns.
MAX_TOP_K = 10
#: Characters of one passage's text shown to the model.
MAX_PASSAGE_CHARS = 1000

_TOKEN_RE = re.compile(r"\w+")


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens (``\\w+``) of ``text``."""
    return _TOKEN_RE.findall(text.lower())


@dataclass(frozen=True)
class Passage:
    """One document of a corpus."""

    id: str
    title: str
    text: str


def load_corpus(path: str | os.PathLike[str]) -> list[Passage]:
    """Read a JSON Lines corpus (see the module docstring); blank lines are skipped.

    Raises:
        ValueError: a line is not a JSON object, or has neither ``text`` nor ``contents``.
    """
    passages = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object per line")
            text = row.get("text", row.get("contents"))
            if not isinstance(text, str):
                raise ValueError(f'{path}:{number}: needs a "text" or "contents" string')
            ident = next((row[k] for k in ("id", "docid", "_id") if k in row), number)
            title = row.get("title") or ""
            passages.append(Passage(str(ident), str(title), text))
    return passages


class SearchIndex:
    """A BM25 index over passages.

    Args:
        passages: the corpus.
        k1, b: BM25 parameters (rank-bm25's defaults).
    """

    def __init__(self, passages: Sequence[Passage], *, k1: float = 1.5, b: float = 0.75) -> None:
        from rank_bm25 import BM25Okapi  # imported here: only a search needs it

        self.passages = list(passages)
        tokens = [tokenize(f"{p.title} {p.text}") for p in self.passages]
        if not any(tokens):
            raise ValueError("the corpus has no words to index")
        self._bm25 = BM25Okapi(tokens, k1=k1, b=b)
        self._postings: dict[str, list[int]] = {}
        for index, doc in enumerate(tokens):
            for term in set(doc):
                self._postings.setdefault(term, []).append(index)

    @classmethod
    def from_jsonl(cls, path: str | os.PathLike[str], **options: float) -> SearchIndex:
        """Build the index of a JSON Lines corpus file."""
        return cls(load_corpus(path), **options)

    def __len__(self) -> int:
        return len(self.passages)

    def search(self, query: str, top_k: int = 3) -> list[tuple[Passage, float]]:
        """The ``top_k`` passages sharing a term with ``query``, best first, with BM25 scores.

        Ties keep corpus order.
        """
        terms = tokenize(query)
        candidates = sorted({i for t in terms for i in self._postings.get(t, ())})
        if not candidates or top_k < 1:
            return []
        scores = self._bm25.get_batch_scores(terms, candidates)
        ranked = sorted(zip(candidates, scores), key=lambda pair: (-pair[1], pair[0]))
        return [(self.passages[i], float(s)) for i, s in ranked[:top_k]]

    def format_results(
        self,
        query: str,
        top_k: int = 3,
        *,
        max_top_k: int = MAX_TOP_K,
        max_passage_chars: int = MAX_PASSAGE_CHARS,
    ) -> str:
        """The text the policy sees: numbered passages (``top_k`` clamped to 1..max_top_k).

        Raises:
            ToolError: the query has no words.
        """
        if not tokenize(query):
            raise ToolError("Error: the query has no words to search for")
        hits = self.search(query, max(1, min(int(top_k), max_top_k)))
        if not hits:
            return f"No results for: {query}"
        blocks = []
        for rank, (passage, _score) in enumerate(hits, 1):
            text = passage.text.strip()
            if len(text) > max_passage_chars:
                text = text[:max_passage_chars].rstrip() + " ..."
            header = f"[{rank}] {passage.title}" if passage.title else f"[{rank}]"
            blocks.append(f"{header}\n{text}")
        return "\n\n".join(blocks)


_DOC = """Search the knowledge corpus and return the most relevant passages.

    Args:
        query: What to look for: keywords or a question.
        top_k: How many passages to return (1 to 10).
    """


def make_search_tool(
    corpus: str | os.PathLike[str] | SearchIndex | Iterable[Passage],
    *,
    name: str = "search",
    max_top_k: int = MAX_TOP_K,
    max_passage_chars: int = MAX_PASSAGE_CHARS,
) -> Tool:
    """A search tool bound to one corpus.

    Args:
        corpus: a JSON Lines path, a built :class:`SearchIndex`, or passages.
        name: the tool's name for the model.
        max_top_k: most passages per call.
        max_passage_chars: characters of each passage shown.
    """
    if isinstance(corpus, SearchIndex):
        index = corpus
    elif isinstance(corpus, str | os.PathLike):
        index = SearchIndex.from_jsonl(corpus)
    else:
        index = SearchIndex(list(corpus))

    def search(query: str, top_k: int = 3) -> str:
        return index.format_results(
            query, top_k, max_top_k=max_top_k, max_passage_chars=max_passage_chars
        )

    search.__doc__ = _DOC.replace("(1 to 10)", f"(1 to {max_top_k})")
    return Tool.from_function(search, name=name)


_indexes: dict[tuple[str, float], SearchIndex] = {}
_index_lock = threading.Lock()


def corpus_index(path: str | os.PathLike[str]) -> SearchIndex:
    """The index of ``path``, built once per path and modification time."""
    resolved = Path(path).resolve()
    key = (str(resolved), resolved.stat().st_mtime)
    with _index_lock:
        if key not in _indexes:
            for old in [k for k in _indexes if k[0] == key[0]]:
                del _indexes[old]
            _indexes[key] = SearchIndex.from_jsonl(resolved)
        return _indexes[key]


def corpus_problem() -> str | None:
    """Why the ``search`` tool could not answer (no corpus configured, or one that cannot
    be read), checked before a run starts; None when its corpus loads."""
    path = os.environ.get(CORPUS_ENV)
    if not path:
        return f"the search tool needs a corpus: set {CORPUS_ENV} to a .jsonl file of passages"
    try:
        corpus_index(path)
    except (OSError, ValueError) as exc:
        return f"the search tool's corpus {CORPUS_ENV}={path!r} cannot be read: {exc}"
    return None


@TOOLS.register("search")
def search(query: str, top_k: int = 3) -> str:
    """Search the knowledge corpus and return the most relevant passages.

    Args:
        query: What to look for: keywords or a question.
        top_k: How many passages to return (1 to 10).
    """
    path = os.environ.get(CORPUS_ENV)
    if not path:
        raise ToolError(
            f"Error: no search corpus is configured (set {CORPUS_ENV} to a .jsonl file, "
            f"or use rlkit.tools.make_search_tool)"
        )
    try:
        index = corpus_index(path)
    except (OSError, ValueError) as exc:
        raise ToolError(f"Error: the search corpus cannot be read: {exc}") from None
    return index.format_results(query, top_k)
