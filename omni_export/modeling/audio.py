"""Audio files: mono 16-bit PCM WAV written from float samples, and PCM WAV read back as mono
float32 at a sample rate (resampled when needed). Shared by the recipes' synth and prompts."""
from __future__ import annotations

import wave
from pathlib import Path


def write_wav(path: Path, wav, sr: int) -> None:
    import numpy as np

    pcm = (np.clip(np.asarray(wav, np.float32), -1, 1) * 32767).round().astype("<i2")
    path.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm.tobytes())


def read_wav(path: Path, sr: int, option: str = "--ref-audio"):
    """Mono float32 at `sr` from a PCM WAV (16/32-bit int); channels averaged, resampled if needed.
    Errors name `option`, the flag that gave the file."""
    import numpy as np

    from ..core import UsageError
    from ..weights import check_side_file

    check_side_file(Path(path), "reference audio")
    try:
        with wave.open(str(path), "rb") as w:
            ch, width, rate, n = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(n)
    except (wave.Error, EOFError, OSError) as e:
        raise UsageError(f"{option} {path}: not a PCM WAV file ({e})") from None
    if width not in (2, 4):
        raise UsageError(f"{option} {path}: {8 * width}-bit samples; use 16- or 32-bit PCM")
    x = np.frombuffer(raw, dtype="<i2" if width == 2 else "<i4").astype(np.float32) / (2 ** (8 * width - 1))
    x = x.reshape(-1, ch).mean(axis=1)
    if rate != sr:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(rate, sr)
        x = resample_poly(x, sr // g, rate // g).astype(np.float32)
    return x
