"""The bus: the fast path between gateways and workers (DESIGN.md §5).

One module per part: the protocol every backend implements (:mod:`.protocol`,
re-exported here), the in-process bus (:mod:`.memory`) and, on Redis, the
pipelined connection for the hot commands (:mod:`.pipe`), the retrying command
client (:mod:`.client`), the pub/sub multiplexer (:mod:`.pubsub`), the inbox
stream (:mod:`.inbox`), wait tokens and heartbeats (:mod:`.tokens`), the per-user
quota windows (:mod:`.window`) and the :class:`~.redis.RedisBus` facade that
composes them (:mod:`.redis`). Importing this package loads no Redis code.
"""

from signoff.runtime.bus.protocol import Bus, Delivery, Job, Subscription

__all__ = ["Bus", "Delivery", "Job", "Subscription"]
