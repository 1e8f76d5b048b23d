"""Attention and hashing kernels with a dispatcher: Triton, FlashInfer, FlexAttention or plain torch.

Everything here runs with torch alone; Triton and FlashInfer are optional fast paths imported only when used.
The package knows nothing about models: it sees tensors, per-key biases and bucket codes.
"""

from .attention import attention
from .dispatch import available_backends, choose_backend
from .errors import BackendUnavailableError, KernelInputError
from .hashing import BucketSort, bucket_sort, lsh_codes
from .merge import merge_attention_states
from .sparse_attention import sparse_attention
from .sparse_layout import SparseLayout, build_sparse_layout

__all__ = [
    "BackendUnavailableError",
    "BucketSort",
    "KernelInputError",
    "SparseLayout",
    "attention",
    "available_backends",
    "bucket_sort",
    "build_sparse_layout",
    "choose_backend",
    "lsh_codes",
    "merge_attention_states",
    "sparse_attention",
]
