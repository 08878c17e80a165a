"""A function wrapper that records its calls, shared by tests that check what a module passes on."""
from typing import Any, Dict, List, Tuple


class CallSpy:
    """Wraps a function, records its positional and keyword arguments, calls through.

    Args:
        fn: The function to wrap.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.calls: List[Tuple[tuple, Dict[str, Any]]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return self.fn(*args, **kwargs)
