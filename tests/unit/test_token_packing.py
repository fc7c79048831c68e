"""Token packing on a small random Llama: the dense layers over the real tokens only give the same hidden states at
every real token as the plain pass, and the model is as it was after the pass (no model file needed)."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from offline_sumscore.engine.token_packing import TokenPacking


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def test_a_packed_pass_equals_the_dense_pass_at_every_real_token(model):
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]])
    ids = torch.randint(0, 64, mask.shape)
    packing = TokenPacking(model)
    with torch.inference_mode():
        dense = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        real = mask.reshape(-1).nonzero().squeeze(1)
        with packing.packed(real, mask.numel()):
            packed = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(packed[mask.bool()], dense[mask.bool()], atol=1e-5)
    # 2 layers x (the MLP as a whole + the four attention projections)
    assert len(packing.sites) == 10 and all(type(p).__name__ == "_OnRealTokens" for _, _, _, p in packing.sites)


def test_the_model_is_unchanged_after_a_packed_pass_even_one_that_raises(model):
    before = [type(m).__name__ for m in model.modules()]
    packing = TokenPacking(model)
    with pytest.raises(RuntimeError, match="boom"):
        with packing.packed(torch.tensor([0]), 1):
            assert any(type(m).__name__ == "_OnRealTokens" for m in model.modules())
            raise RuntimeError("boom")
    assert [type(m).__name__ for m in model.modules()] == before and packing.index is None


def test_a_layer_fed_another_shape_than_the_pass_grid_fails_loudly(model):
    packing = TokenPacking(model)
    ids = torch.randint(0, 64, (2, 3))
    with pytest.raises(RuntimeError, match="token_packing=False"):
        with torch.inference_mode(), packing.packed(torch.tensor([0, 1, 2]), 4):  # the grid is 6 slots, not 4
            model.model(input_ids=ids)


def test_a_mixture_of_experts_block_is_not_packed_whole():
    from offline_sumscore.engine.token_packing import _dense_mlp

    class Router(torch.nn.Module):  # a block with parameters of its own besides its linear layers
        def __init__(self):
            super().__init__()
            self.gate = torch.nn.Parameter(torch.zeros(4, 8))
            self.up = torch.nn.Linear(8, 8)

    assert not _dense_mlp(Router())
    assert _dense_mlp(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Linear(8, 8)))
