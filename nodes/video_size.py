"""Size and length in one place: the start node.

A start node (AR Image to Video, World Model Start) is where a video's width, height and length are set: it encodes
the start at that size, records it in its conditioning (``VIDEO_SIZE_KEY``) and gives it as INT outputs, which the
shipped workflows link to the sampler's width, height and length. A sampler whose size differs from its start's (an
unlinked widget left at another value, or a LATENT of another size) is refused before anything is loaded, in one
line naming both.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..fastar_core.errors import FastARError
from .constants import VIDEO_SIZE_KEY


@dataclass(frozen=True)
class VideoSize:
    width: int
    height: int
    length: int  # video frames
    node: str  # the start node that set it, for messages

    def as_extras(self) -> dict:
        """The conditioning entry's extra: plain values, which ComfyUI's conditioning copies carry unchanged."""
        return {VIDEO_SIZE_KEY: (self.width, self.height, self.length, self.node)}


def size_of_start(positive) -> VideoSize | None:
    """The size a start node recorded in a CONDITIONING's first entry, or in a prompt schedule (None: no start
    node's)."""
    if hasattr(positive, "video_size"):  # an AR Prompt Schedule carries conditioning_1's
        return positive.video_size
    if not isinstance(positive, (list, tuple)) or not positive:
        return None
    entry = positive[0]
    extras = entry[1] if isinstance(entry, (list, tuple)) and len(entry) > 1 and isinstance(entry[1], dict) else {}
    return size_from_extras(extras)


def size_from_extras(extras: dict) -> VideoSize | None:
    recorded = extras.get(VIDEO_SIZE_KEY)
    if recorded is None:
        return None
    if not (isinstance(recorded, (list, tuple)) and len(recorded) == 4 and all(isinstance(v, int)
                                                                               for v in recorded[:3])):
        raise FastARError(f"the conditioning's {VIDEO_SIZE_KEY} is {recorded!r}, not the (width, height, length, "
                          "node) a start node records")
    return VideoSize(*recorded[:3], str(recorded[3]))


def check_sampler_size(start: VideoSize | None, width: int, height: int, length: int,
                       sampler: str = "the sampler makes",
                       fix: str = "link its width, height and length outputs to the sampler's, or set them alike"
                       ) -> None:
    """Refuse a sampler size that is not its start node's, naming both (nothing to check without a start node).
    ``sampler`` says whose size ``width``, ``height`` and ``length`` are ("the Long Video Sampler makes")."""
    if start is None:
        return
    ours = {"width": width, "height": height, "length": length}
    theirs = {"width": start.width, "height": start.height, "length": start.length}
    differ = [k for k in ours if ours[k] != theirs[k]]
    if differ:
        said = ", ".join(f"{k} {ours[k]}" for k in differ)
        start_said = ", ".join(f"{k} {theirs[k]}" for k in differ)
        raise FastARError(f"{sampler} {said} but 'positive' comes from {start.node}, set to {start_said}: the start "
                          f"node sets the video's size and length ({fix})")
