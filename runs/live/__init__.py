"""Live delivery: the session socket and what feeds it (design note: docs/live-delivery.md).

protocol (frames, parsing) · reads (batched database reads) · feed (SessionFeed, LiveHub:
one per session and process, the one owner of gap repair) · subscription (one per socket:
replay, dedupe) · consumer (the Channels consumer, thin) · routing (URL patterns).
"""
