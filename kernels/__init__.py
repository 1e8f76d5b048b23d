"""Attention and hashing kernels with a dispatcher: Triton, FlashInfer, FlexAttention, folded SDPA, a host's
attention, or plain torch.

Everything here runs with torch alone; Triton and FlashInfer are optional fast paths imported only when used,
and each is checked against torch the first time it runs a kind of call (`verify`), falling back to torch if
it fails. The package knows nothing about models: it sees tensors, per-key biases and bucket codes.
"""

from .attention import attention
from .dispatch import available_backends, backend_chain, choose_backend
from .errors import BackendUnavailableError, KernelInputError
from .hashing import BucketSort, bucket_sort, lsh_codes
from .host_backends import register_host_backend, registered_host_backends, unregister_host_backend
from .merge import merge_attention_states
from .sparse_attention import sparse_attention
from .sparse_layout import SparseLayout, build_sparse_layout
from .topk import row_max, row_topk, topk_scores
from .verify import set_verification, verification_enabled, verification_turned_off

__all__ = [
    "BackendUnavailableError",
    "BucketSort",
    "KernelInputError",
    "SparseLayout",
    "attention",
    "available_backends",
    "backend_chain",
    "bucket_sort",
    "build_sparse_layout",
    "choose_backend",
    "lsh_codes",
    "merge_attention_states",
    "register_host_backend",
    "registered_host_backends",
    "row_max",
    "row_topk",
    "set_verification",
    "sparse_attention",
    "topk_scores",
    "unregister_host_backend",
    "verification_enabled",
    "verification_turned_off",
]
