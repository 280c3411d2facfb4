"""The engine core's command frames: an image's pixels travel out of band (as the arrays themselves, not copied into
the pickle on the API's event loop) and arrive equal and writable."""
import torch
import zmq

from atomlite.engine.ipc.core import pickled_frames, unpickled_frames
from atomlite.multimodal.inputs import ImageItem, MultiModalPrompt


def test_an_items_pixels_and_positions_are_frames_of_their_own_and_arrive_equal():
    item = ImageItem("image", torch.rand(2520, 768), torch.arange(5040).view(2520, 2), 256, b"hash", 1.5)
    command = ("add", "r", [1, 2], None, 0, MultiModalPrompt([1, 2], [item], [(0, 2)]))
    frames = pickled_frames(command)
    assert [len(memoryview(f)) for f in frames[1:]] == [2520 * 768 * 4, 5040 * 8]
    assert len(frames[0]) < 1000
    context = zmq.Context.instance()
    sender, receiver = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        sender.bind("inproc://core-frames")
        receiver.connect("inproc://core-frames")
        sender.send_multipart(frames, copy=False)
        got = unpickled_frames(receiver.recv_multipart(copy=False))
    finally:
        sender.close(), receiver.close()
    arrived = got[5].items[0]
    assert got[:5] == command[:5] and (arrived.num_soft_tokens, arrived.content_hash, arrived.timestamp_s) == (
        256, b"hash", 1.5)
    assert torch.equal(arrived.pixel_values, item.pixel_values)
    assert torch.equal(arrived.image_position_ids, item.image_position_ids)
    arrived.pixel_values.add_(1)  # its own memory, not the message's
