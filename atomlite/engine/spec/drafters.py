"""Drafters: each proposes up to k tokens per sequence after the step that gave it its newest token.

NgramDrafter looks the sequence's tail up in its own tokens. AssistantDrafter runs the model's MTP assistant (the
module its class names as `mtp_assistant`, see atomlite.registry), which reads the target's KV cache: its input is the
newest token and the target's last hidden state of the position before it (the state that predicted that token), and
each of its k steps feeds its own guess back at the same position.
"""
import torch

from atomlite.engine.sequence import Sequence
from atomlite.engine.spec.draft_graphs import DraftGraphs
from atomlite.engine.spec.ngram import propose_ngram
from atomlite.engine.runner.step_inputs import StepInputBuilder, step_metadata_by_group


class NgramDrafter:
    needs_hidden = False

    def __init__(self, n_min: int, n_max: int):
        self.n_min, self.n_max = n_min, n_max

    def propose(self, seqs: list[Sequence], hidden: torch.Tensor | None, ks: list[int]) -> list[list[int]]:
        return [propose_ngram(seq.token_ids, k, self.n_min, self.n_max) for seq, k in zip(seqs, ks)]


class AssistantDrafter:
    """hidden[i]: the target's final hidden state at position len(seqs[i].token_ids) - 2."""
    needs_hidden = True

    def __init__(self, assistant, kv, device: torch.device):
        self.assistant = assistant
        layers = assistant.attention_layers()
        for attention, target_layer in zip(layers, assistant.target_kv_layers):
            attention.bind_cache(*kv.cache_for_layer(target_layer))
        self.inputs = StepInputBuilder(kv, device, step_metadata_by_group(layers))
        self.graphs: DraftGraphs | None = None

    def use_graphs(self, max_batch: int, max_model_len: int, num_drafts: int, capture: bool = True) -> DraftGraphs:
        """Rounds of num_drafts steps for up to max_batch sequences from static buffers (graphs when capture)."""
        dtype = self.assistant.model.norm.weight.dtype  # the models' activations' (a quantized weight's is not)
        self.graphs = DraftGraphs(self.assistant, self.inputs, max_batch, max_model_len, num_drafts,
                                  self.assistant.spec.backbone_hidden_size, dtype, capture)
        if capture:
            self.graphs.capture_all()
        return self.graphs

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], hidden: torch.Tensor, ks: list[int]) -> list[list[int]]:
        graphs = self.graphs
        if graphs is not None and graphs.fits(len(seqs)) and max(ks) <= graphs.num_drafts:
            rows = graphs.propose(seqs, hidden).tolist()
            return [row[:k] for row, k in zip(rows, ks)]
        ids, ctx = self.inputs.context(self.inputs.build_draft(seqs))
        guesses = []
        for _ in range(max(ks)):
            normed, hidden = self.assistant(ids, hidden, ctx)
            ids = torch.argmax(self.assistant.compute_logits(normed), dim=-1)
            guesses.append(ids)
        rows = torch.stack(guesses, dim=1).tolist()
        return [row[:k] for row, k in zip(rows, ks)]


class ReplayDrafter:
    """A measurement hook, not a drafter: proposes the continuation `script` recorded for each prompt (the
    target's own greedy output: every draft accepted), or with `corrupt`, a token other than each recorded one
    (every draft rejected). The bounds of speculative decoding's gain and overhead, measured in one run."""
    needs_hidden = False

    def __init__(self, scripts: dict[tuple[int, ...], list[int]], vocab_size: int, corrupt: bool = False):
        self.scripts, self.vocab_size, self.corrupt = scripts, vocab_size, corrupt

    def propose(self, seqs: list[Sequence], hidden: torch.Tensor | None, ks: list[int]) -> list[list[int]]:
        drafts = []
        for seq, k in zip(seqs, ks):
            script = self.scripts.get(tuple(seq.prompt_token_ids), [])
            done = seq.num_output_tokens
            guess = script[done:done + k]
            drafts.append([(t + 1) % self.vocab_size for t in guess] if self.corrupt else guess)
        return drafts


def drafting_allowed(seq: Sequence) -> bool:
    """Whether seq's next tokens may be verified several at a time: its sampling must not depend on the tokens
    before each one (penalties, bad_words, min_tokens still counting), which would differ row by row. Such a
    request decodes one token per step (a grammar's requests too: the engine checks those)."""
    params = seq.params
    return not (params.uses_penalties or params.bad_words_token_ids
                or seq.num_output_tokens < params.min_tokens)


def build_drafter(config, assistant, kv, device: torch.device):
    """The drafter a SpeculativeConfig asks for (None without one)."""
    if config is None:
        return None
    if config.method == "ngram":
        return NgramDrafter(config.prompt_lookup_min, config.prompt_lookup_max)
    return AssistantDrafter(assistant, kv, device)
