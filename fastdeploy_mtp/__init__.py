"""fastdeploy_mtp: MTP (multi-token-prediction) speculative decoding for PaddlePaddle serving.

Native ops live in :mod:`fastdeploy_mtp.ops`; the Python runtime (proposer, models,
reference engine) in the subpackages beside it.
"""

__version__ = "0.1.0"
