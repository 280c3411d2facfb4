"""N-gram (prompt lookup) drafts: where the sequence's last n tokens occurred before, propose what followed them.
No weights; pays off where outputs repeat their input (code edits, quoting, extraction)."""
import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def propose_ngram(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the longest suffix of n_max..n_min tokens."""
    if len(tokens) < n_min + 1:
        return []
    history = np.asarray(tokens, dtype=np.int64)
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        windows = sliding_window_view(history[:-1], n)  # every n-gram that ends before the last token
        found = np.flatnonzero((windows == history[-n:]).all(axis=1))
        if found.size:
            start = int(found[-1]) + n
            return tokens[start:start + k]
    return []
