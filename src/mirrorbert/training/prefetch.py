"""Batches made in a background thread ahead of the step that trains them (MLM's masking, Mirror-BERT's views)."""

from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator


def prefetch(make_items: Iterable[Any], depth: int = 4, name: str = "prefetch") -> Iterator[Any]:
    """The items of `make_items` in order, made by one background thread `depth` items ahead (`depth` 0: in this
    thread)."""
    if depth <= 0:
        yield from make_items
        return
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

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
            q.put(("done", None))
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

