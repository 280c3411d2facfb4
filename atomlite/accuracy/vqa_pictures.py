"""Synthetic pictures for the demo's vision tower (the demo-vqa job's, and those its training in
tools/demo_training/train_vision.py draws): one to four shapes (circles, squares, triangles) of one colour on a
light background, small (32 to 64 pixels a side), and questions about them with short answers, as chats in the
demo's chat template. Seeded: a picture and its question depend only on the generator's state.

    What color are the shapes?  -> Red.
    How many shapes are there?  -> 3.
    What is in the image?       -> 3 red shapes.

Training and evaluation draw from disjoint seeds (TRAIN_SEED here, EVAL_SEED for the demo-vqa accuracy job).
"""
import io
import random
import re
from dataclasses import dataclass

from PIL import Image, ImageDraw

COLORS = {"red": (215, 40, 40), "green": (40, 165, 60), "blue": (45, 85, 220), "yellow": (235, 200, 35)}
SHAPES = ("circle", "square", "triangle")
MAX_SHAPES = 4
SIDES = (32, 40, 48, 56, 64)
QUESTIONS = {
    "color": ["What color are the shapes?", "What colour are the shapes?", "Which color are they?"],
    "count": ["How many shapes are there?", "How many shapes?", "Count the shapes."],
    "describe": ["What is in the image?", "What do you see?", "Describe the image."],
}
TRAIN_SEED, EVAL_SEED = 11, 3001


@dataclass(frozen=True)
class Picture:
    image: Image.Image
    color: str
    count: int


def answer(kind: str, picture: Picture) -> str:
    if kind == "color":
        return f"{picture.color.capitalize()}."
    if kind == "count":
        return f"{picture.count}."
    return f"{picture.count} {picture.color} shape{'s' if picture.count > 1 else ''}."


def normalized(text: str) -> str:
    """An answer compared without case, punctuation or surrounding space."""
    return re.sub(r"[^a-z0-9 ]", "", text.lower()).strip()


def _jittered(rgb: tuple[int, int, int], rng: random.Random, spread: int) -> tuple[int, ...]:
    return tuple(min(255, max(0, c + rng.randint(-spread, spread))) for c in rgb)


def picture(rng: random.Random) -> Picture:
    """Shapes in distinct cells of a 2 x 2 grid, each inside its cell with a margin, so none touch."""
    width, height = rng.choice(SIDES), rng.choice(SIDES)
    color, count = rng.choice(list(COLORS)), rng.randint(1, MAX_SHAPES)
    background = _jittered((242, 242, 242), rng, 12)
    image = Image.new("RGB", (width, height), background)
    draw = ImageDraw.Draw(image)
    fill = _jittered(COLORS[color], rng, 20)
    cell_w, cell_h = width // 2, height // 2
    for cell in rng.sample(range(4), count):
        size = rng.randint(max(6, min(cell_w, cell_h) // 2), min(cell_w, cell_h) - 3)
        x0 = (cell % 2) * cell_w + rng.randint(1, cell_w - size - 1)
        y0 = (cell // 2) * cell_h + rng.randint(1, cell_h - size - 1)
        box = (x0, y0, x0 + size, y0 + size)
        shape = rng.choice(SHAPES)
        if shape == "circle":
            draw.ellipse(box, fill=fill)
        elif shape == "square":
            draw.rectangle(box, fill=fill)
        else:
            draw.polygon([(x0 + size / 2, y0), (x0, y0 + size), (x0 + size, y0 + size)], fill=fill)
    return Picture(image, color, count)


def question(rng: random.Random, picture: Picture) -> tuple[str, str]:
    """(question, answer) about the picture."""
    kind = rng.choice(list(QUESTIONS))
    return rng.choice(QUESTIONS[kind]), answer(kind, picture)


def png_bytes(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def eval_items(n: int, seed: int = EVAL_SEED) -> list[tuple[Picture, str, str]]:
    """n held-out (picture, question, answer) triples."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        p = picture(rng)
        items.append((p, *question(rng, p)))
    return items
