"""Video bytes -> (frames, metadata) with PyAV (the `video` extra), reading only the frames Gemma 4 samples, as
transformers' PyAV reader does: the stream's frame count and average rate, indices i * total // 32."""
import io

import numpy as np

from atomlite.multimodal.media import MediaError, MediaPolicy
from atomlite.multimodal.video import MAX_FRAMES, sample_indices

MAX_DECODED_FRAMES = 200_000


def decode_video(data: bytes, policy: MediaPolicy, where: str) -> tuple[np.ndarray, dict]:
    """([T, H, W, 3] uint8 of the sampled frames, {"fps", "frames_indices"}) as vLLM hands videos over."""
    try:
        import av
    except ImportError:
        raise MediaError(where, "decoding video needs PyAV, which is not installed: pip install 'atomlite[video]'") \
            from None
    try:
        with av.open(io.BytesIO(data)) as container:
            if not container.streams.video:
                raise MediaError(where, "the file has no video stream")
            stream = container.streams.video[0]
            if stream.codec_context.width * stream.codec_context.height > policy.max_image_pixels:
                raise MediaError(where, f"video frames of {stream.codec_context.width}x{stream.codec_context.height}"
                                        f" pixels are over the limit of {policy.max_image_pixels}")
            total = stream.frames or _count_frames(container, stream, where)
            wanted = sample_indices(total, MAX_FRAMES)
            frames = _read_frames(container, stream, set(wanted))
    except av.FFmpegError as e:
        raise MediaError(where, f"not a decodable video ({e})") from None
    if not frames:
        raise MediaError(where, "the video has no frames")
    indices = [i for i in wanted if i in frames]
    fps = float(stream.average_rate) if stream.average_rate else None
    return np.stack([frames[i] for i in indices]), {"fps": fps, "frames_indices": indices}


def _count_frames(container, stream, where: str) -> int:
    count = 0
    for _ in container.decode(stream):
        count += 1
        if count > MAX_DECODED_FRAMES:
            raise MediaError(where, f"the video has more than {MAX_DECODED_FRAMES} frames")
    container.seek(0)
    return count


def _read_frames(container, stream, wanted: set[int]) -> dict[int, np.ndarray]:
    frames, last = {}, max(wanted, default=-1)
    for i, frame in enumerate(container.decode(stream)):
        if i > last:
            break
        if i in wanted:
            frames[i] = frame.to_ndarray(format="rgb24")
    return frames
