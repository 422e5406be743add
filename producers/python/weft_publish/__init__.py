"""weft-publish: send Weaver contract events to weft's HTTP gateway.

`Publisher` does the transport (queue, batches, retries, on-disk buffer);
`weft_publish.kernel` and `weft_publish.chainweaver` adapt weaver-kernel and ChainWeaver.
"""

from .buffer import BufferFull, BufferLocked, DiskBuffer
from .context import current_flow_step, current_request_id, request
from .publisher import (
    KINDS,
    TRANSIENT_CODES,
    Backpressure,
    Publisher,
    PublishError,
    Rejection,
    SenderFailed,
    contract_to_dict,
)

__all__ = [
    "KINDS",
    "TRANSIENT_CODES",
    "Backpressure",
    "BufferFull",
    "BufferLocked",
    "DiskBuffer",
    "Publisher",
    "PublishError",
    "Rejection",
    "SenderFailed",
    "contract_to_dict",
    "current_flow_step",
    "current_request_id",
    "request",
]
