import torch

from fedseg.methods.finch import finch_clusters


def test_near_prototypes_merge_and_far_ones_separate():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    group_a = a + 0.01 * torch.randn(3, 8, generator=gen)
    group_b = b + 0.01 * torch.randn(3, 8, generator=gen)
    labels, centroids = finch_clusters(torch.cat([group_a, group_b]))
    assert len(set(labels[:3].tolist())) == 1 and len(set(labels[3:].tolist())) == 1
    assert labels[0] != labels[3] and len(centroids) == 2
    torch.testing.assert_close(centroids[labels[0]], group_a.mean(0))
    torch.testing.assert_close(centroids[labels[3]], group_b.mean(0))


def test_one_and_few_vectors():
    one = torch.randn(1, 4)
    labels, centroids = finch_clusters(one)
    assert labels.tolist() == [0] and torch.equal(centroids, one)
    labels, centroids = finch_clusters(torch.randn(3, 4))  # n <= 3 always gives one cluster
    assert labels.tolist() == [0, 0, 0] and centroids.shape == (1, 4)
