"""Stop strings: a sequence ends at the token that completes one of them (e.g. the end of a
code fence), checked on the decoded text of each row as it grows.

Only the tail of a row is decoded each step (enough tokens to hold the longest stop string,
every token being at least one character of text), so the check costs the same at token
500 as at token 5. Checked every step, a stop string is found at the token that completes
it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from learner.sampling import Completion


class StopStrings:
    def __init__(self, stops: Sequence[str], decode: Callable[[list[int]], str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.decode = decode
        self.window = max((len(s) for s in self.stops), default=0) + 2

    def __bool__(self) -> bool:
        return bool(self.stops)

    def hit(self, tokens: list[int]) -> bool:
        """Whether the text of ``tokens`` ends a stop string somewhere in its tail."""
        if not self.stops:
            return False
        text = self.decode(tokens[-self.window :])
        return any(s in text for s in self.stops)

    def first_hit(self, tokens: Sequence[int]) -> int | None:
        """The number of tokens up to and including the one completing a stop string."""
        for end in range(1, len(tokens) + 1):
            if self.hit(list(tokens[:end])):
                return end
        return None

    def truncate(self, completion: Completion) -> Completion:
        """``completion`` cut after the token completing a stop string (finish ``stop``),
        for samplers that cannot check while decoding."""
        end = self.first_hit(completion.tokens)
        if end is None:
            return completion
        return Completion(
            completion.tokens[:end], completion.logprobs[:end], "stop", completion.versions[:end]
        )
