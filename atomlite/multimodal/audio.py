"""Audio clips in: files decoded and resampled to 16 kHz mono with PyAV (FFmpeg: wav, mp3, flac, ogg, m4a, ...),
then turned into the Gemma 4 audio tower's log-mel features by transformers' own Gemma4AudioFeatureExtractor (the
checkpoint's settings), its padding cut off, and hashed.

A clip may last at most MAX_SECONDS: the extractor would silently cut a longer one, so it is refused instead."""
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import torch

from atomlite.multimodal.inputs import AudioItem
from atomlite.multimodal.media import MediaError

SAMPLE_RATE = 16_000  # what the feature extractor reads
MAX_SECONDS = 30
MAX_SOFT_TOKENS = 750  # a 30 s clip's: one soft token per 40 ms
FRAMES_PER_SOFT_TOKEN = 4  # 10 ms log-mel frames, subsampled twice by 2
MEL_BINS = 128


def dummy_features(num_soft_tokens: int) -> torch.Tensor:
    """Log-mel features of a clip the extractor could give with num_soft_tokens soft tokens (for profiling)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(num_soft_tokens * FRAMES_PER_SOFT_TOKEN, MEL_BINS, generator=generator)


def _require_av(where: str):
    try:
        import av
    except ImportError:
        raise MediaError(where, "decoding audio needs PyAV, which is not installed: pip install 'atomlite[audio]'") \
            from None
    return av


def decode_audio(data: bytes, where: str) -> np.ndarray:
    """The first audio stream of a file's bytes as 16 kHz mono float32 samples."""
    av = _require_av(where)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    chunks, count = [], 0
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.audio:
                raise MediaError(where, "the file has no audio stream")
            for frame in container.decode(container.streams.audio[0]):
                chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
                count += frame.samples * SAMPLE_RATE // frame.sample_rate
                _check_length(count, where)
            chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    except av.FFmpegError as e:
        raise MediaError(where, f"not a decodable audio file ({e})") from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return _checked(samples, where)


def resampled(samples: np.ndarray, rate: int, where: str) -> np.ndarray:
    """A mono waveform at `rate` Hz -> 16 kHz float32 (FFmpeg's resampler, as for decoded files)."""
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if rate == SAMPLE_RATE:
        return _checked(samples, where)
    _check_length(int(len(samples) * SAMPLE_RATE / rate), where)
    av = _require_av(where)
    frame = av.AudioFrame.from_ndarray(samples[None, :], format="flt", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame) + resampler.resample(None)]
    return _checked(np.concatenate(out) if out else np.zeros(0, np.float32), where)


def _check_length(num_samples: int, where: str) -> None:
    if num_samples > MAX_SECONDS * SAMPLE_RATE:
        raise MediaError(where, f"the clip lasts over {MAX_SECONDS} s, the limit per clip: cut it into shorter clips")


def _checked(samples: np.ndarray, where: str) -> np.ndarray:
    _check_length(len(samples), where)
    if not np.isfinite(samples).all():
        raise MediaError(where, "the clip has samples that are not finite numbers")
    return samples


def waveform(clip, where: str) -> np.ndarray:
    """vLLM's offline audio: (samples, sample_rate), samples [n] or [n, channels] (averaged to mono) -> 16 kHz."""
    if not (isinstance(clip, (tuple, list)) and len(clip) == 2):
        raise MediaError(where, f"give a clip as (samples, sample_rate), got {type(clip).__name__}")
    samples, rate = clip
    samples = np.asarray(samples)
    if samples.ndim == 2:
        samples = samples.mean(axis=1)
    if samples.ndim != 1 or not np.issubdtype(samples.dtype, np.number) or len(samples) == 0:
        raise MediaError(where, f"samples must be a non-empty 1-D (or [n, channels]) array of numbers, got "
                                f"{samples.dtype} {list(samples.shape)}")
    if isinstance(rate, bool) or not isinstance(rate, (int, np.integer)) or rate <= 0:
        raise MediaError(where, f"sample_rate must be a positive integer, got {rate!r}")
    return resampled(samples, int(rate), where)


class AudioFeatures:
    """The checkpoint's Gemma4AudioFeatureExtractor: processor_config.json's "feature_extractor", else
    preprocessor_config.json's, else transformers' defaults."""

    def __init__(self, model_dir: str | Path):
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
        settings = _settings(Path(model_dir))
        self.extractor = Gemma4AudioFeatureExtractor(**settings)
        if self.extractor.sampling_rate != SAMPLE_RATE or self.extractor.feature_size != MEL_BINS:
            raise ValueError(f"the checkpoint's audio feature extractor reads {self.extractor.sampling_rate} Hz into "
                             f"{self.extractor.feature_size} mel bins; atomlite takes {SAMPLE_RATE} Hz and {MEL_BINS}")
        if self.extractor.dither:
            raise ValueError("the checkpoint's audio feature extractor dithers (random noise): its features would "
                             "differ on every call; set dither to 0")
        self.settings = json.dumps(settings, sort_keys=True, default=str).encode()

    def item(self, samples: np.ndarray, where: str) -> AudioItem:
        """A 16 kHz mono clip -> its AudioItem."""
        batch = self.extractor([samples], return_tensors="np")  # a batch of one: the form it pads right
        features = batch["input_features"][0][batch["input_features_mask"][0]]
        if len(features) == 0:
            raise MediaError(where, f"the clip lasts {len(samples) / SAMPLE_RATE * 1000:.0f} ms, too short for one "
                                    f"soft token")
        h = hashlib.sha256(self.settings)
        h.update(np.ascontiguousarray(samples, dtype=np.float32).data)
        return AudioItem(torch.from_numpy(np.ascontiguousarray(features, dtype=np.float32)),
                         soft_token_count(len(features)), h.digest())


def soft_token_count(frames: int) -> int:
    """What the tower's two stride-2 convolutions leave of `frames` log-mel frames."""
    return (frames + 3) // 4


def _settings(model_dir: Path) -> dict:
    def read(name: str) -> dict:
        path = model_dir / name
        return json.loads(path.read_text()) if path.is_file() else {}
    given = read("processor_config.json").get("feature_extractor") or read("preprocessor_config.json")
    if given.get("feature_extractor_type", "Gemma4AudioFeatureExtractor") != "Gemma4AudioFeatureExtractor":
        given = {}  # a vision-only preprocessor_config.json
    return {k: v for k, v in given.items() if k not in ("feature_extractor_type", "processor_class")}
