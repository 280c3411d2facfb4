"""Synthetic arithmetic in the two formats lm-eval's gsm8k and MMLU templates use, and chats in the demo's chat
template, from one seeded generator.

gsm8k style: {"question", "answer": "<reasoning>\\n#### N"};  MMLU style: {"question", "choices", "answer": index}.
Training text and evaluation files come from disjoint seeds.

`python -m tools.demo_training.data OUT_DIR` writes the evaluation files (test and few-shot splits of both tasks).
"""
import json
import random
import sys
from pathlib import Path

NAMES = ["Ava", "Ben", "Cleo", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia", "Omar",
         "Pia", "Quin", "Rosa", "Sam", "Tess", "Uma", "Vic", "Wes", "Yara", "Zoe"]
THINGS = ["apples", "books", "coins", "pens", "cards", "shells", "stamps", "marbles", "cookies", "stickers"]
MAX_OPERAND = 20
MMLU_DESCRIPTION = "The following are multiple choice questions (with answers) about arithmetic.\n\n"
LETTERS = "ABCD"


def _add(rng):
    name, thing, a, b = rng.choice(NAMES), rng.choice(THINGS), rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND)
    q = rng.choice([f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
                    f"There are {a} {thing} in a box. {name} puts in {b} more. How many {thing} are in the box?"])
    return q, [f"{a} + {b} = {a + b}"], a + b


def _sub(rng):
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a = rng.randint(2, 2 * MAX_OPERAND)  # as large as the sums that two-step problems subtract from
    b = rng.randint(1, a)
    q = rng.choice([f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?",
                    f"There are {a} {thing} on a shelf. {name} takes {b}. How many {thing} remain?"])
    return q, [f"{a} - {b} = {a - b}"], a - b


def _two_steps(rng):
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND)
    c = rng.randint(1, a + b)
    q = f"{name} has {a} {thing}, buys {b} more and then gives away {c}. How many {thing} does {name} have?"
    return q, [f"{a} + {b} = {a + b}", f"{a + b} - {c} = {a + b - c}"], a + b - c


PROBLEMS = [_add, _sub, _two_steps]


def gsm8k_doc(rng: random.Random) -> dict:
    question, steps, result = rng.choice(PROBLEMS)(rng)
    return {"question": question, "answer": "\n".join(steps) + f"\n#### {result}"}


def _expression(rng):
    a, b = rng.randint(1, MAX_OPERAND), rng.randint(1, MAX_OPERAND)
    if rng.random() < 0.5:
        return f"What is {a} + {b}?", [], a + b
    a, b = max(a, b), min(a, b)
    return f"What is {a} - {b}?", [], a - b


def _lookup(rng):
    result = rng.randint(0, 2 * MAX_OPERAND)  # the range of every other question's answer
    return f"Which choice is {result}?", [], result


def mmlu_doc(rng: random.Random, lookup_share: float = 0.0) -> dict:
    """lookup_share: the share of "Which choice is N?" questions (training only; the evaluation files have none)."""
    if lookup_share and rng.random() < lookup_share:
        question, _, result = _lookup(rng)
    else:
        question, _, result = rng.choice([_expression, _expression, _add, _sub])(rng)
    wrong = set()
    while len(wrong) < 3:
        candidate = result + rng.choice([-1, 1]) * rng.randint(1, 5)
        if candidate >= 0 and candidate != result:
            wrong.add(candidate)
    choices = [str(x) for x in rng.sample(sorted(wrong), 3)]
    answer = rng.randrange(4)
    choices.insert(answer, str(result))
    return {"question": question, "choices": choices, "answer": answer, "subject": "arithmetic"}


def gsm8k_text(doc: dict, with_answer: bool = True) -> str:
    """Exactly lm-eval's gsm8k rendering: 'Question: q\\nAnswer:' + ' ' + answer."""
    return f"Question: {doc['question']}\nAnswer:" + (f" {doc['answer']}" if with_answer else "")


def mmlu_text(doc: dict, with_answer: bool = True) -> str:
    """Exactly lm-eval's MMLU rendering: question, 'A. ..' lines, 'Answer:' + ' ' + letter."""
    lines = [doc["question"].strip()] + [f"{LETTERS[i]}. {c}" for i, c in enumerate(doc["choices"])]
    return "\n".join(lines) + "\nAnswer:" + (f" {LETTERS[doc['answer']]}" if with_answer else "")


ANSWER_WEIGHT = {"gsm8k": 3.0, "mmlu": 20.0}
# Lookups teach matching a number to its choice line and letter apart from the arithmetic: with 30% of them, a
# GPU run left chance level sooner and ended higher (0.875 vs 0.81 held-out letter accuracy at hidden 128).
LOOKUP_SHARE = 0.3


def training_episode(rng: random.Random, chat_share: float = 0.0) -> list[tuple[str, float]]:
    """Several solved examples joined as lm-eval joins few-shot examples ('\\n\\n'), as (text, loss weight)
    pieces: the answers weigh more than the questions, most of all the single MMLU answer letter; or, for a
    chat_share of episodes, a chat (chat_episode)."""
    if chat_share and rng.random() < chat_share:
        return chat_episode(rng)
    shots = rng.randint(1, 6)
    pieces: list[tuple[str, float]] = []
    if rng.random() < 0.4:
        for _ in range(shots):
            doc = gsm8k_doc(rng)
            pieces += [(gsm8k_text(doc, with_answer=False), 1.0), (f" {doc['answer']}", ANSWER_WEIGHT["gsm8k"]),
                       ("\n\n", 1.0)]
        return pieces
    pieces.append((MMLU_DESCRIPTION, 1.0))
    for _ in range(shots):
        doc = mmlu_doc(rng, LOOKUP_SHARE)
        pieces += [(mmlu_text(doc, with_answer=False), 1.0), (f" {LETTERS[doc['answer']]}", ANSWER_WEIGHT["mmlu"]),
                   ("\n\n", 1.0)]
    return pieces


# Chats rendered as the demo's chat template renders them (tokenizer.CHAT_TEMPLATE, plain turns), so that a chat
# turn ends: the reply is followed by <end_of_turn>, one of the model's end-of-sequence tokens. Arithmetic gets a
# worked answer; anything else the one reply below.
CHAT_WEIGHT = 3.0
DEMO_REPLY = "Hi! Ask me some arithmetic."
SMALL_TALK = ["hi", "Hi", "hello", "Hello!", "Hey", "Good morning", "Who are you?", "What can you do?", "Thanks!",
              "How are you?", "Name a color.", "Weather in Paris?", "Tell me a joke.", "Help"]


def _chat_turn(rng: random.Random) -> tuple[str, str]:
    """(the user's message, the demo's reply)."""
    kind = rng.random()
    if kind < 0.45:
        doc = gsm8k_doc(rng)
        return doc["question"], doc["answer"]
    if kind < 0.7:
        question, _, result = _expression(rng)
        return question, f"The answer is {result}."
    if kind < 0.9:
        return rng.choice(SMALL_TALK), DEMO_REPLY
    return f"Tell me about {rng.choice(THINGS)} and {rng.choice(NAMES)}.", DEMO_REPLY


def chat_episode(rng: random.Random) -> list[tuple[str, float]]:
    """One to three turns as the chat template renders them ('<bos>', '<start_of_turn>' and '<end_of_turn>' are
    pieces of their own: special tokens), the replies and their <end_of_turn> weighted."""
    pieces = [("<bos>", 1.0)]
    for _ in range(rng.randint(1, 3)):
        user, reply = _chat_turn(rng)
        pieces += [("<start_of_turn>", 1.0), (f"user\n{user}", 1.0), ("<end_of_turn>", 1.0), ("\n", 1.0),
                   ("<start_of_turn>", 1.0), ("assistant\n", 1.0), (reply, CHAT_WEIGHT),
                   ("<end_of_turn>", CHAT_WEIGHT), ("\n", 1.0)]
    return pieces


EVAL_SEEDS = {"gsm8k_test": 1001, "gsm8k_fewshot": 1002, "mmlu_test": 1003, "mmlu_fewshot": 1004}
EVAL_SIZES = {"gsm8k_test": 200, "gsm8k_fewshot": 20, "mmlu_test": 200, "mmlu_fewshot": 10}
TRAIN_SEED = 7


def write_eval_files(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, seed in EVAL_SEEDS.items():
        rng = random.Random(seed)
        make = gsm8k_doc if split.startswith("gsm8k") else mmlu_doc
        with open(out / f"{split}.jsonl", "w") as f:
            for _ in range(EVAL_SIZES[split]):
                f.write(json.dumps(make(rng)) + "\n")


if __name__ == "__main__":
    write_eval_files(Path(sys.argv[1] if len(sys.argv) > 1 else "ci/accuracy/data"))
