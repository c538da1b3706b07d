import torch

from fedseg.methods import Payload
from fedseg.methods.aggregate import sample_weights, weighted_average


def test_weighted_average_by_sample_count():
    a = Payload({"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}, num_examples=1)
    b = Payload({"w": torch.tensor([4.0, 8.0]), "n": torch.tensor(6)}, num_examples=2)
    assert sample_weights({"a": a, "b": b}) == {"a": 1 / 3, "b": 2 / 3}
    avg = weighted_average({"a": a, "b": b})
    torch.testing.assert_close(avg["w"], torch.tensor([3.0, 6.0]))
    assert avg["n"].dtype == torch.int64 and int(avg["n"]) == 5
