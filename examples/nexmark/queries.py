"""Nexmark queries, each as a cutline pipeline and as the Spark Structured Streaming query a
Spark user would write (DataFrame / SQL functions; Python only where SQL cannot say it).

Both read the same events (``cutline nexmark generate``; the records of
``cutline.connectors.nexmark``): ``event_type`` 0 / 1 / 2 with a ``person``, ``auction`` or
``bid`` struct, times in epoch milliseconds.  Every query's rows are plain tuples, times in
epoch milliseconds, in the same column order in both systems, so outputs compare as sets.

=====  ===============================================  =======================  ==========
query  what                                             cutline                  Spark
=====  ===============================================  =======================  ==========
q0     pass-through: every bid                          filter + map             select
q1     price in euros (x 0.908, whole cents)            filter + map             select
q2     bids on auctions whose id is a multiple of 123   filter + map             where
q3     persons in OR/ID/CA selling in category 10       keyed process (state)    stream join
q4     average closing price per category               timers + keyed process   Python + agg
q5     hot items: most-bid auctions per sliding window  window over window       window over window
q7     highest bid per 10 s tumbling window             window aggregate         window max
q8     persons who opened an auction in the 10 s        keyed process (timers)   windowed join
       window they registered in
q11    bids per bidder per session (gap 10 s)           session window           session_window
q18    last bid per (bidder, auction)                   keyed process            max(struct)
=====  ===============================================  =======================  ==========

Columnar forms (``build_columnar``, batch streams of Arrow record batches): q0-q2 with
pyarrow.compute; q5 counts bids per auction and sliding window on batches, keeps per
subtask the rows with the window's highest count there, and picks the hottest per window
record by record; q7 keeps the highest bid per window of each record batch (a local
pre-aggregate, as Spark's partial aggregation) and the highest of those per window record
by record; q11 counts bids per bidder session on batches; q18 keeps the last bid per
(bidder, auction) with ``latest`` (each batch cut to its last bid per key with Arrow, then
one keyed-state lookup per key); the joins (q3, q4, q8)
read only the fields they use and pick the events they join on batches (q3 about one
event in 45, q8 one in 12, q4 all but persons), then join record by record as their
per-record forms do.

Where the results are compared (``expected_kind``):

- *rows*: append output, equal multisets of rows (q0-q3, q5, q7, q8, q11).  Windows are
  emitted when the watermark passes their end in both systems; Spark's watermark moves only
  with its input, so the input ends with a far-future sentinel bid (auction and bidder -1),
  and rows it makes are left out (``drop_sentinel``).
- *final*: update output (q4, q18): both emit a new value for a key whenever it changes; the
  last value per key is compared (Spark: complete mode's final table; cutline: the latest
  update per key).
"""

from __future__ import annotations

import sys
from typing import Any

from cutline import session, sliding, tumbling
from cutline.connectors.nexmark import AUCTION, BID, PERSON, SENTINEL_AUCTION, event_time

WINDOW = 10  # seconds: q5's window size, q7's and q8's tumbling windows
SLIDE = 2  # seconds: q5's slide (Flink nexmark's HOP of 2 s)
GAP = 10  # seconds: q11's session gap
EURO = 908  # q1: 0.908 euros per dollar, in thousandths
SKIP = 123  # q2: auctions whose id is a multiple of this
Q3_STATES = ("OR", "ID", "CA")
Q3_CATEGORY = 10

QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q18")
# q18 keeps a key per (bidder, auction) forever: millions of keys, whose full snapshot in
# the memory backend costs over a second a checkpoint at 5M events (0.3x the records/s);
# RocksDB's incremental checkpoints upload only what changed (Flink's Nexmark setup runs
# every query on RocksDB)
STATE_BACKEND = {"q18": "rocksdb"}
FINAL = ("q4", "q18")  # update output: compare the last value per key
KEY_COLUMNS = {"q4": 1, "q18": 2}  # the key is the first N columns of a row


def expected_kind(query: str) -> str:
    return "final" if query in FINAL else "rows"


def ship_by_value() -> None:
    """Spark's workers cannot import this file: pickle its functions by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --------------------------------------------------------------------------- cutline
# Per record: ``build(query, events, max_delay)`` takes the stream of event dicts (straight
# from the source) and returns the stream of result tuples.


def is_bid(e: dict) -> bool:
    return e["event_type"] == BID


def bid_row(e: dict) -> tuple:
    b = e["bid"]
    return (b["auction"], b["bidder"], b["price"], b["dateTime"], b["extra"])


def euro_row(e: dict) -> tuple:
    b = e["bid"]
    return (b["auction"], b["bidder"], b["price"] * EURO // 1000, b["dateTime"], b["extra"])


def q2_keep(e: dict) -> bool:
    return e["event_type"] == BID and e["bid"]["auction"] % SKIP == 0


def q2_row(e: dict) -> tuple:
    return (e["bid"]["auction"], e["bid"]["price"])


def bid_auction(e: dict) -> int:
    return e["bid"]["auction"]


def bid_bidder(e: dict) -> int:
    return e["bid"]["bidder"]


def ms(t: float) -> int:
    return int(round(t * 1000))


# q3: persons of some states selling in one category; a join kept in keyed state


def q3_keep(e: dict) -> bool:
    t = e["event_type"]
    if t == PERSON:
        return e["person"]["state"] in Q3_STATES
    return t == AUCTION and e["auction"]["category"] == Q3_CATEGORY


def q3_key(e: dict) -> int:
    return e["person"]["id"] if e["event_type"] == PERSON else e["auction"]["seller"]


def q3_join(ctx: Any, e: dict) -> list:
    """The person once it came (name, city, state), the auctions that came before it."""
    person = ctx.value_state("person", None)
    if e["event_type"] == PERSON:
        p = e["person"]
        person.update((p["name"], p["city"], p["state"]))
        waiting = ctx.list_state("auctions")
        out = [(p["name"], p["city"], p["state"], a) for a in waiting]
        waiting.clear()
        return out
    if person.value is None:
        ctx.list_state("auctions").append(e["auction"]["id"])
        return []
    return [(*person.value, e["auction"]["id"])]


# q4: the closing price of every auction (its highest bid between its start and its end),
# when it closes (an event-time timer at its end); then the running average per category


def q4_keep(e: dict) -> bool:
    return e["event_type"] in (AUCTION, BID)


def q4_key(e: dict) -> int:
    return e["auction"]["id"] if e["event_type"] == AUCTION else e["bid"]["auction"]


def q4_close(ctx: Any, e: dict) -> None:
    auction = ctx.value_state("auction", None)  # (category, start, end), then "closed"
    if auction.value == "closed":
        return
    if e["event_type"] == AUCTION:
        a = e["auction"]
        auction.update((a["category"], a["dateTime"], a["expires"]))
        ctx.timers.register_event_time(a["expires"] / 1000)
        best = ctx.value_state("best", None)
        for when, price in ctx.list_state("early"):  # bids that came before the auction
            if a["dateTime"] <= when <= a["expires"] and (best.value is None
                                                          or price > best.value):
                best.update(price)
        ctx.list_state("early").clear()
        return
    b = e["bid"]
    if auction.value is None:
        ctx.list_state("early").append((b["dateTime"], b["price"]))
        return
    _, start, end = auction.value
    best = ctx.value_state("best", None)
    if start <= b["dateTime"] <= end and (best.value is None or b["price"] > best.value):
        best.update(b["price"])


def q4_closed(ctx: Any, key: int, when: float) -> list:
    auction, best = ctx.value_state("auction", None), ctx.value_state("best", None)
    out = [] if best.value is None else [(auction.value[0], best.value)]
    auction.update("closed")  # bids of a closed auction are ignored from now on
    best.clear()
    return out


def q4_category(r: tuple) -> int:
    return r[0]


def q4_average(ctx: Any, r: tuple) -> list:
    """(category, average closing price, auctions closed): an update per closed auction."""
    acc = ctx.value_state("sum", (0, 0))
    n, total = acc.value
    n, total = n + 1, total + r[1]
    acc.update((n, total))
    return [(r[0], total / n, n)]


# q5: hot items


def window_of(r: Any) -> tuple:
    return (r.start, r.end)


def q5_hottest(window: tuple, w: Any, results: list) -> list:
    """The auctions with the most bids of one sliding window (all of them on a tie)."""
    return q5_hottest_rows(window, w, [{"auction": r.key, "count": r.value} for r in results])


# q7: the highest bid of every tumbling window (ties: the largest (price, dateTime, auction,
# bidder, extra), as Spark's max(struct(...)) picks)


def everything(_e: Any) -> int:
    return 0


def q7_create() -> None:
    return None


def q7_add(acc: tuple | None, e: dict) -> tuple:
    return q7_add_row(acc, e["bid"])


def q7_add_row(acc: tuple | None, b: dict) -> tuple:
    """A bid (its fields) into the window's highest."""
    mine = (b["price"], b["dateTime"], b["auction"], b["bidder"], b["extra"])
    return mine if acc is None or mine > acc else acc


def q7_merge(a: tuple | None, b: tuple | None) -> tuple | None:
    return b if a is None or (b is not None and b > a) else a


def q7_row(r: Any) -> tuple:
    price, when, auction, bidder, extra = r.value
    return (ms(r.start), auction, price, bidder, when, extra)


# q8: persons who opened an auction in the tumbling window they registered in.  A keyed
# process (Flink's KeyedProcessFunction) keyed by person id, with per-(person, window) state:
# the row goes out the moment the person and their first auction of the window are both in
# (as Spark's windowed join emits it), never twice, and an event-time timer at the window's
# end (no allowed lateness) drops the window's state.

Q8_OPENED, Q8_EMITTED = 1, 2  # a window's state, besides the person's name (came first)


def q8_keep(e: dict) -> bool:
    return e["event_type"] in (PERSON, AUCTION)


def q8_key(e: dict) -> int:
    return e["person"]["id"] if e["event_type"] == PERSON else e["auction"]["seller"]


def q8_join(ctx: Any, e: dict) -> list:
    """The row (person, name, window start) when the person and their first auction of the
    window are both in; state per window start: the name, ``Q8_OPENED`` or ``Q8_EMITTED``."""
    person = e["person"] if e["event_type"] == PERSON else None
    when = person["dateTime"] if person else e["auction"]["dateTime"]
    start = when - when % (WINDOW * 1000)
    end = (start + WINDOW * 1000) / 1000
    if end <= ctx.watermark:  # late: its window closed (as the window operators drop it)
        return []
    state = ctx.value_state("windows", None)
    windows = dict(state.value or {})  # a copy: the stored one may be in a snapshot
    was = windows.get(start)
    if was is None:
        ctx.timers.register_event_time(end)
    out = []
    if person is not None and was == Q8_OPENED:
        out = [(ctx.key, person["name"], start)]
    elif person is None and isinstance(was, str):
        out = [(ctx.key, was, start)]
    elif was is not None:
        return []  # emitted already, or another auction of the window before the person
    windows[start] = Q8_EMITTED if out else (person["name"] if person else Q8_OPENED)
    state.update(windows)
    return out


def q8_closed(ctx: Any, key: int, when: float) -> list:
    """The window ending at ``when`` closed: drop its state."""
    state = ctx.value_state("windows", None)
    windows = {s: v for s, v in (state.value or {}).items()
               if s + WINDOW * 1000 > when * 1000}
    if windows:
        state.update(windows)
    else:
        state.clear()
    return []


# q11: bids per bidder session


def q11_row(r: Any) -> tuple:
    return (r.key, r.value, ms(r.start), ms(r.end))


# q18: the last bid of every (bidder, auction) (ties at the same millisecond: the largest
# (dateTime, price, extra), as Spark's max(struct(...)))


def q18_key(e: dict) -> tuple:
    return q18_key_row(e["bid"])


def q18_key_row(b: dict) -> tuple:
    return (b["bidder"], b["auction"])


def q18_last(ctx: Any, e: dict) -> list:
    return q18_last_row(ctx, e["bid"])


def q18_last_row(ctx: Any, b: dict) -> list:
    """A bid (its fields): an update if it is the key's latest."""
    last = ctx.value_state("last", None)
    mine = (b["dateTime"], b["price"], b["extra"])
    if last.value is not None and last.value >= mine:
        return []
    last.update(mine)
    return [(b["bidder"], b["auction"], *mine)]


def build(query: str, events: Any, max_delay: float, prefix: str = "") -> Any:
    """Query ``query`` on the cutline stream ``events`` (event dicts): its result stream.
    ``prefix`` goes before every operator's uid (several queries on one source)."""
    def u(name: str) -> str:
        return prefix + name

    def timed() -> Any:
        return events.assign_timestamps(event_time, max_delay=max_delay, uid=u("event-time"))

    if query == "q0":
        return events.filter(is_bid, uid=u("bids")).map(bid_row, uid=u("q0"))
    if query == "q1":
        return events.filter(is_bid, uid=u("bids")).map(euro_row, uid=u("q1"))
    if query == "q2":
        return events.filter(q2_keep, uid=u("q2-filter")).map(q2_row, uid=u("q2"))
    if query == "q3":
        return events.filter(q3_keep, uid=u("q3-filter")).key_by(q3_key).process(
            q3_join, uid=u("q3"))
    if query == "q4":
        return (timed().filter(q4_keep, uid=u("q4-filter")).key_by(q4_key)
                .process(q4_close, on_timer=q4_closed, uid=u("closing-prices"))
                .key_by(q4_category).process(q4_average, uid=u("q4")))
    if query == "q5":
        return (timed().filter(is_bid, uid=u("bids")).key_by(bid_auction)
                .window(sliding(WINDOW, SLIDE)).count(uid=u("bids-per-auction"))
                .key_by(window_of).window(tumbling(SLIDE)).apply(q5_hottest, uid=u("q5")))
    if query == "q7":
        return (timed().filter(is_bid, uid=u("bids")).key_by(everything)
                .window(tumbling(WINDOW)).aggregate(q7_create, q7_add, q7_merge, uid=u("q7"))
                .map(q7_row, uid=u("q7-rows")))
    if query == "q8":
        return (timed().filter(q8_keep, uid=u("q8-filter")).key_by(q8_key)
                .process(q8_join, on_timer=q8_closed, uid=u("q8")))
    if query == "q11":
        return (timed().filter(is_bid, uid=u("bids")).key_by(bid_bidder)
                .window(session(GAP)).count(uid=u("q11")).map(q11_row, uid=u("q11-rows")))
    if query == "q18":
        return events.filter(is_bid, uid=u("bids")).key_by(q18_key).process(q18_last, uid=u("q18"))
    raise ValueError(f"unknown Nexmark query {query!r}; one of {', '.join(QUERIES)}")


# Columnar: the same queries on a batch stream of Arrow record batches
# (``FileSource(path, "parquet").batches()``), vectorised with pyarrow.compute.  q5 and q7
# run their windows on the batches too; what is left after them (a few rows per window) goes
# on record by record.
COLUMNAR = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q18")
# what each reads (``FileSource(...).batches(columns=...)``: parquet reads nothing else, as
# Spark prunes the columns, nested fields too, its query does not use)
_EVENT_TIMES = ["auction.dateTime", "person.dateTime"]  # the watermark follows all events
COLUMNS = {"q0": ["event_type", "bid"], "q1": ["event_type", "bid"],
           "q2": ["event_type", "bid.auction", "bid.price"],
           "q5": ["event_type", "bid.auction", "bid.dateTime", *_EVENT_TIMES],
           "q7": ["event_type", "bid", *_EVENT_TIMES],
           "q11": ["event_type", "bid.bidder", "bid.dateTime", *_EVENT_TIMES],
           "q18": ["event_type", "bid"],
           # the joins: the batches pick the events a join takes (a Python dict each then)
           "q3": ["event_type", "person.id", "person.name", "person.city", "person.state",
                  "auction.id", "auction.seller", "auction.category"],
           "q4": ["event_type", "auction.id", "auction.category", "auction.dateTime",
                  "auction.expires", "bid.auction", "bid.price", "bid.dateTime",
                  "person.dateTime"],
           "q8": ["event_type", "person.id", "person.name", "person.dateTime",
                  "auction.seller", "auction.dateTime", "bid.dateTime"]}


def bid_columns(batch: Any) -> Any:
    """A batch of events (all bids) as the flat bid columns (and ``ts``, if it has one)."""
    import pyarrow as pa

    bid = batch.column("bid")
    cols, names = bid.flatten(), [f.name for f in bid.type]
    if "ts" in batch.schema.names:
        cols, names = [*cols, batch.column("ts")], [*names, "ts"]
    return pa.RecordBatch.from_arrays(cols, names=names)


def euro_columns(batch: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    bid = bid_columns(batch)
    price = pc.divide(pc.multiply(bid.column("price"), EURO), 1000)  # whole cents, >= 0
    return pa.RecordBatch.from_arrays(
        [price if f == "price" else bid.column(f) for f in bid.schema.names],
        names=bid.schema.names)


def q2_multiple(batch: Any) -> Any:
    import pyarrow.compute as pc

    a = batch.column("auction")  # no modulo in pyarrow.compute: a - (a / k) * k
    return pc.equal(pc.subtract(a, pc.multiply(pc.divide(a, SKIP), SKIP)), 0)


def q3_batch_keep(batch: Any) -> Any:
    """:func:`q3_keep` for a whole batch: persons of ``Q3_STATES``, auctions of
    ``Q3_CATEGORY``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = batch.column("event_type")
    state = pc.struct_field(batch.column("person"), "state")
    category = pc.struct_field(batch.column("auction"), "category")
    person = pc.and_kleene(pc.equal(kind, PERSON),
                           pc.is_in(state, value_set=pa.array(Q3_STATES)))
    auction = pc.and_kleene(pc.equal(kind, AUCTION), pc.equal(category, Q3_CATEGORY))
    return pc.fill_null(pc.or_kleene(person, auction), False)


def q4_batch_keep(batch: Any) -> Any:
    """:func:`q4_keep` for a whole batch: auctions and bids."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(batch.column("event_type"), value_set=pa.array([AUCTION, BID], pa.int32()))


def q8_batch_keep(batch: Any) -> Any:
    """:func:`q8_keep` for a whole batch: persons and auctions."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.is_in(batch.column("event_type"),
                    value_set=pa.array([PERSON, AUCTION], pa.int32()))


def event_seconds(batch: Any) -> Any:
    """Every event's time in seconds (float, as ``event_time``): the bid's, auction's or
    person's ``dateTime``, whichever the event has."""
    import pyarrow as pa
    import pyarrow.compute as pc

    when = pc.coalesce(*(pc.struct_field(batch.column(k), "dateTime")
                         for k in ("bid", "auction", "person")))
    return pc.divide(pc.cast(when, pa.float64()), 1000.0)


def q5_local_top(batch: Any) -> Any:
    """Of one subtask's fired (auction, window, count) rows, those with the most bids of
    their window *here*: no other row can be the window's hottest over all subtasks."""
    if not batch.num_rows:
        return batch
    return batch.filter(at_group_max(batch.column("start").to_numpy(),
                                     batch.column("count").to_numpy()))


def at_group_max(group: Any, values: Any) -> Any:
    """Per row (numpy arrays): whether its integer value is the largest of its group's (all
    of them on a tie)."""
    import numpy as np

    _, g = np.unique(group, return_inverse=True)
    top = np.full(g.max() + 1, np.iinfo(values.dtype).min, dtype=values.dtype)
    np.maximum.at(top, g, values)
    return values == top[g]


def window_bounds(r: dict) -> tuple:
    return (r["start"], r["end"])


def q5_hottest_rows(window: tuple, _w: Any, rows: list) -> list:
    """Of (auction, count) rows of one sliding window, those with its most bids."""
    top = max(r["count"] for r in rows)
    return [(ms(window[0]), ms(window[1]), r["auction"], r["count"]) for r in rows
            if r["count"] == top]


Q7_ORDER = [("start", "ascending"), ("price", "descending"), ("dateTime", "descending"),
            ("auction", "descending"), ("bidder", "descending"), ("extra", "descending")]


def q7_local_top(batch: Any) -> Any:
    """The highest bid of each 10 s window in one record batch (a local pre-aggregate, as
    Spark's partial aggregation or Flink's two-phase one): the window keeps the highest of
    these.  The bids at their window's highest price are picked with numpy first (a few per
    window), then those are sorted by window and the tie order of :func:`q7_add`; the first
    of each.  Sorting the whole batch by that order (strings among its keys) took 7x longer."""
    import numpy as np
    import pyarrow as pa

    if not batch.num_rows:
        return batch
    when = batch.column("dateTime").to_numpy()
    start = when - when % (WINDOW * 1000)
    at_top = np.flatnonzero(at_group_max(start, batch.column("price").to_numpy()))
    t = pa.Table.from_batches([batch.take(pa.array(at_top))]).append_column(
        "start", pa.array(start[at_top]))
    return first_of_each(t, Q7_ORDER, ["start"]).drop_columns(["start"])


def first_of_each(table: Any, order: list, keys: list[str]) -> Any:
    """``table`` sorted by ``order`` (which begins with ``keys``): the first row of each
    group of equal ``keys``, as one record batch."""
    import numpy as np

    t = table.sort_by(order)
    new = np.zeros(t.num_rows, dtype=bool)
    new[0] = True
    for k in keys:
        c = t.column(k).to_numpy()
        new[1:] |= c[1:] != c[:-1]
    return t.take(np.flatnonzero(new)).combine_chunks().to_batches()[0]


def q11_columns(batch: Any) -> Any:
    """Session rows as :func:`q11_row`'s: (bidder, count, start, end), times in ms."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def ms_of(c: str) -> Any:
        return pc.cast(pc.round(pc.multiply(batch.column(c), 1000)), pa.int64())

    return pa.RecordBatch.from_arrays(
        [batch.column("bidder"), batch.column("count"), ms_of("start"), ms_of("end")],
        names=["bidder", "count", "start", "end"])


def build_columnar(query: str, events: Any, max_delay: float = 0.0, prefix: str = "") -> Any:
    """Query ``query`` (one of ``COLUMNAR``) on a batch stream of events: its rows, as
    record batches (q0-q2, q11) or records (q5, q7, q18: what the record-by-record step
    after the batches gives).  ``prefix``
    goes before every operator's uid."""
    import pyarrow.compute as pc

    def u(name: str) -> str:
        return prefix + name

    if query in ("q4", "q5", "q7", "q8", "q11"):
        events = events.with_column("ts", event_seconds, uid=u("ts")).assign_timestamps(
            "ts", max_delay=max_delay, uid=u("event-time"))
    if query == "q3":  # the joins: the events they take, picked on batches; the rest as is
        return (events.filter_batches(q3_batch_keep, uid=u("q3-filter")).rows(uid=u("rows"))
                .key_by(q3_key).process(q3_join, uid=u("q3")))
    if query == "q4":
        return (events.filter_batches(q4_batch_keep, uid=u("q4-filter")).rows(uid=u("rows"))
                .key_by(q4_key).process(q4_close, on_timer=q4_closed, uid=u("closing-prices"))
                .key_by(q4_category).process(q4_average, uid=u("q4")))
    if query == "q8":
        return (events.filter_batches(q8_batch_keep, uid=u("q8-filter")).rows(uid=u("rows"))
                .key_by(q8_key).process(q8_join, on_timer=q8_closed, uid=u("q8")))
    bids = events.where(pc.field("event_type") == BID, uid=u("bids"))
    if query == "q0":
        return bids.map_batches(bid_columns, uid=u("q0"))
    if query == "q1":
        return bids.map_batches(euro_columns, uid=u("q1"))
    if query == "q2":
        return (bids.map_batches(bid_columns, uid=u("bid-columns"))
                .filter_batches(q2_multiple, uid=u("q2-filter"))
                .select("auction", "price", uid=u("q2")))
    if query == "q5":
        return (bids.map_batches(bid_columns, uid=u("bid-columns")).key_by("auction")
                .window(sliding(WINDOW, SLIDE)).count(uid=u("bids-per-auction"))
                .map_batches(q5_local_top, uid=u("local-top")).rows(uid=u("rows"))
                .key_by(window_bounds).window(tumbling(SLIDE))
                .apply(q5_hottest_rows, uid=u("q5")))
    if query == "q7":
        return (bids.map_batches(bid_columns, uid=u("bid-columns"))
                .map_batches(q7_local_top, uid=u("local-top")).rows(uid=u("rows"))
                .key_by(everything).window(tumbling(WINDOW))
                .aggregate(q7_create, q7_add_row, q7_merge, uid=u("q7"))
                .map(q7_row, uid=u("q7-rows")))
    if query == "q11":
        return (bids.map_batches(bid_columns, uid=u("bid-columns")).key_by("bidder")
                .window(session(GAP)).count(uid=u("q11"))
                .map_batches(q11_columns, uid=u("q11-rows")))
    if query == "q18":
        return (bids.map_batches(bid_columns, uid=u("bid-columns")).key_by(["bidder", "auction"])
                .latest(by=["dateTime", "price", "extra"], uid=u("q18"))
                .select("bidder", "auction", "dateTime", "price", "extra", uid=u("q18-rows")))
    raise ValueError(f"query {query!r} has no columnar form; those that do: "
                     f"{', '.join(COLUMNAR)}")


# --------------------------------------------------------------------------- Spark


def spark_events(spark: Any, directory: str, fmt: str = "parquet",
                 max_files: int | None = None) -> Any:
    """The event files as a streaming DataFrame."""
    from cutline.connectors.nexmark import spark_schema

    reader = spark.readStream.schema(spark_schema())
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    return reader.format(fmt).load(directory)


def _timed(events: Any, max_delay: float) -> Any:
    """The events with their event time as column ``ts`` (whichever of the person's,
    auction's or bid's ``dateTime`` the event has) and a watermark ``max_delay`` behind it:
    one watermark over all events, as cutline's ``assign_timestamps`` after the source
    (watermarks per kind would hold back at the last auction's time, say)."""
    from pyspark.sql import functions as F

    when = F.coalesce("bid.dateTime", "auction.dateTime", "person.dateTime")
    return (events.withColumn("ts", F.timestamp_millis(when))
            .withWatermark("ts", f"{int(round(max_delay * 1000))} milliseconds"))


def _of(events: Any, kind: str) -> Any:
    """One kind's rows (``select("bid.*")``), with ``ts`` if the events have it."""
    from pyspark.sql import functions as F

    code = {"person": PERSON, "auction": AUCTION, "bid": BID}[kind]
    timed = ["ts"] if "ts" in events.columns else []
    return events.where(F.col("event_type") == code).select(f"{kind}.*", *timed)


def _millis(col: Any) -> Any:
    from pyspark.sql import functions as F

    return F.unix_millis(col)


def q4_close_pandas(key: Any, frames: Any, state: Any) -> Any:
    """Spark's q4, per auction (``applyInPandasWithState``, event-time timeout at its end):
    its highest bid between its start and end, emitted when the watermark passes the end.
    SQL cannot say it: a join, a max per auction, then an average per category are three
    stateful steps, and Spark chains those only over windows."""
    import json

    import pandas as pd

    # state: category, start, end (None until the auction came), best, closed, and the
    # (time, price) of bids that came before their auction, as JSON text: PySpark 4.3's
    # worker cannot read an array column of a state schema (KeyError 'elementType')
    cat, start, end, best, closed, early_json = state.get if state.exists else (
        None, None, None, None, False, "[]")
    early = [tuple(x) for x in json.loads(early_json or "[]")]

    def close() -> Any:
        state.update((cat, start, end, None, True, "[]"))
        return pd.DataFrame({"category": [cat] if best is not None else [],
                             "final": [best] if best is not None else []}, dtype="int64")

    if closed:
        return
    if state.hasTimedOut:
        yield close()
        return
    for pdf in frames:
        for is_auction, c, s, e, when, price in zip(
                pdf["is_auction"], pdf["category"], pdf["start"], pdf["expires"],
                pdf["dateTime"], pdf["price"]):
            if is_auction:
                cat, start, end = int(c), int(s), int(e)
            else:
                early.append((int(when), int(price)))
    if cat is not None:
        for when, price in early:
            if start <= when <= end and (best is None or price > best):
                best = price
        early = []
        if end <= state.getCurrentWatermarkMs():  # the watermark passed it already
            yield close()
            return
        state.setTimeoutTimestamp(end)
    state.update((cat, start, end, best, False, json.dumps(early)))


# q4's average per category follows a stateful Python step whose output rows carry no event
# time: Spark's check for rows that a later stateful operator could drop as late refuses the
# plan, though the average (complete mode, no watermark) drops nothing.  A Spark user
# switches the check off for this query.
SPARK_CONF = {"q4": {"spark.sql.streaming.statefulOperator.checkCorrectness.enabled": "false"}}

Q4_STATE = "category long, start long, expires long, best long, closed boolean, early string"


def spark_query(query: str, events: Any, max_delay: float) -> tuple[Any, str]:
    """Query ``query`` on the streaming DataFrame ``events``: (result DataFrame, output
    mode).  The result's columns are the cutline rows' fields, in order."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    timed = _timed(events, max_delay)
    if query == "q0":
        return _of(events, "bid").select("auction", "bidder", "price", "dateTime",
                                         "extra"), "append"
    if query == "q1":
        return _of(events, "bid").select(
            "auction", "bidder", F.expr(f"price * {EURO} div 1000").alias("price"),
            "dateTime", "extra"), "append"
    if query == "q2":
        return (_of(events, "bid").where(F.col("auction") % SKIP == 0)
                .select("auction", "price"), "append")
    if query == "q3":
        persons = _of(events, "person").where(F.col("state").isin(*Q3_STATES))
        auctions = _of(events, "auction").where(F.col("category") == Q3_CATEGORY)
        joined = auctions.join(persons, auctions["seller"] == persons["id"])
        return joined.select(persons["name"], persons["city"], persons["state"],
                             auctions["id"]), "append"
    if query == "q4":
        a = _of(timed, "auction").select(
            F.col("id").alias("auction"), F.lit(True).alias("is_auction"), "category",
            F.col("dateTime").alias("start"), "expires", "dateTime",
            F.lit(None).cast("long").alias("price"), "ts")
        b = _of(timed, "bid").select(
            "auction", F.lit(False).alias("is_auction"), F.lit(None).cast("long").alias(
                "category"), F.lit(None).cast("long").alias("start"),
            F.lit(None).cast("long").alias("expires"), "dateTime", "price", "ts")
        closing = a.unionByName(b).groupBy("auction").applyInPandasWithState(
            q4_close_pandas, "category long, final long", Q4_STATE, "append",
            GroupStateTimeout.EventTimeTimeout)
        return (closing.groupBy("category").agg(F.avg("final").alias("avg"),
                                                F.count("final").alias("n")), "complete")
    if query == "q5":
        bids = _of(timed, "bid")
        counts = bids.groupBy(F.window("ts", f"{WINDOW} seconds", f"{SLIDE} seconds"),
                              "auction").count()
        per_window = counts.groupBy(
            F.window(F.window_time("window"), f"{SLIDE} seconds").alias("w")).agg(
            F.max("count").alias("top"),
            F.collect_list(F.struct("window", "auction", "count")).alias("items"))
        hot = per_window.select("top", F.explode("items").alias("i")).where(
            F.col("i.count") == F.col("top"))
        return hot.select(_millis("i.window.start"), _millis("i.window.end"), "i.auction",
                          "i.count"), "append"
    if query == "q7":
        bids = _of(timed, "bid")
        best = bids.groupBy(F.window("ts", f"{WINDOW} seconds")).agg(
            F.max(F.struct("price", "dateTime", "auction", "bidder", "extra")).alias("b"))
        return best.select(_millis("window.start"), "b.auction", "b.price", "b.bidder",
                           "b.dateTime", "b.extra"), "append"
    if query == "q8":
        persons = _of(timed, "person").select(
            "id", "name", F.window("ts", f"{WINDOW} seconds").alias("w"))
        auctions = _of(timed, "auction").select(
            "seller", F.window("ts", f"{WINDOW} seconds").alias("w2"))
        joined = persons.join(auctions, (persons["id"] == auctions["seller"])
                              & (persons["w"] == auctions["w2"]))
        return (joined.select("id", "name", _millis("w.start").alias("start"))
                .dropDuplicates(["id", "start"]), "append")
    if query == "q11":
        bids = _of(timed, "bid")
        sessions = bids.groupBy(F.session_window("ts", f"{GAP} seconds").alias("s"),
                                "bidder").count()
        return sessions.select("bidder", "count", _millis("s.start"),
                               _millis("s.end")), "append"
    if query == "q18":
        last = _of(events, "bid").groupBy("bidder", "auction").agg(
            F.max(F.struct("dateTime", "price", "extra")).alias("b"))
        return last.select("bidder", "auction", "b.dateTime", "b.price",
                           "b.extra"), "complete"
    raise ValueError(f"unknown Nexmark query {query!r}; one of {', '.join(QUERIES)}")


# --------------------------------------------------------------------------- comparing


def drop_sentinel(query: str, rows: list[tuple]) -> list[tuple]:
    """Rows without what the sentinel bid made (auction or bidder -1; its windows)."""
    s = SENTINEL_AUCTION
    if query in ("q0", "q1"):
        return [r for r in rows if r[0] != s]
    if query == "q5":
        return [r for r in rows if r[2] != s]
    if query == "q7":
        return [r for r in rows if r[1] != s]
    if query in ("q11", "q18"):
        return [r for r in rows if r[0] != s]
    return rows


def final(query: str, rows: list[tuple]) -> dict:
    """Update output: the last value per key, the largest by the column that only grows
    (q4: the number of auctions averaged; q18: the bid's time, then price and extra)."""
    k = KEY_COLUMNS[query]
    out: dict = {}
    for r in rows:
        key, value = r[:k], r[k:]
        order = value[::-1] if query == "q4" else value
        if key not in out or order > out[key][0]:
            out[key] = (order, value)
    return {key: value for key, (_, value) in out.items()}
