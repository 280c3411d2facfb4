"""Fusion as one pass over a built model: each layer learns what reads its output, and where both kernels can, hands
it over in a form that saves a launch (model_ops.carriers), so that layer forwards read as the math.

The model names its dataflow (model.dataflow()) with two kinds of edge:
- Feeds(producer, consumer): consumer reads what producer returns. The producer hands over each form it can write
  and the consumer can read (capabilities "writes_<form>" / "reads_<form>", dispatch.CAPABILITIES): a projection
  returns PartialSums to a layer that adds split-K slices as it reads them; attention writes QuantizedRows for an
  o_proj that reads them; the MLP's activation hands [gate | up] to a down projection that computes it (GatedInput);
  an output norm's join with another branch stays a NormedPair for the residual update that joins it; under tensor
  parallelism a row-parallel projection's share goes unsummed (RankPartials) to a residual update that sums it over
  the ranks through peer memory.
- NormedSum(update, norms, reader, last_reader): a residual update's sum is normalized next by norms, reader is the
  one linear reading the first of them, and last_reader the layer reading the last (of two or three). The update's
  kernel computes those norms in the same pass, the first written as the reader's QuantizedRows (MXFP4) or
  TokenRows (FP8 per token) where both can, the last as last_reader's TokenRows where both can; each norm returns
  its result when applied to that sum.
A layer takes part through can(capability) (its kernel's, or what the layer itself can hand over) and, as a
producer, link_consumer(consumer, forms). Unlinked, every layer computes its own output: the same math, more launches.
"""
from dataclasses import dataclass

from torch import nn

FORMS = ("partial_sums", "normed_pair", "quantized_rows", "token_rows", "gated_input", "rank_partials")
QUANTIZED_FORMS = ("quantized_rows", "token_rows")  # x written quantized for the GEMM that reads it


@dataclass(frozen=True)
class Feeds:
    producer: nn.Module
    consumer: nn.Module


@dataclass(frozen=True)
class NormedSum:
    update: nn.Module  # the RMSNorm whose add_to_residual makes the sum
    norms: tuple[nn.Module, ...]
    reader: nn.Module | None = None
    last_reader: nn.Module | None = None


def link(model: nn.Module) -> nn.Module:
    """Links every edge of model.dataflow() (a model that declares none stays as built); returns the model."""
    for edge in getattr(model, "dataflow", lambda: ())():
        if isinstance(edge, NormedSum):
            _link_sum(edge)
        else:
            link_feed(edge.producer, edge.consumer)
    return model


def can(module: nn.Module | None, capability: str) -> bool:
    """Whether module takes part in fusion with capability (a module that knows nothing of fusion cannot)."""
    check = getattr(module, "can", None)
    return check is not None and check(capability)


def link_feed(producer: nn.Module, consumer: nn.Module) -> None:
    """producer hands consumer each form the one can write and the other read (Feeds)."""
    if not hasattr(producer, "link_consumer"):
        return
    forms = {form for form in FORMS if can(producer, f"writes_{form}") and can(consumer, f"reads_{form}")}
    producer.link_consumer(consumer, forms)


def _link_sum(edge: NormedSum) -> None:
    """The kernel applies the update's eps to every norm of the sum: norms with another eps are computed apart."""
    norms = edge.norms if all(norm.eps == edge.update.eps for norm in edge.norms) else ()
    quantized = bool(norms) and any(can(edge.update, f"writes_{form}") and can(edge.reader, f"reads_{form}")
                                    for form in QUANTIZED_FORMS)
    last = (len(norms) > 1 and can(edge.update, "writes_token_rows")
            and can(edge.last_reader, "reads_token_rows"))
    edge.update.link_next_norms(norms, edge.reader if quantized else None, edge.last_reader if last else None)
