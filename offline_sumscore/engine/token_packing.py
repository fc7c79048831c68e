"""The decoder's per-token layers run over a pass's real tokens only, not over its holes.

A pass is a [rows, width] grid: rows feed different numbers of tokens, and the shorter ones carry masked holes.
Attention needs the grid (each row attends its own slots), but a linear layer maps each token on its own, so the
projections and the MLPs can run on the real tokens gathered into one [tokens, hidden] block and scattered back,
with zeros at the holes. Those layers hold nearly all of a pass's compute, so a hole then costs only its share of
attention and of the elementwise work between the layers, instead of a whole token's compute.

Only modules that are per-token by construction are packed: every nn.Linear in a decoder layer, and a layer's
`mlp` as a whole where it is built of linear layers and parameter-free activations alone (a mixture-of-experts
block reads its input's batch and sequence axes, so its own linear layers are packed instead). The model is not
changed outside a packed pass: the packing modules are put in for the pass and taken out after it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


class _OnRealTokens(nn.Module):
    """Runs `inner` on the tokens at `packing.index` (flat positions in the pass's grid); zeros at the holes."""

    def __init__(self, inner: nn.Module, packing: TokenPacking):
        super().__init__()
        self.inner = inner
        self.packing = packing

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index, lead = self.packing.index, x.shape[:-1]
        if lead.numel() != self.packing.grid:  # a layer fed some other shape: packing by grid position would be wrong
            raise RuntimeError(
                f"token packing: {type(self.inner).__name__} got {tuple(x.shape)}, not the pass's {self.packing.grid} "
                "token slots; run this model with TransformersEngine(token_packing=False)"
            )
        out = self.inner(x.reshape(-1, x.shape[-1]).index_select(0, index))
        grid = out.new_zeros((lead.numel(), out.shape[-1]))
        grid.index_copy_(0, index, out)
        return grid.view(*lead, out.shape[-1])


def _dense_mlp(module: nn.Module) -> bool:
    """Built of linear layers and parameter-free modules only (no router, no experts)."""
    return all(
        isinstance(m, nn.Linear) or not any(True for _ in m.parameters(recurse=False)) for m in module.modules()
    ) and any(isinstance(m, nn.Linear) for m in module.modules())


class TokenPacking:
    """The packable sites of a model's decoder layers, and a context that packs them for one pass."""

    def __init__(self, model: nn.Module):
        self.index: torch.Tensor | None = None
        self.grid = 0  # the open pass's rows x width
        # (parent, attribute, original module, packing module)
        self.sites: list[tuple[nn.Module, str, nn.Module, _OnRealTokens]] = []
        for layer in getattr(model.get_decoder(), "layers", []):
            mlp = getattr(layer, "mlp", None)
            whole = mlp if isinstance(mlp, nn.Module) and _dense_mlp(mlp) else None
            if whole is not None:
                self._add(layer, "mlp", whole)
            for parent in layer.modules():
                if whole is not None and any(parent is m for m in whole.modules()):
                    continue
                for name, child in list(parent._modules.items()):
                    if isinstance(child, nn.Linear):
                        self._add(parent, name, child)

    def _add(self, parent: nn.Module, name: str, module: nn.Module) -> None:
        self.sites.append((parent, name, module, _OnRealTokens(module, self)))

    @property
    def available(self) -> bool:
        return bool(self.sites)

    @contextmanager
    def packed(self, index: torch.Tensor, grid: int):
        """Within: the sites compute only the positions in index (a 1-D long tensor on the model's device) of a
        pass's grid of `grid` token slots.
        Modules are swapped in the parents' module tables directly (nn.Module.__setattr__ costs microseconds a
        call, and a pass swaps a few hundred)."""
        self.index, self.grid = index, grid
        for parent, name, _, packing in self.sites:
            parent._modules[name] = packing
        try:
            yield
        finally:
            for parent, name, original, _ in self.sites:
                parent._modules[name] = original
            self.index, self.grid = None, 0
