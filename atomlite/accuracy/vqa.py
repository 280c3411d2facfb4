"""The demo-vqa task: held-out synthetic pictures (atomlite/accuracy/vqa_pictures.py, a seed apart from training's), each
sent as a data-URL PNG with its question to the server's chat API, scored by exact match of the answer without case
or punctuation. It returns lm-eval's result shape, so the runner reads and records it as any other task."""
import asyncio
import base64

import httpx

from atomlite.accuracy.vqa_pictures import eval_items, normalized, png_bytes

DEFAULT_ITEMS = 200
METRIC = "exact_match"


def data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()


def chat_request(model: str, image, question: str) -> dict:
    content = [{"type": "image_url", "image_url": {"url": data_url(image)}}, {"type": "text", "text": question}]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 24,
            "temperature": 0}


async def _ask_all(base_url: str, requests: list[dict], concurrency: int) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def ask(body: dict) -> str:
            async with gate:
                response = await client.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                return response.json()["choices"][0]["message"]["content"] or ""
        return await asyncio.gather(*(ask(body) for body in requests))


def run_vqa(base_url: str, model: str, task: str, limit: int | None = None, concurrency: int = 16) -> dict:
    """Ask the server at base_url (http://host:port) about `limit` held-out pictures (DEFAULT_ITEMS when None)."""
    items = eval_items(limit or DEFAULT_ITEMS)
    replies = asyncio.run(_ask_all(base_url, [chat_request(model, p.image, q) for p, q, _ in items], concurrency))
    samples = [{"doc_id": i, "question": q, "color": p.color, "count": p.count, "target": a, "response": reply,
                METRIC: float(normalized(reply) == normalized(a))}
               for i, ((p, q, a), reply) in enumerate(zip(items, replies))]
    score = sum(s[METRIC] for s in samples) / len(samples)
    return {"results": {task: {METRIC: score}}, "samples": {task: samples}}
