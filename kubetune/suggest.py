"""The one "did you mean": the known name a typo stands for (override keys, dataset
columns, component paths, command-line options)."""

from __future__ import annotations


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance with adjacent transpositions (``epcohs`` is one edit)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cost = 0 if ca == cb else 1
            best = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                best = min(best, prev2[j - 2] + 1)
            cur.append(best)
        prev2, prev = prev, cur
    return prev[-1]


def closest(name: str, known: set[str]) -> str | None:
    """The known name a typo of ``name`` would be: one edit for short names, two else."""
    limit = 1 if len(name) <= 5 else 2
    scored = sorted((edit_distance(name, k), k) for k in known if k != name)
    return scored[0][1] if scored and scored[0][0] <= limit else None
