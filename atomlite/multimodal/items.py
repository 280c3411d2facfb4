"""Images and video frames as ImageItems: RGB pixels (transparency over white, as transformers converts), resized,
patched and hashed."""
import numpy as np

from atomlite.multimodal.inputs import ImageItem
from atomlite.multimodal.patches import PatchSpec, content_hash, fitted_size, patchify, resize_frames, resize_image
from atomlite.multimodal.video import SampledVideo

IMAGE_RESIZE = "pil-bicubic"
FRAME_RESIZE = "torch-bicubic-antialias"


def rgb_array(image, where: str) -> np.ndarray:
    """A PIL image or a uint8 array ([H, W], [H, W, 3] or [H, W, 4]) as [H, W, 3] uint8."""
    from PIL import Image
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3, 4)):
            raise ValueError(f"{where}: an image array must be uint8 of shape [H, W], [H, W, 3] or [H, W, 4]; got "
                             f"{image.dtype} {list(image.shape)}")
        image = Image.fromarray(image[..., 0] if image.ndim == 3 and image.shape[2] == 1 else image)
    if not isinstance(image, Image.Image):
        raise ValueError(f"{where}: expected a PIL image or a uint8 array, got {type(image).__name__}")
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return np.asarray(image.convert("RGB"))


def image_item(image, spec: PatchSpec, where: str) -> ImageItem:
    rgb = rgb_array(image, where)
    resized = resize_image(rgb, fitted_size(rgb.shape[0], rgb.shape[1], spec))
    pixel_values, positions, soft_tokens = patchify(resized, spec)
    return ImageItem("image", pixel_values, positions, soft_tokens, content_hash(rgb, spec, IMAGE_RESIZE))


def video_frame_items(video: SampledVideo, spec: PatchSpec) -> list[ImageItem]:
    """One item per sampled frame; every frame of a video has its size, so they resize together."""
    frames = video.frames
    resized = resize_frames(frames, fitted_size(frames.shape[1], frames.shape[2], spec))
    items = []
    for frame, original, timestamp in zip(resized, frames, video.timestamps):
        pixel_values, positions, soft_tokens = patchify(frame, spec)
        items.append(ImageItem("video", pixel_values, positions, soft_tokens,
                               content_hash(original, spec, FRAME_RESIZE), timestamp))
    return items
