"""A prepared judge's embedding read from its file by pread (engine/cpu/embedding_rows.py): the same rows as the
loaded table, bit for bit, for any ids and shapes; an id outside the vocabulary refused; a table that is not the
file's left as it is."""

import json

import pytest
import torch
from safetensors.torch import save_file

from offline_sumscore.engine.cpu.embedding_rows import EmbeddingRowsFromFile, embedding_from_file


class TinyModel(torch.nn.Module):
    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding.from_pretrained(table)

    def get_output_embeddings(self):
        return getattr(self, "lm_head", None)

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, module):
        self.embed_tokens = module


@pytest.fixture
def prepared(tmp_path):
    torch.manual_seed(0)
    table = torch.randn(50, 8).to(torch.bfloat16)
    save_file(
        {"model.norm.weight": torch.ones(8, dtype=torch.bfloat16), "model.embed_tokens.weight": table},
        str(tmp_path / "model-00001-of-00001.safetensors"),
    )
    index = {
        "weight_map": {
            k: "model-00001-of-00001.safetensors" for k in ("model.norm.weight", "model.embed_tokens.weight")
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path, table


def test_rows_read_from_the_file_equal_the_loaded_tables(prepared):
    folder, table = prepared
    model = TinyModel(table)
    said = embedding_from_file(model, folder)
    assert isinstance(model.embed_tokens, EmbeddingRowsFromFile) and "pread" in said
    ids = torch.tensor([[3, 49, 3, 0], [7, 7, 7, 12]])
    assert torch.equal(model.embed_tokens(ids), torch.nn.functional.embedding(ids, table))
    assert model.embed_tokens(torch.tensor([5])).shape == (1, 8)


def test_an_id_outside_the_vocabulary_is_refused(prepared):
    folder, table = prepared
    model = TinyModel(table)
    embedding_from_file(model, folder)
    with pytest.raises(IndexError, match="50"):
        model.embed_tokens(torch.tensor([[1, 50]]))


def test_a_table_that_is_not_the_files_stays_mapped(prepared):
    folder, table = prepared
    model = TinyModel(table.float())  # loaded as float32 (--dtype float32): not the file's bytes
    assert "mapped as every weight" in embedding_from_file(model, folder)
    assert isinstance(model.embed_tokens, torch.nn.Embedding)


def test_a_table_tied_to_the_vocabulary_projection_stays_mapped(prepared):
    folder, table = prepared
    model = TinyModel(table)
    model.lm_head = torch.nn.Linear(8, 50, bias=False)
    model.lm_head.weight = model.embed_tokens.weight  # tied: the projection reads every row at every step anyway
    assert "tied" in embedding_from_file(model, folder)
    assert isinstance(model.embed_tokens, torch.nn.Embedding)
