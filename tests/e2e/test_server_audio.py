"""The server hears, over real HTTP with the openai client: a chat with an input_audio part and
/v1/audio/transcriptions (json, text, streamed) give transformers' greedy tokens for the same prompt (a tiny E-style
model with audio and vision towers and the demo's character tokenizer); refusals are 400s naming the part, the field
or the model."""
import base64
import io
import wave

import numpy as np
import openai
import pytest

from atomlite import LLM
from atomlite.chat_template import render_chat_text
from atomlite.multimodal.audio import decode_audio
from atomlite.server.app import make_app
from atomlite.server.transcription import instruction
from audio_prompts import audio_checkpoint, clip, transformers_greedy
from server_utils import running

NAME = "hear"


def wav_bytes(samples: np.ndarray, rate: int = 16_000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


@pytest.fixture(scope="module")
def served(checkpoints):
    path, ref = audio_checkpoint(checkpoints)
    llm = LLM(str(path), dtype="float32", device="cpu", enable_prefix_caching=False, max_model_len=512)
    with running(make_app(llm.engine, NAME)) as base:
        yield openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0), llm, ref


def expected_text(llm, ref, content: list[dict], audio: bytes, max_tokens: int) -> str:
    """transformers' greedy answer to a one-turn chat of content, its clip decoded as the server decodes it."""
    text = render_chat_text(llm.tokenizer, [{"role": "user", "content": content}], None, llm.tokenizer.chat_template)
    prompt = llm._multimodal.processor.process(text, audios=[decode_audio(audio, "clip")], add_special_tokens=False)
    tokens, _ = transformers_greedy(ref, prompt, max_tokens)
    eos = llm.tokenizer.eos_token_id
    return llm.tokenizer.decode(tokens[:tokens.index(eos)] if eos in tokens else tokens)  # the server stops there


def test_chat_with_input_audio_matches_transformers(served):
    client, llm, ref = served
    audio = wav_bytes(clip(0.8, seed=1)[0])
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}
    out = client.chat.completions.create(model=NAME, max_tokens=4, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What is said?"}, part]}])
    want = expected_text(llm, ref, [{"type": "text", "text": "What is said?"}, part], audio, 4)
    assert out.choices[0].message.content == want


@pytest.mark.parametrize("language", [None, "fr"])
def test_transcriptions_match_transformers(served, language):
    client, llm, ref = served
    audio = wav_bytes(clip(1.1, seed=2)[0])
    extra = {"language": language} if language else {}
    out = client.audio.transcriptions.create(model=NAME, file=("clip.wav", audio, "audio/wav"), temperature=0,
                                             extra_body={"max_completion_tokens": 6}, **extra)
    content = [{"type": "text", "text": instruction(language, None)}, {"type": "input_audio", "input_audio": {}}]
    assert out.text == expected_text(llm, ref, content, audio, 6)


def test_transcription_as_text_and_streamed_give_the_same_transcript(served):
    client, _, _ = served
    audio = wav_bytes(clip(0.6, seed=3)[0])
    limit = {"max_completion_tokens": 8}
    whole = client.audio.transcriptions.create(model=NAME, file=("a.wav", audio), temperature=0, extra_body=limit)
    text = client.audio.transcriptions.create(model=NAME, file=("a.wav", audio), temperature=0,
                                              response_format="text", extra_body=limit)
    events = list(client.audio.transcriptions.create(model=NAME, file=("a.wav", audio), temperature=0, stream=True,
                                                     extra_body=limit))
    assert text == whole.text and whole.usage.output_tokens == 8
    assert [e.type for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1].type == "transcript.text.done" and events[-1].text == whole.text
    assert "".join(e.delta for e in events[:-1]) == whole.text


def bad_request(call) -> dict:
    with pytest.raises(openai.BadRequestError) as e:
        call()
    assert e.value.status_code == 400
    return e.value.body


def ask(client, part: dict):
    return client.chat.completions.create(model=NAME, max_tokens=2, messages=[{"role": "user", "content": [part]}])


@pytest.mark.parametrize("part,needle", [
    ({"type": "input_audio", "input_audio": {"data": "UklG", "format": "aiff"}},
     "messages[0].content[0].input_audio: format 'aiff' is not one of wav, mp3"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"not audio at all").decode(), "format": "wav"}},
     "messages[0].content[0].input_audio: not a decodable audio file"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(np.zeros(16_000 * 31))).decode(),
                                             "format": "wav"}},
     "messages[0].content[0].input_audio: the clip lasts over 30 s, the limit per clip"),
    ({"type": "audio_url", "audio_url": {"url": "http://127.0.0.1:9/a.wav"}},
     "messages[0].content[0].audio_url: fetching from '127.0.0.1' is not allowed"),
])
def test_unreadable_or_refused_audio_is_a_400_naming_the_part(served, part, needle):
    body = bad_request(lambda: ask(served[0], part))
    assert needle in body["message"], body


def test_an_audio_url_data_url_is_read(served):
    client, _, _ = served
    url = "data:audio/wav;base64," + base64.b64encode(wav_bytes(clip(0.3)[0])).decode()
    out = ask(client, {"type": "audio_url", "audio_url": {"url": url}})
    assert out.choices[0].finish_reason == "length"


def test_transcription_fields_are_checked(served):
    client, _, _ = served
    audio = wav_bytes(clip(0.3)[0])
    body = bad_request(lambda: client.audio.transcriptions.create(model=NAME, file=("a.wav", audio), language="xx"))
    assert body["param"] == "language"
    body = bad_request(lambda: client.audio.transcriptions.create(model=NAME, file=("a.wav", audio),
                                                                  response_format="srt"))
    assert body["param"] == "response_format"
    body = bad_request(lambda: client.audio.transcriptions.create(model=NAME, file=("a.wav", b"nothing")))
    assert body["param"] == "file" and "file: not a decodable audio file" in body["message"]


def test_audio_for_a_model_without_an_audio_tower_is_a_400_naming_it(checkpoints):
    llm_dir, _ = checkpoints.get("ple", vision="clipped", char_tokenizer=True)
    engine = LLM(str(llm_dir), dtype="float32", device="cpu", max_model_len=256).engine
    with running(make_app(engine, "eyes")) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        audio = wav_bytes(clip(0.3)[0])
        body = bad_request(lambda: client.audio.transcriptions.create(model="eyes", file=("a.wav", audio)))
        assert "the model eyes takes no audio" in body["message"] and body["param"] == "file"
        part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"}}
        body = bad_request(lambda: client.chat.completions.create(model="eyes", max_tokens=2, messages=[
            {"role": "user", "content": [part]}]))
        assert "messages[0].content[0].input_audio: the model eyes takes no audio" in body["message"]
