"""What one synth run cost, on this machine's wall clock: every graph call timed by name, the
streaming Code2Wav decoder's chunks as they leave, time to first audio and the real-time factor.

The clock starts once every graph the run needs is open (sessions created, eager modules built:
`setup_ms`, not part of the figures) and covers prompt, generation and decoding. Host work is the
run's wall time outside graph calls: sampling, embedding gathers, KV-cache copies, window building.
"""
from __future__ import annotations

import os
import socket
import time

import numpy as np

_TALKER = ("talker_decode", "talker_decode_part1", "talker_decode_part2")
_PREDICTOR = ("predictor_frame", "predictor_prefill", "predictor_decode")


class Latency:
    """A graph set (graphs.py) that times its calls, and the streaming decoder fed frame by frame."""

    def __init__(self, graphs, model):
        self.inner, self.model = graphs, model
        self.calls: dict[str, list[float]] = {}
        self.before: dict[str, list[float]] = {}
        self.chunks: list[dict] = []
        self.frames = 0
        self.t0 = self.t1 = None
        self.setup = 0.0
        self.load = os.getloadavg()[0]
        self._stream = None
        self._pieces: list = []
        self._last = ("", 0.0)

    def __getattr__(self, name):            # specs, precision, close, ... of the graphs it times
        return getattr(self.__dict__["inner"], name)

    def __call__(self, name: str, inputs: dict) -> dict:
        t = time.perf_counter()
        out = self.inner(name, inputs)
        dt = time.perf_counter() - t
        self.calls.setdefault(name, []).append(dt)
        self._last = (name, dt)
        return out

    def start(self, predictor: str | None = None, stream: bool = True) -> None:
        """Open what the run needs (its setup, untimed), then start the clock; `stream`: decode chunks
        as their frames arrive (frame())."""
        t = time.perf_counter()
        self._open(self._needed(predictor))
        self.setup = time.perf_counter() - t
        self.before, self.calls = self.calls, {}       # the voice's graphs (speaker encoder), before the clock
        self._stream = self.model.chunk_stream(self, self._chunk) if stream else None
        self.t0 = time.perf_counter()

    def frame(self, codes16) -> None:
        """host.generate's on_frame: one more frame of codes."""
        self.frames += 1
        if self._stream is not None:
            self._pieces += self._stream.push(codes16)

    def decode(self, codes: np.ndarray) -> np.ndarray:
        """The whole waveform: the stream's chunks so far and the rest (or, decoding given codes, all of them)."""
        if self.t0 is None:
            self.start()
        if self._stream is not None and not self.frames:
            self._pieces += self._stream.push(codes)
        if self._stream is not None:
            self._pieces += self._stream.finish()
            wav = np.concatenate(self._pieces) if self._pieces else np.zeros(0, np.float32)
        else:
            wav = self.model.decode(self, codes) if len(codes) else np.zeros(0, np.float32)
        self.t1 = time.perf_counter()
        return wav

    def _chunk(self, end: int, samples: int) -> None:
        name, dt = self._last
        self.chunks.append({"graph": name, "frames": end - sum(c["frames"] for c in self.chunks),
                            "ms": round(1e3 * dt, 2), "audio_ready_ms": round(1e3 * (time.perf_counter() - self.t0), 2)})

    def _needed(self, predictor: str | None) -> list[str]:
        m = self.model
        want = {"text_projection", "talker_prefill", "talker_decode", "talker_prefill_part1", "talker_prefill_part2",
                "talker_decode_part1", "talker_decode_part2", *m.chunk_graphs()}
        if predictor:
            want |= {"predictor_frame"} if predictor == "frame" else {"predictor_prefill", "predictor_decode"}
        return [n for n in m.components() if n in want]

    def _open(self, names: list[str]) -> None:
        g = self.inner
        if hasattr(g, "open"):                    # a build's sessions
            g.open([n for n in names if n in g.specs])
        elif hasattr(g, "graph"):                 # eager modules
            for n in names:
                g.graph(n)

    def summary(self, audio_seconds: float, where: str) -> dict:
        """The --json figures: ttfa_ms, first_audio_after_frames, rtf, stages_ms, chunks, and what timed them."""
        if self.t0 is None or self.t1 is None:
            return {}
        wall = self.t1 - self.t0
        in_graphs = sum(sum(v) for v in self.calls.values())
        stages = {n: {"calls": len(v), "total": _ms(sum(v)), "mean": _ms(sum(v) / len(v))} for n, v in self.calls.items()}
        stages["host"] = {"total": _ms(wall - in_graphs),
                          "what": "sampling, embedding gathers, KV-cache copies, chunk windows: wall time outside graph calls"}
        frames = max(self.frames, 1)

        def per_frame(names) -> float:
            return _ms(sum(sum(self.calls.get(n, ())) for n in names) / frames)

        first = self.chunks[0] if self.chunks else None
        return {
            "ttfa_ms": first["audio_ready_ms"] if first else None,
            "first_audio_after_frames": first["frames"] if first else None,
            "rtf": round(wall / audio_seconds, 4) if audio_seconds else None,
            "latency": {
                "timed_on": f"wall clock of this machine ({socket.gethostname()}, {os.cpu_count()} cores, load average "
                            f"{self.load:.1f} at start), graphs: {where}",
                "total_ms": _ms(wall), "setup_ms": _ms(self.setup), "audio_s": round(audio_seconds, 3),
                "per_frame_ms": {"talker": per_frame(_TALKER), "predictor": per_frame(_PREDICTOR),
                                 "code2wav": per_frame(self.model.chunk_graphs()),
                                 "host": _ms((wall - in_graphs) / frames)},
                "stages_ms": stages, "chunks": self.chunks,
                **({"before_clock_ms": {n: _ms(sum(v)) for n, v in self.before.items()}} if self.before else {}),
                **({} if self._stream is not None else
                   {"not_streamed": "decoded after generation (in-context cloning decodes with the reference)"}),
            },
        }


def _ms(seconds: float) -> float:
    return round(1e3 * seconds, 2)


def first_audio(options: dict) -> dict:
    """RealTime.first_audio: the frames of codes before the first audio along --chunk-schedule (its
    first chunk, capped at --chunk-frames), the Code2Wav graph that decodes them, and the graph calls that
    make them after the prompt (host.generate: the prefill gives frame 1's code 0; each frame one
    predictor frame, each frame after the first one talker step)."""
    from ...core import variant_name
    from .model import parse_schedule

    chunk = int(options["chunk-frames"])
    schedule = [min(n, chunk) for n in parse_schedule(options.get("chunk-schedule"))]
    frames = schedule[0] if schedule else chunk
    return {"frames": frames, "graph": "code2wav" if frames == chunk else variant_name("code2wav", "N", frames),
            "calls": (("predictor_frame", frames), ("talker_decode", frames - 1))}
