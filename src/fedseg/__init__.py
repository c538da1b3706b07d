"""fedseg: federated and personalized-federated medical image segmentation."""

__version__ = "0.1.0"
