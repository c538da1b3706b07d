import pytest
import torch

from fedseg.methods import Payload
from fedseg.methods.aggregate import RunningAverage, sample_weights, weighted_average


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
