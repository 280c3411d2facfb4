"""Which steps of an image request hold the GIL, and for how long: a ticker thread's lateness while each step runs
on 16 chats with one 896x896 PNG data-URL image (what `bench serve --images-per-prompt 1` sends)."""
import base64
import concurrent.futures
import io
import pickle
import threading
import time

from PIL import Image

from atomlite.benchmarks.images import ImageLoad, image_chats
from atomlite.multimodal.chat_media import load_media, media_parts
from atomlite.multimodal.items import image_item
from atomlite.engine.ipc.core import pickled_frames
from atomlite.multimodal.media import MediaPolicy, _b64decode
from atomlite.multimodal.patches import PatchSpec

CHATS = image_chats(16, ImageLoad(1, 896, 896), 256, 0)
URLS = [c[0]["content"][0]["image_url"]["url"].split(",", 1)[1] for c in CHATS]
late, stopping = [], threading.Event()


def ticker():
    while not stopping.is_set():
        t = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - t - 0.001)


def measure(name, fn, items, threads=1):
    time.sleep(0.05)
    late.clear()
    start = time.perf_counter()
    if threads == 1:
        out = [fn(x) for x in items]
    else:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            out = list(pool.map(fn, items))
    took = time.perf_counter() - start
    ranked = sorted(late) or [0.0]
    print(f"{name:<44} {took / len(items) * 1e3:7.1f} ms each  lateness p99 {ranked[int(len(ranked) * 0.99)] * 1e3:6.1f}"
          f"  max {ranked[-1] * 1e3:6.1f} ms", flush=True)
    return out


def main():
    threading.Thread(target=ticker, daemon=True).start()
    policy = MediaPolicy(None, ())
    measure("idle (sleep 10 ms)", lambda _: time.sleep(0.01), range(16))
    measure("idle, 4 threads", lambda _: time.sleep(0.01), range(16), threads=4)
    measure("b64decode in one call", lambda u: base64.b64decode(u, validate=True), URLS)
    raw = measure("b64decode in slices (media._b64decode)", _b64decode, URLS)
    images = measure("PIL open + load + RGB", lambda b: Image.open(io.BytesIO(b)).convert("RGB"), raw)
    items = measure("image_item (resize, patches, hash)", lambda i: image_item(i, PatchSpec(max_soft_tokens=280), "x"),
                    images)
    measure("load_media + image_item, 4 threads",
            lambda c: image_item(load_media(media_parts(c), policy)[0][0], PatchSpec(max_soft_tokens=280), "x"),
            CHATS, threads=4)
    measure("pickle.dumps(item) in band", lambda i: pickle.dumps(i, protocol=5), items)
    measure("pickled_frames(item): out of band", pickled_frames, items)
    stopping.set()


if __name__ == "__main__":
    main()
