import pytest
import torch

from fedseg.methods import Payload, aggregate
from fedseg.methods.aggregate import (
    RunningAverage,
    average_state,
    mix_states,
    sample_weights,
    weighted_average,
)


def test_weighted_average_by_sample_count():
    a = Payload({"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, num_examples=1)
    b = Payload({"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(6)}, num_examples=2)
    assert sample_weights({"a": a, "b": b}) == {"a": 1 / 3, "b": 2 / 3}
    avg = weighted_average({"a": a, "b": b})
    torch.testing.assert_close(avg["w"], torch.tensor([3.0, 6.0]))
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 5


def test_running_average_matches_the_batch_average_in_any_weight_scale():
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(5, 3, generator=gen)} for _ in range(4)]
    counts = [3.0, 7.0, 1.0, 9.0]
    expected = sum(c * s["w"].double() for c, s in zip(counts, states, strict=True)) / 20.0
    for scale in (1.0, 1 / 20.0, 1000.0):
        avg = RunningAverage()
        for c, s in zip(counts, states, strict=True):
            avg.add(s, c * scale)
        out = avg.result()["w"]
        assert out.dtype == torch.float32
        torch.testing.assert_close(out, expected.float())


def test_running_average_refuses_an_empty_or_weightless_sum():
    avg = RunningAverage()
    with pytest.raises(ValueError, match="positive weight"):
        avg.result()
    avg.add({"w": torch.ones(2)}, 0.0)
    with pytest.raises(ValueError, match="positive weight"):
        avg.result()


@pytest.mark.parametrize("block_bytes", [64 * 2**20, 8 * 7 * 5])  # one block; 5 columns
def test_mix_states_gives_each_row_its_average_state(monkeypatch, block_bytes):
    """Every row of the mixing matrix gives what average_state gives for it (zero weights
    included, integer tensors rounded), in blocks of columns or in one; each result owns its
    tensors."""
    monkeypatch.setattr(aggregate, "_BLOCK_BYTES", block_bytes)
    gen = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(4, 6, generator=gen), "n": torch.tensor(i * 3)} for i in range(4)]
    mix = torch.rand(3, 4, generator=gen)
    mix[0, 2] = mix[1, 0] = 0.0
    mixed = mix_states(states, mix)
    for row, out in zip(mix, mixed, strict=True):
        expect = average_state(states, row.tolist())
        torch.testing.assert_close(out["w"], expect["w"], rtol=0, atol=1e-6)
        assert out["n"].dtype == torch.int64 and int(out["n"]) == int(expect["n"])
    storages = {out["w"].untyped_storage().data_ptr() for out in mixed}
    assert len(storages) == 3 and all(out["w"].untyped_storage().nbytes() == 96 for out in mixed)


def test_mix_states_refuses_rows_without_weight():
    states = [{"w": torch.ones(2)}, {"w": torch.zeros(2)}]
    with pytest.raises(ValueError, match="positive sum"):
        mix_states(states, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"\[M, 2\]"):
        mix_states(states, torch.ones(2, 3))
