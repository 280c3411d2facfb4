"""Builds each Linear of a model the way its checkpoint stores it: plain, MXFP4 (Quark) or FP8 (Quark,
compressed-tensors), per the checkpoint's quantization_config.

Models name every projection (`model.layers.0.mlp.gate_up_proj`); the quantization spec of that name decides the
class, which chooses its kernel through the dispatch table. Under tensor parallelism (atomlite.distributed.use) a
layer given the shard it keeps (rows: column-parallel; columns: row-parallel) holds only that, and reads only that
from the checkpoint; with one process every shard is whole and the layers are the single-process ones.
"""
from atomlite import distributed
from atomlite.distributed import Shard
from atomlite.errors import ConfigError
from atomlite.model_ops.linear import Linear, MergedLinear, RowParallelLinear
from atomlite.model_ops.sharding import read_narrowed, read_per_expert_mxfp4, read_stacked_experts
from atomlite.quant.fp8 import FP8Spec

SUPPORTED_METHODS = ("atomlite loads Quark (quant_method 'quark': MXFP4, FP8) and compressed-tensors (quant_method "
                     "'compressed-tensors', format float-quantized: FP8) checkpoints")


def checkpoint_quantization(qc: dict):
    """A checkpoint's quantization_config parsed once: QuarkConfig or CompressedTensorsConfig (both answer
    spec_for(module name)); ConfigError naming the field for a method or scheme atomlite does not run."""
    method = qc.get("quant_method")
    try:
        if method == "quark":
            from atomlite.quant.quark import QuarkConfig
            return QuarkConfig.from_hf_config(qc)
        if method == "compressed-tensors":
            from atomlite.quant.compressed_tensors import CompressedTensorsConfig
            return CompressedTensorsConfig.from_hf_config(qc)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    raise ConfigError(f"quantization_config.quant_method {method!r} is not supported; {SUPPORTED_METHODS}")


def _packed(layer) -> list:
    """The parameters whose rows are the layer's output rows (an MXFP4 weight's scales too)."""
    return [layer.weight] + ([layer.weight_scale] if hasattr(layer, "weight_scale") else [])


class LinearBuilder:
    def __init__(self, hf_config: dict):
        self.tp = distributed.current()
        qc = hf_config.get("quantization_config")
        self.quant = checkpoint_quantization(qc) if qc else None

    def _spec(self, name: str):
        if self.quant is None:
            return None
        try:
            spec = self.quant.spec_for(name)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if isinstance(spec, FP8Spec) and self.tp.size > 1:
            raise ConfigError(f"{name}: fp8 checkpoints run on one GPU for now (--tensor-parallel-size 1)")
        return spec

    def can_fuse(self, names: list[str]) -> bool:
        """Whether these projections of one input share a quantization, so one fused GEMM can run them."""
        return len({self._spec(name) for name in names}) == 1

    def linear(self, name: str, in_features: int, out_features: int, rows: Shard | None = None):
        """rows: the output rows this rank keeps (column-parallel); None: all of them (replicated)."""
        spec = self._spec(name)
        size = out_features if rows is None else rows.size
        if spec is None:
            layer = Linear(in_features, size)
        elif isinstance(spec, FP8Spec):
            from atomlite.model_ops.fp8_linear import FP8Linear
            layer = FP8Linear(in_features, size, spec)
        else:
            from atomlite.model_ops.mxfp4_linear import MXFP4Linear
            layer = MXFP4Linear(in_features, size, spec)
        if rows is not None and not rows.whole:
            for param in _packed(layer):
                read_narrowed(param, 0, rows)
        layer.output_shards = [rows or Shard(0, out_features, out_features)]  # what an adapter's B keeps
        return layer

    def row_parallel(self, name: str, columns: Shard, out_features: int):
        """A linear keeping `columns` of its input dim; its output is all-reduced over the ranks."""
        if columns.whole:
            return self.linear(name, columns.total, out_features)
        spec = self._spec(name)
        if spec is None:
            layer = RowParallelLinear(columns.size, out_features, tp=self.tp)
            read_narrowed(layer.weight, 1, columns)
            layer.input_shard = columns  # what an adapter's A keeps
            layer.output_shards = [Shard(0, out_features, out_features)]
            return layer
        from atomlite.model_ops.mxfp4_linear import RowParallelMXFP4Linear
        scale_columns = columns.in_blocks(spec.block_size, f"{name} input (MXFP4 scale blocks)")
        layer = RowParallelMXFP4Linear(columns.size, out_features, spec, tp=self.tp)
        read_narrowed(layer.weight, 1, columns.in_blocks(2, name))
        read_narrowed(layer.weight_scale, 1, scale_columns)
        return layer

    def merged(self, name: str, in_features: int, out_features: list[int], parts: list[str] | None = None,
               rows: list[Shard] | None = None):
        """parts: the checkpoint projections it fuses, when not all of the fused name's usual ones (a k_eq_v layer
        has no v_proj); their common quantization is the fused layer's. rows: the rows of each part this rank keeps
        (column-parallel); None: all of them."""
        layer = self._merged(name, in_features, out_features if rows is None else [r.size for r in rows], parts)
        if rows is not None and not all(r.whole for r in rows):
            for param in _packed(layer):
                read_narrowed(param, 0, rows)
        layer.output_shards = rows or [Shard(0, n, n) for n in out_features]
        return layer

    def _merged(self, name: str, in_features: int, out_features: list[int], parts: list[str] | None):
        spec = self._spec(name) if parts is None else self._spec(parts[0])
        if parts is not None and not self.can_fuse(parts):
            raise ConfigError(f"{name} fuses {', '.join(parts)}, which are quantized differently")
        if spec is None:
            return MergedLinear(in_features, out_features)
        if isinstance(spec, FP8Spec):
            from atomlite.model_ops.fp8_linear import FP8Linear
            return FP8Linear(in_features, sum(out_features), spec, shard_sizes=out_features)
        from atomlite.model_ops.mxfp4_linear import MXFP4MergedLinear
        return MXFP4MergedLinear(in_features, out_features, spec)

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int):
        """Float stacked experts, or MXFP4 ones when Quark's config quantizes the per-expert projections
        (name.E.gate_proj / up_proj / down_proj), which must then all share one spec. Under tensor parallelism
        each rank keeps its part of the intermediate size; the experts' output is then all-reduced."""
        part = distributed.split(intermediate, self.tp.rank, self.tp.size, "moe_intermediate_size")
        if part.whole:
            return self._experts(name, num_experts, hidden, intermediate)
        return self._sharded_experts(name, num_experts, hidden, part)

    def _sharded_experts(self, name: str, num_experts: int, hidden: int, part: Shard):
        spec = self._experts_spec(name, num_experts)
        if spec is None:
            from atomlite.model_ops.moe import ShardedExperts
            experts = ShardedExperts(num_experts, hidden, part.size, tp=self.tp)
            read_stacked_experts(experts.gate_up_proj, experts.down_proj, part)
            return experts
        from atomlite.model_ops.mxfp4_moe import ShardedMXFP4Experts
        what = f"{name} moe_intermediate_size"
        part.in_blocks(spec.block_size, what)  # refused before building, with the reason
        experts = ShardedMXFP4Experts(num_experts, hidden, part.size, spec, tp=self.tp)
        read_per_expert_mxfp4(experts.gate_up_proj, experts.gate_up_proj_scale, experts.down_proj,
                              experts.down_proj_scale, part, spec.block_size, what)
        return experts

    def _experts_spec(self, name: str, num_experts: int):
        specs = {self._spec(f"{name}.{e}.{proj}") for e in range(num_experts)
                 for proj in ("gate_proj", "up_proj", "down_proj")}
        if len(specs) > 1:
            raise ConfigError(f"quantization_config gives the experts of {name} different schemes; atomlite loads "
                              f"MoE experts either all MXFP4 (one scheme) or all unquantized")
        return specs.pop()

    def _experts(self, name: str, num_experts: int, hidden: int, intermediate: int):
        from atomlite.model_ops.moe import Experts
        spec = self._experts_spec(name, num_experts)
        if spec is None:
            return Experts(num_experts, hidden, intermediate)
        if isinstance(spec, FP8Spec):
            from atomlite.model_ops.fp8_moe import FP8Experts
            return FP8Experts(num_experts, hidden, intermediate, spec)
        from atomlite.model_ops.mxfp4_moe import MXFP4Experts
        try:
            return MXFP4Experts(num_experts, hidden, intermediate, spec)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None
