"""Media URLs under the operator's policy: data: URLs always; file:// only inside the allowed folder; http(s) only
from allowed hosts, served here by a local HTTP server on 127.0.0.1, with a byte limit, a deadline and redirects
checked host by host; decoding bounded."""
import base64
import contextlib
import http.server
import io
import threading
import time

import numpy as np
import pytest
from PIL import Image

from atomlite.multimodal.media import MediaError, MediaPolicy, decode_image, fetch_media, load_image, load_video
from atomlite.multimodal.options import parse_allowed_media_domains
from vision_checkpoint import video_bytes

WHERE = "messages[0].content[1].image_url"


def png_bytes(height=20, width=30, seed=0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        port = self.server.server_address[1]
        routes = {
            "/img.png": lambda: self._send(png_bytes()),
            "/big": lambda: self._stream(chunks=64, size=2**16),
            "/slow": lambda: self._stream(chunks=20, size=10, pause=0.2),
            "/to-local-name": lambda: self._redirect(f"http://localhost:{port}/img.png"),
            "/to-same-host": lambda: self._redirect("/img.png"),
            "/missing": lambda: self._send(b"no", status=404),
        }
        routes[self.path]()

    def _send(self, body: bytes, status: int = 200):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, chunks: int, size: int, pause: float = 0.0):
        self.send_response(200)  # no Content-Length: only reading shows the size
        self.end_headers()
        with contextlib.suppress(OSError):
            for _ in range(chunks):
                self.wfile.write(b"x" * size)
                self.wfile.flush()
                time.sleep(pause)

    def _redirect(self, location: str):
        self.send_response(302)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture(scope="module")
def media_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


ALLOW_LOCAL = MediaPolicy(allowed_media_domains=("127.0.0.1",))


def test_a_data_url_image_is_read_by_default():
    image = load_image(data_url(png_bytes(20, 30)), MediaPolicy(), WHERE)
    assert image.size == (30, 20)
    assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(png_bytes(20, 30)))))


@pytest.mark.parametrize("url,reason", [
    ("data:text/plain;base64,aGk=", "is not image"),
    ("data:image/png,rawtext", "data:image/...;base64"),
    ("data:image/png;base64,@@@", "not valid base64"),
    (data_url(b"not an image at all"), "not a decodable image"),
    ("ftp://example.com/a.png", "unsupported URL scheme 'ftp'"),
])
def test_bad_data_urls_and_schemes_are_refused_naming_the_part(url, reason):
    with pytest.raises(MediaError, match=reason) as e:
        load_image(url, MediaPolicy(), WHERE)
    assert str(e.value).startswith(WHERE + ": ")


def test_base64_over_several_slices_decodes_as_one_call_and_padding_only_ends_it():
    from atomlite.multimodal.media import B64_SLICE, _b64decode
    raw = np.random.default_rng(0).integers(0, 256, 3 * B64_SLICE + 1, dtype=np.uint8).tobytes()
    encoded = base64.b64encode(raw).decode()
    assert len(encoded) > 3 * B64_SLICE and _b64decode(encoded) == raw
    with pytest.raises(ValueError):
        _b64decode("QQ==" + "QUJD" * B64_SLICE)  # padding inside: whole-string decoding refuses it too
    with pytest.raises(ValueError):
        _b64decode(encoded[:-1])


def test_file_urls_are_refused_by_default(tmp_path):
    (tmp_path / "a.png").write_bytes(png_bytes())
    with pytest.raises(MediaError, match="--allowed-local-media-path"):
        fetch_media(f"file://{tmp_path}/a.png", "image", MediaPolicy(), WHERE)


def test_file_urls_are_read_under_the_allowed_folder_only(tmp_path):
    allowed, outside = tmp_path / "media", tmp_path / "secret"
    allowed.mkdir(), outside.mkdir()
    (allowed / "a b.png").write_bytes(png_bytes())
    (outside / "key.png").write_bytes(png_bytes(seed=1))
    (allowed / "link.png").symlink_to(outside / "key.png")
    policy = MediaPolicy(allowed_local_media_path=allowed.resolve())
    assert fetch_media(f"file://{allowed}/a%20b.png", "image", policy, WHERE) == png_bytes()
    for url in (f"file://{allowed}/../secret/key.png", f"file://{allowed}/link.png", f"file://{outside}/key.png"):
        with pytest.raises(MediaError, match="must name a file under --allowed-local-media-path"):
            fetch_media(url, "image", policy, WHERE)
    with pytest.raises(MediaError, match="no such file"):
        fetch_media(f"file://{allowed}/nothing.png", "image", policy, WHERE)
    with pytest.raises(MediaError, match="names a host"):
        fetch_media(f"file://example.com{allowed}/a%20b.png", "image", policy, WHERE)


def test_http_is_refused_by_default(media_server):
    with pytest.raises(MediaError, match="not allowed .*--allowed-media-domains is not set"):
        fetch_media(f"{media_server}/img.png", "image", MediaPolicy(), WHERE)


def test_http_from_an_allowed_host_is_read(media_server):
    assert fetch_media(f"{media_server}/img.png", "image", ALLOW_LOCAL, WHERE) == png_bytes()
    assert fetch_media(f"{media_server}/to-same-host", "image", ALLOW_LOCAL, WHERE) == png_bytes()


def test_only_exact_hosts_are_allowed(media_server):
    near_misses = MediaPolicy(allowed_media_domains=("127.0.0.10", "0.0.1", "localhost"))
    with pytest.raises(MediaError, match="fetching from '127.0.0.1' is not allowed"):
        fetch_media(f"{media_server}/img.png", "image", near_misses, WHERE)


def test_a_redirect_to_a_host_not_allowed_is_refused(media_server):
    with pytest.raises(MediaError, match="fetching from 'localhost' is not allowed"):
        fetch_media(f"{media_server}/to-local-name", "image", ALLOW_LOCAL, WHERE)


def test_a_body_over_the_byte_limit_is_refused(media_server):
    small = MediaPolicy(allowed_media_domains=("127.0.0.1",), max_bytes=100_000)
    with pytest.raises(MediaError, match="over 100000 bytes"):
        fetch_media(f"{media_server}/big", "image", small, WHERE)
    tiny = MediaPolicy(allowed_media_domains=("127.0.0.1",), max_bytes=100)
    with pytest.raises(MediaError, match="over 100 bytes"):  # refused on its Content-Length
        fetch_media(f"{media_server}/img.png", "image", tiny, WHERE)


def test_a_slow_server_times_out(media_server):
    impatient = MediaPolicy(allowed_media_domains=("127.0.0.1",), timeout_s=0.5)
    start = time.monotonic()
    with pytest.raises(MediaError, match="timed out after 0.5 s"):
        fetch_media(f"{media_server}/slow", "image", impatient, WHERE)
    assert time.monotonic() - start < 2.0


def test_an_http_error_status_is_refused(media_server):
    with pytest.raises(MediaError, match="answered HTTP 404"):
        fetch_media(f"{media_server}/missing", "image", ALLOW_LOCAL, WHERE)


def test_an_image_over_the_pixel_bound_is_refused_before_decoding():
    with pytest.raises(MediaError, match="30x20 pixels, over the limit of 500"):
        decode_image(png_bytes(20, 30), MediaPolicy(max_image_pixels=500), WHERE)


def test_allowed_media_domains_take_host_names_alone():
    assert parse_allowed_media_domains(["A.com,b.org", "c.net"]) == ("a.com", "b.org", "c.net")
    for bad in ("https://a.com", "a.com:8080", "a.com/path"):
        with pytest.raises(ValueError, match="host names alone"):
            parse_allowed_media_domains(bad)


@pytest.mark.parametrize("codec", ["mpeg4", "ffv1"])
def test_a_video_data_url_is_decoded_to_the_frames_gemma4_samples(codec):
    frames, metadata = load_video(data_url(video_bytes(45, 10, codec), "video/mp4"), MediaPolicy(), "video")
    assert metadata["fps"] == 10.0
    assert metadata["frames_indices"] == [i * 45 // 32 for i in range(32)]
    assert frames.shape == (32, 48, 64, 3)
    brightness = frames.reshape(32, -1).mean(axis=1)
    assert np.allclose(brightness, [5 * i for i in metadata["frames_indices"]], atol=1.5)


def test_a_file_that_is_no_video_is_refused_naming_the_part():
    with pytest.raises(MediaError, match="^video: not a decodable video"):
        load_video(data_url(b"garbage" * 100, "video/mp4"), MediaPolicy(), "video")
