"""Media from chat URLs under the operator's policy (vLLM's flags): data: URLs always; file:// only inside
--allowed-local-media-path (after symlinks are resolved); http(s) only from a host in --allowed-media-domains
(exact match), with a byte limit, a deadline, and every redirect's host checked. Anything else is refused with a
MediaError naming the request part it came from."""
import base64
import io
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

MIB = 2**20


class MediaError(ValueError):
    """A media URL refused or undecodable; the message starts with the request part (`messages[0].content[1]...`)."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where = where


@dataclass(frozen=True)
class MediaPolicy:
    allowed_local_media_path: Path | None = None  # resolved; None: file:// refused
    allowed_media_domains: tuple[str, ...] = ()  # lower-case host names; empty: http(s) refused
    max_bytes: int = 64 * MIB
    timeout_s: float = 10.0  # the whole fetch, redirects included
    max_redirects: int = 5
    max_image_pixels: int = 40_000_000  # also per video frame


def fetch_media(url: str, kind: str, policy: MediaPolicy, where: str) -> bytes:
    """The bytes of an image, video or audio URL (kind "image" | "video" | "audio"), or a MediaError saying why
    not."""
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "data":
        return _data_url(url, kind, policy, where)
    if scheme == "file":
        return _local_file(url, policy, where)
    if scheme in ("http", "https"):
        return _http(url, policy, where)
    raise MediaError(where, f"unsupported URL scheme {scheme or 'none'!r}: send a data: URL (base64), or an http(s) "
                            f"or file:// URL the server allows")


def _data_url(url: str, kind: str, policy: MediaPolicy, where: str) -> bytes:
    header, comma, payload = url[len("data:"):].partition(",")
    media_type, *params = header.split(";")
    if not comma or "base64" not in params:
        raise MediaError(where, f"a data: URL must be data:{kind}/...;base64,<data>")
    if not media_type.lower().startswith(f"{kind}/"):
        raise MediaError(where, f"a data: URL of type {media_type or 'none'!r} is not {kind} ({kind}/*)")
    if len(payload) * 3 // 4 > policy.max_bytes:
        raise MediaError(where, f"the {kind} is over {policy.max_bytes} bytes")
    try:
        return _b64decode(payload)
    except ValueError:
        raise MediaError(where, "the data: URL is not valid base64") from None


B64_SLICE = 1 << 16  # base64 characters decoded per call


def _b64decode(payload: str) -> bytes:
    """Strict base64, decoded in slices: one call over megabytes holds the GIL for tens of milliseconds, which would
    stall the server's event loop; between slices it runs. Padding may end the payload only."""
    if "=" in payload[:-2]:
        raise ValueError("padding inside base64")
    return b"".join(base64.b64decode(payload[i:i + B64_SLICE], validate=True)
                    for i in range(0, len(payload), B64_SLICE))


def _local_file(url: str, policy: MediaPolicy, where: str) -> bytes:
    root = policy.allowed_local_media_path
    if root is None:
        raise MediaError(where, "file:// URLs are refused: the server reads local files only under "
                                "--allowed-local-media-path")
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaError(where, f"a file:// URL names a host ({parts.netloc}); use file:///absolute/path")
    try:
        path = Path(urllib.parse.unquote(parts.path)).resolve(strict=True)
    except (OSError, RuntimeError):
        raise MediaError(where, "no such file") from None
    if not path.is_relative_to(root) or not path.is_file():
        raise MediaError(where, f"file:// URLs must name a file under --allowed-local-media-path {root}")
    if path.stat().st_size > policy.max_bytes:
        raise MediaError(where, f"the file is over {policy.max_bytes} bytes")
    return path.read_bytes()


def _check_host(url: str, policy: MediaPolicy, where: str) -> None:
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or host not in policy.allowed_media_domains:
        allowed = ", ".join(policy.allowed_media_domains) or "none: --allowed-media-domains is not set"
        raise MediaError(where, f"fetching from {host or url!r} is not allowed (allowed hosts: {allowed})")


def _http(url: str, policy: MediaPolicy, where: str) -> bytes:
    import httpx
    deadline = time.monotonic() + policy.timeout_s
    try:
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=policy.timeout_s) as client:
            for _ in range(policy.max_redirects + 1):
                _check_host(url, policy, where)
                with client.stream("GET", url) as response:
                    if not response.is_redirect:
                        return _body(response, policy, deadline, where)
                    url = str(response.url.join(response.headers.get("location", "")))
    except httpx.TimeoutException:
        raise MediaError(where, f"fetching the URL timed out after {policy.timeout_s:g} s") from None
    except httpx.HTTPError as e:
        raise MediaError(where, f"fetching the URL failed: {e}") from None
    raise MediaError(where, f"fetching the URL took more than {policy.max_redirects} redirects")


def _body(response, policy: MediaPolicy, deadline: float, where: str) -> bytes:
    if response.status_code != 200:
        raise MediaError(where, f"fetching the URL answered HTTP {response.status_code}")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise MediaError(where, f"the media is over {policy.max_bytes} bytes")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > policy.max_bytes:
            raise MediaError(where, f"the media is over {policy.max_bytes} bytes")
        if time.monotonic() > deadline:
            raise MediaError(where, f"fetching the URL timed out after {policy.timeout_s:g} s")
    return bytes(body)


def decode_image(data: bytes, policy: MediaPolicy, where: str):
    """A PIL image, its pixels loaded, after its header says it is within max_image_pixels."""
    from PIL import Image
    try:
        image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > policy.max_image_pixels:
            raise MediaError(where, f"the image is {width}x{height} pixels, over the limit of "
                                    f"{policy.max_image_pixels}")
        image.load()
    except (Image.DecompressionBombError, Image.UnidentifiedImageError, OSError, SyntaxError) as e:
        raise MediaError(where, f"not a decodable image ({type(e).__name__}: {e})") from None
    return image


def load_image(url: str, policy: MediaPolicy, where: str):
    return decode_image(fetch_media(url, "image", policy, where), policy, where)


def load_audio(url: str, policy: MediaPolicy, where: str):
    from atomlite.multimodal.audio import decode_audio
    return decode_audio(fetch_media(url, "audio", policy, where), where)


def load_video(url: str, policy: MediaPolicy, where: str):
    from atomlite.multimodal.video_decode import decode_video
    return decode_video(fetch_media(url, "video", policy, where), policy, where)
