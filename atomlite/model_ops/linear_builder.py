"""Builds each Linear of a model the way its checkpoint stores it: plain, or MXFP4 per the Quark config.

Models name every projection (`model.layers.0.mlp.gate_up_proj`); the quantization spec of that name decides the
class, which chooses its kernel through the dispatch table.
"""
from atomlite.errors import ConfigError
from atomlite.model_ops.linear import Linear, MergedLinear


class LinearBuilder:
    def __init__(self, hf_config: dict):
        self.quark = None
        qc = hf_config.get("quantization_config")
        if qc:
            from atomlite.quant.quark import QuarkConfig
            if qc.get("quant_method") != "quark":
                raise ConfigError(f"quantization_config quant_method {qc.get('quant_method')!r} is not supported; "
                                  f"atomlite loads Quark (quant_method 'quark') MXFP4 checkpoints")
            try:
                self.quark = QuarkConfig.from_hf_config(qc)
            except ValueError as e:
                raise ConfigError(str(e)) from None

    def _spec(self, name: str):
        if self.quark is None:
            return None
        try:
            return self.quark.spec_for(name)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    def can_fuse(self, names: list[str]) -> bool:
        """Whether these projections of one input share a quantization, so one fused GEMM can run them."""
        return len({self._spec(name) for name in names}) == 1

    def linear(self, name: str, in_features: int, out_features: int):
        spec = self._spec(name)
        if spec is None:
            return Linear(in_features, out_features)
        from atomlite.model_ops.mxfp4_linear import MXFP4Linear
        return MXFP4Linear(in_features, out_features, spec)

    def merged(self, name: str, in_features: int, out_features: list[int], parts: list[str] | None = None):
        """parts: the checkpoint projections it fuses, when not all of the fused name's usual ones (a k_eq_v layer
        has no v_proj); their common quantization is the fused layer's."""
        spec = self._spec(name) if parts is None else self._spec(parts[0])
        if parts is not None and not self.can_fuse(parts):
            raise ConfigError(f"{name} fuses {', '.join(parts)}, which are quantized differently")
        if spec is None:
            return MergedLinear(in_features, out_features)
        from atomlite.model_ops.mxfp4_linear import MXFP4MergedLinear
        return MXFP4MergedLinear(in_features, out_features, spec)

    def experts(self, name: str, num_experts: int, hidden: int, intermediate: int):
        """Float stacked experts, or MXFP4 ones when Quark's config quantizes the per-expert projections
        (name.E.gate_proj / up_proj / down_proj), which must then all share one spec."""
        from atomlite.model_ops.moe import Experts
        specs = {self._spec(f"{name}.{e}.{proj}") for e in range(num_experts)
                 for proj in ("gate_proj", "up_proj", "down_proj")}
        if len(specs) > 1:
            raise ConfigError(f"quantization_config gives the experts of {name} different schemes; atomlite loads "
                              f"MoE experts either all MXFP4 (one scheme) or all unquantized")
        spec = specs.pop()
        if spec is None:
            return Experts(num_experts, hidden, intermediate)
        from atomlite.model_ops.mxfp4_moe import MXFP4Experts
        try:
            return MXFP4Experts(num_experts, hidden, intermediate, spec)
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None
