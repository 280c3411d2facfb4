"""safetensors checkpoint -> model parameters, each through its own weight_loader. Tensors are read lazily,
one at a time; names the model skips (towers it has not, ...) are never read. `load_dummy_weights` fills the
same parameters with seeded random values instead (benchmarks at real shapes from config.json alone). KV cache
scales (tensors the model's kv_scale_target names) are collected into model.checkpoint_kv_scales for the engine."""
import contextlib
import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from atomlite.errors import ConfigError

# checkpoint name prefix -> the model's; a model adds its own as `checkpoint_aliases`
CHECKPOINT_ALIASES = (("model.language_model.", "model."),)


@contextlib.contextmanager
def open_weights(file: Path):
    """safe_open, with a truncated, damaged or non-safetensors file reported as one line naming it."""
    try:
        handle = safe_open(file, framework="pt")
    except (SafetensorError, OSError) as e:
        raise ConfigError(f"weight file {file} is not a readable safetensors file ({e}): it is truncated or "
                          f"damaged; download or copy it again") from None
    with handle as f:
        yield f


def checkpoint_index(model_dir: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it, for single-file and sharded checkpoints."""
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return {name: model_dir / file for name, file in _weight_map(index).items()}
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no *.safetensors weights in {model_dir}")
    names = {}
    for file in files:
        with open_weights(file) as f:
            names.update({name: file for name in f.keys()})
    return names


def _weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ConfigError(f"{index} is not a safetensors index with a weight_map ({type(e).__name__}: {e}): "
                          f"download or copy it again") from None
    return weight_map


def _alias(model, name: str) -> str:
    for old, new in CHECKPOINT_ALIASES + getattr(model, "checkpoint_aliases", ()):
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _param_name(model, name: str, params) -> tuple[str, int | None]:
    stacked = getattr(model, "stacked_weight", None)
    if stacked is not None and (found := stacked(name)) is not None:
        return found
    for fragment, (fused, shard) in getattr(model, "packed_weights", {}).items():
        packed = name.replace(f".{fragment}.", f".{fused}.")
        # a layer whose parts are quantized differently keeps them apart (no fused parameter exists)
        if f".{fragment}." in name and packed in params:
            return packed, shard
    return name, None


def _expected(model) -> set[tuple[str, int | None]]:
    expected = set()
    for name, param in model.named_parameters():
        shards = getattr(param, "num_shards", None)
        expected |= {(name, s) for s in range(shards)} if shards else {(name, None)}
    return expected


def resolve(model, name: str, params: dict | None = None) -> tuple[str, int | None] | None:
    """Checkpoint tensor name -> (parameter name, shard), or None for a tensor the model never reads.
    params: the model's named parameters, when the caller has them already."""
    if name.startswith(model.skipped_prefixes):
        return None
    name = _alias(model, name)
    if model.ignored_weight(name):
        return None
    return _param_name(model, name, params if params is not None else dict(model.named_parameters()))


def load_tensor(params: dict, name: str, target: str, shard: int | None, tensor, where: str) -> None:
    param = params.get(target)
    if param is None:
        raise ConfigError(f"unexpected tensor {name}{where}: the model has no parameter {target}")
    if shard is not None and getattr(param, "num_shards", None) is None:
        raise ConfigError(f"tensor {name}{where} is one part of {target}, which this model loads as one tensor "
                          f"(its quantization_config does not quantize it)")
    try:
        if shard is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard)
    except ValueError as e:
        raise ConfigError(f"tensor {name}{where} {e}") from None


def finish_loading(model, loaded: set[tuple[str, int | None]], source: str) -> None:
    """Every parameter (every shard of a fused one) must have been loaded; then one-time re-layouts run."""
    missing = sorted(f"{n}" + ("" if s is None else f" (shard {s})") for n, s in _expected(model) - loaded)
    if missing:
        raise ConfigError(f"{source} lacks {len(missing)} tensor(s) the model needs: "
                          f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    for module in model.modules():
        if hasattr(module, "process_after_loading"):
            module.process_after_loading()


def kv_scale_of(model, name: str) -> tuple[int, str] | None:
    """(layer, "k" or "v") for a checkpoint tensor that is a KV cache scale (the model declares which), else None."""
    target = getattr(model, "kv_scale_target", None)
    return target(_alias(model, name)) if target is not None else None


def _wanted(model, index: dict[str, Path]) -> dict[Path, list[tuple[str, str | tuple[int, str], int | None]]]:
    """Per file, (checkpoint name, parameter name or KV scale target, shard) of every tensor the model reads."""
    by_file = defaultdict(list)
    params = dict(model.named_parameters())
    for name, file in index.items():
        resolved = resolve(model, name, params)
        if resolved is not None:
            scale = kv_scale_of(model, name)
            by_file[file].append((name, scale, None) if scale is not None else (name, *resolved))
    return by_file


def read_tensor(f, name: str, param, shard: int | None) -> torch.Tensor:
    """The checkpoint tensor, or only the part of it that param keeps where it says which (read_shard: a
    tensor-parallel shard), read through safetensors' slices so the rest is never read."""
    reader = getattr(param, "read_shard", None)
    return f.get_tensor(name) if reader is None else reader(f.get_slice(name), shard)


def load_weights(model, model_dir: str | Path) -> None:
    model_dir = Path(model_dir)
    params = dict(model.named_parameters())
    by_file = _wanted(model, checkpoint_index(model_dir))
    loaded = set()
    model.checkpoint_kv_scales = {}
    total = sum(len(v) for v in by_file.values())
    with tqdm(total=total, desc="Loading weights", unit="tensor", delay=1.0) as bar:
        for file, entries in by_file.items():
            if not file.exists():
                raise ConfigError(f"weight file {file} listed in the checkpoint index does not exist")
            with open_weights(file) as f:
                for name, target, shard in entries:
                    if isinstance(target, tuple):
                        model.checkpoint_kv_scales[target] = f.get_tensor(name).float().item()
                    else:
                        tensor = read_tensor(f, name, params.get(target), shard)
                        load_tensor(params, name, target, shard, tensor, f" in {file}")
                        loaded.add((target, shard))
                    bar.update()
    finish_loading(model, loaded, f"checkpoint {model_dir}")


DUMMY_STD = 0.02
# e8m0 exponents 2^-11 .. 2^-5: with e2m1 values up to 6, weights land around +-0.02 like the float ones
DUMMY_E8M0_RANGE = (116, 123)
DUMMY_FP8_STD = 16.0  # with the FP8 layers' dummy weight scale (0.02 / 16), weights land around +-0.02 too


def _fill_dummy(name: str, param, generator) -> None:
    data = param.data
    if hasattr(param, "dummy_fill"):  # the parameter's own neutral value (a clip bound: unbounded)
        data.fill_(param.dummy_fill)
    elif data.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):  # FP8 weights: e4m3 values around +-16
        data.copy_(torch.randn(data.shape, generator=generator, device=data.device).mul_(DUMMY_FP8_STD))
    elif data.dtype == torch.uint8:  # MXFP4: packed e2m1 pairs (every byte is a valid pair) or e8m0 scales
        low, high = DUMMY_E8M0_RANGE if name.endswith("scale") else (0, 256)
        data.random_(low, high, generator=generator)
    elif data.dim() <= 1:  # norm weights, layer scalars, router scales: at 1, so activations keep their size
        data.fill_(1.0)
    else:
        data.normal_(0.0, DUMMY_STD, generator=generator)


def load_dummy_weights(model, seed: int = 0) -> None:
    """Seeded random weights in every parameter's own shape, dtype and device (--load-format dummy)."""
    generators = {}
    params = list(model.named_parameters())
    for name, param in tqdm(params, desc="Dummy weights", unit="tensor", delay=1.0):
        device = param.device
        if device not in generators:
            generators[device] = torch.Generator(device).manual_seed(seed)
        _fill_dummy(name, param, generators[device])
    finish_loading(model, _expected(model), "dummy weights")
