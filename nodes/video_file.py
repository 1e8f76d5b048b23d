"""An H.264 MP4 written frame by frame with PyAV (ComfyUI's own video dependency)."""

from __future__ import annotations

from fractions import Fraction

from ..fastar_core.errors import FastARError


class Mp4Writer:
    def __init__(self, path, fps: float, width: int, height: int, metadata: dict | None = None, crf: int = 19):
        try:
            import av
        except ImportError:
            raise FastARError("writing the video needs PyAV (pip install av); ComfyUI installs it") from None
        self.container = av.open(str(path), mode="w", options={"movflags": "use_metadata_tags"})
        for key, value in (metadata or {}).items():
            self.container.metadata[key] = value
        self.stream = self.container.add_stream("h264", rate=Fraction(round(fps * 1000), 1000))
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = "yuv420p"
        self.stream.options = {"crf": str(crf)}
        self.frames = 0
        self._av = av

    def write(self, frames) -> None:
        """uint8 frames [n, H, W, 3] (a CPU tensor or numpy array)."""
        for frame in frames:
            image = self._av.VideoFrame.from_ndarray(frame.numpy() if hasattr(frame, "numpy") else frame,
                                                     format="rgb24")
            for packet in self.stream.encode(image):
                self.container.mux(packet)
            self.frames += 1

    def abort(self) -> None:
        """Close without finishing (after an error or interrupt) and remove the partial file."""
        import os

        if self.container is not None:
            name = self.container.name
            self.container.close()
            self.container = None
            if os.path.exists(name):
                os.remove(name)

    def close(self) -> None:
        if self.container is None:
            return
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()
        self.container = None
