"""Batches made in a background thread ahead of the step that trains them: tokenising or masking the next batch
overlaps the current step's compute (the tokenizers and torch release the GIL). Used by MLM pre-training (slicing
and masking the packed sequences) and Mirror-BERT (reading the token ids and making the second views)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator


def prefetch(make_items: Iterable[Any], depth: int = 4, name: str = "prefetch") -> Iterator[Any]:
    """Run an iterator in a background thread `depth` items ahead (`depth` 0: in this thread, as it is).

    Items are produced in order by a single thread, so prefetching never changes what the loop sees.
    """
    if depth <= 0:
        yield from make_items
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def worker() -> None:
        try:
            for item in make_items:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(("done", done))
        except BaseException as exc:  # surfaced in the consumer
            q.put(("error", exc))

    thread = threading.Thread(target=worker, name=name, daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                pass
            thread.join(timeout=0.05)

