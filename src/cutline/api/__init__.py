"""The user's vocabulary: ``Pipeline``, ``Stream``, ``KeyedStream``, ``CheckpointConfig``.

A pipeline is built by chaining operators on streams; nothing runs until
:meth:`Pipeline.run`.  Everything a user passes is validated here, up front, with an error
that names the argument.  Split by what it describes: :mod:`.config` (``CheckpointConfig``
and the checks of uids, functions and parallelism), :mod:`.pipeline`, :mod:`.streams`
(record streams, keyed streams, iterations), :mod:`.windows` (a keyed record stream's
windows) and :mod:`.batches` (batch streams of Arrow record batches).
"""

from ..logical import Node
from .batches import BatchKeyedStream, BatchStream, BatchWindowedResults, BatchWindowedStream
from .config import CheckpointConfig
from .pipeline import Pipeline
from .streams import IterativeStream, KeyedStream, Stream
from .windows import WindowedResults, WindowedStream

__all__ = ["BatchKeyedStream", "BatchStream", "BatchWindowedResults", "BatchWindowedStream",
           "CheckpointConfig", "IterativeStream", "Pipeline", "Stream", "KeyedStream", "Node",
           "WindowedResults", "WindowedStream"]
